//! `telemark export`: a capture through the switch's flow meter, exported as IPFIX and sFlow
//! exactly as a running agent exports its ports' traffic (docs/flow-export.md). Flow timeouts
//! run on the capture's clock; at the end every flow still cached is exported.

use crate::input::Input;
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use telemark_agent::config::{IpfixSection, SflowSection};
use telemark_agent::flow_export::{FlowExport, PortInfo};
use telemark_core::flow_hash;
use telemark_datapath::flow_meter::FlowMeter;
use telemark_wire::flow::extract;

/// `telemark export` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Captures to read (pcap or pcapng), one after the other.
    #[arg(long = "read", required = true)]
    pub read: Vec<PathBuf>,
    /// IPFIX collector: host:port or udp://host:port, tcp://host:port (repeatable).
    #[arg(long)]
    pub ipfix: Vec<String>,
    /// sFlow collector: host:port (repeatable).
    #[arg(long)]
    pub sflow: Vec<String>,
    /// IPFIX: one packet in N metered.
    #[arg(long)]
    pub ipfix_sampling: Option<u32>,
    /// sFlow: one packet in N sampled (default 400).
    #[arg(long)]
    pub sflow_sampling: Option<u32>,
    /// IPFIX active timeout (default 60s).
    #[arg(long)]
    pub active_timeout: Option<String>,
    /// IPFIX idle timeout (default 15s).
    #[arg(long)]
    pub idle_timeout: Option<String>,
    /// IPFIX flow cache size (default 65536).
    #[arg(long)]
    pub max_flows: Option<usize>,
    /// IPFIX observation domain (default 1).
    #[arg(long)]
    pub domain: Option<u32>,
}

/// Runs `telemark export`.
pub fn run(a: Args) -> Result<()> {
    if a.ipfix.is_empty() && a.sflow.is_empty() {
        bail!("nothing to export to: give --ipfix and/or --sflow collectors");
    }
    let ipfix = (!a.ipfix.is_empty())
        .then(|| {
            IpfixSection {
                collectors: a.ipfix.clone(),
                sampling: a.ipfix_sampling,
                domain: a.domain,
                active_timeout: a.active_timeout.clone(),
                idle_timeout: a.idle_timeout.clone(),
                max_flows: a.max_flows,
                template_refresh: None,
                loss: Some(false),
            }
            .validate()
        })
        .transpose()?;
    let sflow = (!a.sflow.is_empty())
        .then(|| {
            SflowSection {
                collectors: a.sflow.clone(),
                sampling: a.sflow_sampling,
                ..SflowSection::default()
            }
            .validate()
        })
        .transpose()?;
    let mut packets = 0u64;
    let mut skipped = 0u64;
    let done = Arc::new(AtomicBool::new(false));
    let mut exporter = None;
    let mut meter = None;
    for path in &a.read {
        let mut input = Input::open(path).with_context(|| format!("{}", path.display()))?;
        let link = input.link;
        if meter.is_none() {
            let (m, rings) = FlowMeter::new(
                1,
                sflow.as_ref().map(|s| s.settings),
                ipfix.as_ref().map(|i| i.settings),
                telemark_transport::now_ns(),
            );
            meter = Some(m.patient().with_link(link));
            let ports = vec![PortInfo { ifindex: 1 }];
            exporter = Some(FlowExport::start(
                sflow.as_ref(),
                ipfix.as_ref(),
                rings,
                ports,
                done.clone(),
            )?);
        }
        let Some(m) = meter.as_mut() else { continue };
        let mut swept_at = 0u64;
        while let Some(p) = input.next_packet() {
            packets += 1;
            let parsed = extract(&p.data, link);
            if parsed.is_err() {
                skipped += 1;
            }
            let key = parsed.as_ref().ok().map(|x| (x, flow_hash(&x.key)));
            m.packet(0, u16::MAX, &p.data, p.bytes_on_wire() as u32, key, p.ts_ns);
            // Timeouts on the capture's clock: the whole cache once per capture second.
            if p.ts_ns >= swept_at + 1_000_000_000 {
                m.sweep(p.ts_ns, m.cache_capacity());
                swept_at = p.ts_ns;
            }
        }
        input.check_complete()?;
    }
    if let Some(m) = meter.as_mut() {
        m.flush();
    }
    done.store(true, Ordering::Release);
    let stats = exporter.map(FlowExport::join).unwrap_or_default();
    eprintln!(
        "telemark export: {packets} packets read ({skipped} without a flow key); \
         IPFIX: {} flow records in {} messages; sFlow: {} samples in {} datagrams",
        stats.ipfix_flow_records,
        stats.ipfix_messages,
        stats.sflow_flow_samples,
        stats.sflow_datagrams
    );
    if stats.ipfix_not_sent > 0 || stats.flow_send_errors > 0 {
        bail!("{} records not sent, {} sends failed", stats.ipfix_not_sent, stats.flow_send_errors);
    }
    Ok(())
}
