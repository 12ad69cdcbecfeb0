//! goflow2's Kafka encoding of flows, so that pipelines built on goflow2 (its `-format=bin`
//! output: ClickHouse and Elastic loaders, akvorado-style consumers) read Telemark's flow
//! records unchanged: a `flowpb.FlowMessage` (github.com/netsampler/goflow2, `pb/flow.proto`)
//! in protobuf, with a varint length in front as goflow2 writes it.
//!
//! Telemark's counts are already scaled by the sampling rate, so `sampling_rate` is 1 and
//! `packets` and `bytes` are totals; `sampler_address` is the exporter (absent for an agent's
//! own heavy hitters, whose `agent` is a name).

use std::net::IpAddr;
use telemark_core::records::FlowRecord;

/// `flowpb.FlowMessage`, the fields Telemark fills (numbers as in goflow2's schema).
#[derive(Clone, PartialEq, prost::Message)]
pub struct FlowMessage {
    /// FlowType: 0 unknown, 1 sFlow 5, 2 NetFlow v5, 3 NetFlow v9, 4 IPFIX.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// 1 in how many packets (1: the counts are totals).
    #[prost(uint64, tag = "3")]
    pub sampling_rate: u64,
    /// Source address.
    #[prost(bytes = "vec", tag = "6")]
    pub src_addr: Vec<u8>,
    /// Destination address.
    #[prost(bytes = "vec", tag = "7")]
    pub dst_addr: Vec<u8>,
    /// Bytes.
    #[prost(uint64, tag = "9")]
    pub bytes: u64,
    /// Packets.
    #[prost(uint64, tag = "10")]
    pub packets: u64,
    /// The exporter's address.
    #[prost(bytes = "vec", tag = "11")]
    pub sampler_address: Vec<u8>,
    /// Input interface.
    #[prost(uint32, tag = "18")]
    pub in_if: u32,
    /// IP protocol.
    #[prost(uint32, tag = "20")]
    pub proto: u32,
    /// Source port.
    #[prost(uint32, tag = "21")]
    pub src_port: u32,
    /// Destination port.
    #[prost(uint32, tag = "22")]
    pub dst_port: u32,
    /// EtherType of the addresses: 0x0800 or 0x86dd.
    #[prost(uint32, tag = "30")]
    pub etype: u32,
    /// When the collector stored it, ns.
    #[prost(uint64, tag = "110")]
    pub time_received_ns: u64,
    /// The flow's first packet, ns.
    #[prost(uint64, tag = "111")]
    pub time_flow_start_ns: u64,
    /// Its last packet, ns.
    #[prost(uint64, tag = "112")]
    pub time_flow_end_ns: u64,
}

fn octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

impl FlowMessage {
    /// The message of a stored flow record, received at `received_ns`.
    pub fn of(f: &FlowRecord, received_ns: u64) -> FlowMessage {
        let src: Option<IpAddr> = f.flow.src.parse().ok();
        let dst: Option<IpAddr> = f.flow.dst.parse().ok();
        FlowMessage {
            r#type: match f.point.as_str() {
                "sflow" => 1,
                "netflow5" => 2,
                "netflow9" => 3,
                "ipfix" => 4,
                _ => 0,
            },
            sampling_rate: 1,
            src_addr: src.map(octets).unwrap_or_default(),
            dst_addr: dst.map(octets).unwrap_or_default(),
            bytes: f.bytes,
            packets: f.packets,
            sampler_address: f.agent.parse().ok().map(octets).unwrap_or_default(),
            in_if: f.port.parse().unwrap_or(0),
            proto: u32::from(f.flow.proto),
            src_port: u32::from(f.flow.sport),
            dst_port: u32::from(f.flow.dport),
            etype: match src {
                Some(IpAddr::V6(_)) => 0x86dd,
                Some(IpAddr::V4(_)) => 0x0800,
                None => 0,
            },
            time_received_ns: received_ns,
            time_flow_start_ns: f.window_start_ns,
            time_flow_end_ns: f.window_end_ns,
        }
    }

    /// Its bytes as goflow2 puts them on Kafka: a varint length, then the message.
    pub fn to_delimited(&self) -> Vec<u8> {
        prost::Message::encode_length_delimited_to_vec(self)
    }
}
