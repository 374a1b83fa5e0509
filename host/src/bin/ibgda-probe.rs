//! `ibgda-probe`: what this node offers ibgda: rdma-core, RDMA devices and GPUs with their PCIe
//! placement, and per GPU the way it would reach peers behind a NIC, with the reason.
//! `IBGDA_NIC=auto|emu|mlx5|verbs` is read as at init; `IBGDA_LIBIBVERBS` names another library.
use ibgda::nic::{probe, NicChoice};

fn main() {
    let choice = match std::env::var("IBGDA_NIC").map(|v| v.parse::<NicChoice>()) {
        Err(_) => NicChoice::Auto,
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            eprintln!("ibgda-probe: {e}");
            std::process::exit(2);
        }
    };
    println!("{}", probe(choice));
}
