//! The aggregation thread: the loss paper's aggregator over the datapath's batch events
//! (DESIGN.md, "Data flow"), INT events and heavy-hitter windows turned into records, the
//! summary, health and cost records every interval, and the records handed to the output
//! (output.rs) and, with `[ipfix] loss`, to the flow-export thread.

use crate::config::AgentConfig;
use crate::doorbell::Backoff;
use crate::egress::RuledEvent;
use crate::flow_export;
use crate::kafka_out::KafkaOut;
use crate::output::{emit, Out};
use crate::shared::{PathStats, PointTable, Shared};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use telemark_core::loss::{Aggregator, BatchEvent};
use telemark_core::records::{
    CostRecord, FlowRecord, HealthRecord, HhWindowHealth, PointHealth, Record,
};
use telemark_core::spsc::Consumer;
use telemark_datapath::heavy_hitters::PortWindow;
use telemark_transport::exporter::Exporter;
use telemark_transport::now_ns;

pub(crate) struct Aggregation {
    pub(crate) cfg: AgentConfig,
    pub(crate) agg: Aggregator,
    pub(crate) cons: Consumer<BatchEvent>,
    /// INT sink events.
    pub(crate) int_events: Consumer<RuledEvent>,
    /// Heavy-hitter windows (with `[heavy_hitters]`).
    pub(crate) hh_windows: Option<Consumer<PortWindow>>,
    /// Heavy-hitter windows closed since the last health record.
    pub(crate) hh_health: Vec<HhWindowHealth>,
    /// Export drops reported in the last health record.
    pub(crate) last_export_dropped: u64,
    /// Where loss records go as IPFIX too (`[ipfix] loss`).
    pub(crate) loss_tx: Option<std::sync::mpsc::SyncSender<telemark_core::records::LossRecord>>,
}

/// Names in a lossy record of a segment inside this agent the kernel's drops of its flow not
/// named yet (eBPF datapath). A point measured against another agent's (a link in) is left
/// out: the kernel here dropped nothing on the way to it.
fn name_drops(l: &mut telemark_core::records::LossRecord, shared: &Shared) {
    if (l.lost == 0 && l.uncertain == 0) || l.scope != telemark_core::records::Scope::Segment {
        return;
    }
    let Ok(flow) = telemark_wire::FlowKey::try_from(&l.flow) else { return };
    let mut pending = shared.pending_drops.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = pending.remove(&flow) {
        l.drops = d
            .into_iter()
            .map(|(reason, packets)| telemark_core::records::DropCount { reason, packets })
            .collect();
    }
}

impl Aggregation {
    /// Runs until the datapath is done (`path_done`) and every event it left is turned into
    /// records and handed on.
    pub(crate) fn run(mut self, path_done: &AtomicBool, shared: &Shared) {
        let boot = now_ns();
        let kafka = self.cfg.kafka.as_ref().map(|k| {
            telemark_kafka::Producer::new(k, true).map(|p| (p, k.buffer_records as usize))
        });
        let mut out = match (&self.cfg.collector, kafka) {
            (_, Some(Ok((producer, bound)))) => {
                Out::Kafka(Box::new(KafkaOut::new(producer, &self.cfg.agent, boot, bound)))
            }
            (_, Some(Err(e))) => {
                tracing::error!("kafka: {e}; records are discarded");
                Out::Discard
            }
            (Some(c), None) => {
                let mut ex = Exporter::new(c, &self.cfg.agent, boot, self.cfg.buffer)
                    .with_token(self.cfg.token.as_deref());
                if let Some(tls) = &self.cfg.tls {
                    ex = ex.with_tls(tls.clone());
                }
                Out::Collector(Box::new(ex))
            }
            (None, None) if self.cfg.quiet => Out::Discard,
            (None, None) => Out::Stdout,
        };
        let mut records = 0u64;
        let mut interval_start = boot;
        let mut next_summary = boot + self.cfg.summary_interval_ns;
        let mut next_export = boot + self.cfg.export_interval_ns;
        let mut last_path = PathStats::default();
        let mut was_failing = false;
        // Per-flow state of flows silent this long is forgotten (it was reported already).
        let forget_ns = self.cfg.loss.idle_ns.saturating_mul(4).max(30_000_000_000);
        let mut idle = Backoff::new();
        let mut handled = 0u64;
        loop {
            let records_before = records;
            let finished = path_done.load(Ordering::Acquire);
            let n = self.drain_events(shared);
            if finished && n == 0 {
                break;
            }
            records += self.poll_records(&mut out, shared);
            handled += n as u64;
            shared.events_handled.store(handled, Ordering::Release);
            records += self.drain_int_events(&mut out);
            records += self.drain_heavy_hitters(&mut out, shared);
            let now = now_ns();
            if now >= next_summary {
                let snap = shared.path.lock().map(|s| s.clone()).unwrap_or_default();
                self.report_interval(&mut out, &snap, &last_path, interval_start, now);
                // Each stage's time since the last cost records.
                let before = last_path.stages();
                for (stage, ns) in snap.stages() {
                    let was = before.iter().find(|b| b.0 == stage).map_or(0, |b| b.1);
                    emit(
                        &mut out,
                        Record::Cost(CostRecord {
                            agent: self.cfg.agent.clone(),
                            stage: stage.into(),
                            packets: snap.rx.saturating_sub(last_path.rx),
                            cycles: ns.saturating_sub(was),
                            interval_ns: now.saturating_sub(interval_start),
                        }),
                    );
                }
                last_path = snap;
                self.agg.book_quiet_before(now.saturating_sub(2 * self.cfg.loss.idle_ns));
                self.agg.forget_before(now.saturating_sub(forget_ns));
                interval_start = now;
                next_summary = now + self.cfg.summary_interval_ns;
            }
            if let Out::Kafka(k) = &mut out {
                k.poll();
            }
            if now >= next_export {
                next_export = now + self.cfg.export_interval_ns;
                if let Out::Collector(e) = &mut out {
                    match e.flush() {
                        Ok(_) if was_failing => {
                            tracing::info!("collector reachable again");
                            was_failing = false;
                        }
                        Ok(_) => {}
                        Err(err) if !was_failing => {
                            tracing::warn!("export failed, will retry: {err}");
                            was_failing = true;
                        }
                        Err(_) => {}
                    }
                }
            }
            if let Some(new) = shared.new_export.lock().ok().and_then(|mut e| e.take()) {
                self.set_export(new, &mut out);
                next_export = now_ns() + self.cfg.export_interval_ns;
                next_summary = next_summary.min(now_ns() + self.cfg.summary_interval_ns);
            }
            self.publish(shared, &out, records);
            if n > 0 || records > records_before {
                idle.worked();
            } else if !finished {
                // Until the datapath rings, something comes in, or the next interval is due.
                let due = next_summary.min(next_export).saturating_sub(now_ns());
                let wait = idle.next().min(Duration::from_nanos(due));
                shared.aggregation_bell.wait(wait, || {
                    path_done.load(Ordering::Acquire)
                        || !self.cons.is_empty()
                        || !self.int_events.is_empty()
                        || self.hh_windows.as_ref().is_some_and(|c| !c.is_empty())
                });
            }
        }
        // The fast path closed every batch: resolve and export the rest.
        records += self.drain_int_events(&mut out);
        records += self.drain_heavy_hitters(&mut out, shared);
        self.agg.flush();
        records += self.poll_records(&mut out, shared);
        // The flow-export thread ends when it has sent what it holds.
        self.loss_tx = None;
        let now = now_ns();
        let snap = shared.path.lock().map(|s| s.clone()).unwrap_or_default();
        self.report_interval(&mut out, &snap, &last_path, interval_start, now);
        if let Out::Kafka(k) = &mut out {
            k.finish(Duration::from_secs(5));
            let pending = k.pending();
            if pending > 0 {
                tracing::warn!(pending, "records not acknowledged by Kafka at exit");
            }
        }
        if let Out::Collector(e) = &mut out {
            let deadline = Instant::now() + Duration::from_secs(5);
            while e.pending() > 0 && Instant::now() < deadline {
                if e.flush().is_err() {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            if e.pending() > 0 {
                tracing::warn!(
                    pending = e.pending(),
                    "records not acknowledged by the collector at exit"
                );
            }
        }
        self.publish(shared, &out, records);
    }

    /// The datapath's batch events into the aggregator; how many.
    fn drain_events(&mut self, shared: &Shared) -> usize {
        let agg = &mut self.agg;
        self.cons.drain(|ev| {
            if usize::from(ev.point) >= agg.points().len() {
                // Points are published before the events that name them.
                for spec in shared
                    .new_points
                    .lock()
                    .map(|mut v| std::mem::take(&mut *v))
                    .unwrap_or_default()
                {
                    agg.add_point(spec);
                }
            }
            agg.handle(ev)
        })
    }

    /// The aggregator's records, loss records with the drops they explain, handed on; how
    /// many.
    fn poll_records(&mut self, out: &mut Out, shared: &Shared) -> u64 {
        let mut n = 0;
        while let Some(mut r) = self.agg.poll_record() {
            n += 1;
            if let Record::Loss(l) = &mut r {
                name_drops(l, shared);
            }
            self.offer_ipfix(&r, shared);
            emit(out, r);
        }
        n
    }

    /// A loss record to the IPFIX exporter too, when it takes them.
    /// Hands a loss record to the IPFIX exporter: a lossy one, or any with `report_all`. The
    /// every-period records of host mode's uplinks are for the collector to line hosts up
    /// with; an IPFIX collector gets what `report_all` asks for, as before.
    fn offer_ipfix(&self, r: &Record, shared: &Shared) {
        if let (Some(tx), Record::Loss(l)) = (&self.loss_tx, r) {
            if l.lost > 0 || l.uncertain > 0 || self.cfg.report_all {
                flow_export::offer_loss(tx, l, shared);
            }
        }
    }

    /// INT events from the fast path, as records; how many.
    fn drain_int_events(&mut self, out: &mut Out) -> u64 {
        let mut n = 0;
        while let Some((e, rules)) = self.int_events.pop() {
            emit(out, Record::Event(e.record(&self.cfg.agent, &rules)));
            n += 1;
        }
        n
    }

    /// Heavy flows of the windows the fast path closed, as `flow` records; how many. Every
    /// window, heavy flows or not, goes into the next health record.
    fn drain_heavy_hitters(&mut self, out: &mut Out, shared: &Shared) -> u64 {
        let Some(cons) = &self.hh_windows else { return 0 };
        let mut n = 0;
        let mut names: Option<Vec<String>> = None;
        while let Some(w) = cons.pop() {
            // The eBPF datapath's ports are the interfaces it attached to so far.
            let names = names.get_or_insert_with(|| match &self.cfg.ebpf {
                Some(_) => shared.port_labels.lock().map(|v| v.clone()).unwrap_or_default(),
                None => self.port_names(),
            });
            let port = names.get(usize::from(w.port)).cloned().unwrap_or_default();
            for f in &w.hh.flows {
                let r = FlowRecord::heavy(&self.cfg.agent, &port, (w.start_ns, w.end_ns), &w.hh, f);
                emit(out, Record::Flow(r));
                n += 1;
            }
            // Bounded: a health record leaves every summary interval (windows are ≥ 100 ms).
            if self.hh_health.len() < 4096 {
                self.hh_health.push(HhWindowHealth {
                    port,
                    window_start_ns: w.start_ns,
                    window_end_ns: w.end_ns,
                    packets: w.hh.packets,
                    threshold_packets: w.hh.threshold_packets,
                    heavy_flows: w.hh.flows.len() as u64,
                    complete: w.hh.complete,
                });
            }
        }
        n
    }

    /// New export settings: the collector, token and TLS trust (records not yet acknowledged
    /// go to the new collector), intervals, buffer size, report-all.
    fn set_export(&mut self, new: AgentConfig, out: &mut Out) {
        if let (Out::Collector(e), Some(url)) = (out, &new.collector) {
            e.retarget(url, new.token.as_deref(), new.tls.clone());
            e.set_capacity(new.buffer);
        }
        self.agg.set_report_all(new.report_all);
        self.cfg.collector = new.collector;
        self.cfg.token = new.token;
        self.cfg.tls = new.tls;
        self.cfg.export_interval_ns = new.export_interval_ns;
        self.cfg.summary_interval_ns = new.summary_interval_ns;
        self.cfg.buffer = new.buffer;
        self.cfg.report_all = new.report_all;
    }

    /// The interval's per-point summaries, each ingress or tap point's marked with its port's
    /// receive-ring drops, and the agent's health record (counters since `last`).
    fn summaries_and_health(
        &mut self,
        snap: &PathStats,
        last: &PathStats,
        start_ns: u64,
        end_ns: u64,
        export_dropped: u64,
    ) -> Vec<Record> {
        let ports = self.port_names();
        let ring_drops = |port: &str| -> u64 {
            let Some(i) = ports.iter().position(|p| p == port) else { return 0 };
            let now = snap.rx_ring_drops_by_port.get(i).copied().unwrap_or(0);
            now.saturating_sub(last.rx_ring_drops_by_port.get(i).copied().unwrap_or(0))
        };
        let specs = self.agg.points().to_vec();
        let mut v = self.agg.summaries(start_ns, end_ns);
        for (r, spec) in v.iter_mut().zip(&specs) {
            if let Record::Summary(s) = r {
                if spec.name == "ingress" || spec.name == "tap" {
                    s.rx_ring_drops = ring_drops(&spec.port);
                }
            }
        }
        let before = |pt: u8| {
            last.points.iter().find(|x| x.point == pt).map(|x| x.stats).unwrap_or_default()
        };
        let points = snap
            .points
            .iter()
            .filter_map(|t: &PointTable| {
                let spec = specs.get(usize::from(t.point))?;
                let (st, b) = (t.stats, before(t.point));
                Some(PointHealth {
                    point: spec.name.clone(),
                    port: spec.port.clone(),
                    flows_admitted: st.admitted.saturating_sub(b.admitted),
                    flows_evicted: st.evicted.saturating_sub(b.evicted),
                    packets_refused: st.refused.saturating_sub(b.refused),
                    packets_unselected: st.unselected.saturating_sub(b.unselected),
                    flows: t.flows,
                    capacity: t.capacity,
                })
            })
            .collect();
        v.push(Record::Health(HealthRecord {
            agent: self.cfg.agent.clone(),
            interval_start_ns: start_ns,
            interval_end_ns: end_ns,
            rx: snap.rx.saturating_sub(last.rx),
            rx_ring_drops: snap.rx_ring_drops.saturating_sub(last.rx_ring_drops),
            tx_drops: snap.tx_drops.saturating_sub(last.tx_drops),
            events_lost: snap.event_drops.saturating_sub(last.event_drops),
            export_dropped: export_dropped.saturating_sub(self.last_export_dropped),
            points,
            hh_windows: std::mem::take(&mut self.hh_health),
        }));
        v
    }

    /// Emits the interval's summaries and health record. The health record counts the export
    /// drops since the last health record that got out: one dropped itself (the collector or
    /// broker away) hands its count on to the next.
    fn report_interval(
        &mut self,
        out: &mut Out,
        snap: &PathStats,
        last: &PathStats,
        start_ns: u64,
        end_ns: u64,
    ) {
        let dropped = out.dropped();
        for r in self.summaries_and_health(snap, last, start_ns, end_ns, dropped) {
            let health = matches!(r, Record::Health(_));
            if emit(out, r) && health {
                self.last_export_dropped = dropped;
            }
        }
    }

    /// Port names in the order the fast path opened them (pairs' a, b, then taps).
    fn port_names(&self) -> Vec<String> {
        self.cfg
            .pairs
            .iter()
            .flat_map(|p| [p.a.clone(), p.b.clone()])
            .chain(self.cfg.taps.iter().map(|t| t.port.clone()))
            .collect()
    }

    fn publish(&self, shared: &Shared, out: &Out, records: u64) {
        if let Ok(mut g) = shared.export.lock() {
            g.records = records;
            match out {
                Out::Collector(e) => {
                    g.exported = e.acked;
                    g.export_drops = e.dropped;
                    g.export_pending = e.pending() as u64;
                    g.export_failures = e.failures;
                }
                Out::Kafka(k) => {
                    g.exported = k.acked;
                    g.export_drops = k.lost();
                    g.export_pending = k.pending() as u64;
                    g.export_failures = k.failed;
                }
                _ => {}
            }
        }
    }
}
