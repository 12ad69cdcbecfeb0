//! What a record must be to be stored: checked at the boundary, so that nothing stored can
//! break a query or the page later (docs/collector.md, "Bad input").

use telemark_core::records::{EventRecord, Flow, LossRecord, Record};

/// Largest count (packets, bytes, frames, cycles, …) one record of any kind may carry:
/// 2^53 − 1, the largest integer every JSON reader holds exactly (RFC 8259 §6; JavaScript's
/// numbers). Every count of every record kind is held to it by [`counts`], one rule for agents,
/// Kafka and exporters alike; sums of stored counts saturate (`store.rs`, `usum`).
pub const MAX_COUNT: u64 = (1 << 53) - 1;
/// How far in the past a record may be dated.
pub const MAX_AGE_NS: u64 = 400 * 24 * 3600 * 1_000_000_000;
/// How far in the future (clocks disagree a little, never by a day).
pub const MAX_AHEAD_NS: u64 = 24 * 3600 * 1_000_000_000;

/// Why record `n` of a request was refused.
pub fn record(r: &Record, now: u64) -> Result<(), String> {
    if let Some(a) = r.agent() {
        name("agent", a)?;
    }
    counts(r)?;
    match r {
        Record::Loss(l) => loss(l, now),
        Record::Summary(s) => {
            name("point", &s.point)?;
            time_range(s.interval_start_ns, s.interval_end_ns, now)
        }
        Record::FlowLoss(f) => {
            name("point", &f.point)?;
            flow(&f.flow)
        }
        Record::Flow(f) => {
            name("point", &f.point)?;
            flow(&f.flow)?;
            time_range(f.window_start_ns, f.window_end_ns, now)
        }
        Record::Health(h) => {
            time_range(h.interval_start_ns, h.interval_end_ns, now)?;
            if h.hh_windows.len() > 4096 {
                return Err("more than 4,096 heavy-hitter windows in one health record".into());
            }
            h.hh_windows
                .iter()
                .try_for_each(|w| time_range(w.window_start_ns, w.window_end_ns, now))?;
            h.points.iter().try_for_each(|p| name("point", &p.point))
        }
        Record::Cost(c) => name("stage", &c.stage),
        Record::Event(e) => event(e, now),
        Record::Capture(_) => Err("capture records come from replay, not from agents".into()),
    }
}

fn event(e: &EventRecord, now: u64) -> Result<(), String> {
    const DETECTORS: [&str; 6] = ["per_hop", "per_flow", "ewma", "noop", "complex", "switch"];
    if !DETECTORS.contains(&e.detector.as_str()) {
        return Err(format!("detector {:?} (one of {})", e.detector, DETECTORS.join(", ")));
    }
    if let Some(m) = &e.metric {
        if telemark_core::int::Field::from_name(m).is_none() {
            return Err(format!("metric {m:?} is not an INT field"));
        }
    }
    if e.expression.as_ref().is_some_and(|x| x.len() > 1024) {
        return Err("expression longer than 1024 bytes".into());
    }
    if e.path.len() > 64 {
        return Err(format!("path of {} hops (at most 64)", e.path.len()));
    }
    flow(&e.flow)?;
    time_range(e.time_ns, e.time_ns, now)
}

fn loss(l: &LossRecord, now: u64) -> Result<(), String> {
    name("point", &l.point)?;
    name("port", &l.port)?;
    if let Some(u) = &l.upstream {
        // `point`, or `agent/point` for another agent's.
        u.split('/').try_for_each(|part| name("upstream", part))?;
    }
    flow(&l.flow)?;
    if l.color > 1 {
        return Err(format!("color {} (0 or 1)", l.color));
    }
    time_range(l.first_ns, l.last_ns, now)?;
    if let Some(e) = l.expected {
        if l.lost.saturating_add(l.uncertain) > e {
            return Err(format!(
                "lost {} + uncertain {} is more than the {e} expected",
                l.lost, l.uncertain
            ));
        }
    } else if l.lost > 0 {
        return Err(format!("lost {} with nothing expected", l.lost));
    }
    if l.drops.len() > MAX_DROP_REASONS {
        return Err(format!("{} drop reasons (at most {MAX_DROP_REASONS})", l.drops.len()));
    }
    for d in &l.drops {
        let ok = (1..=64).contains(&d.reason.len())
            && d.reason.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(format!("drop reason {:?}: 1-64 of A-Z, 0-9 and _", short(&d.reason)));
        }
    }
    Ok(())
}

/// Drop reasons one loss record may name (the kernel has about a hundred).
const MAX_DROP_REASONS: usize = 32;

fn flow(f: &Flow) -> Result<(), String> {
    for (what, a) in [("src", &f.src), ("dst", &f.dst)] {
        if a.parse::<core::net::IpAddr>().is_err() {
            return Err(format!("flow {what} {:?} is not an IP address", short(a)));
        }
    }
    if f.si.is_some() != f.spi.is_some() || f.spi.is_some_and(|s| s >= 1 << 24) {
        return Err("flow spi (24 bits) and si come together".into());
    }
    Ok(())
}

fn name(what: &str, s: &str) -> Result<(), String> {
    if telemark_core::records::valid_agent_name(s) {
        Ok(())
    } else {
        Err(format!("{what} {:?}: 1-64 of letters, digits and - _ . :", short(s)))
    }
}

fn time_range(first: u64, last: u64, now: u64) -> Result<(), String> {
    if last < first {
        return Err(format!("ends ({last}) before it begins ({first})"));
    }
    if first < now.saturating_sub(MAX_AGE_NS) || last > now.saturating_add(MAX_AHEAD_NS) {
        return Err(format!(
            "dated {first}..{last} ns, more than 400 days ago or a day ahead of the collector's \
             clock ({now})"
        ));
    }
    Ok(())
}

/// Whether every count `r` carries is at most [`MAX_COUNT`]; else which one is not. The one
/// rule for counts: `record` applies it to what agents and Kafka send, the store to what
/// exporters send (`Store::ingest_flows`).
pub fn counts(r: &Record) -> Result<(), String> {
    let loss = |c: &telemark_core::records::LossCounts| {
        [
            ("batches", c.batches),
            ("lossy_batches", c.lossy_batches),
            ("expected", c.expected),
            ("observed", c.observed),
            ("late", c.late),
            ("lost", c.lost),
            ("uncertain", c.uncertain),
            ("uncertain_batches", c.uncertain_batches),
            ("excess", c.excess),
            ("unmatched", c.unmatched),
        ]
    };
    let mut all: Vec<(&str, u64)> = Vec::new();
    match r {
        Record::Loss(l) => {
            all.extend([
                ("expected", l.expected.unwrap_or(0)),
                ("observed", l.observed),
                ("lost", l.lost),
                ("late", l.late),
                ("uncertain", l.uncertain),
                ("own_colour", l.own_colour),
            ]);
            all.extend(l.drops.iter().map(|d| ("drops", d.packets)));
        }
        Record::Summary(s) => {
            all.extend(loss(&s.counts));
            all.push(("rx_ring_drops", s.rx_ring_drops));
        }
        Record::FlowLoss(f) => {
            all.extend(loss(&f.counts));
            all.push(("truth_lost", f.truth_lost.unwrap_or(0)));
        }
        Record::Flow(f) => all.extend([
            ("packets", f.packets),
            ("bytes", f.bytes),
            ("error_bound", f.error_bound),
            ("truth_packets", f.truth_packets.unwrap_or(0)),
            ("truth_bytes", f.truth_bytes.unwrap_or(0)),
            ("estimate", f.heavy.estimate.unwrap_or(0)),
            ("estimate_bytes", f.heavy.estimate_bytes.unwrap_or(0)),
            ("window_packets", f.heavy.window_packets.unwrap_or(0)),
            ("threshold_packets", f.heavy.threshold_packets.unwrap_or(0)),
            ("window_flows", f.heavy.window_flows.unwrap_or(0)),
        ]),
        Record::Health(h) => {
            all.extend([
                ("rx", h.rx),
                ("rx_ring_drops", h.rx_ring_drops),
                ("tx_drops", h.tx_drops),
                ("events_lost", h.events_lost),
                ("export_dropped", h.export_dropped),
            ]);
            for p in &h.points {
                all.extend([
                    ("flows_admitted", p.flows_admitted),
                    ("flows_evicted", p.flows_evicted),
                    ("packets_refused", p.packets_refused),
                    ("packets_unselected", p.packets_unselected),
                    ("flows", p.flows),
                    ("capacity", p.capacity),
                ]);
            }
            for w in &h.hh_windows {
                all.extend([
                    ("hh_windows.packets", w.packets),
                    ("hh_windows.threshold_packets", w.threshold_packets),
                    ("hh_windows.heavy_flows", w.heavy_flows),
                ]);
            }
        }
        Record::Cost(c) => all.extend([("packets", c.packets), ("cycles", c.cycles)]),
        Record::Capture(c) => {
            all.extend([("packets", c.packets), ("cut", c.cut)]);
            all.extend(c.skipped.values().map(|v| ("skipped", *v)));
        }
        // An event's value is a measurement (a latency, a queue depth), not a count.
        Record::Event(_) => {}
    }
    match all.iter().find(|(_, v)| *v > MAX_COUNT) {
        Some((what, v)) => {
            Err(format!("{what} {v} is more than one record can carry ({MAX_COUNT}, 2^53 - 1)"))
        }
        None => Ok(()),
    }
}

/// The first 40 characters of `s`, for an error message.
fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A field of `got` (a request's JSON) that `known` (the same record as parsed, written back)
/// does not have: an unknown field, which the record types cannot refuse themselves where they
/// flatten their counters. A field holding `null`, `false` or 0 is let pass: the record types
/// leave out such optional fields when they write, and it carries nothing.
pub fn unknown_fields(
    got: &serde_json::Value,
    known: &serde_json::Value,
    at: &str,
) -> Option<String> {
    use serde_json::Value;
    let (Value::Object(g), Value::Object(k)) = (got, known) else {
        return None;
    };
    for (key, v) in g {
        let empty = match v {
            Value::Null | Value::Bool(false) => true,
            Value::Number(n) => n.as_u64() == Some(0),
            _ => false,
        };
        match k.get(key) {
            None if empty => {}
            None => return Some(format!("{at}{key}")),
            Some(kv) => {
                if let Some(f) = unknown_fields(v, kv, &format!("{at}{key}.")) {
                    return Some(f);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: u64 = 1_800_000_000_000_000_000;

    fn loss(v: serde_json::Value) -> Record {
        let mut base = json!({
            "kind": "loss", "agent": "sw-b", "port": "p1", "point": "ingress", "upstream": null,
            "flow": {"src": "10.0.0.1", "dst": "10.0.0.7", "sport": 1, "dport": 2, "proto": 17,
                     "spi": null, "si": null},
            "color": 1, "batch": 3, "first_ns": NOW - 1000, "last_ns": NOW,
            "expected": 100, "observed": 97, "lost": 3, "late": 0, "uncertain": 0
        });
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            for (k, x) in o {
                b.insert(k.clone(), x.clone());
            }
        }
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn records_that_make_no_sense_are_refused_with_the_reason() {
        assert_eq!(record(&loss(json!({})), NOW), Ok(()));
        let flow = |src: &str| {
            json!({"src": src, "dst": "10.0.0.7", "sport": 1, "dport": 2,
                                      "proto": 17, "spi": null, "si": null})
        };
        for (change, says) in [
            (json!({"flow": flow("<img src=x onerror=alert(1)>")}), "not an IP address"),
            (json!({"point": "<script>"}), "point"),
            (json!({"first_ns": NOW, "last_ns": NOW - 1}), "before it begins"),
            (json!({"lost": 101, "observed": 0}), "more than the 100 expected"),
            (json!({"lost": u64::MAX}), "more than one record can carry"),
            (json!({"own_colour": u64::MAX}), "own_colour 18446744073709551615 is more than"),
            (json!({"first_ns": 0, "last_ns": 1}), "400 days"),
            (json!({"first_ns": NOW, "last_ns": 7_258_118_400_000_000_000u64}), "a day ahead"),
            (json!({"color": 2}), "color"),
            (json!({"expected": null, "lost": 1}), "nothing expected"),
        ] {
            let e = record(&loss(change.clone()), NOW).err().unwrap_or_default();
            assert!(e.contains(says), "{change}: {e}");
        }
    }

    #[test]
    fn unknown_fields_are_found_at_any_depth() {
        let known = json!({"a": 1, "flow": {"src": "x"}});
        assert_eq!(unknown_fields(&json!({"a": 1}), &known, ""), None);
        assert_eq!(unknown_fields(&json!({"b": 1}), &known, "").as_deref(), Some("b"));
        assert_eq!(unknown_fields(&json!({"tail": false, "x": null}), &known, ""), None);
        let deep = json!({"flow": {"src": "x", "evil": 1}});
        assert_eq!(unknown_fields(&deep, &known, "").as_deref(), Some("flow.evil"));
    }
}
