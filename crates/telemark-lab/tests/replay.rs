//! Replay of generated traffic through marker → dropper → switch → dropper → next hop,
//! checked against the droppers' own record of what they dropped.

use std::collections::HashMap;
use telemark_core::loss::LossConfig;
use telemark_core::records::Record;
use telemark_core::FlowKey;
use telemark_lab::dropper::{DropModel, Placement};
use telemark_lab::gen::{self, GenConfig, SizeDist};
use telemark_lab::pipeline::{points, Replay, ReplayConfig};
use telemark_wire::flow::LinkType;

/// Realistic small flows plus enough heavy ones (up to 4,000 packets) that every drop
/// placement sees hundreds of drops.
fn traffic(flows: usize, seed: u64) -> Vec<telemark_datapath::Pkt> {
    let cfg = GenConfig { flows, seed, ..GenConfig::default() };
    let mut sizes: Vec<u64> = (1..=40).map(|i| i * 140_000).collect();
    sizes.extend([300, 1_200, 5_000, 20_000, 90_000].repeat(8));
    gen::packets(&cfg, &gen::plan(&cfg, &SizeDist::from_sizes(sizes, "test mix")))
}

fn run(drops: Vec<(Placement, DropModel)>, reorder: u64, seed: u64, loss: LossConfig) -> Replay {
    let cfg = ReplayConfig {
        loss,
        mark: true,
        drops,
        reorder,
        seed,
        agent: "sw".into(),
        report_all: true,
        heavy: None,
    };
    let mut r = Replay::new(cfg, LinkType::Ethernet);
    for p in traffic(300, seed) {
        r.push(p);
    }
    r.finish();
    r
}

fn loss_records(r: &mut Replay) -> Vec<telemark_core::records::LossRecord> {
    let mut v = Vec::new();
    while let Some(rec) = r.agg.poll_record() {
        if let Record::Loss(l) = rec {
            v.push(l);
        }
    }
    v
}

fn key_of(f: &telemark_core::records::Flow) -> FlowKey {
    FlowKey {
        src: f.src.parse().unwrap(),
        dst: f.dst.parse().unwrap(),
        sport: f.sport,
        dport: f.dport,
        proto: f.proto,
        spi: f.spi,
        si: f.si,
    }
}

#[test]
fn per_batch_loss_equals_ground_truth_at_every_placement() {
    // Room for every flow, so that every drop falls on a monitored flow.
    let loss = LossConfig { table_size: 65536, ..LossConfig::default() };
    for model in [DropModel::Independent { p: 0.02 }, DropModel::Bursty { p: 0.02, burst: 6.0 }] {
        let drops = Placement::ALL.iter().map(|p| (*p, model)).collect();
        let mut r = run(drops, 0, 7, loss);
        assert_eq!(r.agg.gaps(), 0);
        assert_eq!(r.switch.stats().skipped.iter().sum::<u64>(), 0);
        let [ing, eg] = r.switch.point_stats().unwrap();
        assert_eq!(ing.refused + eg.refused, 0);
        let recs = loss_records(&mut r);
        let point_index = |name: &str| match name {
            "ingress" => points::INGRESS,
            "egress" => points::EGRESS,
            "next-hop" => points::NEXT_HOP,
            other => panic!("unexpected point {other}"),
        };
        let mut checked: HashMap<u8, (u64, u64)> = HashMap::new();
        for rec in &recs {
            let p = point_index(&rec.point);
            let placement = Replay::placement_of_point(p).unwrap();
            let truth = r.truth(placement, &key_of(&rec.flow), Some(rec.batch as u32));
            // Every drop is reported, lost or uncertain, and nothing more is reported lost.
            assert_eq!(
                rec.lost + rec.uncertain,
                truth,
                "{model:?} {} batch {} of {:?}",
                rec.point,
                rec.batch,
                rec.flow
            );
            assert_eq!(rec.late, 0);
            let e = checked.entry(p).or_default();
            e.0 += 1;
            e.1 += rec.lost + rec.uncertain;
        }
        for pl in Placement::ALL {
            let d = r.dropper(pl).unwrap();
            let p = match pl {
                Placement::Ingress => points::INGRESS,
                Placement::Switch => points::EGRESS,
                Placement::Egress => points::NEXT_HOP,
            };
            assert!(d.dropped > 100, "the dropper at {pl:?} dropped only {}", d.dropped);
            // Every drop shows up in some batch's record, and nothing else does; only whole
            // batches at the edges of a flow are uncertain.
            let (lost, uncertain) = r
                .agg
                .flow_records()
                .iter()
                .filter(|(_, q, _)| *q == p)
                .fold((0, 0), |(l, u), (_, _, f)| (l + f.counts.lost, u + f.counts.uncertain));
            assert_eq!(checked[&p].1, lost + uncertain);
            assert_eq!(d.dropped, lost + uncertain, "{model:?} {pl:?}: dropped vs detected");
            assert!(
                uncertain * 20 < d.dropped,
                "{model:?} {pl:?}: {uncertain} of {} uncertain",
                d.dropped
            );
        }
    }
}

#[test]
fn reordering_a_third_of_a_batch_keeps_flow_totals_within_one_percent() {
    let loss = LossConfig::default();
    let drops = vec![(Placement::Switch, DropModel::Independent { p: 0.05 })];
    let r = run(drops, 33, 11, loss);
    let mut total_truth = 0;
    let mut total_detected = 0;
    for (key, p, f) in r.agg.flow_records() {
        let f = f.counts;
        if p != points::EGRESS || f.expected < 1000 {
            continue;
        }
        let truth = r.truth(Placement::Switch, &key, None);
        let err = (f.lost as f64 - truth as f64).abs() / f.expected as f64;
        assert!(err <= 0.01, "flow {key}: lost {} truth {truth} of {}", f.lost, f.expected);
        total_truth += truth;
        total_detected += f.lost;
    }
    assert!(total_truth > 500, "enough loss to measure: {total_truth}");
    let rel = (total_detected as f64 - total_truth as f64).abs() / total_truth as f64;
    assert!(rel < 0.01, "detected {total_detected} vs truth {total_truth}");
}

/// Flow churn with nothing dropped: 300,000 flows of one to three packets over 10 s. At every
/// table size, from far too small to large enough for all, not one packet is reported lost or
/// uncertain at any point, and the flows each point refused are counted.
#[test]
fn churn_without_drops_reports_no_loss_at_any_table_size() {
    let cfg =
        GenConfig { flows: 300_000, seed: 9, duration_ns: 10_000_000_000, ..GenConfig::default() };
    let sizes: Vec<u64> = (1..=30).map(|i| i * 130).collect();
    let pkts = gen::packets(&cfg, &gen::plan(&cfg, &SizeDist::from_sizes(sizes, "1-3 packets")));
    assert!(pkts.len() > 400_000);
    for table_size in [256, 1024, 16_384, 1 << 19] {
        let loss = LossConfig { table_size, ..LossConfig::default() };
        let cfg = ReplayConfig { loss, ..ReplayConfig::default() };
        let mut r = Replay::new(cfg, LinkType::Ethernet);
        for p in &pkts {
            r.push(p.clone());
        }
        r.finish();
        let mut total = telemark_core::records::LossCounts::default();
        for (_, _, f) in r.agg.flow_records() {
            total.add(&f.counts);
        }
        assert_eq!((total.lost, total.uncertain), (0, 0), "table of {table_size}: {total:?}");
        let [ing, _] = r.switch.point_stats().unwrap();
        let refused = ing.refused + r.next_hop_stats().refused;
        if table_size <= 1024 {
            assert!(refused > 10_000, "table of {table_size}: {refused} packets refused");
        }
        assert!(total.batches > 100_000, "table of {table_size}: {} batches", total.batches);
    }
}
