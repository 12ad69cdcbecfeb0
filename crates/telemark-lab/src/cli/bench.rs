//! `telemark bench`: the overhead table in seconds (criterion has the careful version:
//! `cargo bench -p telemark --bench switch`).

use crate::bench::{measure, measure_export, Variant, EXPORT_CASES, POOL};
use anyhow::Result;
use clap::Args as ClapArgs;

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
    /// Flow counts of the flow-export table (sFlow sampling and the IPFIX cache next to the
    /// loss check); `--export-flows 0` leaves the table out.
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 65536])]
    pub export_flows: Vec<usize>,
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
    export_table(&a)
}

/// The flow-export table: the fast path's cost with sFlow sampling and the IPFIX cache next
/// to the loss check, normalised to `no_action` (64-byte frames or the first `--sizes`).
fn export_table(a: &Args) -> Result<()> {
    let flows: Vec<usize> = a.export_flows.iter().copied().filter(|&f| f > 0).collect();
    if flows.is_empty() {
        return Ok(());
    }
    let size = a.sizes.first().copied().unwrap_or(64);
    let names: Vec<String> = EXPORT_CASES.iter().map(|(v, e)| e.name(*v)).collect();
    if a.csv {
        println!(
            "\nflows,frame_bytes,{}",
            names.iter().map(|n| format!("{n}_ns")).collect::<Vec<_>>().join(",")
        );
    } else {
        println!("\nflow export after the switch: throughput normalised to no_action ({size}-byte frames)");
        print!("{:>6} {:>10}", "flows", "no_action");
        for n in &names[1..] {
            print!(" {n:>12}");
        }
        println!();
    }
    for f in flows {
        let r = measure_export(f, size, a.rounds);
        if a.csv {
            let ns: Vec<String> = r.ns_per_pkt.iter().map(|v| format!("{v:.2}")).collect();
            println!("{f},{size},{}", ns.join(","));
        } else {
            print!("{:>6} {:>7.1} ns", f, r.ns_per_pkt[0]);
            for i in 1..names.len() {
                print!(" {:>12.3}", r.normalised(i));
            }
            println!();
        }
    }
    if !a.csv {
        println!("sflow_1:N: 1-in-N sampling, 128 header bytes handed to the exporter's ring; ipfix_1:N: 1-in-N into the flow cache (room for every flow, held already)");
    }
    Ok(())
}
