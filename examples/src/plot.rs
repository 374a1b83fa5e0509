//! PNG plots of `compare_bench` results: one line (or bar) per mode, axes labelled with units.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// One measured value.
#[derive(Clone, Debug)]
pub struct Point {
    /// The line it belongs to (a mode).
    pub series: String,
    /// What was measured (`put_bw`, `p_rate`, ...).
    pub metric: String,
    /// Message size, thread count, ...
    pub x: f64,
    /// The measurement.
    pub y: f64,
}

type Error = Box<dyn std::error::Error>;

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// The same colour for a mode in every plot; other series take the palette in order.
fn color_of(name: &str, i: usize) -> RGBColor {
    match name {
        "p2p" => COLORS[0],
        "ibgda" => COLORS[1],
        "ibgda-cpu-doorbell" => COLORS[2],
        n if n.starts_with("proxy") => COLORS[3],
        _ => COLORS[(4 + i) % COLORS.len()],
    }
}

/// Modes in their usual order (fastest transport first), then anything else.
fn rank(name: &str) -> usize {
    ["p2p", "ibgda", "ibgda-cpu-doorbell", "proxy"]
        .iter()
        .position(|m| *m == name)
        .unwrap_or(4)
}

/// Registers a TrueType font as `sans-serif` (once): `IBGDA_PLOT_FONT`, else DejaVu Sans.
fn load_font() -> Result<(), Error> {
    static LOADED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    LOADED
        .get_or_init(|| {
            let candidates: Vec<PathBuf> = std::env::var_os("IBGDA_PLOT_FONT")
                .map(PathBuf::from)
                .into_iter()
                .chain(
                    [
                        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
                        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
                        "/usr/share/fonts/TTF/DejaVuSans.ttf",
                    ]
                    .map(PathBuf::from),
                )
                .collect();
            let path = candidates.iter().find(|p| p.exists()).ok_or_else(|| {
                "no font for the plots: install DejaVu Sans (Debian: fonts-dejavu-core) or set IBGDA_PLOT_FONT to a .ttf".to_string()
            })?;
            let bytes: &'static [u8] = Box::leak(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?.into_boxed_slice());
            plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                .map_err(|_| format!("{}: not a usable TrueType font", path.display()))
        })
        .clone()
        .map_err(Into::into)
}

/// The series of `metric`, each sorted by x, in first-seen order.
fn series(points: &[Point], metric: &str) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut out: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for p in points.iter().filter(|p| p.metric == metric) {
        match out.iter_mut().find(|(s, _)| *s == p.series) {
            Some((_, v)) => v.push((p.x, p.y)),
            None => out.push((p.series.clone(), vec![(p.x, p.y)])),
        }
    }
    for (_, v) in &mut out {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out.sort_by_key(|(s, _)| rank(s));
    out
}

/// Decimal units: a log axis puts its ticks at powers of ten.
fn bytes_label(b: f64) -> String {
    match b {
        b if b < 1e3 => format!("{b:.0} B"),
        b if b < 1e6 => format!("{:.0} kB", b / 1e3),
        b if b < 1e9 => format!("{:.0} MB", b / 1e6),
        b => format!("{:.0} GB", b / 1e9),
    }
}

/// Values on a y axis: plain decimals down to 0.001 (three places at most, trailing zeros
/// dropped, so neighbouring linear ticks such as 0.15 and 0.2 stay distinct), `1e-4` style below.
fn value_label(v: f64) -> String {
    match v {
        v if v >= 10.0 => format!("{v:.0}"),
        v if v >= 1.0 => format!("{v:.1}"),
        v if v >= 0.001 => {
            let s = format!("{v:.3}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
        v if v > 0.0 => format!("{v:.0e}"),
        _ => "0".into(),
    }
}

/// Whole numbers only (a linear axis of counts also has ticks between them).
fn whole_label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-6 {
        count_label(v)
    } else {
        String::new()
    }
}

fn count_label(n: f64) -> String {
    let n = n.round() as u64;
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

struct Axes<'a> {
    title: &'a str,
    x_desc: &'a str,
    y_desc: &'a str,
    x_fmt: fn(f64) -> String,
}

/// Draws every series as a line with markers on prepared coordinates.
fn draw_lines<X, Y>(
    root: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    axes: &Axes<'_>,
    data: &[(String, Vec<(f64, f64)>)],
    x: X,
    y: Y,
) -> Result<(), Error>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(axes.title, ("sans-serif", 26))
        .margin(18)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)?;
    let fmt = axes.x_fmt;
    chart
        .configure_mesh()
        .x_desc(axes.x_desc)
        .y_desc(axes.y_desc)
        .x_label_formatter(&|v| fmt(*v))
        .y_label_formatter(&|v| value_label(*v))
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()?;
    for (i, (name, pts)) in data.iter().enumerate() {
        let color = color_of(name, i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(3)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

fn bounds(data: &[(String, Vec<(f64, f64)>)]) -> ((f64, f64), (f64, f64)) {
    let all = data.iter().flat_map(|(_, v)| v.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    ((x0, x1), (y0, y1))
}

/// A log-log line chart of `metric`, or nothing when no point has it.
fn log_log(points: &[Point], metric: &str, axes: Axes<'_>, path: &Path) -> Result<Option<PathBuf>, Error> {
    let data = series(points, metric);
    if data.is_empty() {
        return Ok(None);
    }
    let ((x0, x1), (y0, y1)) = bounds(&data);
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let (y0, y1) = (y0.max(1e-6) / 2.0, y1 * 2.0);
    draw_lines(
        &root,
        &axes,
        &data,
        (x0 / 1.5..x1 * 1.5).log_scale(),
        (y0..y1).log_scale(),
    )?;
    Ok(Some(path.to_path_buf()))
}

/// A linear line chart of `metric` (from zero on y).
fn linear(points: &[Point], metric: &str, axes: Axes<'_>, path: &Path) -> Result<Option<PathBuf>, Error> {
    let data = series(points, metric);
    if data.is_empty() {
        return Ok(None);
    }
    let ((x0, x1), (_, y1)) = bounds(&data);
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let pad = ((x1 - x0) * 0.05).max(0.5);
    let x: RangedCoordf64 = (x0 - pad..x1 + pad).into();
    let y: RangedCoordf64 = (0.0..y1 * 1.15).into();
    draw_lines(&root, &axes, &data, x, y)?;
    Ok(Some(path.to_path_buf()))
}

/// One bar per series of `metric` (its first point), labelled with the value.
fn bars(points: &[Point], metric: &str, title: &str, y_desc: &str, path: &Path) -> Result<Option<PathBuf>, Error> {
    let data = series(points, metric);
    if data.is_empty() {
        return Ok(None);
    }
    let values: Vec<(String, f64)> = data.iter().map(|(s, v)| (s.clone(), v[0].1)).collect();
    let top = values.iter().map(|v| v.1).fold(0.0, f64::max) * 1.2;
    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let names: Vec<String> = values.iter().map(|v| v.0.clone()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 26))
        .margin(18)
        .x_label_area_size(56)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..values.len() as f64 - 0.5, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(values.len())
        .x_label_formatter(&|v| {
            let i = v.round();
            if (v - i).abs() < 1e-6 && i >= 0.0 {
                names.get(i as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .draw()?;
    for (i, (name, v)) in values.iter().enumerate() {
        let color = color_of(name, i);
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x - 0.3, 0.0), (x + 0.3, *v)],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{v:.2}"),
            (x - 0.12, *v + top * 0.02),
            ("sans-serif", 18),
        )))?;
    }
    root.present()?;
    Ok(Some(path.to_path_buf()))
}

/// Draws every plot the points allow into `dir`; returns the files written.
pub fn draw_all(points: &[Point], dir: &Path) -> Result<Vec<PathBuf>, Error> {
    load_font()?;
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    out.extend(log_log(
        points,
        "put_bw",
        Axes {
            title: "put bandwidth vs message size (block-scope put_nbi)",
            x_desc: "message size",
            y_desc: "bandwidth (GB/s)",
            x_fmt: bytes_label,
        },
        &dir.join("put_bandwidth.png"),
    )?);
    out.extend(log_log(
        points,
        "get_bw",
        Axes {
            title: "get bandwidth vs message size (block-scope get_nbi)",
            x_desc: "message size",
            y_desc: "bandwidth (GB/s)",
            x_fmt: bytes_label,
        },
        &dir.join("get_bandwidth.png"),
    )?);
    out.extend(log_log(
        points,
        "p_rate",
        Axes {
            title: "8-byte put (p) message rate vs issuing threads",
            x_desc: "issuing GPU threads",
            y_desc: "message rate (M ops/s)",
            x_fmt: count_label,
        },
        &dir.join("p_rate.png"),
    )?);
    out.extend(log_log(
        points,
        "p_rate_scattered",
        Axes {
            title: "8-byte p rate, every other word (one WQE per p) vs issuing threads",
            x_desc: "issuing GPU threads",
            y_desc: "message rate (M ops/s)",
            x_fmt: count_label,
        },
        &dir.join("p_rate_scattered.png"),
    )?);
    out.extend(log_log(
        points,
        "fetch_add_rate",
        Axes {
            title: "atomic_fetch_add rate vs issuing threads",
            x_desc: "issuing GPU threads",
            y_desc: "rate (M ops/s)",
            x_fmt: count_label,
        },
        &dir.join("fetch_add_rate.png"),
    )?);
    out.extend(linear(
        points,
        "proxy_scaling",
        Axes {
            title: "CPU proxy: 8-byte p rate vs proxy threads",
            x_desc: "proxy threads per PE",
            y_desc: "message rate (M ops/s)",
            x_fmt: whole_label,
        },
        &dir.join("proxy_scaling.png"),
    )?);
    out.extend(bars(
        points,
        "put_signal_pingpong",
        "put_signal ping-pong latency (8 B, one thread per PE)",
        "round trip (us)",
        &dir.join("pingpong_latency.png"),
    )?);
    Ok(out)
}

/// Draws the MoE dispatch/combine plots of `ep_bench` / `bench_ep.py` rows (series = system,
/// metric prefixed with the mode: `ht_dispatch_bw`, `ll_dispatch_latency`, ...) into `dir`.
pub fn draw_ep(points: &[Point], dir: &Path) -> Result<Vec<PathBuf>, Error> {
    load_font()?;
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    for (metric, title, file) in [
        (
            "ht_dispatch_bw",
            "high-throughput dispatch (FP8) bandwidth vs tokens per rank",
            "ep_dispatch_bw.png",
        ),
        (
            "ht_combine_bw",
            "high-throughput combine (BF16) bandwidth vs tokens per rank",
            "ep_combine_bw.png",
        ),
    ] {
        out.extend(linear(
            points,
            metric,
            Axes {
                title,
                x_desc: "tokens per rank",
                y_desc: "bandwidth (GB/s, DeepEP's accounting)",
                x_fmt: whole_label,
            },
            &dir.join(file),
        )?);
    }
    out.extend(bars(
        points,
        "ll_dispatch_latency",
        "low-latency dispatch (FP8), 128 tokens per rank",
        "latency (us)",
        &dir.join("ep_ll_dispatch_latency.png"),
    )?);
    out.extend(bars(
        points,
        "ll_combine_latency",
        "low-latency combine (BF16), 128 tokens per rank",
        "latency (us)",
        &dir.join("ep_ll_combine_latency.png"),
    )?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_group_and_sort_by_x() {
        let p = |s: &str, m: &str, x: f64, y: f64| Point {
            series: s.into(),
            metric: m.into(),
            x,
            y,
        };
        let pts = [
            p("a", "m", 4.0, 1.0),
            p("b", "m", 1.0, 2.0),
            p("a", "m", 1.0, 3.0),
            p("a", "n", 1.0, 9.0),
        ];
        let s = series(&pts, "m");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], ("a".to_string(), vec![(1.0, 3.0), (4.0, 1.0)]));
        assert_eq!(s[1], ("b".to_string(), vec![(1.0, 2.0)]));
        assert_eq!(bytes_label(8.0), "8 B");
        assert_eq!(bytes_label(10_000.0), "10 kB");
        assert_eq!(bytes_label(1e8), "100 MB");
        assert_eq!(value_label(0.001), "0.001");
        assert_eq!(value_label(0.15), "0.15");
        assert_eq!(value_label(0.2), "0.2");
        assert_eq!(value_label(0.00005), "5e-5");
        assert_eq!(whole_label(2.0), "2");
        assert_eq!(whole_label(2.5), "");
        assert_eq!(value_label(350.0), "350");
        assert_eq!(count_label(131072.0), "128K");
        assert_eq!(count_label(32.0), "32");
    }
}
