//! Telemark's lab: everything that evaluates, generates, drops, reorders or demonstrates, kept
//! out of the product. It depends on the product crates and never the other way round; where it
//! needs to reach inside the switch, it uses the switch's general extension point
//! ([`telemark_datapath::switch::Inside`]).
//!
//! - Ground truth: [`dropper`] (the loss paper's synthetic dropper, V-B), [`reorder`]; their randomness is [`telemark_core::rng`].
//! - Traffic: [`gen`] (captures of many flows with realistic sizes), [`bursts`] (the INT paper's
//!   microbursts), [`traffic`] (live UDP flows into an AF_PACKET ring).
//! - Evaluation paths: [`eval`] (loss paper Fig. 4), [`pipeline`] (capture replay through
//!   marker, droppers and switch), [`bench`] (loss paper Fig. 6 / Table II), [`nitro_thread`]
//!   (NitroSketch's separate-thread variant, measured against the inline one).
//! - [`cli`]: the lab's subcommands of the `telemark` binary (bench*, eval, demo, gen, replay).

pub mod bench;
pub mod bursts;
pub mod cli;
pub mod dropper;
pub mod eval;
pub mod gen;
pub mod nitro_thread;
pub mod pipeline;
pub mod reorder;
pub mod traffic;
