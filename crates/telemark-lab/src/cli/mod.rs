//! The lab's subcommands of the `telemark` binary: each module has its clap `Args` and a `run`.

pub mod bench;
pub mod bench_collector;
pub mod bench_ebpf;
pub mod bench_flows;
pub mod bench_int;
pub mod bench_kafka;
pub mod bench_live;
pub mod bench_sketch;
pub mod demo;
pub mod eval;
pub mod eval_hh;
pub mod eval_sketch;
pub mod gen;
pub mod opts;
pub mod replay;
pub mod sim;
