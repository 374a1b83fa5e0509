//! `ep_plot CSV DIR`: PNG plots of MoE dispatch/combine results (the `system,mode,metric,tokens,
//! value,unit` rows `ep_bench` and `bench_ep.py` write): bandwidth vs tokens per rank for
//! dispatch and combine, one line per system, and low-latency latency bars.
use plot::{draw_ep, Point};
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [csv, dir] = args.as_slice() else {
        eprintln!("usage: ep_plot RESULTS.csv PLOT_DIR");
        std::process::exit(2);
    };
    let text = match std::fs::read_to_string(csv) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ep_plot: {csv}: {e}");
            std::process::exit(1);
        }
    };
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let parsed = (f.len() == 6)
            .then(|| Some((f[3].parse::<f64>().ok()?, f[4].parse::<f64>().ok()?)))
            .flatten();
        let Some((x, y)) = parsed else {
            eprintln!(
                "ep_plot: {csv}:{}: not `system,mode,metric,tokens,value,unit`: {line}",
                n + 1
            );
            std::process::exit(1);
        };
        points.push(Point {
            series: f[0].to_string(),
            metric: format!("{}_{}", f[1], f[2]),
            x,
            y,
        });
    }
    match draw_ep(&points, &PathBuf::from(dir)) {
        Ok(files) => files.iter().for_each(|f| println!("{}", f.display())),
        Err(e) => {
            eprintln!("ep_plot: {e}");
            std::process::exit(1);
        }
    }
}

// Shared with compare_bench; each binary uses part of it.
#[allow(dead_code)]
#[path = "../plot.rs"]
mod plot;
