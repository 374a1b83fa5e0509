//! compare_bench's rows (`mode,metric,x,value,unit`): building and printing them as they are
//! measured, the CSV they are written to and read back from, the sizes derived from them (90% of
//! the peak or of the modelled link), and the points the plots take.

use std::io::Write;
use std::path::Path;

/// One measured point.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) mode: String,
    pub(crate) metric: String,
    pub(crate) x: f64,
    pub(crate) value: f64,
    pub(crate) unit: String,
}

/// Prints a finished point at once (stderr, `ROW ` + its CSV line), so a run cut short still
/// leaves every point it measured in its log.
pub(crate) fn emit(rows: &[Row]) {
    if let Some(r) = rows.last() {
        eprintln!("ROW {},{},{},{:.4},{}", r.mode, r.metric, r.x, r.value, r.unit);
    }
}

pub(crate) fn row(mode: &str, metric: &str, x: f64, value: f64, unit: &str) -> Row {
    Row {
        mode: mode.into(),
        metric: metric.into(),
        x,
        value,
        unit: unit.into(),
    }
}

pub(crate) fn write_csv(path: &Path, rows: &[Row]) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    writeln!(f, "mode,metric,x,value,unit")?;
    // Fields are plain text; a comma inside one would shift every later field.
    let field = |s: &str| s.replace(',', ";");
    for r in rows {
        writeln!(
            f,
            "{},{},{},{:.4},{}",
            field(&r.mode),
            field(&r.metric),
            r.x,
            r.value,
            field(&r.unit)
        )?;
    }
    Ok(())
}

pub(crate) fn read_csv(path: &Path) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 5 {
            return Err(format!("{}:{}: expected 5 fields, got {}", path.display(), i + 1, f.len()).into());
        }
        rows.push(row(f[0], f[1], f[2].parse()?, f[3].parse()?, f[4]));
    }
    Ok(rows)
}

/// The smallest size whose bandwidth reaches 90% of the mode's peak, per mode and direction.
pub(crate) fn ninety_percent(rows: &[Row]) -> Vec<Row> {
    let mut out = Vec::new();
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.metric.ends_with("_bw"))
        .map(|r| (r.mode.clone(), r.metric.clone()))
        .collect();
    keys.dedup();
    for (mode, metric) in keys {
        let pts: Vec<&Row> = rows.iter().filter(|r| r.mode == mode && r.metric == metric).collect();
        let peak = pts.iter().map(|r| r.value).fold(0.0, f64::max);
        if let Some(r) = pts.iter().find(|r| r.value >= 0.9 * peak) {
            out.push(row(
                &mode,
                &format!("{metric}_90pct_size"),
                r.x,
                peak,
                "bytes at 90% of peak GB/s",
            ));
        }
    }
    out
}

/// With the rate model on: the smallest size whose bandwidth reaches 90% of the modelled link
/// (`link_gbs` GB/s), per mode and direction (none when a mode never does).
pub(crate) fn link_ninety_percent(rows: &[Row], link_gbs: f64) -> Vec<Row> {
    let mut keys: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.metric == "put_bw" || r.metric == "get_bw")
        .map(|r| (r.mode.clone(), r.metric.clone()))
        .collect();
    keys.dedup();
    keys.into_iter()
        .filter_map(|(mode, metric)| {
            rows.iter()
                .filter(|r| r.mode == mode && r.metric == metric && r.value >= 0.9 * link_gbs)
                .map(|r| r.x)
                .reduce(f64::min)
                .map(|x| {
                    row(
                        &mode,
                        &format!("{metric}_90pct_link_size"),
                        x,
                        link_gbs,
                        "bytes at 90% of the modelled link (GB/s)",
                    )
                })
        })
        .collect()
}

pub(crate) fn rows_for_plot(rows: &[Row]) -> Vec<crate::ibgda_examples_plot::Point> {
    rows.iter()
        .map(|r| crate::ibgda_examples_plot::Point {
            series: r.mode.clone(),
            metric: r.metric.clone(),
            x: r.x,
            y: r.value,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trips_every_row_and_derives_the_90_percent_sizes() {
        let rows = vec![
            row("p2p", "put_bw", 8.0, 1.0, "GB/s"),
            row("p2p", "put_bw", 1024.0, 95.0, "GB/s"),
            row("p2p", "put_bw", 4096.0, 100.0, "GB/s"),
            row("proxy (16384 issuing threads)", "proxy_scaling", 2.0, 0.1431, "Mops/s"),
            row("odd, mode", "p_rate", 32.0, 0.5, "Mops/s"),
        ];
        let path = std::env::temp_dir().join(format!("compare_bench_test_{}.csv", std::process::id()));
        write_csv(&path, &rows).unwrap();
        let back = read_csv(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back.len(), rows.len());
        assert_eq!(back[3].mode, "proxy (16384 issuing threads)");
        assert_eq!((back[3].x, back[3].value), (2.0, 0.1431));
        assert_eq!(back[4].mode, "odd; mode");
        let ninety = ninety_percent(&back);
        assert_eq!(ninety.len(), 1);
        assert_eq!((ninety[0].x, ninety[0].value), (1024.0, 100.0));
    }
}
