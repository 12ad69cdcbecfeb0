//! `telemark replay`: captures (or generated traffic) through the evaluation pipeline, and
//! two-point analysis of captures taken at two places on a path.

use crate::cli::gen::load_sizes;
use crate::cli::opts::{parse_drop, LossOpts};
use crate::dropper::{DropModel, Placement};
use crate::gen::{self as g, GenConfig};
use crate::pipeline::{HeavyConfig, Replay, ReplayConfig};
use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use telemark_core::loss::{color_of, Aggregator, AnyColorTable, BatchEvent, LossConfig, PointSpec};
use telemark_core::records::{FlowLossRecord, FlowRecord, LossCounts, Record};
use telemark_core::sketch::sfcmon::HhConfig;
use telemark_core::{flow_hash, FlowKey};
use telemark_datapath::input::Input;
use telemark_wire::flow::{extract, LinkType, SkipReason};

/// `telemark replay` flags.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Capture to replay (pcap or pcapng).
    #[arg(value_name = "CAPTURE")]
    pub capture: Option<PathBuf>,
    /// Replay N generated flows instead of a capture (no file needed).
    #[arg(long, value_name = "FLOWS", conflicts_with = "capture")]
    pub generate: Option<usize>,
    /// Two-point analysis: NAME=FILE, given twice, upstream first (e.g. --point up=a.pcap
    /// --point down=b.pcap). The captures must hold already-marked traffic.
    #[arg(long = "point", value_name = "NAME=FILE", conflicts_with_all = ["capture", "generate"])]
    pub points: Vec<String>,
    /// The capture is already colored: do not mark at the first hop.
    #[arg(long)]
    pub marked: bool,
    /// Drop packets: PLACE=PROB or PLACE=PROB:BURST (PLACE: ingress, switch, egress). Repeatable.
    #[arg(long = "drop-at", value_name = "PLACE=P[:BURST]")]
    pub drops: Vec<String>,
    /// Reorder packets on the ingress link by up to this many positions.
    #[arg(long, default_value_t = 0)]
    pub reorder: u64,
    /// Seed of droppers, reorderer and generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print records as JSON lines (DESIGN.md schema) instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Report every batch, not only lossy ones.
    #[arg(long)]
    pub all_batches: bool,
    /// Flows (and batches) to list in the text output.
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// Agent name in records.
    #[arg(long, default_value = "replay")]
    pub agent: String,
    /// Two-point analysis: how far apart (after removing the median offset) the two
    /// captures' times of one batch may be: path jitter plus clock wander, e.g. 1ms.
    #[arg(long, default_value = "1ms", value_parser = crate::cli::opts::parse_duration_ns)]
    pub tolerance: u64,
    /// Flow-size file for --generate.
    #[arg(long, value_name = "FILE")]
    pub sizes: Option<PathBuf>,
    /// Run the SFCMon heavy-hitter pipeline at the switch's ingress in windows of T and list
    /// each window's top flows next to their exact counts (implied by --select-top and
    /// --top-flows, with 1s).
    #[arg(long, value_name = "T", value_parser = crate::cli::opts::parse_duration_ns)]
    pub hh_window: Option<u64>,
    /// Active flow selection: the loss monitor watches only the N flows with the most packets
    /// in the last window, as the heavy-hitter pipeline found them (default: first come first
    /// served).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub select_top: Option<u64>,
    /// Heavy flows listed per window in the text output.
    #[arg(long, value_name = "K")]
    pub top_flows: Option<usize>,
    #[command(flatten)]
    pub loss: LossOpts,
}

/// Runs `telemark replay`.
pub fn run(a: Args) -> Result<()> {
    let loss = a.loss.config()?;
    if !a.points.is_empty() {
        return two_point(&a, loss);
    }
    let drops: Vec<(Placement, DropModel)> =
        a.drops.iter().map(|d| parse_drop(d)).collect::<Result<_>>()?;
    let cfg = ReplayConfig {
        loss,
        mark: !a.marked,
        drops,
        reorder: a.reorder,
        seed: a.seed,
        agent: a.agent.clone(),
        // With selection, every batch is kept so that the ground truth can be summed over the
        // batches each flow was watched in (the flow's other drops were never watched);
        // only lossy ones are printed unless --all-batches.
        report_all: a.all_batches || a.select_top.is_some(),
        heavy: heavy_config(&a),
    };
    match (&a.capture, a.generate) {
        (Some(path), None) => {
            // Streamed: memory is the pipeline's state, whatever the capture's size.
            let mut input = Input::open(path)?;
            let mut r = Replay::new(cfg, input.link);
            while let Some(p) = input.next_packet() {
                r.push(p);
            }
            r.finish();
            for (reason, n) in SkipReason::ALL.iter().zip(r.skipped) {
                input.skip(reason.as_str(), n);
            }
            let source = path.display().to_string();
            report_replay(&a, &mut r, &source, Some(&input))?;
            input.check_complete()
        }
        (None, Some(flows)) => {
            if flows == 0 {
                bail!("--generate needs at least 1 flow");
            }
            let dist = load_sizes(a.sizes.as_deref(), a.seed)?;
            let gc = GenConfig { flows, seed: a.seed, ..GenConfig::default() };
            let mut r = Replay::new(cfg, LinkType::Ethernet);
            for p in g::packets(&gc, &g::plan(&gc, &dist)) {
                r.push(p);
            }
            r.finish();
            let source = format!("{flows} generated flows (sizes from {})", dist.source);
            report_replay(&a, &mut r, &source, None)
        }
        _ => bail!(
            "give a CAPTURE, --generate N, or two --point NAME=FILE (see telemark replay --help)"
        ),
    }
}

/// Heavy hitters per window, when any flag asks for them.
fn heavy_config(a: &Args) -> Option<HeavyConfig> {
    if a.hh_window.is_none() && a.select_top.is_none() && a.top_flows.is_none() {
        return None;
    }
    Some(HeavyConfig {
        hh: HhConfig::default(),
        window_ns: a.hh_window.unwrap_or(1_000_000_000),
        select_top: a.select_top.map(|n| n as usize),
        exact_top: a.top_flows.unwrap_or(5).max(1),
    })
}

/// Each window's listed flows as `flow` records, with the exact counts beside.
fn flow_records(a: &Args, r: &Replay) -> Vec<Record> {
    let mut v = Vec::new();
    for w in r.windows() {
        for f in &w.hh.flows {
            let truth = w.exact.get(&f.key);
            v.push(Record::Flow(FlowRecord {
                truth_packets: truth.map(|t| t.0),
                truth_bytes: truth.map(|t| t.1),
                ..FlowRecord::heavy(&a.agent, "in", (w.start_ns, w.end_ns), &w.hh, f)
            }));
        }
    }
    v
}

/// The heavy-hitter windows as text: one line per window, then its top flows.
fn report_windows(a: &Args, r: &Replay, out: &mut impl Write) -> Result<()> {
    let windows = r.windows();
    let Some(first) = windows.first() else { return Ok(()) };
    let k = a.top_flows.unwrap_or(5);
    writeln!(
        out,
        "\nheavy hitters at the switch's ingress (SFCMon pipeline, {} s windows), top {k} per window next to the exact count:",
        (first.end_ns - first.start_ns) as f64 / 1e9
    )?;
    writeln!(
        out,
        "{:>6} {:<48} {:>9} {:>7} {:>9} {:>12} {:>12}",
        "window", "flow", "packets", "±bound", "exact", "bytes", "exact bytes"
    )?;
    for (i, w) in windows.iter().enumerate() {
        writeln!(
            out,
            "{i:>6} {} packets, {} heavy flows listed{}{}",
            w.hh.packets,
            w.hh.flows.len(),
            if w.hh.complete {
                ""
            } else {
                " (IBLT listing INCOMPLETE: more heavy flows than it could list)"
            },
            w.selected.map_or(String::new(), |n| format!("; loss monitor watches these {n} next"))
        )?;
        for f in w.hh.flows.iter().take(k) {
            let (ep, eb) = w.exact.get(&f.key).copied().unwrap_or_default();
            writeln!(
                out,
                "{:>6} {:<48} {:>9} {:>7} {:>9} {:>12} {:>12}",
                "",
                f.key.to_string(),
                f.packets,
                f.error_bound,
                ep,
                f.bytes,
                eb
            )?;
        }
        let missed: Vec<&FlowKey> = w
            .exact_top
            .iter()
            .take(k)
            .filter(|x| !w.hh.flows.iter().any(|f| f.key == **x))
            .collect();
        for x in missed {
            let (ep, _) = w.exact.get(x).copied().unwrap_or_default();
            writeln!(
                out,
                "{:>6} {:<48} {:>9} {:>7} {:>9}   (not listed)",
                "",
                x.to_string(),
                "-",
                "-",
                ep
            )?;
        }
    }
    Ok(())
}

fn report_replay(a: &Args, r: &mut Replay, source: &str, input: Option<&Input>) -> Result<()> {
    let mut skipped: Vec<(String, u64)> = match input {
        Some(i) => i.skipped().iter().map(|(k, n)| (k.clone(), *n)).collect(),
        None => SkipReason::ALL
            .iter()
            .zip(r.skipped)
            .filter(|(_, n)| *n > 0)
            .map(|(k, n)| (k.as_str().to_string(), n))
            .collect(),
    };
    skipped.sort();
    let mut out = std::io::stdout().lock();
    let records: Vec<Record> = std::iter::from_fn(|| r.agg.poll_record()).collect();
    let summaries = r.agg.summaries(0, 0);
    let flows = r.agg.flow_records();
    let r = &*r;
    // With selection, a flow's drops while it was not watched are not the point's to see:
    // the truth is summed over the batches the point compared.
    let mut watched_truth: HashMap<(FlowKey, u8), u64> = HashMap::new();
    if a.select_top.is_some() {
        for rec in &records {
            let Record::Loss(l) = rec else { continue };
            let point = r.agg.points().iter().position(|p| p.name == l.point).unwrap_or(0) as u8;
            let (Some(pl), Some(_), Ok(key)) =
                (Replay::placement_of_point(point), l.expected, FlowKey::try_from(&l.flow))
            else {
                continue;
            };
            let t = r.truth(pl, &key, u32::try_from(l.batch).ok());
            *watched_truth.entry((key, point)).or_default() += t;
        }
    }
    let truth = |key: &FlowKey, point: u8| {
        let pl = Replay::placement_of_point(point)?;
        if a.select_top.is_some() {
            return Some(watched_truth.get(&(*key, point)).copied().unwrap_or(0));
        }
        Some(r.truth(pl, key, None))
    };
    if a.json {
        if let Some(i) = input {
            writeln!(out, "{}", serde_json::to_string(&Record::Capture(i.record()))?)?;
        }
        for rec in &records {
            if matches!(rec, Record::Loss(l) if l.lost == 0 && !a.all_batches) {
                continue;
            }
            writeln!(out, "{}", serde_json::to_string(rec)?)?;
        }
        for (k, p, f) in &flows {
            if *p == 0 {
                continue;
            }
            let rec = Record::FlowLoss(FlowLossRecord { truth_lost: truth(k, *p), ..f.clone() });
            writeln!(out, "{}", serde_json::to_string(&rec)?)?;
        }
        for s in &summaries {
            writeln!(out, "{}", serde_json::to_string(s)?)?;
        }
        for f in flow_records(a, r) {
            writeln!(out, "{}", serde_json::to_string(&f)?)?;
        }
        return Ok(());
    }
    writeln!(out, "replayed {source}: {} packets", r.packets)?;
    if let Some(rec) = input.map(|i| i.record()) {
        if rec.cut > 0 {
            writeln!(out, "{} packets cut by the capture's snapshot length (counted at their length on the wire)", rec.cut)?;
        }
        if let Some(d) = rec.damaged {
            writeln!(out, "stopped at a damaged record ({d}): the results cover what came before")?;
        }
    }
    if !skipped.is_empty() {
        let s: Vec<String> = skipped.iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(out, "skipped: {}", s.join(", "))?;
    }
    if let Some(m) = r.marker_stats().filter(|m| m.refused > 0) {
        writeln!(
            out,
            "marker: {} flows marked, {} packets of flows left unmarked (no room in its table of {}; raise --table-size)",
            m.admitted, m.refused, a.loss.table_size.max(crate::pipeline::MARKER_FLOWS)
        )?;
    }
    if let Some([st, _]) = r.switch.point_stats() {
        writeln!(
            out,
            "flow table: {} flows measured, {} packets of flows refused (room for {})",
            st.admitted,
            st.refused,
            r.switch.capacity(),
        )?;
        let nh = r.next_hop_stats();
        writeln!(
            out,
            "next hop: {} flows measured, {} packets of flows refused (room for {})",
            nh.admitted, nh.refused, a.loss.table_size
        )?;
        if a.select_top.is_some() {
            writeln!(
                out,
                "active flow selection (top {} per window): {} packets of flows not selected, {} flows dropped from watch",
                a.select_top.unwrap_or(0),
                st.unselected,
                st.deselected
            )?;
        }
    }
    for pl in Placement::ALL {
        if let Some(d) = r.dropper(pl) {
            writeln!(
                out,
                "dropper@{}: {} of {} packets dropped ({:.3} %)",
                pl.as_str(),
                d.dropped,
                d.seen,
                100.0 * d.rate()
            )?;
        }
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:<9} {:>7} {:>6} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8}   segment",
        "point", "batches", "lossy", "expected", "observed", "late", "lost", "uncertain", "truth"
    )?;
    if a.select_top.is_some() {
        writeln!(out, "(truth: the droppers' drops in the batches each point compared)")?;
    }
    let mut per_point: HashMap<u8, (LossCounts, u64)> = HashMap::new();
    for (k, p, f) in &flows {
        let e = per_point.entry(*p).or_default();
        e.0.add(&f.counts);
        e.1 += truth(k, *p).unwrap_or(0);
    }
    let mut pts: Vec<_> = per_point.into_iter().filter(|(p, _)| *p != 0).collect();
    pts.sort_by_key(|(p, _)| *p);
    for (p, (c, truth)) in pts {
        let name = &r.agg.points()[usize::from(p)].name;
        let seg = match p {
            1 => "link into the switch (marker → ingress)",
            2 => "inside the switch (ingress → egress)",
            _ => "link out of the switch (egress → next hop)",
        };
        writeln!(
            out,
            "{:<9} {:>7} {:>6} {:>9} {:>9} {:>6} {:>8} {:>9} {:>8}   {seg}",
            name,
            c.batches,
            c.lossy_batches,
            c.expected,
            c.observed,
            c.late,
            c.lost,
            c.uncertain,
            truth
        )?;
        if c.excess > 0 {
            writeln!(
                out,
                "{:<9} {} packets more than were sent in some batches: reordering deeper than the threshold moved packets between batches; their neighbours' shortfall is uncertain (docs/loss.md)",
                "", c.excess
            )?;
        }
    }
    if r.agg.gaps() > 0 {
        writeln!(
            out,
            "telemetry events were lost {} times: the batches they concerned are uncertain",
            r.agg.gaps()
        )?;
    }
    let mut lossy: Vec<_> = flows
        .iter()
        .filter(|(k, p, f)| {
            *p != 0 && (f.counts.lost + f.counts.uncertain > 0 || truth(k, *p).unwrap_or(0) > 0)
        })
        .collect();
    lossy.sort_by(|x, y| y.2.counts.lost.cmp(&x.2.counts.lost).then(x.0.cmp(&y.0)));
    if !lossy.is_empty() {
        writeln!(out, "\nflows with loss (top {} of {}):", a.top.min(lossy.len()), lossy.len())?;
        writeln!(
            out,
            "{:<52} {:<9} {:>7} {:>9} {:>6} {:>6} {:>9} {:>6}",
            "flow", "point", "batches", "expected", "late", "lost", "uncertain", "truth"
        )?;
        for (k, p, f) in lossy.iter().take(a.top) {
            writeln!(
                out,
                "{:<52} {:<9} {:>7} {:>9} {:>6} {:>6} {:>9} {:>6}",
                k.to_string(),
                f.point,
                f.counts.batches,
                f.counts.expected,
                f.counts.late,
                f.counts.lost,
                f.counts.uncertain,
                truth(k, *p).unwrap_or(0)
            )?;
        }
    } else {
        writeln!(out, "\nno flow lost packets")?;
    }
    report_windows(a, r, &mut out)
}

/// One point's capture in a two-point analysis, streamed: the packets with a flow key, as
/// (time, flow, color).
struct PointCapture {
    name: String,
    input: Input,
    color_bit: u8,
    keyed: u64,
    next: Option<(u64, FlowKey, u8)>,
}

impl PointCapture {
    fn open(spec: &str, color_bit: u8) -> Result<PointCapture> {
        let Some((name, file)) = spec.split_once('=') else {
            bail!("--point takes NAME=FILE (like up=a.pcap), not '{spec}'");
        };
        if name.is_empty() || file.is_empty() {
            bail!("--point takes NAME=FILE (like up=a.pcap), not '{spec}'");
        }
        let input = Input::open(&PathBuf::from(file))?;
        let mut pc =
            PointCapture { name: name.to_string(), input, color_bit, keyed: 0, next: None };
        pc.advance();
        Ok(pc)
    }

    /// Reads up to the next packet with a flow key.
    fn advance(&mut self) {
        self.next = None;
        while let Some(p) = self.input.next_packet() {
            match extract(&p.data, self.input.link) {
                Ok(parsed) => {
                    self.keyed += 1;
                    self.next = Some((p.ts_ns, parsed.key, color_of(parsed.dscp, self.color_bit)));
                    return;
                }
                Err(e) => self.input.skip(e.as_str(), 1),
            }
        }
    }

    /// Takes the next keyed packet.
    fn take(&mut self) -> Option<(u64, FlowKey, u8)> {
        let n = self.next.take();
        if n.is_some() {
            self.advance();
        }
        n
    }
}

/// Median over flows seen at both points of (first time downstream − first time upstream):
/// one pass over both captures, memory per flow.
fn estimate_skew(a: &Args, color_bit: u8) -> Result<i64> {
    let mut first_up: HashMap<FlowKey, u64> = HashMap::new();
    let mut up = PointCapture::open(&a.points[0], color_bit)?;
    while let Some((t, k, _)) = up.take() {
        first_up.entry(k).or_insert(t);
    }
    let mut down = PointCapture::open(&a.points[1], color_bit)?;
    let mut seen = std::collections::HashSet::new();
    let mut d: Vec<i64> = Vec::new();
    while let Some((t, k, _)) = down.take() {
        if seen.insert(k) {
            if let Some(u) = first_up.get(&k) {
                d.push(t as i64 - *u as i64);
            }
        }
    }
    d.sort_unstable();
    Ok(d.get(d.len() / 2).copied().unwrap_or(0))
}

fn two_point(a: &Args, loss: LossConfig) -> Result<()> {
    if a.points.len() != 2 {
        bail!(
            "two-point analysis takes exactly two --point NAME=FILE (upstream first), got {}",
            a.points.len()
        );
    }
    if !a.drops.is_empty() || a.reorder > 0 {
        bail!(
            "--drop-at and --reorder apply to replay, not to two-point analysis of real captures"
        );
    }
    if heavy_config(a).is_some() {
        bail!(
            "--hh-window, --select-top and --top-flows apply to replay, not to two-point analysis"
        );
    }
    let skew = estimate_skew(a, loss.color_bit)?;
    let mut up = PointCapture::open(&a.points[0], loss.color_bit).context("upstream point")?;
    let mut down = PointCapture::open(&a.points[1], loss.color_bit).context("downstream point")?;
    if up.name == down.name {
        bail!("the two points need different names, both are '{}'", up.name);
    }
    let spec = |name: &str, upstream, skew_ns| PointSpec {
        name: name.into(),
        agent: a.agent.clone(),
        port: "-".into(),
        upstream,
        marker: false,
        skew_ns,
        upstream_label: None,
        every_batch: false,
    };
    let mut agg = Aggregator::new(
        vec![spec(&up.name, None, 0), spec(&down.name, Some(0), skew)],
        None,
        a.tolerance,
    )
    .report_all(a.all_batches);
    let mut tables = [AnyColorTable::new(&loss, 0), AnyColorTable::new(&loss, 1)];
    // Merge the two captures in (skew-corrected) time order, as the points would have seen
    // the packets, so the aggregator lines batches up as they close.
    let mut ev: Vec<BatchEvent> = Vec::new();
    loop {
        let take_up = match (&up.next, &down.next) {
            (Some(u), Some(d)) => (u.0 as i128) <= d.0 as i128 - i128::from(skew),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let (p, next) = if take_up { (0usize, up.take()) } else { (1usize, down.take()) };
        let Some((t, k, c)) = next else { break };
        if let Some(tb) = tables.get_mut(p) {
            tb.observe(&k, flow_hash(&k), c, t, &mut ev);
        }
        for e in ev.drain(..) {
            agg.handle(e);
        }
    }
    for t in tables.iter_mut() {
        t.flush(&mut ev);
        for e in ev.drain(..) {
            agg.handle(e);
        }
    }
    agg.flush();
    let mut out = std::io::stdout().lock();
    if a.json {
        for pc in [&up, &down] {
            writeln!(out, "{}", serde_json::to_string(&Record::Capture(pc.input.record()))?)?;
        }
        while let Some(rec) = agg.poll_record() {
            writeln!(out, "{}", serde_json::to_string(&rec)?)?;
        }
        for (_, p, f) in agg.flow_records() {
            if p == 1 {
                writeln!(out, "{}", serde_json::to_string(&Record::FlowLoss(f))?)?;
            }
        }
        up.input.check_complete()?;
        return down.input.check_complete();
    }
    for pc in [&up, &down] {
        let s: Vec<String> = pc.input.skipped().iter().map(|(k, n)| format!("{k} {n}")).collect();

        writeln!(
            out,
            "{}: {} ({} packets, {} with a flow key{}{})",
            pc.name,
            pc.input.path().display(),
            pc.input.packets(),
            pc.keyed,
            if s.is_empty() { "" } else { "; skipped: " },
            s.join(", ")
        )?;
    }
    writeln!(
        out,
        "clock offset + path delay {} → {}: {:.3} ms (median over flows)",
        up.name,
        down.name,
        skew as f64 / 1e6
    )?;
    let refused: u64 = tables.iter().map(|t| t.stats().refused).sum();
    if refused > 0 {
        writeln!(
            out,
            "{refused} packets of flows beyond --table-size {} were not measured",
            loss.table_size
        )?;
    }
    let flows: Vec<_> = agg.flow_records().into_iter().filter(|(_, p, _)| *p == 1).collect();
    let total_lost: u64 = flows.iter().map(|(_, _, f)| f.counts.lost).sum();
    let total_exp: u64 = flows.iter().map(|(_, _, f)| f.counts.expected).sum();
    let total_uncertain: u64 = flows.iter().map(|(_, _, f)| f.counts.uncertain).sum();
    writeln!(
        out,
        "{} → {}: {} of {} packets lost over {} flows{}\n",
        up.name,
        down.name,
        total_lost,
        total_exp,
        flows.len(),
        if total_uncertain > 0 {
            format!(", {total_uncertain} more uncertain (see docs/loss.md)")
        } else {
            String::new()
        }
    )?;
    writeln!(
        out,
        "{:<52} {:>7} {:>6} {:>9} {:>9} {:>6} {:>6} {:>9}",
        "flow", "batches", "lossy", "sent", "received", "late", "lost", "uncertain"
    )?;
    let mut fl = flows.clone();
    fl.sort_by(|x, y| y.2.counts.lost.cmp(&x.2.counts.lost).then(x.0.cmp(&y.0)));
    for (k, _, f) in fl.iter().take(a.top) {
        writeln!(
            out,
            "{:<52} {:>7} {:>6} {:>9} {:>9} {:>6} {:>6} {:>9}",
            k.to_string(),
            f.counts.batches,
            f.counts.lossy_batches,
            f.counts.expected,
            f.counts.observed + f.counts.late,
            f.counts.late,
            f.counts.lost,
            f.counts.uncertain
        )?;
    }
    let mut batches = Vec::new();
    while let Some(Record::Loss(l)) = agg.poll_record() {
        if l.lost > 0 {
            batches.push(l);
        }
    }
    if !batches.is_empty() {
        writeln!(
            out,
            "\nlossy batches (first {} of {}):",
            a.top.min(batches.len()),
            batches.len()
        )?;
        writeln!(
            out,
            "{:<44} {:>6} {:>5} {:>22} {:>8} {:>8} {:>5} {:>5}",
            "flow", "batch", "color", "first_ns", "expected", "observed", "late", "lost"
        )?;
        for l in batches.iter().take(a.top) {
            let f = &l.flow;
            writeln!(
                out,
                "{:<44} {:>6} {:>5} {:>22} {:>8} {:>8} {:>5} {:>5}",
                format!("{} {}:{} > {}:{}", f.proto, f.src, f.sport, f.dst, f.dport),
                l.batch,
                l.color,
                l.first_ns,
                l.expected.map_or("-".into(), |e| e.to_string()),
                l.observed,
                l.late,
                l.lost
            )?;
        }
    }
    up.input.check_complete()?;
    down.input.check_complete()
}
