//! `telemark bench`: the overhead table in seconds (criterion has the careful version:
//! `cargo bench -p telemark --bench switch`).

use anyhow::Result;
use clap::Args as ClapArgs;
use telemark_datapath::bench::{measure, Variant, POOL};

/// `telemark bench` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Flow counts (table sizes) to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [4usize, 1024, 2048, 8192, 16384, 32768, 65536])]
    pub flows: Vec<usize>,
    /// Frame sizes in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize])]
    pub sizes: Vec<usize>,
    /// Passes of the packet pool per variant; the median is reported.
    #[arg(long, default_value_t = 15)]
    pub rounds: usize,
    /// Print CSV instead of a table.
    #[arg(long)]
    pub csv: bool,
}

/// Runs `telemark bench`.
pub fn run(a: Args) -> Result<()> {
    if a.flows.contains(&0) || a.sizes.iter().any(|s| *s < 60) || a.rounds == 0 {
        anyhow::bail!("--flows must be ≥ 1, --sizes ≥ 60 bytes, --rounds ≥ 1");
    }
    if a.csv {
        println!("flows,frame_bytes,no_action_ns,dec_ttl_ns,loss_chk_ns,dec_ttl_loss_chk_ns,norm_dec_ttl,norm_loss_chk,norm_dec_ttl_loss_chk,refused_pkts");
    } else {
        println!(
            "one core, bursts of 32, pool of {POOL} packets, median of {} passes per variant",
            a.rounds
        );
        println!(
            "{:>6} {:>5} {:>10} {:>8} | {:>8} {:>8} {:>8} | {:>11} {:>9}",
            "flows",
            "bytes",
            "no_action",
            "Mpps",
            "dec_ttl",
            "loss_chk",
            "both",
            "+ns/pkt",
            "refused"
        );
    }
    for &size in &a.sizes {
        for &flows in &a.flows {
            let r = measure(flows, size, a.rounds);
            let base = r.ns_per_pkt[0];
            if a.csv {
                println!(
                    "{},{},{:.2},{:.2},{:.2},{:.2},{:.3},{:.3},{:.3},{}",
                    flows,
                    size,
                    base,
                    r.ns_per_pkt[1],
                    r.ns_per_pkt[2],
                    r.ns_per_pkt[3],
                    r.normalised(1),
                    r.normalised(2),
                    r.normalised(3),
                    r.refused
                );
            } else {
                println!(
                    "{:>6} {:>5} {:>7.1} ns {:>8.2} | {:>8.3} {:>8.3} {:>8.3} | {:>11.1} {:>9}",
                    flows,
                    size,
                    base,
                    1e3 / base,
                    r.normalised(1),
                    r.normalised(2),
                    r.normalised(3),
                    r.ns_per_pkt[2] - base,
                    r.refused
                );
            }
        }
    }
    if !a.csv {
        println!(
            "columns dec_ttl, loss_chk ({}), both: throughput normalised to no_action; +ns/pkt: what the loss check adds",
            Variant::LossCheck.name()
        );
    }
    Ok(())
}
