//! The metric aggregator (loss paper, IV-A.4), off the fast path.
//!
//! It takes the points' batch events, waits out each batch's late window, lines the batch up
//! with the same batch at the upstream point (same flow, same color, overlapping in time), and
//! computes the batch's loss on the segment between the two points. Only lossy (or uncertain)
//! batches become `loss` records by default; every batch feeds the per-interval summaries and
//! per-flow totals.
//!
//! What is lost and what is uncertain. A packet is reported lost only where the point is known
//! to have been watching the flow when it went missing:
//! - in a batch the point reported, against the upstream count of the same batch;
//! - as a whole upstream batch missing between two batches the point reported in one watch
//!   (its [`Span::Continues`]).
//!
//! Everything else that is missing is `uncertain`, never lost: whole upstream batches before a
//! point's first batch or after its last one in a watch (it may have refused, evicted or not
//! yet admitted the flow), every batch whose events may be among those a full ring dropped
//! ([`BatchEventKind::Gap`]), and the batches around one that holds more packets than were
//! sent (reordering deeper than the step threshold absorbs moves packets between batches).
//! Batches a point chose not to watch (refused for room, left out by selection) are neither.

use super::{BatchEvent, BatchEventKind};
use crate::records::{Flow, FlowLossRecord, LossCounts, LossRecord, Record, Scope, SummaryRecord};
use std::collections::{HashMap, HashSet, VecDeque};
use telemark_wire::FlowKey;

/// The whole number of the marking period of `period_ns` whose low 32 bits are `low`, for a
/// batch whose first packet a point dated `first_ns`: the one nearest the period that time is
/// in (a point's clock is within a period of the marker's, far inside the 2^32 periods that
/// tell two numbers with the same low bits apart).
pub fn period_number(low: u32, first_ns: u64, period_ns: u64) -> u64 {
    const SPAN: u64 = 1 << 32;
    let near = first_ns / period_ns.max(1);
    let k = (near & !(SPAN - 1)) | u64::from(low);
    // The candidates with those low bits either side of `near`'s block: the nearest.
    [k.wrapping_sub(SPAN), k, k.wrapping_add(SPAN)]
        .into_iter()
        .min_by_key(|c| c.abs_diff(near))
        .unwrap_or(k)
}

/// Resolved batches kept per flow and point for downstream matching.
const DONE_KEEP: usize = 64;
/// Batches a point may hold waiting for its upstream before they are resolved without it.
const WAIT_MAX: usize = 64;
/// Batches on either side of one with excess packets whose shortfall is uncertain: reordering
/// deeper than the late window moves a packet at most into the next batch of its color, two
/// batches on, and the step detector's double step (see `Detector::resumed`) spans as many.
const DISORDER_REACH: usize = 2;

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
    /// Whether the point reports every batch, lossy or not, whatever
    /// [`Aggregator::report_all`] says: a point at one end of a segment that leaves this agent
    /// (a host's uplink), whose other end only the collector sees.
    pub every_batch: bool,
}

impl PointSpec {
    /// Which stretch of the path this point's figures cover: from its upstream point here,
    /// or, with none here, from the marking switch (against B).
    pub fn scope(&self) -> Scope {
        if self.upstream.is_some() {
            Scope::Segment
        } else {
            Scope::Path
        }
    }
}

/// How a point's batch follows the one it reported before for the same flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Span {
    /// The point reported the flow's previous batch in the same watch: an upstream batch
    /// between the two that it did not see at all was lost whole on the segment.
    Continues,
    /// The first batch of a new watch: a newly admitted flow, one retired before (idle,
    /// evicted), or one whose events may have been lost. What came before is uncertain here.
    Fresh,
    /// The first batch after the point chose not to watch the flow (no room, left out by
    /// active flow selection): what came before was not watched, and is not reported.
    Rejoins,
}

/// What the aggregator knows of a point's watch over a flow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Watch {
    /// No batch yet, or the last one ended the watch (flush, idle timeout, eviction).
    #[default]
    Ended,
    /// Reporting batches.
    Watching,
    /// Refused or left out, and not reported since.
    NotWatched,
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
    /// Cut short when the point stopped watching the flow.
    cut: bool,
    span: Span,
    /// Some of the point's events about it may have been lost.
    uncertain: bool,
    id: u64,
    matched: bool,
    /// The flow's TTL (hop limit) at the point, where known.
    ttl: Option<u8>,
}

/// A resolved batch, held until the batches after it show whether it was disordered.
#[derive(Debug, Clone, Copy)]
struct Verdict {
    batch: Batch,
    /// Packets sent into the segment for it (`None`: not known).
    expected: Option<u64>,
    id: u64,
    /// The point `expected` came from.
    upstream: Option<u8>,
    /// Its shortfall is uncertain, not lost.
    uncertain: bool,
}

#[derive(Default)]
struct PointFlow {
    /// Closed batches whose late window is still open.
    pending: VecDeque<Batch>,
    /// Final batches waiting for their upstream.
    waiting: VecDeque<Batch>,
    /// Resolved batches, for downstream points to match.
    done: VecDeque<Batch>,
    watch: Watch,
    /// Gaps seen by the aggregator when this entry's last event arrived.
    epoch: u64,
    /// Resolved batches not yet booked (see [`DISORDER_REACH`]).
    awaiting_neighbours: VecDeque<Verdict>,
    /// Batches still to be marked uncertain after one with excess.
    disorder: usize,
    /// Packets disordered batches of the current stretch hold beyond their expectation.
    credit: u64,
}

/// Lines batches up across points and turns them into records.
pub struct Aggregator {
    points: Vec<PointSpec>,
    /// For each point, the points whose upstream it is.
    downstream: Vec<Vec<u8>>,
    batch: Option<u32>,
    /// The marking period when batches are periods of time numbered from the Unix epoch
    /// (each point's batch ordinal is the low 32 bits of its period's number).
    period_ns: Option<u64>,
    tol_ns: u64,
    report_all: bool,
    flows: HashMap<(FlowKey, u8), PointFlow>,
    totals: HashMap<(FlowKey, u8), LossCounts>,
    interval: Vec<LossCounts>,
    out: VecDeque<Record>,
    /// [`BatchEventKind::Gap`] events seen.
    gaps: u64,
    /// Per point, whether it has refused a flow for lack of room: from then on a flow it
    /// admits may join part-way through a batch (see [`Aggregator::match_upstream`]).
    refusing: Vec<bool>,
    /// Events that named a point the aggregator does not know.
    pub bad_events: u64,
}

impl Aggregator {
    /// An aggregator for `points` (upstream before downstream); `batch` is B when every batch
    /// is known to start with B packets; `tol_ns` is how far apart in time two points' views of
    /// one batch may be.
    pub fn new(points: Vec<PointSpec>, batch: Option<u32>, tol_ns: u64) -> Self {
        let downstream = (0..points.len())
            .map(|p| {
                (0..points.len() as u8)
                    .filter(|q| points[usize::from(*q)].upstream == Some(p as u8))
                    .collect()
            })
            .collect();
        Aggregator {
            downstream,
            interval: vec![LossCounts::default(); points.len()],
            refusing: vec![false; points.len()],
            points,
            batch,
            period_ns: None,
            tol_ns,
            report_all: false,
            flows: HashMap::new(),
            totals: HashMap::new(),
            out: VecDeque::new(),
            gaps: 0,
            bad_events: 0,
        }
    }

    /// Emit a `loss` record for every batch, not only lossy ones.
    pub fn report_all(mut self, yes: bool) -> Self {
        self.set_report_all(yes);
        self
    }

    /// Batches are the marking periods of `period_ns` on Unix time, and each point's ordinal
    /// is the low 32 bits of its batch's period number (the eBPF datapath): records carry the
    /// period's whole number as `batch`, with `period_ns`, so that the collector can line up
    /// points of different agents by period rather than by their clocks.
    pub fn periods(mut self, period_ns: Option<u64>) -> Self {
        self.period_ns = period_ns.filter(|t| *t > 0);
        self
    }

    /// Changes [`Aggregator::report_all`] on a running aggregator.
    pub fn set_report_all(&mut self, yes: bool) {
        self.report_all = yes;
    }

    /// Adds a point (a datapath that learns its points as interfaces and paths appear: the
    /// eBPF datapath). Its upstream, if any, must be a point added before it. Returns its
    /// number, or `None` when 255 points are taken or the upstream is unknown.
    pub fn add_point(&mut self, spec: PointSpec) -> Option<u8> {
        let id = u8::try_from(self.points.len()).ok().filter(|id| *id < u8::MAX)?;
        if let Some(u) = spec.upstream {
            self.downstream.get_mut(usize::from(u))?.push(id);
        }
        self.points.push(spec);
        self.downstream.push(Vec::new());
        self.interval.push(LossCounts::default());
        self.refusing.push(false);
        Some(id)
    }

    /// The points.
    pub fn points(&self) -> &[PointSpec] {
        &self.points
    }

    /// Gaps in the event stream seen so far (events a full ring dropped before each).
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Takes one event from a point.
    pub fn handle(&mut self, ev: BatchEvent) {
        if ev.kind == BatchEventKind::Gap {
            self.gaps += 1;
            return;
        }
        let p = ev.point;
        if usize::from(p) >= self.points.len() {
            self.bad_events += 1;
            return;
        }
        if ev.kind == BatchEventKind::OwnColour {
            self.own_colour(&ev);
            return;
        }
        let gaps = self.gaps;
        let pf = self
            .flows
            .entry((ev.key, p))
            .or_insert_with(|| PointFlow { epoch: gaps, ..PointFlow::default() });
        let after_gap = pf.epoch != gaps;
        if after_gap {
            // Events of this flow here may be among those lost: what it holds may lack late
            // packets, and the watch may have ended and begun again unseen (a refusal, and
            // this batch the partial first one after it).
            pf.epoch = gaps;
            for b in pf.pending.iter_mut().chain(pf.waiting.iter_mut()) {
                b.uncertain = true;
            }
            if pf.watch == Watch::Watching {
                pf.watch = Watch::Ended;
            }
        }
        match ev.kind {
            BatchEventKind::Closed => {
                let span = match pf.watch {
                    _ if ev.head => Span::Rejoins,
                    Watch::NotWatched => Span::Rejoins,
                    Watch::Ended => Span::Fresh,
                    // A flow's first batch at a point is its batch 0: a restart whose end was
                    // not seen.
                    Watch::Watching if ev.ordinal == 0 => Span::Fresh,
                    Watch::Watching => Span::Continues,
                };
                pf.watch = match (ev.tail, ev.cut) {
                    (_, true) => Watch::NotWatched,
                    (true, false) => Watch::Ended,
                    (false, false) => Watch::Watching,
                };
                // A newer batch closed: older ones can get no more late packets.
                let older: Vec<Batch> = pf.pending.drain(..).collect();
                pf.waiting.extend(older);
                let b = Batch {
                    ordinal: ev.ordinal,
                    color: ev.color,
                    count: u64::from(ev.count),
                    late: 0,
                    first_ns: ev.first_ns,
                    last_ns: ev.last_ns,
                    tail: ev.tail,
                    // The first batch after a refusal lacks the packets refused: comparable
                    // with no whole batch upstream, as one cut short is.
                    cut: ev.cut || (span == Span::Rejoins && !ev.head),
                    span,
                    uncertain: after_gap,
                    id: u64::from(ev.ordinal),
                    matched: false,
                    ttl: ev.ttl,
                };
                if ev.tail || self.points[usize::from(p)].marker {
                    // Tail batches have no late window; the marker's counts are exact.
                    pf.waiting.push_back(b);
                } else {
                    pf.pending.push_back(b);
                }
            }
            BatchEventKind::Refused => {
                // Nothing this point says about the flow is a measurement until it reports it.
                pf.watch = Watch::NotWatched;
                if let Some(r) = self.refusing.get_mut(usize::from(p)) {
                    *r = true;
                }
                // A batch the point retired (idle, evicted) and then refused the rest of was
                // cut short by the end of watching, as a deselected one is: not comparable
                // with the whole batch upstream.
                for b in pf.pending.iter_mut().chain(pf.waiting.iter_mut()) {
                    b.cut |= b.tail;
                }
                for v in pf.awaiting_neighbours.iter_mut().filter(|v| v.batch.tail) {
                    v.batch.cut = true;
                    v.expected = None;
                    v.upstream = None;
                }
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
            BatchEventKind::Gap | BatchEventKind::OwnColour => {}
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
            let Some(&(mut b)) = pf.waiting.front() else { break };
            let must = force || pf.waiting.len() > WAIT_MAX;
            let (expected, id, matched_up) = match upstream {
                _ if marker => (Some(b.count + b.late), b.id, None),
                None => {
                    let e = self.batch.filter(|_| !b.tail).map(u64::from);
                    (e, b.id, None)
                }
                Some(u) => match self.match_upstream(key, (p, u), &mut b, skew, &mut wiped) {
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
            for (w, lost) in wiped.drain(..) {
                self.account_wiped(key, p, &w, lost);
            }
            self.account(
                key,
                p,
                Verdict { batch: b, expected, id, upstream: matched_up, uncertain: b.uncertain },
            );
        }
        for i in 0..self.downstream[usize::from(p)].len() {
            let q = self.downstream[usize::from(p)][i];
            self.resolve(key, q, force);
        }
    }

    /// Finds the upstream batches this batch is (same color, overlapping in time; several when
    /// a whole batch in between was lost here and two batches of this color merged). Upstream
    /// batches older than the match that nothing matched are returned in `wiped`: lost whole
    /// on this segment (`true`) when the point's previous batch was in the same watch
    /// ([`Span::Continues`]), uncertain (`false`) when this batch began a new one, and not at
    /// all when the point had chosen not to watch the flow ([`Span::Rejoins`]). A batch cut
    /// short by the end of watching is only compared with upstream batches cut at the same
    /// moment; against a whole one its expectation is unknown (`Found(None, _)`). At a point
    /// whose table has refused flows, or after events were lost, the first batch of a new
    /// watch that began after its upstream batch began may not have been seen from its start
    /// (the flow admitted once an idle flow made room, its refusal forgotten by the point or
    /// its event lost): its shortfall is uncertain, never lost. (Points arm the flows they
    /// remember refusing, so that they report only whole batches; this covers the rest.)
    fn match_upstream(
        &mut self,
        key: &FlowKey,
        (p, u): (u8, u8),
        b: &mut Batch,
        skew: i64,
        wiped: &mut Vec<(Batch, bool)>,
    ) -> Match {
        let tol = self.tol_ns as i128;
        let pressed = self.gaps > 0 || self.refusing.get(usize::from(p)).copied().unwrap_or(true);
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
        if pressed
            && b.span == Span::Fresh
            && up.done.get(j).is_some_and(|x| i128::from(x.first_ns) + tol < first)
        {
            b.uncertain = true;
        }
        let mut expected = 0;
        let mut comparable = true;
        let id = up.done.get(j).map_or(0, |x| x.id);
        for (i, x) in up.done.iter_mut().enumerate() {
            if x.matched {
                continue;
            }
            if i < j {
                x.matched = true;
                match b.span {
                    Span::Continues => wiped.push((*x, true)),
                    Span::Fresh => wiped.push((*x, false)),
                    Span::Rejoins => {}
                }
            } else if x.color == b.color && overlaps(x) {
                x.matched = true;
                expected += x.count + x.late;
                comparable &= x.cut == b.cut;
            }
        }
        Match::Found(comparable.then_some(expected), id)
    }

    /// Takes a resolved batch of point `p` towards booking: it waits until
    /// [`DISORDER_REACH`] more batches have resolved, as a batch with excess packets (or one
    /// that matches no upstream batch of a flow the upstream point reported) makes the
    /// shortfall of the batches on either side of it uncertain.
    fn account(&mut self, key: &FlowKey, p: u8, mut v: Verdict) {
        let gaps = self.gaps;
        let upstream_reported = self.points[usize::from(p)]
            .upstream
            .is_some_and(|u| self.flows.contains_key(&(*key, u)));
        // (A point that never reported the flow gets an entry for its batches too.)
        let pf = self
            .flows
            .entry((*key, p))
            .or_insert_with(|| PointFlow { epoch: gaps, ..PointFlow::default() });
        let got = v.batch.count + v.batch.late;
        // Packets beyond what was sent, or a batch that matches nothing upstream although
        // its upstream reported the flow: the batches here no longer line up with those sent.
        // (Reordering does this, and so does a point that retired a flow in the middle of a
        // batch, idle there but not upstream, and admitted it again: the batch's two parts
        // are reported apart, the second matching nothing.)
        let b = &v.batch;
        let disordered = match v.expected {
            Some(e) => got > e,
            None => upstream_reported && !b.cut && got > 0,
        };
        if disordered {
            // What it holds beyond its expectation came from its neighbours: credited against
            // their shortfall when they are booked.
            pf.credit += got - v.expected.unwrap_or(0);
            for s in pf.awaiting_neighbours.iter_mut() {
                s.uncertain = true;
            }
            v.uncertain = true;
            pf.disorder = DISORDER_REACH;
        } else if pf.disorder > 0 {
            v.uncertain = true;
            pf.disorder -= 1;
        }
        pf.awaiting_neighbours.push_back(v);
        self.book_ready(key, p, DISORDER_REACH);
    }

    /// Books the batches of `key` at `p` that more than `keep` others have followed.
    fn book_ready(&mut self, key: &FlowKey, p: u8, keep: usize) {
        loop {
            let Some(pf) = self.flows.get_mut(&(*key, p)) else { return };
            if pf.awaiting_neighbours.len() <= keep {
                return;
            }
            let Some(v) = pf.awaiting_neighbours.pop_front() else { return };
            self.book(key, p, &v);
        }
    }

    /// Books a batch: its point's totals, the interval's summary, and its record.
    fn book(&mut self, key: &FlowKey, p: u8, v: &Verdict) {
        let b = &v.batch;
        let got = b.count + b.late;
        let short = v.expected.map_or(0, |e| e.saturating_sub(got));
        let (mut lost, mut uncertain) = (short, 0);
        if let Some(pf) = self.flows.get_mut(&(*key, p)) {
            if v.uncertain {
                // Packets a disordered neighbour holds beyond its expectation are not missing.
                let credit = short.min(pf.credit);
                pf.credit -= credit;
                (lost, uncertain) = (0, short - credit);
            }
            if pf.disorder == 0 && pf.awaiting_neighbours.iter().all(|s| !s.uncertain) {
                // The disordered stretch is over.
                pf.credit = 0;
            }
        }
        let c = LossCounts {
            batches: 1,
            lossy_batches: u64::from(lost > 0),
            expected: v.expected.unwrap_or(0),
            observed: b.count,
            late: b.late,
            lost,
            uncertain,
            uncertain_batches: u64::from(uncertain > 0),
            excess: v.expected.map_or(0, |e| got.saturating_sub(e)),
            unmatched: u64::from(v.expected.is_none()),
        };
        self.totals.entry((*key, p)).or_default().add(&c);
        if let Some(s) = self.interval.get_mut(usize::from(p)) {
            s.add(&c);
        }
        let spec = &self.points[usize::from(p)];
        if spec.marker || !(lost > 0 || uncertain > 0 || self.report_all || spec.every_batch) {
            return;
        }
        let (batch, period_ns) = match self.period_ns {
            Some(t) => (period_number(b.ordinal, b.first_ns, t), Some(t)),
            None => (v.id, None),
        };
        self.out.push_back(Record::Loss(LossRecord {
            agent: spec.agent.clone(),
            port: spec.port.clone(),
            point: spec.name.clone(),
            upstream: match v.upstream {
                Some(u) => Some(self.points[usize::from(u)].name.clone()),
                // The configured upstream in another agent, whether or not this batch had a
                // count to compare with (time-based marking never gives one).
                None => spec.upstream_label.clone(),
            },
            scope: spec.scope(),
            flow: Flow::from(key),
            color: b.color,
            batch,
            period_ns,
            first_ns: b.first_ns,
            last_ns: b.last_ns,
            expected: v.expected,
            observed: b.count,
            lost,
            late: b.late,
            uncertain,
            tail: b.tail,
            incomplete: b.uncertain,
            ttl: b.ttl,
            own_colour: 0,
            drops: Vec::new(),
        }));
    }

    /// Names a flow whose sender set the colour bit in a record of the marker's point: packets
    /// left as they were, no measurement (`incomplete`), a segment inside the agent.
    fn own_colour(&mut self, ev: &BatchEvent) {
        let spec = &self.points[usize::from(ev.point)];
        let (batch, period_ns) = match self.period_ns {
            Some(t) => (period_number(ev.ordinal, ev.first_ns, t), Some(t)),
            None => (u64::from(ev.ordinal), None),
        };
        self.out.push_back(Record::Loss(LossRecord {
            agent: spec.agent.clone(),
            port: spec.port.clone(),
            point: spec.name.clone(),
            upstream: None,
            scope: Scope::Segment,
            flow: Flow::from(&ev.key),
            color: 0,
            batch,
            period_ns,
            first_ns: ev.first_ns,
            last_ns: ev.last_ns,
            expected: None,
            observed: 0,
            lost: 0,
            late: 0,
            uncertain: 0,
            tail: false,
            incomplete: true,
            ttl: ev.ttl,
            own_colour: u64::from(ev.count),
            drops: Vec::new(),
        }));
    }

    /// An upstream batch of which not one packet reached point `p`: lost whole, or (`lost`
    /// false) uncertain.
    fn account_wiped(&mut self, key: &FlowKey, p: u8, up: &Batch, lost: bool) {
        let gone = Batch { count: 0, late: 0, ..*up };
        let upstream = self.points[usize::from(p)].upstream;
        let expected = Some(up.count + up.late);
        self.account(
            key,
            p,
            Verdict { batch: gone, expected, id: up.id, upstream, uncertain: !lost },
        );
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
        // Upstream batches nothing downstream matched: lost whole where the downstream point
        // was still watching the flow, uncertain where its watch had ended (or it never
        // reported the flow), not reported where it chose not to watch.
        for (k, u) in order.iter().copied() {
            for i in 0..self.downstream[usize::from(u)].len() {
                let q = self.downstream[usize::from(u)][i];
                let gaps = self.gaps;
                let watch = self.flows.get(&(k, q)).map(|pf| (pf.watch, pf.epoch == gaps));
                if watch.is_some_and(|(w, _)| w == Watch::NotWatched) {
                    continue;
                }
                // (Still watching as far as its events tell, unless some may have been lost.)
                let lost = watch == Some((Watch::Watching, true));
                let Some(pf) = self.flows.get_mut(&(k, u)) else { continue };
                let missed: Vec<Batch> = pf
                    .done
                    .iter_mut()
                    .filter(|x| !x.matched)
                    .map(|x| {
                        x.matched = true;
                        *x
                    })
                    .collect();
                for w in missed {
                    self.account_wiped(&k, q, &w, lost);
                }
            }
        }
        let all: Vec<(FlowKey, u8)> = self.flows.keys().copied().collect();
        for (k, p) in all {
            self.book_ready(&k, p, 0);
        }
    }

    /// Forgets flows whose last batch at every point ended before `before_ns` and that have
    /// nothing in flight (a long-running agent's memory stays bounded by its active flows);
    /// their loss was reported when it happened. A flow is forgotten at all its points at
    /// once, so that no point's batches outlive what its neighbours knew of the flow (a refusal
    /// forgotten before the upstream batches it explains would make them look lost). Returns
    /// the (flow, point) entries forgotten.
    pub fn forget_before(&mut self, before_ns: u64) -> usize {
        let mut live: HashSet<FlowKey> = HashSet::new();
        for ((k, _), pf) in &self.flows {
            let stale = pf.pending.is_empty()
                && pf.waiting.is_empty()
                && pf.done.back().is_none_or(|b| b.last_ns < before_ns);
            if !stale {
                live.insert(*k);
            }
        }
        let stale: Vec<(FlowKey, u8)> =
            self.flows.keys().filter(|(k, _)| !live.contains(k)).copied().collect();
        for (k, p) in &stale {
            self.book_ready(k, *p, 0);
        }
        for k in &stale {
            self.flows.remove(k);
            self.totals.remove(k);
        }
        stale.len()
    }

    /// Books every resolved batch of flows whose last batch at a point ended before
    /// `before_ns`: held for the batches that might follow them (see [`DISORDER_REACH`]), they
    /// are final once the flow has been quiet that long (a live agent calls this now and then,
    /// with a horizon of a few idle timeouts, so that a flow's last batches are not held until
    /// it is forgotten).
    pub fn book_quiet_before(&mut self, before_ns: u64) {
        let quiet: Vec<(FlowKey, u8)> = self
            .flows
            .iter()
            .filter(|(_, pf)| {
                pf.awaiting_neighbours.back().is_some_and(|v| v.batch.last_ns < before_ns)
            })
            .map(|(k, _)| *k)
            .collect();
        for (k, p) in quiet {
            self.book_ready(&k, p, 0);
        }
    }

    /// Takes the next record to export.
    pub fn poll_record(&mut self) -> Option<Record> {
        self.out.pop_front()
    }

    /// Per-point summaries since the last call, as records; starts a new interval.
    pub fn summaries(&mut self, start_ns: u64, end_ns: u64) -> Vec<Record> {
        let mut v = Vec::with_capacity(self.points.len());
        for (spec, c) in self.points.iter().zip(self.interval.iter_mut()) {
            v.push(Record::Summary(SummaryRecord {
                agent: spec.agent.clone(),
                point: spec.name.clone(),
                interval_start_ns: start_ns,
                interval_end_ns: end_ns,
                scope: spec.scope(),
                counts: std::mem::take(c),
                rx_ring_drops: 0,
            }));
        }
        v
    }

    /// Totals of one flow at one point.
    pub fn totals(&self, key: &FlowKey, point: u8) -> LossCounts {
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
                        scope: s.scope(),
                        counts: *t,
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
            every_batch: false,
        }
    }

    #[test]
    fn a_periods_whole_number_comes_back_from_its_low_bits() {
        const T: u64 = 100_000_000;
        // 2026 in periods of 100 ms is past 2^32; the point's clock a period either way.
        for k in [17_000_000_000u64, (1 << 32) * 4 - 1, (1 << 32) * 4, 5] {
            for off in [-(T as i64), -1, 0, T as i64 / 2, 2 * T as i64] {
                let first = (k * T) as i64 + off;
                assert_eq!(period_number(k as u32, first.max(0) as u64, T), k, "{k} {off}");
            }
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
            ttl: None,
        };
        agg.handle(ev(1, BatchEventKind::Closed, 100));
        agg.handle(ev(2, BatchEventKind::Closed, 1_000));
        agg.handle(ev(3, BatchEventKind::Refused, 0));
        // Resolved batches are held for the batches that may follow, until the flow is quiet.
        assert_eq!(agg.totals(&crate::loss::test_key(1), 0).batches, 0);
        agg.book_quiet_before(500);
        assert_eq!(agg.totals(&crate::loss::test_key(1), 0).batches, 1);
        assert_eq!(agg.totals(&crate::loss::test_key(2), 0).batches, 0);
        assert_eq!(agg.forget_before(500), 2, "flow 1 and the refused flow 3");
        assert_eq!(agg.totals(&crate::loss::test_key(1), 0), LossCounts::default());
        agg.book_quiet_before(2_000);
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

    /// One flow of `n` packets from the marker (point 0) through ingress (1) and egress (2),
    /// packet `i` dropped on the link when `link(i)` and inside the switch when `switch(i)`;
    /// everything flushed and resolved.
    fn run_path(
        n: u64,
        link: impl Fn(u64) -> bool,
        switch: impl Fn(u64) -> bool,
    ) -> (FlowKey, Aggregator) {
        let cfg = LossConfig::default();
        let (mut m, [mut ing, mut eg], mut agg) = marker_ingress_egress(&cfg);
        let k = FlowKey::default();
        let h = crate::flow_hash(&k);
        let mut ev: Vec<BatchEvent> = Vec::new();
        for i in 0..n {
            let (c, _) = m.mark(&k, h, i, &mut ev).unwrap();
            if !link(i) {
                ing.observe(&k, h, c, i, &mut ev);
                if !switch(i) {
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
        (k, agg)
    }

    /// A whole batch lost between two batches the point saw is lost; one lost before its first
    /// batch or after its last is uncertain (the point may not have been watching then).
    #[test]
    fn whole_batches_are_lost_inside_a_watch_and_uncertain_at_its_edges() {
        for (gone, lost, uncertain) in [(3u64, 100, 0), (0, 0, 100), (9, 0, 100)] {
            let (k, agg) = run_path(1000, |i| i / 100 == gone, |_| false);
            let t = agg.totals(&k, 1);
            assert_eq!((t.lost, t.uncertain), (lost, uncertain), "batch {gone} lost: {t:?}");
            // Inside the switch nothing was lost, whatever happened on the link.
            let e = agg.totals(&k, 2);
            assert_eq!((e.lost, e.uncertain), (0, 0), "batch {gone} lost: {e:?}");
        }
    }

    /// A point that began watching a flow after the batch began (admitted once a full table
    /// made room, its refusal unknown to the aggregator: forgotten, or its event lost) has no
    /// count of the whole batch: 26 packets marked, the ingress admitted the flow for its last
    /// one. Uncertain, not lost; and the batches after it are measured as usual.
    #[test]
    fn a_batch_joined_part_way_is_not_lost() {
        let mut agg = Aggregator::new(
            vec![spec("marker", None, true), spec("ingress", Some(0), false)],
            Some(100),
            0,
        )
        .report_all(true);
        let k = crate::loss::test_key(1);
        let ev = |point: u8, ordinal: u32, color: u8, count: u32, first_ns: u64, last_ns: u64| {
            BatchEvent {
                key: k,
                point,
                kind: BatchEventKind::Closed,
                color,
                ordinal,
                count,
                first_ns,
                last_ns,
                tail: false,
                head: false,
                cut: false,
                ttl: None,
            }
        };
        // The ingress table is full: it refuses flows (another one's event came through).
        agg.handle(BatchEvent::refused(&crate::loss::test_key(2), 1));
        // Batch 0: marked from t=0, seen at ingress from t=2,500 (one packet); batch 1 whole
        // at both, 3 of its packets lost on the way.
        agg.handle(ev(0, 0, 0, 26, 0, 2_500));
        agg.handle(ev(1, 0, 0, 1, 2_500, 2_500));
        agg.handle(ev(0, 1, 1, 100, 2_600, 3_600));
        agg.handle(ev(1, 1, 1, 97, 2_600, 3_600));
        agg.flush();
        let t = agg.totals(&k, 1);
        assert_eq!((t.lost, t.uncertain), (3, 25), "{t:?}");
    }

    /// Marker → ingress → egress with a deterministic drop pattern at each segment.
    #[test]
    fn per_segment_loss_equals_drops() {
        let (link, switch) = (|i: u64| i % 97 == 5, |i: u64| i % 89 == 7);
        let (k, mut agg) = run_path(1050, link, switch);
        let link_drops = (0..1050).filter(|&i| link(i)).count() as u64;
        let sw_drops = (0..1050).filter(|&i| !link(i) && switch(i)).count() as u64;
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
