//! The metric aggregator (loss paper, IV-A.4), off the fast path.
//!
//! It takes the points' batch events, waits out each batch's late window, lines the batch up
//! with the same batch at the upstream point (same flow, same color, overlapping in time), and
//! computes the batch's loss on the segment between the two points. Only lossy batches become
//! `loss` records by default; every batch feeds the per-interval summaries and per-flow totals.

use super::{BatchEvent, BatchEventKind};
use crate::records::{Flow, FlowLossRecord, LossRecord, Record, SummaryRecord};
use std::collections::{HashMap, HashSet, VecDeque};
use telemark_wire::FlowKey;

/// Resolved batches kept per flow and point for downstream matching.
const DONE_KEEP: usize = 64;
/// Batches a point may hold waiting for its upstream before they are resolved without it.
const WAIT_MAX: usize = 64;

/// One observation point as the aggregator knows it.
#[derive(Debug, Clone)]
pub struct PointSpec {
    /// Name in records (`ingress`, `egress`, `up`, …).
    pub name: String,
    /// Agent (switch) the point belongs to.
    pub agent: String,
    /// Port it observes.
    pub port: String,
    /// Index of the point upstream of it on the path, if any.
    pub upstream: Option<u8>,
    /// Whether this point is the marker: its counts are what was sent.
    pub marker: bool,
    /// Nanoseconds to subtract from this point's times to line them up with its upstream's
    /// (clock offset plus path delay between two capture points).
    pub skew_ns: i64,
    /// Where the expected counts of a point with no upstream here come from, named in its
    /// records (`sw-b/egress`: another agent's point on the path, so the collector can name
    /// the link between the two).
    pub upstream_label: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Batch {
    ordinal: u32,
    color: u8,
    count: u64,
    late: u64,
    first_ns: u64,
    last_ns: u64,
    tail: bool,
    /// First batch after the point began watching the flow mid-flow.
    head: bool,
    /// Cut short when the point stopped watching the flow.
    cut: bool,
    id: u64,
    matched: bool,
}

#[derive(Default)]
struct PointFlow {
    pending: VecDeque<Batch>,
    waiting: VecDeque<Batch>,
    done: VecDeque<Batch>,
}

/// A flow's totals at one point.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowTotals {
    /// Batches resolved.
    pub batches: u64,
    /// Batches with loss.
    pub lossy_batches: u64,
    /// Packets expected (over batches whose expectation was known).
    pub expected: u64,
    /// Packets observed in time.
    pub observed: u64,
    /// Packets late.
    pub late: u64,
    /// Packets lost.
    pub lost: u64,
    /// Packets observed beyond what was expected (duplicates, or a mismatched batch).
    pub excess: u64,
    /// Batches that had no upstream batch to compare with.
    pub unmatched: u64,
}

/// Lines batches up across points and turns them into records.
pub struct Aggregator {
    points: Vec<PointSpec>,
    /// For each point, the points whose upstream it is.
    downstream: Vec<Vec<u8>>,
    batch: Option<u32>,
    tol_ns: u64,
    report_all: bool,
    flows: HashMap<(FlowKey, u8), PointFlow>,
    totals: HashMap<(FlowKey, u8), FlowTotals>,
    interval: Vec<SummaryRecord>,
    out: VecDeque<Record>,
    /// Flows a point refused (no room): never reported as lost there.
    unwatched: HashSet<(FlowKey, u8)>,
    /// Events that named a point the aggregator does not know.
    pub bad_events: u64,
}

impl Aggregator {
    /// An aggregator for `points` (upstream before downstream); `batch` is B when every batch
    /// is known to start with B packets; `tol_ns` is how far apart in time two points' views of
    /// one batch may be.
    pub fn new(points: Vec<PointSpec>, batch: Option<u32>, tol_ns: u64) -> Self {
        let interval = points
            .iter()
            .map(|p| SummaryRecord {
                agent: p.agent.clone(),
                point: p.name.clone(),
                ..Default::default()
            })
            .collect();
        let downstream = (0..points.len())
            .map(|p| {
                (0..points.len() as u8)
                    .filter(|q| points[usize::from(*q)].upstream == Some(p as u8))
                    .collect()
            })
            .collect();
        Aggregator {
            downstream,
            points,
            batch,
            tol_ns,
            report_all: false,
            flows: HashMap::new(),
            totals: HashMap::new(),
            interval,
            out: VecDeque::new(),
            unwatched: HashSet::new(),
            bad_events: 0,
        }
    }

    /// Emit a `loss` record for every batch, not only lossy ones.
    pub fn report_all(mut self, yes: bool) -> Self {
        self.report_all = yes;
        self
    }

    /// The points.
    pub fn points(&self) -> &[PointSpec] {
        &self.points
    }

    /// Takes one event from a point.
    pub fn handle(&mut self, ev: BatchEvent) {
        let p = ev.point;
        if usize::from(p) >= self.points.len() {
            self.bad_events += 1;
            return;
        }
        // Active flow selection: the point watches the flow again from this batch, or stops
        // after it (what upstream sends meanwhile is not lost here).
        if ev.head {
            self.unwatched.remove(&(ev.key, p));
        }
        if ev.cut {
            self.unwatched.insert((ev.key, p));
        }
        let pf = self.flows.entry((ev.key, p)).or_default();
        match ev.kind {
            BatchEventKind::Closed => {
                // A newer batch closed: older ones can get no more late packets.
                let older: Vec<Batch> = pf.pending.drain(..).collect();
                let b = Batch {
                    ordinal: ev.ordinal,
                    color: ev.color,
                    count: u64::from(ev.count),
                    late: 0,
                    first_ns: ev.first_ns,
                    last_ns: ev.last_ns,
                    tail: ev.tail,
                    head: ev.head,
                    cut: ev.cut,
                    id: u64::from(ev.ordinal),
                    matched: false,
                };
                let marker = self.points[usize::from(p)].marker;
                for o in older {
                    pf.waiting.push_back(o);
                }
                if ev.tail || marker {
                    // Tail batches have no late window; the marker's counts are exact.
                    pf.waiting.push_back(b);
                } else {
                    pf.pending.push_back(b);
                }
            }
            BatchEventKind::Refused => {
                // Nothing this point says about the flow is a measurement.
                self.unwatched.insert((ev.key, p));
                return;
            }
            BatchEventKind::Late => {
                if let Some(i) = pf.pending.iter().position(|b| b.ordinal == ev.ordinal) {
                    if let Some(mut b) = pf.pending.remove(i) {
                        b.late += u64::from(ev.count);
                        pf.waiting.push_back(b);
                    }
                }
            }
        }
        self.resolve(&ev.key, p, false);
    }

    /// Resolves what `p` has waiting for flow `key`, then what its downstream points have.
    fn resolve(&mut self, key: &FlowKey, p: u8, force: bool) {
        let (marker, upstream, skew) = {
            let s = &self.points[usize::from(p)];
            (s.marker, s.upstream, s.skew_ns)
        };
        let mut wiped = Vec::new();
        loop {
            let Some(pf) = self.flows.get_mut(&(*key, p)) else { return };
            let Some(&b) = pf.waiting.front() else { break };
            let must = force || pf.waiting.len() > WAIT_MAX;
            let (expected, id, matched_up) = match upstream {
                _ if marker => (Some(b.count + b.late), b.id, None),
                None => {
                    let e = self.batch.filter(|_| !b.tail).map(u64::from);
                    (e, b.id, None)
                }
                Some(u) => match self.match_upstream(key, u, &b, skew, &mut wiped) {
                    Match::Found(e, id) => (e, id, e.map(|_| u)),
                    Match::Never => (None, b.id, None),
                    Match::NotYet if must => (None, b.id, None),
                    Match::NotYet => break,
                },
            };
            let Some(pf) = self.flows.get_mut(&(*key, p)) else { return };
            pf.waiting.pop_front();
            let mut done = b;
            done.id = id;
            pf.done.push_back(done);
            if pf.done.len() > DONE_KEEP {
                pf.done.pop_front();
            }
            for w in wiped.drain(..) {
                self.account_wiped(key, p, &w);
            }
            self.account(key, p, &b, expected, id, matched_up);
        }
        for i in 0..self.downstream[usize::from(p)].len() {
            let q = self.downstream[usize::from(p)][i];
            self.resolve(key, q, force);
        }
    }

    /// Finds the upstream batches this batch is (same color, overlapping in time; several when
    /// a whole batch in between was lost here and two batches of this color merged). Upstream
    /// batches older than the match that nothing matched were lost entirely on this segment:
    /// they are returned in `wiped`, unless this batch is the point's first after it began
    /// watching the flow (`head`: it did not watch them). A batch cut short by the end of
    /// watching is only compared with upstream batches cut at the same moment; against a whole
    /// one its expectation is unknown (`Found(None, _)`).
    fn match_upstream(
        &mut self,
        key: &FlowKey,
        u: u8,
        b: &Batch,
        skew: i64,
        wiped: &mut Vec<Batch>,
    ) -> Match {
        let tol = self.tol_ns as i128;
        let (first, last) =
            (i128::from(b.first_ns) - i128::from(skew), i128::from(b.last_ns) - i128::from(skew));
        let Some(up) = self.flows.get_mut(&(*key, u)) else { return Match::NotYet };
        let overlaps = |x: &Batch| {
            i128::from(x.first_ns) <= last + tol && i128::from(x.last_ns) + tol >= first
        };
        let Some(j) = up.done.iter().position(|x| !x.matched && x.color == b.color && overlaps(x))
        else {
            // The upstream point has moved past this batch: nothing will match any more.
            let past = up.done.iter().any(|x| i128::from(x.first_ns) > last + tol);
            return if past { Match::Never } else { Match::NotYet };
        };
        let mut expected = 0;
        let mut comparable = true;
        let id = up.done.get(j).map_or(0, |x| x.id);
        for (i, x) in up.done.iter_mut().enumerate() {
            if x.matched {
                continue;
            }
            if i < j {
                x.matched = true;
                if !b.head {
                    wiped.push(*x);
                }
            } else if x.color == b.color && overlaps(x) {
                x.matched = true;
                expected += x.count + x.late;
                comparable &= x.cut == b.cut;
            }
        }
        Match::Found(comparable.then_some(expected), id)
    }

    /// Books batch `b` at point `p`; `upstream` is the point `expected` came from.
    fn account(
        &mut self,
        key: &FlowKey,
        p: u8,
        b: &Batch,
        expected: Option<u64>,
        id: u64,
        upstream: Option<u8>,
    ) {
        let got = b.count + b.late;
        let lost = expected.map_or(0, |e| e.saturating_sub(got));
        let t = self.totals.entry((*key, p)).or_default();
        t.batches += 1;
        t.observed += b.count;
        t.late += b.late;
        match expected {
            Some(e) => {
                t.expected += e;
                t.lost += lost;
                t.excess += got.saturating_sub(e);
            }
            None => t.unmatched += 1,
        }
        if lost > 0 {
            t.lossy_batches += 1;
        }
        if let Some(s) = self.interval.get_mut(usize::from(p)) {
            s.batches += 1;
            s.lossy_batches += u64::from(lost > 0);
            s.expected += expected.unwrap_or(0);
            s.observed += b.count;
            s.late += b.late;
            s.lost += lost;
            s.unmatched += u64::from(expected.is_none());
        }
        let spec = &self.points[usize::from(p)];
        if spec.marker || !(lost > 0 || self.report_all) {
            return;
        }
        self.out.push_back(Record::Loss(LossRecord {
            agent: spec.agent.clone(),
            port: spec.port.clone(),
            point: spec.name.clone(),
            upstream: match upstream {
                Some(u) => Some(self.points[usize::from(u)].name.clone()),
                None => spec.upstream_label.clone().filter(|_| expected.is_some()),
            },
            flow: Flow::from(key),
            color: b.color,
            batch: id,
            first_ns: b.first_ns,
            last_ns: b.last_ns,
            expected,
            observed: b.count,
            lost,
            late: b.late,
        }));
    }

    /// An upstream batch of which not one packet reached point `p`.
    fn account_wiped(&mut self, key: &FlowKey, p: u8, up: &Batch) {
        let gone = Batch { count: 0, late: 0, ..*up };
        let upstream = self.points[usize::from(p)].upstream;
        self.account(key, p, &gone, Some(up.count + up.late), up.id, upstream);
    }

    /// Ends every batch still in a late window or waiting for its upstream (end of capture).
    pub fn flush(&mut self) {
        let keys: Vec<(FlowKey, u8)> = self.flows.keys().copied().collect();
        for k in &keys {
            if let Some(pf) = self.flows.get_mut(k) {
                let pending: Vec<Batch> = pf.pending.drain(..).collect();
                pf.waiting.extend(pending);
            }
        }
        // Upstream points first, so downstream batches find their match.
        let mut order: Vec<(FlowKey, u8)> = keys;
        order.sort_by_key(|(_, p)| *p);
        for (k, p) in &order {
            self.resolve(k, *p, true);
        }
        // Upstream batches nothing downstream matched were lost whole, also when the flow
        // never reached the downstream point at all.
        for (k, u) in order {
            for i in 0..self.downstream[usize::from(u)].len() {
                let q = self.downstream[usize::from(u)][i];
                if self.unwatched.contains(&(k, q)) {
                    continue;
                }
                let Some(pf) = self.flows.get_mut(&(k, u)) else { continue };
                let lost: Vec<Batch> = pf
                    .done
                    .iter_mut()
                    .filter(|x| !x.matched)
                    .map(|x| {
                        x.matched = true;
                        *x
                    })
                    .collect();
                for w in lost {
                    self.account_wiped(&k, q, &w);
                }
            }
        }
    }

    /// Forgets flows whose last batch at a point ended before `before_ns` and that have
    /// nothing in flight there (a long-running agent's memory stays bounded by its active
    /// flows); their loss was reported when it happened. Returns the (flow, point) entries
    /// forgotten.
    pub fn forget_before(&mut self, before_ns: u64) -> usize {
        let stale: Vec<(FlowKey, u8)> = self
            .flows
            .iter()
            .filter(|(_, pf)| {
                pf.pending.is_empty()
                    && pf.waiting.is_empty()
                    && pf.done.back().is_none_or(|b| b.last_ns < before_ns)
            })
            .map(|(k, _)| *k)
            .collect();
        for k in &stale {
            self.flows.remove(k);
            self.totals.remove(k);
            self.unwatched.remove(k);
        }
        stale.len()
    }

    /// Takes the next record to export.
    pub fn poll_record(&mut self) -> Option<Record> {
        self.out.pop_front()
    }

    /// Per-point summaries since the last call, as records; starts a new interval.
    pub fn summaries(&mut self, start_ns: u64, end_ns: u64) -> Vec<Record> {
        self.interval
            .iter_mut()
            .map(|s| {
                let r = SummaryRecord {
                    agent: s.agent.clone(),
                    point: s.point.clone(),
                    interval_start_ns: start_ns,
                    interval_end_ns: end_ns,
                    ..s.clone()
                };
                *s = SummaryRecord {
                    agent: s.agent.clone(),
                    point: s.point.clone(),
                    ..Default::default()
                };
                Record::Summary(r)
            })
            .collect()
    }

    /// Totals of one flow at one point.
    pub fn totals(&self, key: &FlowKey, point: u8) -> FlowTotals {
        self.totals.get(&(*key, point)).copied().unwrap_or_default()
    }

    /// Every flow's totals at every point, as records, sorted by point then flow.
    pub fn flow_records(&self) -> Vec<(FlowKey, u8, FlowLossRecord)> {
        let mut v: Vec<_> = self
            .totals
            .iter()
            .map(|((k, p), t)| {
                let s = &self.points[usize::from(*p)];
                (
                    *k,
                    *p,
                    FlowLossRecord {
                        agent: s.agent.clone(),
                        point: s.name.clone(),
                        flow: Flow::from(k),
                        batches: t.batches,
                        lossy_batches: t.lossy_batches,
                        expected: t.expected,
                        observed: t.observed,
                        late: t.late,
                        lost: t.lost,
                        truth_lost: None,
                    },
                )
            })
            .collect();
        v.sort_by_key(|a| (a.1, a.0));
        v
    }
}

enum Match {
    /// Expected packets (`None`: not comparable) and the upstream batch's id.
    Found(Option<u64>, u64),
    NotYet,
    Never,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::{ColorTable, EventSink, LossConfig, Marker};

    fn spec(name: &str, upstream: Option<u8>, marker: bool) -> PointSpec {
        PointSpec {
            name: name.into(),
            agent: "sw".into(),
            port: "p".into(),
            upstream,
            marker,
            skew_ns: 0,
            upstream_label: None,
        }
    }

    /// Flows silent since before the cut are forgotten (memory follows the active flows);
    /// a flow with a batch in flight or active after the cut is kept.
    #[test]
    fn idle_flows_are_forgotten() {
        let mut agg = Aggregator::new(vec![spec("ingress", None, false)], Some(100), 0);
        let ev = |i: u8, kind, t: u64| BatchEvent {
            key: crate::loss::test_key(i),
            point: 0,
            kind,
            color: 0,
            ordinal: 0,
            count: 97,
            first_ns: t,
            last_ns: t + 10,
            tail: true,
            head: false,
            cut: false,
        };
        agg.handle(ev(1, BatchEventKind::Closed, 100));
        agg.handle(ev(2, BatchEventKind::Closed, 1_000));
        agg.handle(ev(3, BatchEventKind::Refused, 0));
        assert_eq!(agg.totals(&crate::loss::test_key(1), 0).batches, 1);
        assert_eq!(agg.forget_before(500), 2, "flow 1 and the refused flow 3");
        assert_eq!(agg.totals(&crate::loss::test_key(1), 0), FlowTotals::default());
        assert_eq!(agg.totals(&crate::loss::test_key(2), 0).batches, 1);
        assert_eq!(agg.forget_before(500), 0);
        assert_eq!(agg.forget_before(2_000), 1);
    }

    /// A marker (point 0), an ingress (1) and an egress (2) in a row, and their aggregator.
    fn marker_ingress_egress(cfg: &LossConfig) -> (Marker, [ColorTable<u8>; 2], Aggregator) {
        let pts = vec![
            spec("marker", None, true),
            spec("ingress", Some(0), false),
            spec("egress", Some(1), false),
        ];
        (
            Marker::new(cfg, 0),
            [ColorTable::new(cfg, 1), ColorTable::new(cfg, 2)],
            Aggregator::new(pts, Some(cfg.batch), 0),
        )
    }

    /// Marker → ingress → egress with a deterministic drop pattern at each segment.
    #[test]
    fn per_segment_loss_equals_drops() {
        let cfg = LossConfig::default();
        let (mut m, [mut ing, mut eg], mut agg) = marker_ingress_egress(&cfg);
        let k = FlowKey::default();
        let h = crate::flow_hash(&k);
        let mut ev: Vec<BatchEvent> = Vec::new();
        let (mut link_drops, mut sw_drops) = (0u64, 0u64);
        for i in 0..1050u64 {
            let (c, _) = m.mark(&k, h, i, &mut ev).unwrap();
            if i % 97 == 5 {
                link_drops += 1;
            } else {
                ing.observe(&k, h, c, i, &mut ev);
                if i % 89 == 7 {
                    sw_drops += 1;
                } else {
                    eg.observe(&k, h, c, i, &mut ev);
                }
            }
            for e in ev.drain(..) {
                agg.handle(e);
            }
        }
        m.flush(&mut ev);
        ing.flush(&mut ev);
        eg.flush(&mut ev);
        for e in ev.drain(..) {
            agg.handle(e);
        }
        agg.flush();
        assert_eq!(agg.totals(&k, 1).lost, link_drops);
        assert_eq!(agg.totals(&k, 2).lost, sw_drops);
        assert_eq!(agg.totals(&k, 1).unmatched, 0);
        let mut recs = 0;
        while let Some(Record::Loss(r)) = agg.poll_record() {
            assert!(r.lost > 0);
            recs += 1;
        }
        assert_eq!(recs as u64, agg.totals(&k, 1).lossy_batches + agg.totals(&k, 2).lossy_batches);
        let _ = <Vec<BatchEvent> as EventSink>::emit;
    }

    /// Active flow selection moves the ingress and egress points from one flow to another and
    /// back mid-batch. Every batch compared with its upstream shows exactly the drops the
    /// dropper made in it on that segment while the flow was watched (a batch cut short at
    /// both points is compared up to the cut): nothing from before a flow was watched, while it
    /// was armed or after it was cut is reported lost, and batches are still measured.
    #[test]
    fn selection_changes_report_no_false_loss() {
        use std::collections::HashMap;
        let cfg = LossConfig::default();
        let (mut m, mut pts, agg) = marker_ingress_egress(&cfg);
        let mut agg = agg.report_all(true);
        let keys = [crate::loss::test_key(1), crate::loss::test_key(2)];
        let sel =
            |i: usize| -> Option<crate::loss::Selection> { Some([keys[i]].into_iter().collect()) };
        let mut ev: Vec<BatchEvent> = Vec::new();
        for t in pts.iter_mut() {
            t.select(sel(1), &mut ev);
        }
        // truth[(point, flow, marker batch)]: packets of watched flows dropped just upstream
        // of the point.
        let mut truth: HashMap<(u8, usize, u64), u64> = HashMap::new();
        let mut watched = 1;
        for i in 0..2400u64 {
            // Flow 0 watched from packet 350 of each flow (mid-batch 3) to 950 (mid-batch 9),
            // then flow 1 again.
            if i == 700 || i == 1900 {
                watched ^= 1;
                for t in pts.iter_mut() {
                    t.select(sel(watched), &mut ev);
                }
            }
            let f = (i % 2) as usize;
            let k = &keys[f];
            let h = crate::flow_hash(k);
            let (c, ord) = m.mark(k, h, i, &mut ev).unwrap();
            let ord = u64::from(ord);
            let w = u64::from(f == watched);
            if i % 37 == 5 {
                *truth.entry((1, f, ord)).or_default() += w;
            } else {
                pts[0].observe(k, h, c, i, &mut ev);
                if i % 29 == 7 {
                    *truth.entry((2, f, ord)).or_default() += w;
                } else {
                    pts[1].observe(k, h, c, i, &mut ev);
                }
            }
            for e in ev.drain(..) {
                agg.handle(e);
            }
        }
        m.flush(&mut ev);
        for t in pts.iter_mut() {
            t.flush(&mut ev);
        }
        for e in ev.drain(..) {
            agg.handle(e);
        }
        agg.flush();
        let mut compared = HashMap::<(u8, usize), (u64, u64)>::new();
        while let Some(r) = agg.poll_record() {
            let Record::Loss(r) = r else { continue };
            let Some(expected) = r.expected else { continue };
            let p = if r.point == "ingress" { 1 } else { 2 };
            let f = keys.iter().position(|k| Flow::from(k) == r.flow).unwrap();
            let want = truth.get(&(p, f, r.batch)).copied().unwrap_or(0);
            assert_eq!(r.lost, want, "{} flow {f} batch {}: {r:?}", r.point, r.batch);
            assert_eq!(expected, r.observed + r.late + r.lost);
            let c = compared.entry((p, f)).or_default();
            c.0 += 1;
            c.1 += want;
        }
        for p in [1, 2] {
            for f in [0, 1] {
                let (n, lost) = compared.get(&(p, f)).copied().unwrap_or_default();
                // (Flow 1 is armed from its first packet too: a point cannot tell a new flow
                // from one it joins.)
                assert!(n >= 2 && lost > 0, "point {p} flow {f}: {n} batches, {lost} lost");
            }
        }
    }
}
