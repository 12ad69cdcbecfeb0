//! Active flow selection against first come first served, on a crafted capture where 200
//! long-lived mice fill a 64-flow table before 8 elephants arrive. Checked against the
//! generator's plan (which flows are elephants) and the droppers' record of every drop.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use telemark_core::loss::LossConfig;
use telemark_core::records::{Flow, Record};
use telemark_core::sketch::sfcmon::HhConfig;
use telemark_core::FlowKey;
use telemark_datapath::capture::{read_all, CaptureWriter};
use telemark_lab::dropper::{DropModel, Placement};
use telemark_lab::gen::{self, GenConfig};
use telemark_lab::pipeline::{points, HeavyConfig, Replay, ReplayConfig};
use telemark_wire::flow::LinkType;

const MICE: usize = 200;
const ELEPHANTS: usize = 8;
const TABLE: usize = 64;

/// Writes the crafted capture: 4 s; mice at 100 packets/s from the start, elephants at
/// 10,000 packets/s from 1.5 s. Returns its path and the elephants' keys.
fn crafted_capture() -> (PathBuf, Vec<FlowKey>) {
    let cfg = GenConfig { duration_ns: 4_000_000_000, max_packets: 1 << 20, ..Default::default() };
    let plans = gen::mice_then_elephants(&cfg, MICE, 10_000_000, ELEPHANTS, 100_000, 1_500_000_000);
    let pkts = gen::packets(&cfg, &plans);
    let dir = std::env::temp_dir().join(format!("telemark-selection-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mice-then-elephants.pcap");
    let mut w = CaptureWriter::create(&path).unwrap();
    for p in &pkts {
        w.write(p.ts_ns, &p.data).unwrap();
    }
    w.finish().unwrap();
    let elephants = plans.iter().skip(MICE).map(|p| p.key).collect();
    (path, elephants)
}

fn replay(path: &Path, select_top: Option<usize>) -> Replay {
    let loss = LossConfig { table_size: TABLE, ..LossConfig::default() };
    let cfg = ReplayConfig {
        loss,
        mark: true,
        drops: vec![
            (Placement::Ingress, DropModel::Independent { p: 0.004 }),
            (Placement::Switch, DropModel::Bursty { p: 0.01, burst: 3.0 }),
        ],
        reorder: 0,
        seed: 7,
        agent: "sw".into(),
        report_all: true,
        heavy: Some(HeavyConfig {
            hh: HhConfig::default(),
            window_ns: 1_000_000_000,
            select_top,
            exact_top: 16,
        }),
    };
    let (pkts, _) = read_all(path).unwrap();
    let mut r = Replay::new(cfg, LinkType::Ethernet);
    for (_, p) in pkts {
        r.push(p);
    }
    r.finish();
    r
}

/// Per flow and point: (batches compared, lost as measured, lost per the dropper in those
/// batches), asserting batch by batch that the two are equal.
fn compared(r: &mut Replay) -> HashMap<(Flow, u8), (u64, u64, u64)> {
    let mut out: HashMap<(Flow, u8), (u64, u64, u64)> = HashMap::new();
    let mut recs = Vec::new();
    while let Some(rec) = r.agg.poll_record() {
        if let Record::Loss(l) = rec {
            recs.push(l);
        }
    }
    for l in recs {
        let Some(expected) = l.expected else { continue };
        let (point, pl) = match l.point.as_str() {
            "ingress" => (points::INGRESS, Placement::Ingress),
            "egress" => (points::EGRESS, Placement::Switch),
            _ => continue,
        };
        let key = FlowKey::try_from(&l.flow).unwrap();
        let truth = r.truth(pl, &key, Some(l.batch as u32));
        assert_eq!(l.lost, truth, "{} {key} batch {}: {l:?}", l.point, l.batch);
        assert_eq!(expected, l.observed + l.late + l.lost);
        let e = out.entry((l.flow.clone(), point)).or_default();
        e.0 += 1;
        e.1 += l.lost;
        e.2 += truth;
    }
    out
}

#[test]
fn selection_watches_the_elephants_fcfs_misses() {
    let (path, elephants) = crafted_capture();

    // First come first served: the mice take every slot.
    let mut fcfs = replay(&path, None);
    let [ing, _] = fcfs.switch.point_stats().unwrap();
    assert_eq!(ing.admitted, TABLE as u64, "FCFS admitted {ing:?}");
    assert!(ing.refused > 0);
    let fcfs_cmp = compared(&mut fcfs);
    for k in &elephants {
        let lost = fcfs.truth(Placement::Switch, k, None) + fcfs.truth(Placement::Ingress, k, None);
        assert!(lost > 0, "elephant {k} lost nothing: the test shows nothing");
        for p in [points::INGRESS, points::EGRESS] {
            assert_eq!(fcfs.agg.totals(k, p).batches, 0, "FCFS measured elephant {k}");
            assert!(!fcfs_cmp.contains_key(&(Flow::from(k), p)));
        }
    }

    // Selection: the loss monitor follows the sketch's top 16 flows of each window.
    let mut sel = replay(&path, Some(16));
    let windows = sel.windows().to_vec();
    assert_eq!(windows.len(), 4);
    // By the end of the second window the elephants are the heaviest flows, and the sketch
    // (not the exact table) found every one of them.
    let listed: HashSet<FlowKey> = windows[1].hh.flows.iter().take(16).map(|f| f.key).collect();
    for k in &elephants {
        assert!(listed.contains(k), "window 1 did not select elephant {k}");
        assert!(windows[1].exact_top.iter().take(ELEPHANTS).any(|x| x == k));
    }
    let cmp = compared(&mut sel);
    let st = sel.switch.point_stats().unwrap();
    assert!(st[0].unselected > 0 && st[0].deselected > 0, "{st:?}");
    let (mut batches, mut lost) = (0, 0);
    for k in &elephants {
        for p in [points::INGRESS, points::EGRESS] {
            let (n, measured, truth) = cmp.get(&(Flow::from(k), p)).copied().unwrap_or_default();
            // Watched from the third window on: 2 s at 10,000 packets/s, batches of 100,
            // less the two batches an armed flow waits.
            assert!(n >= 190, "elephant {k} at point {p}: only {n} batches compared");
            assert_eq!(measured, truth);
            batches += n;
            lost += measured;
        }
    }
    assert!(lost > 1_000, "only {lost} packets lost in {batches} elephant batches");
    let truth_all: u64 = elephants
        .iter()
        .map(|k| sel.truth(Placement::Switch, k, None) + sel.truth(Placement::Ingress, k, None))
        .sum();
    eprintln!(
        "selection: {batches} elephant batches compared, {lost} lost (= dropper), of {truth_all} \
         elephant drops in the whole capture; ingress {:?}",
        st[0]
    );
    // No flow, mouse or elephant, shows loss the droppers did not make: checked batch by
    // batch in `compared`, for every flow.
    let fcfs_lost: u64 = fcfs_cmp.values().map(|v| v.1).sum();
    let sel_lost: u64 = cmp.values().map(|v| v.1).sum();
    assert!(sel_lost > 2 * fcfs_lost, "selection saw {sel_lost} lost packets, FCFS {fcfs_lost}");
    let _ = std::fs::remove_file(&path);
}

/// A capture whose clock jumps by a year closes the window it was in and starts the next at
/// the jump, without walking through the silence window by window.
#[test]
fn a_clock_jump_does_not_walk_empty_windows() {
    let cfg = GenConfig { duration_ns: 1_000_000_000, ..Default::default() };
    let plans = gen::mice_then_elephants(&cfg, 4, 100_000_000, 0, 1, 0);
    let mut pkts = gen::packets(&cfg, &plans);
    let year = 365 * 86_400 * 1_000_000_000u64;
    let n = pkts.len();
    for p in pkts.iter_mut().skip(n / 2) {
        p.ts_ns += year;
    }
    let rc = ReplayConfig {
        loss: LossConfig::default(),
        mark: true,
        drops: Vec::new(),
        reorder: 0,
        seed: 1,
        agent: "sw".into(),
        report_all: false,
        heavy: Some(HeavyConfig {
            hh: HhConfig::default(),
            window_ns: 1_000,
            select_top: Some(2),
            exact_top: 4,
        }),
    };
    let mut r = Replay::new(rc, LinkType::Ethernet);
    for p in pkts {
        r.push(p);
    }
    r.finish();
    let packets: u64 = r.windows().iter().map(|w| w.hh.packets).sum();
    assert_eq!(packets, n as u64);
    assert!(r.windows().len() <= n, "{} windows for {n} packets", r.windows().len());
}
