//! Zero-copy, panic-free views and owned representations of the wire formats Telemark handles.
//!
//! Every protocol lives in its own module with the same shape (after smoltcp's `wire`):
//! a `Packet<T: AsRef<[u8]>>` view whose `new_checked` validates lengths once so that no
//! accessor can panic afterwards, setters where `T: AsMut<[u8]>`, and an owned `Repr` with
//! `parse`, `emit` and `buffer_len`. Protocol numbers are enums that keep unknown values.
//!
//! [`flow`] walks a whole frame (Ethernet, stacked 802.1Q, IPv4/IPv6, tunnels) and extracts the
//! flow key and the location of the DSCP field that carries the alternate-marking color.
#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::panic, clippy::unwrap_used))]

pub mod checksum;
pub mod dialect;
mod error;
pub mod ethernet;
pub mod flow;
pub mod geneve;
pub mod gre;
pub mod int;
pub mod int_frame;
pub mod ipfix;
pub mod ipv4;
pub mod ipv6;
pub mod link;
pub mod netflow5;
pub mod nsh;
pub mod report;
pub mod report_fast;
pub mod sflow;
pub mod tcp;
pub mod udp;
pub mod vlan;
pub mod vxlan;

pub use error::{Error, Result};
pub use flow::{extract, FlowKey, Parsed, SkipReason};
