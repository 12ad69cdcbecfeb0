//! The flow-export thread: takes what the fast path's flow meter produced (sampled packets,
//! finished flows) and the aggregator's loss records, encodes them as sFlow v5 datagrams and
//! IPFIX messages (`telemark_wire::sflow::Writer`, `telemark_wire::ipfix::MessageWriter`) and
//! sends them to the configured collectors (docs/flow-export.md). It never holds up the fast
//! path: what it cannot send is dropped and counted.

use crate::config::{IpfixExport, IpfixTransport, SflowExport};
pub use crate::shared::FlowExportStats;
use crate::shared::Shared;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use telemark_core::flowexport::{EndReason, FlowEntry};
use telemark_core::records::{LossRecord, Scope};
use telemark_datapath::flow_meter::{MeterRings, PortCounters, SampledPacket};
use telemark_transport::now_ns;
use telemark_wire::ipfix::{
    put_variable, FieldSpec, MessageWriter, Template, TELEMARK_PEN, VARIABLE_LENGTH,
};
use telemark_wire::sflow::{self, CounterData, CounterSample, FlowData, FlowSample, IfCounters};

/// Largest datagram sent (fits a 1,500-byte path with IPv6 and UDP headers).
const MAX_DATAGRAM: usize = 1400;
/// Largest IPFIX message on a TCP stream.
const MAX_STREAM_MESSAGE: usize = 16_384;
/// A batch of sFlow samples waits at most this long for more.
const SFLOW_FLUSH_NS: u64 = 500_000_000;
/// Loss records waiting for the thread, at most.
pub(crate) const LOSS_QUEUE: usize = 4096;

/// One port as sFlow and IPFIX name it.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Its interface index.
    pub ifindex: u32,
}

/// The running flow-export thread.
pub struct FlowExport {
    handle: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl FlowExport {
    /// Starts a thread exporting what the meter whose `rings` these are produces, to the
    /// collectors of `sflow` and `ipfix`; it ends once `done` is set and everything is sent
    /// (`telemark export`: a capture through the flow meter).
    pub fn start(
        sflow: Option<&SflowExport>,
        ipfix: Option<&IpfixExport>,
        rings: MeterRings,
        ports: Vec<PortInfo>,
        done: Arc<AtomicBool>,
    ) -> std::io::Result<FlowExport> {
        let shared = Arc::new(Shared::default());
        let (handle, _) = start(sflow, ipfix, rings, ports, shared.clone(), done)?;
        Ok(FlowExport { handle, shared })
    }

    /// Waits for the thread to end; what it sent.
    pub fn join(self) -> FlowExportStats {
        let _ = self.handle.join();
        self.shared.flow_export.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Starts the thread; it ends once `fast_done` is set and everything is sent. Returns it and
/// the sender the aggregator hands loss records to (with `[ipfix] loss`).
pub(crate) fn start(
    sflow: Option<&SflowExport>,
    ipfix: Option<&IpfixExport>,
    rings: MeterRings,
    ports: Vec<PortInfo>,
    shared: Arc<Shared>,
    fast_done: Arc<AtomicBool>,
) -> std::io::Result<(JoinHandle<()>, Option<SyncSender<LossRecord>>)> {
    let boot = now_ns();
    let sflow_out = sflow.map(|s| SflowOut::new(s, boot)).transpose()?;
    let ipfix_out = ipfix.map(IpfixOut::new).transpose()?;
    let (sflow, ipfix) = (sflow_out, ipfix_out);
    let (loss_tx, loss_rx) = match ipfix.as_ref().map(|x| &x.cfg) {
        Some(i) if i.loss => {
            let (tx, rx) = std::sync::mpsc::sync_channel(LOSS_QUEUE);
            (Some(tx), Some(rx))
        }
        _ => (None, None),
    };
    let mut t =
        Thread { sflow, ipfix, rings, loss: loss_rx, ports, stats: FlowExportStats::default() };
    let h = std::thread::Builder::new()
        .name("tm-flowexport".into())
        .spawn(move || t.run(&shared, &fast_done))?;
    Ok((h, loss_tx))
}

/// Hands a loss record to the thread; false if its queue is full (counted in
/// `ipfix_loss_queue_full`).
pub(crate) fn offer_loss(tx: &SyncSender<LossRecord>, r: &LossRecord, shared: &Shared) -> bool {
    match tx.try_send(r.clone()) {
        Ok(()) => true,
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            if let Ok(mut s) = shared.flow_export.lock() {
                s.ipfix_loss_queue_full += 1;
            }
            false
        }
    }
}

struct Thread {
    sflow: Option<SflowOut>,
    ipfix: Option<IpfixOut>,
    rings: MeterRings,
    loss: Option<Receiver<LossRecord>>,
    ports: Vec<PortInfo>,
    stats: FlowExportStats,
}

impl Thread {
    fn run(&mut self, shared: &Shared, fast_done: &AtomicBool) {
        loop {
            let finished = fast_done.load(Ordering::Acquire);
            let now = now_ns();
            if let Some(ports) = shared.new_ports.lock().ok().and_then(|mut p| p.take()) {
                self.ports = ports;
            }
            let mut got = 0;
            if let (Some(s), Some(ring)) = (&mut self.sflow, &self.rings.samples) {
                got += ring.drain(|p| s.sample(&p, &self.ports, &mut self.stats, now));
            }
            if let (Some(x), Some(ring)) = (&mut self.ipfix, &self.rings.flows) {
                got += ring.drain(|(e, why)| x.flow(&e, why, &self.ports));
            }
            // The aggregator lets go of its sender when it has handed over its last record.
            let mut loss_done = true;
            if let (Some(x), Some(rx)) = (&mut self.ipfix, &self.loss) {
                loop {
                    match rx.try_recv() {
                        Ok(r) => {
                            x.loss(&r);
                            got += 1;
                        }
                        Err(std::sync::mpsc::TryRecvError::Empty) => {
                            loss_done = false;
                            break;
                        }
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => break,
                    }
                }
            }
            let last = finished && got == 0 && loss_done;
            if let Some(s) = &mut self.sflow {
                // The fast path's counters are read (under its lock) only when a poll is due.
                if s.poll_due(now) {
                    s.poll(now, &shared.meter_ports(), &self.ports, &mut self.stats);
                }
                s.flush(now, last, &mut self.stats);
            }
            if let Some(x) = &mut self.ipfix {
                x.send(now, last, &mut self.stats);
            }
            // Every counter is this thread's but the aggregator thread's queue-full count.
            if let Ok(mut g) = shared.flow_export.lock() {
                let queue_full = g.ipfix_loss_queue_full;
                *g = FlowExportStats { ipfix_loss_queue_full: queue_full, ..self.stats.clone() };
            }
            if last {
                break;
            }
            if got == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

fn udp_to(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let bind: SocketAddr = if addr.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = UdpSocket::bind(bind)?;
    s.connect(addr)?;
    s.set_nonblocking(true)?;
    Ok(s)
}

// ---------------------------------------------------------------- sFlow

struct SflowOut {
    cfg: SflowExport,
    socks: Vec<UdpSocket>,
    agent: IpAddr,
    boot_ns: u64,
    datagrams: u32,
    flow_seq: Vec<u32>,
    counter_seq: Vec<u32>,
    next_poll_ns: u64,
    writer: Option<(sflow::Writer, u64)>,
}

impl SflowOut {
    fn new(cfg: &SflowExport, boot_ns: u64) -> std::io::Result<SflowOut> {
        let socks = cfg.collectors.iter().map(|&a| udp_to(a)).collect::<Result<Vec<_>, _>>()?;
        let agent = match cfg.agent_address {
            Some(a) => a,
            None => socks
                .first()
                .map(|s| s.local_addr())
                .transpose()?
                .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |a| a.ip()),
        };
        Ok(SflowOut {
            cfg: cfg.clone(),
            socks,
            agent,
            boot_ns,
            datagrams: 0,
            flow_seq: Vec::new(),
            counter_seq: Vec::new(),
            next_poll_ns: boot_ns + cfg.polling_ns,
            writer: None,
        })
    }

    fn seq(v: &mut Vec<u32>, i: usize) -> u32 {
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        v[i] = v[i].wrapping_add(1);
        v[i] - 1
    }

    /// Adds `s` to the datagram being filled (sending it first when `s` would not fit).
    fn push(&mut self, s: &sflow::Sample<'_>, stats: &mut FlowExportStats, now: u64) {
        // A flow sample with a 256-byte header takes under 400 bytes.
        if self.writer.as_ref().is_some_and(|(w, _)| w.len() + 400 > MAX_DATAGRAM) {
            self.send(stats);
        }
        let uptime = ((now.saturating_sub(self.boot_ns)) / 1_000_000) as u32;
        let (agent, seq) = (self.agent, self.datagrams);
        let (w, _) =
            self.writer.get_or_insert_with(|| (sflow::Writer::new(agent, 0, seq, uptime), now));
        w.push(s);
    }

    fn sample(
        &mut self,
        p: &SampledPacket,
        ports: &[PortInfo],
        stats: &mut FlowExportStats,
        now: u64,
    ) {
        let i = usize::from(p.port);
        let ifindex = |port: u16| ports.get(usize::from(port)).map_or(0, |p| p.ifindex);
        let input = ifindex(p.port);
        let sample = sflow::Sample::Flow(FlowSample {
            sequence: Self::seq(&mut self.flow_seq, i),
            source: sflow::Source { class: 0, index: input },
            sampling_rate: self.cfg.settings.rate,
            sample_pool: p.pool,
            drops: p.drops,
            input,
            output: sflow::Output::Interface(ifindex(p.out_port)),
            records: vec![FlowData::Header(sflow::SampledHeader {
                protocol: 1, // Ethernet
                frame_length: p.frame_len,
                stripped: 0, // AF_PACKET frames come without their FCS
                header: &p.header[..usize::from(p.header_len)],
            })],
        });
        self.push(&sample, stats, now);
        stats.sflow_flow_samples += 1;
    }

    /// Whether the ports' counters are due at `now`.
    fn poll_due(&self, now: u64) -> bool {
        now >= self.next_poll_ns
    }

    /// Each port's counters (as the switch counted them), every polling interval.
    fn poll(
        &mut self,
        now: u64,
        counters: &[PortCounters],
        ports: &[PortInfo],
        stats: &mut FlowExportStats,
    ) {
        self.next_poll_ns = now + self.cfg.polling_ns;
        for (i, (c, p)) in counters.iter().zip(ports).enumerate() {
            let sample = sflow::Sample::Counters(CounterSample {
                sequence: Self::seq(&mut self.counter_seq, i),
                source: sflow::Source { class: 0, index: p.ifindex },
                records: vec![CounterData::Interface(IfCounters {
                    index: p.ifindex,
                    if_type: 6, // ethernetCsmacd
                    speed: 0,
                    direction: 1, // full duplex
                    status: 3,    // admin and operational status up
                    in_octets: c.in_octets,
                    in_unicast: c.in_packets as u32,
                    out_octets: c.out_octets,
                    out_unicast: c.out_packets as u32,
                    ..IfCounters::default()
                })],
            });
            self.push(&sample, stats, now);
            stats.sflow_counter_samples += 1;
        }
    }

    /// Sends the datagram being filled once it waited long enough (or at the end).
    fn flush(&mut self, now: u64, finished: bool, stats: &mut FlowExportStats) {
        if self.writer.as_ref().is_some_and(|(_, t)| finished || now >= t + SFLOW_FLUSH_NS) {
            self.send(stats);
        }
    }

    fn send(&mut self, stats: &mut FlowExportStats) {
        let Some((w, _)) = self.writer.take() else { return };
        let bytes = w.finish();
        self.datagrams = self.datagrams.wrapping_add(1);
        for s in &self.socks {
            match s.send(&bytes) {
                Ok(_) => stats.sflow_datagrams += 1,
                Err(_) => stats.flow_send_errors += 1,
            }
        }
    }
}

// ---------------------------------------------------------------- IPFIX

/// Template ids.
mod tid {
    pub const FLOW_V4: u16 = 256;
    pub const FLOW_V6: u16 = 257;
    pub const LOSS_V4: u16 = 258;
    pub const LOSS_V6: u16 = 259;
    pub const SAMPLING: u16 = 260;
    pub const STATS: u16 = 261;
}

fn iana(id: u16, len: u16) -> FieldSpec {
    FieldSpec { id, enterprise: 0, len }
}

fn telemark(id: u16, len: u16) -> FieldSpec {
    FieldSpec { id, enterprise: TELEMARK_PEN, len }
}

/// The templates Telemark sends (docs/flow-export.md, "IPFIX templates").
fn templates() -> Vec<Template> {
    let flow = |id, v6: bool| {
        let (a, len) = if v6 { ((27, 28), 16) } else { ((8, 12), 4) };
        let fields = vec![
            iana(a.0, len),                     // sourceIPv{4,6}Address
            iana(a.1, len),                     // destinationIPv{4,6}Address
            iana(7, 2),                         // sourceTransportPort
            iana(11, 2),                        // destinationTransportPort
            iana(4, 1),                         // protocolIdentifier
            iana(5, 1),                         // ipClassOfService
            iana(6, 2),                         // tcpControlBits
            iana(60, 1),                        // ipVersion
            iana(10, 4),                        // ingressInterface
            iana(14, 4),                        // egressInterface
            iana(58, 2),                        // vlanId
            iana(61, 1),                        // flowDirection
            iana(2, 8),                         // packetDeltaCount
            iana(1, 8),                         // octetDeltaCount
            iana(152, 8),                       // flowStartMilliseconds
            iana(153, 8),                       // flowEndMilliseconds
            iana(136, 1),                       // flowEndReason
            iana(if v6 { 139 } else { 32 }, 2), // icmpTypeCodeIPv6 / icmpTypeCodeIPv4
        ];
        Template { id, scope_fields: 0, fields, options: false }
    };
    let loss = |id, v6: bool| {
        let (a, len) = if v6 { ((27, 28), 16) } else { ((8, 12), 4) };
        let fields = vec![
            iana(a.0, len),
            iana(a.1, len),
            iana(7, 2),
            iana(11, 2),
            iana(4, 1),
            iana(152, 8),              // flowStartMilliseconds: the batch's first packet
            iana(153, 8),              // flowEndMilliseconds: its last in-time packet
            iana(82, VARIABLE_LENGTH), // interfaceName: the point's port
            telemark(1, 8),            // lossBatch
            telemark(2, 8),            // lossExpectedPackets
            telemark(3, 8),            // lossObservedPackets
            telemark(4, 8),            // lossLostPackets
            telemark(5, 8),            // lossLatePackets
            telemark(6, 8),            // lossUncertainPackets
            telemark(7, 1),            // lossScope
            telemark(8, 1),            // lossColor
            telemark(9, VARIABLE_LENGTH), // lossPoint
            telemark(10, VARIABLE_LENGTH), // lossUpstream
        ];
        Template { id, scope_fields: 0, fields, options: false }
    };
    vec![
        flow(tid::FLOW_V4, false),
        flow(tid::FLOW_V6, true),
        loss(tid::LOSS_V4, false),
        loss(tid::LOSS_V6, true),
        Template {
            id: tid::SAMPLING,
            scope_fields: 1,
            options: true,
            // samplingInterval alone: what collectors read (nfdump 1.7 ignores it next to
            // samplingAlgorithm or selectorAlgorithm).
            fields: vec![
                iana(149, 4), // observationDomainId (scope)
                iana(34, 4),  // samplingInterval
            ],
        },
        Template {
            id: tid::STATS,
            scope_fields: 1,
            options: true,
            fields: vec![
                iana(149, 4), // observationDomainId (scope)
                iana(41, 8),  // exportedMessageTotalCount
                iana(42, 8),  // exportedFlowRecordTotalCount
                iana(166, 8), // notSentFlowTotalCount
                iana(323, 8), // observationTimeMilliseconds
            ],
        },
    ]
}

fn ms(ns: u64) -> [u8; 8] {
    (ns / 1_000_000).to_be_bytes()
}

fn addr_bytes(a: IpAddr, out: &mut Vec<u8>) {
    match a {
        IpAddr::V4(v4) => out.extend_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out.extend_from_slice(&v6.octets()),
    }
}

/// One collector and its transport session.
struct Peer {
    transport: IpfixTransport,
    addr: SocketAddr,
    udp: Option<UdpSocket>,
    tcp: Option<TcpStream>,
    /// Data records sent in this session (the next message's sequence number).
    seq: u32,
    /// When the templates go out next (0: with the next message).
    templates_due_ns: u64,
    next_connect_ns: u64,
}

struct IpfixOut {
    cfg: IpfixExport,
    templates: Vec<Template>,
    peers: Vec<Peer>,
    /// Encoded records waiting: template id, bytes.
    pending: Vec<(u16, Vec<u8>)>,
    messages: u64,
    records: u64,
}

impl IpfixOut {
    fn new(cfg: &IpfixExport) -> std::io::Result<IpfixOut> {
        let mut peers = Vec::new();
        for &(transport, addr) in &cfg.collectors {
            let udp = match transport {
                IpfixTransport::Udp => Some(udp_to(addr)?),
                IpfixTransport::Tcp => None,
            };
            peers.push(Peer {
                transport,
                addr,
                udp,
                tcp: None,
                seq: 0,
                templates_due_ns: 0,
                next_connect_ns: 0,
            });
        }
        Ok(IpfixOut {
            cfg: cfg.clone(),
            templates: templates(),
            peers,
            pending: Vec::new(),
            messages: 0,
            records: 0,
        })
    }

    fn flow(&mut self, e: &FlowEntry, why: EndReason, ports: &[PortInfo]) {
        let f = &e.first;
        let v6 = f.key.src.is_ipv6();
        let mut r = Vec::with_capacity(80);
        addr_bytes(f.key.src, &mut r);
        addr_bytes(f.key.dst, &mut r);
        r.extend_from_slice(&f.key.sport.to_be_bytes());
        r.extend_from_slice(&f.key.dport.to_be_bytes());
        r.push(f.key.proto);
        r.push(f.dscp << 2);
        r.extend_from_slice(&u16::from(e.tcp_flags).to_be_bytes());
        r.push(f.ip_version);
        let ifindex = |port: u16| ports.get(usize::from(port)).map_or(0, |p| p.ifindex);
        r.extend_from_slice(&ifindex(f.in_port).to_be_bytes());
        r.extend_from_slice(&ifindex(f.out_port).to_be_bytes());
        r.extend_from_slice(&f.vlan.to_be_bytes());
        r.push(0); // flowDirection: ingress
        r.extend_from_slice(&e.packets.to_be_bytes());
        r.extend_from_slice(&e.octets.to_be_bytes());
        r.extend_from_slice(&ms(e.start_ns));
        r.extend_from_slice(&ms(e.end_ns));
        r.push(why as u8);
        r.extend_from_slice(&f.icmp_type_code.to_be_bytes());
        self.pending.push((if v6 { tid::FLOW_V6 } else { tid::FLOW_V4 }, r));
    }

    fn loss(&mut self, l: &LossRecord) {
        let (Ok(src), Ok(dst)) = (l.flow.src.parse::<IpAddr>(), l.flow.dst.parse::<IpAddr>())
        else {
            return;
        };
        if src.is_ipv6() != dst.is_ipv6() {
            return;
        }
        let mut r = Vec::with_capacity(120);
        addr_bytes(src, &mut r);
        addr_bytes(dst, &mut r);
        r.extend_from_slice(&l.flow.sport.to_be_bytes());
        r.extend_from_slice(&l.flow.dport.to_be_bytes());
        r.push(l.flow.proto);
        r.extend_from_slice(&ms(l.first_ns));
        r.extend_from_slice(&ms(l.last_ns));
        put_variable(&mut r, l.port.as_bytes());
        for v in [l.batch, l.expected.unwrap_or(0), l.observed, l.lost, l.late, l.uncertain] {
            r.extend_from_slice(&v.to_be_bytes());
        }
        r.push(match l.scope {
            Scope::Segment => 1,
            Scope::Path => 2,
        });
        r.push(l.color);
        put_variable(&mut r, l.point.as_bytes());
        put_variable(&mut r, l.upstream.as_deref().unwrap_or("").as_bytes());
        self.pending.push((if src.is_ipv6() { tid::LOSS_V6 } else { tid::LOSS_V4 }, r));
    }

    /// The options records: sampling, and the exporting process's statistics.
    fn options(&self, now: u64, not_sent: u64) -> Vec<(u16, Vec<u8>)> {
        let rate = self.cfg.settings.rate;
        let mut s = Vec::new();
        s.extend_from_slice(&self.cfg.domain.to_be_bytes());
        s.extend_from_slice(&rate.to_be_bytes());
        let mut st = Vec::new();
        st.extend_from_slice(&self.cfg.domain.to_be_bytes());
        st.extend_from_slice(&self.messages.to_be_bytes());
        st.extend_from_slice(&self.records.to_be_bytes());
        st.extend_from_slice(&not_sent.to_be_bytes());
        st.extend_from_slice(&ms(now));
        vec![(tid::SAMPLING, s), (tid::STATS, st)]
    }

    /// Sends what waits to every collector: over UDP with the templates first whenever
    /// their refresh is due, over TCP with them first on each new connection.
    fn send(&mut self, now: u64, last: bool, stats: &mut FlowExportStats) {
        let due = |p: &Peer| last || now >= p.templates_due_ns;
        if self.pending.is_empty() && !self.peers.iter().any(due) {
            return;
        }
        let records = std::mem::take(&mut self.pending);
        let options = self.options(now, stats.ipfix_not_sent);
        let flows =
            records.iter().filter(|r| r.0 == tid::FLOW_V4 || r.0 == tid::FLOW_V6).count() as u64;
        let losses = records.len() as u64 - flows;
        for i in 0..self.peers.len() {
            let peer = &mut self.peers[i];
            if peer.transport == IpfixTransport::Tcp && peer.tcp.is_none() {
                if now < peer.next_connect_ns {
                    stats.ipfix_not_sent += records.len() as u64;
                    continue;
                }
                peer.next_connect_ns = now + 5_000_000_000;
                match TcpStream::connect_timeout(&peer.addr, Duration::from_secs(1)) {
                    Ok(s) => {
                        let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
                        let _ = s.set_nodelay(true);
                        peer.tcp = Some(s);
                        peer.seq = 0;
                        peer.templates_due_ns = 0;
                    }
                    Err(e) => {
                        tracing::warn!(collector = %peer.addr, "ipfix: connect: {e}");
                        stats.ipfix_not_sent += records.len() as u64;
                        continue;
                    }
                }
            }
            let with_templates = now >= peer.templates_due_ns || last;
            if records.is_empty() && !with_templates {
                continue;
            }
            let max = match peer.transport {
                IpfixTransport::Udp => MAX_DATAGRAM,
                IpfixTransport::Tcp => MAX_STREAM_MESSAGE,
            };
            let mut msgs = Vec::new();
            let mut w = MessageWriter::new((now / 1_000_000_000) as u32, peer.seq, self.cfg.domain);
            if with_templates {
                for t in &self.templates {
                    w.template(t);
                }
                for (id, r) in &options {
                    w.record(*id, r);
                }
                peer.templates_due_ns = match peer.transport {
                    IpfixTransport::Udp => now + self.cfg.template_refresh_ns,
                    IpfixTransport::Tcp => u64::MAX,
                };
            }
            for (id, r) in &records {
                if w.len() + r.len() + 4 > max {
                    let n = w.data_records();
                    msgs.push(w.finish());
                    peer.seq = peer.seq.wrapping_add(n);
                    w = MessageWriter::new((now / 1_000_000_000) as u32, peer.seq, self.cfg.domain);
                }
                w.record(*id, r);
            }
            if !w.is_empty() {
                peer.seq = peer.seq.wrapping_add(w.data_records());
                msgs.push(w.finish());
            }
            let mut ok = true;
            for m in &msgs {
                let sent = match (&peer.udp, &mut peer.tcp) {
                    (Some(u), _) => u.send(m).map(|_| ()),
                    (None, Some(t)) => t.write_all(m),
                    (None, None) => Err(std::io::ErrorKind::NotConnected.into()),
                };
                match sent {
                    Ok(()) => stats.ipfix_messages += 1,
                    Err(e) => {
                        stats.flow_send_errors += 1;
                        ok = false;
                        if peer.tcp.take().is_some() {
                            tracing::warn!(collector = %peer.addr, "ipfix: connection lost: {e}");
                        }
                        break;
                    }
                }
            }
            if ok {
                stats.ipfix_flow_records += flows;
                stats.ipfix_loss_records += losses;
            } else {
                stats.ipfix_not_sent += records.len() as u64;
            }
        }
        self.messages = stats.ipfix_messages;
        self.records = stats.ipfix_flow_records + stats.ipfix_loss_records;
    }
}
