//! `telemark`: the one binary. See `telemark --help`.

mod agent;
mod collector;
mod export;
mod int_replay;
mod kafka_topics;

use clap::{Parser, Subcommand};
use telemark_datapath::input;
use telemark_lab::cli::{
    bench, bench_collector, bench_ebpf, bench_flows, bench_int, bench_kafka, bench_live,
    bench_sketch, demo, eval, gen, replay, sim,
};

/// Per-flow packet loss measured inside the switch fast path, reported only when it happens.
#[derive(Parser)]
#[command(name = "telemark", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a capture of N flows with realistic sizes, optionally already marked.
    Gen(gen::Args),
    /// Run captures (or generated traffic) through marker, droppers and switch; print per-flow
    /// loss next to ground truth. With --point twice, compare two captures of marked traffic.
    Replay(replay::Args),
    /// Overhead of the loss check against no_action and dec_ttl (Fig. 6 / Table II), in seconds.
    Bench(bench::Args),
    /// As root: packets per second through a Telemark switch on AF_PACKET with and without
    /// measurement, and through a Linux bridge on the same veth pair.
    BenchLive(bench_live::Args),
    /// As root: what the eBPF datapath costs: each program's ns per packet by the kernel's own
    /// statistics next to a counting-only reference program, and TCP and UDP through a Linux
    /// bridge with it, with libpcap meters (softflowd, pmacctd) and with the AF_PACKET switch.
    BenchEbpf(bench_ebpf::Args),
    /// The telemetry server: acknowledged ingest from agents, a SQLite or PostgreSQL store,
    /// loss localisation, HTTP JSON API, Prometheus /metrics and a page.
    Collector(Box<collector::Args>),
    /// The loss monitor on live interfaces (AF_PACKET): a software switch between port pairs,
    /// or a tap; exports lossy batches to a collector.
    Agent(agent::Args),
    /// As root: the congestion experiment in network namespaces (testbed, collector, agents,
    /// probe and background traffic), detected loss printed next to the kernel's drop counts.
    Demo(demo::Args),
    /// Reproduce the accuracy figures (Fig. 4a, 4b) as CSV.
    Eval(eval::Args),
    /// Sketch update rates, vanilla against NitroSketch, and the heavy-hitter pipeline against
    /// an exact table as active flows grow (one core).
    BenchSketch(bench_sketch::Args),
    /// INT report collector capacity on one core against hops x items (INT paper Fig. 3), in
    /// memory and (root) over veth; the cost of each detector per report.
    BenchInt(bench_int::Args),
    /// The INT report collector: Telemetry Reports over UDP, per-flow event detection where
    /// the switches did not filter, events to the collector, /metrics.
    IntCollector(telemark_int_collector::Args),
    /// A capture of Telemetry Reports through the INT report collector's own code, driven by
    /// the capture's timestamps: the events and the lost reports it would count.
    IntReplay(int_replay::Args),
    /// Records per second one collector stores, acknowledged, pinned to one core (optionally
    /// against another build's collector, alternating).
    BenchCollector(bench_collector::Args),
    /// Records per second through Kafka with the broker on this host: an agent's producer, a
    /// collector publishing its outbox, a collector consuming and storing; JSON and protobuf.
    BenchKafka(bench_kafka::Args),
    /// A fleet on one machine: N simulated hosts publish what agents would to Kafka, K
    /// collectors in one consumer group store it into PostgreSQL; records/s, lag, rows/s and
    /// query latency as N and K grow (docs/scale.md).
    Sim(sim::Args),
    /// Creates Telemark's Kafka topics from a config's [kafka] section, with the partitions a
    /// consumer group of collectors needs; says which were there and with how many.
    KafkaTopics(kafka_topics::Args),
    /// A capture through the switch's flow meter, exported as IPFIX and sFlow to collectors
    /// (as an agent exports its ports' traffic).
    Export(export::Args),
    /// Flow export into the collector: IPFIX, NetFlow v5 and sFlow decoded per second on one
    /// core, and flows stored per second over loopback UDP at given datagram rates.
    BenchFlows(bench_flows::Args),
}

/// Logs to stderr with time and level; `TELEMARK_LOG` filters (e.g. `debug`,
/// `telemark_transport=debug`; default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TELEMARK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A closed stderr (a journal gone, a reader that left) must not stop a service: by
        // default the subscriber reports a failed write with eprintln!, which panics then.
        .log_internal_errors(false)
        .init();
}

fn main() {
    let cli = Cli::parse();
    init_logging();
    let r = match cli.cmd {
        Cmd::Gen(a) => gen::run(a),
        Cmd::Replay(a) => replay::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::BenchSketch(a) => bench_sketch::run(a),
        Cmd::BenchCollector(a) => bench_collector::run(a),
        Cmd::BenchLive(a) => bench_live::run(a),
        Cmd::BenchEbpf(a) => bench_ebpf::run(a),
        Cmd::Eval(a) => eval::run(a),
        Cmd::Collector(a) => collector::run(*a),
        Cmd::Agent(a) => agent::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::IntCollector(a) => telemark_int_collector::run(a),
        Cmd::IntReplay(a) => int_replay::run(a),
        Cmd::BenchInt(a) => bench_int::run(a),
        Cmd::BenchKafka(a) => bench_kafka::run(a),
        Cmd::KafkaTopics(a) => kafka_topics::run(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::BenchFlows(a) => bench_flows::run(a),
        Cmd::Export(a) => export::run(a),
    };
    if let Err(e) = r {
        // The reader went away (`telemark replay … | head`): not an error.
        let pipe = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        });
        if pipe {
            std::process::exit(0);
        }
        // One clear line, no backtrace.
        eprintln!("telemark: {e:#}");
        // Results were printed, but of part of the input only.
        if e.downcast_ref::<input::Incomplete>().is_some() {
            std::process::exit(3);
        }
        std::process::exit(1);
    }
}
