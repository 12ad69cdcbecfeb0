//! The live experiment end to end (needs root, iproute2, nftables, iperf3; CI installs them):
//! `telemark demo` with short timings builds the namespace testbed, runs the collector and two
//! agents on AF_PACKET, and reports loss next to the kernel's counters (nftables counters of
//! the probe flow into and out of the tbf-shaped link, the tbf queue's backlog, the random-loss
//! rule's counter). These tests hold Telemark's numbers against those counters.

use std::process::Command;
use std::sync::Mutex;

/// The testbed's namespaces and the collector's port are shared: one experiment at a time.
static TESTBED: Mutex<()> = Mutex::new(());

fn demo(args: &[&str]) -> (serde_json::Value, String) {
    let _guard = TESTBED.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["demo", "--no-wait", "--listen", "127.0.0.1:19901", "--json"])
        .arg(&json)
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{text}\n{err}");
    println!("{text}");
    // Nothing of the testbed is left behind.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains("tm-"), "namespaces left over");
    (serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap(), err.into_owned())
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Congestion: loss only while the background traffic runs, per second within 5 % of the
/// kernel's count (or within 50 packets where fewer than 1,000 were lost),
/// localised to the path between the two switches, and a collector killed and restarted in
/// the middle of it all loses and duplicates no record.
#[test]
fn congestion_loss_per_second_matches_the_kernel_and_survives_a_collector_restart() {
    let (o, log) = demo(&[
        "--before",
        "3s",
        "--background",
        "6s",
        "--after",
        "3s",
        "--restart-collector-at",
        "5s",
    ]);
    let secs = o["seconds"].as_array().unwrap();
    assert!(secs.len() >= 11, "{} seconds", secs.len());
    let mut lossy_seconds = 0;
    for s in secs {
        let (truth, det, t) = (u(&s["truth_lost"]), u(&s["detected_lost"]), u(&s["t"]));
        let bg = s["background"].as_bool().unwrap();
        // The second after the background stops may still see its queue drain.
        let near_bg = bg || (3..=9).contains(&t);
        if !near_bg {
            assert_eq!(det, 0, "loss reported at {t} s, outside the background traffic");
        }
        if bg {
            assert!(truth > 0, "no congestion at {t} s: the experiment did not congest the link");
            lossy_seconds += 1;
        }
        // 5 %, or 50 packets where fewer than 1,000 were lost: the truth's own error (the
        // probe packets still queued at a read are estimated from the queue's length and the
        // probe's share of the second) and a lossy batch dated by its first packet move tens
        // of packets across second boundaries; plus the counters' read-time uncertainty.
        let read_s = u(&s["truth_read_ns"]) as f64 / 2e9;
        let tol = (truth as f64 * 0.05).max(50.0) + truth as f64 * read_s;
        assert!(
            (det as f64 - truth as f64).abs() <= tol,
            "second {t}: detected {det}, kernel {truth} (read in {read_s:.3} s)"
        );
    }
    assert!(lossy_seconds >= 5);
    let (truth, det) = (u(&o["truth_lost"]), u(&o["detected_lost"]));
    assert!(truth > 500, "only {truth} probe packets lost: too little congestion to judge");
    assert!((det as f64 - truth as f64).abs() <= truth as f64 * 0.01, "total {det} vs {truth}");
    let verdict = o["verdict"].as_str().unwrap();
    assert!(verdict.contains("sw-b egress") && verdict.contains("sw-f ingress"), "{verdict}");
    // Restart: it happened, and every record an agent had acknowledged is stored exactly
    // once, none dropped.
    assert!(log.contains("collector back"), "the collector was not restarted:\n{log}");
    for agent in ["sw-b", "sw-f"] {
        let a = &o["agents"][agent];
        assert_eq!(u(&a["export_drops"]), 0, "{agent}");
        assert_eq!(u(&a["export_pending"]), 0, "{agent}");
        assert_eq!(u(&o["stored"][agent]), u(&a["exported"]), "{agent}: stored vs acknowledged");
        assert_eq!(u(&a["rx_ring_drops"]) + u(&a["tx_drops"]) + u(&a["event_drops"]), 0, "{agent}");
    }
    assert!(u(&o["agents"]["sw-f"]["exported"]) > 20);
}

/// Random loss by an nftables `numgen random` rule on the link, 2 % and 0.1 %: measured
/// within 2 % of the kernel's count of lost probe packets (at 0.1 %, within one packet), which
/// is the rule's counter give or take a burst into the link's queue, and localised to the link.
#[test]
fn random_nftables_loss_is_measured_and_localised() {
    for (permille, secs) in [("20", "4s"), ("1", "8s")] {
        let (o, _) = demo(&[
            "--before",
            secs,
            "--background",
            "0",
            "--after",
            "0",
            "--random-loss",
            permille,
        ]);
        let drops = u(&o["random_drops"]);
        let det = u(&o["detected_lost"]);
        // The kernel's count of every probe packet lost on the path: the rule's drops, plus
        // any the link's tbf queue made when this shared machine stalled the sender and it
        // caught up in a burst (seen once: 67 by the rule + 5 by tbf, 72 detected).
        let truth = u(&o["truth_lost"]);
        assert!(drops > 20, "{permille}‰: only {drops} drops");
        assert!(truth >= drops, "{permille}‰: kernel {truth} < the rule's {drops}");
        assert!(
            (truth - drops) as f64 <= drops as f64 * 0.1,
            "{permille}‰: {} of {truth} lost packets were not the rule's: the run was congested",
            truth - drops
        );
        let tol = (truth as f64 * 0.02).max(1.0);
        assert!(
            (det as f64 - truth as f64).abs() <= tol,
            "{permille}‰: detected {det}, kernel {truth} (nftables rule {drops})"
        );
        let verdict = o["verdict"].as_str().unwrap();
        assert!(verdict.contains("sw-b egress") && verdict.contains("sw-f ingress"), "{verdict}");
    }
}

/// `telemark demo --int`: the chain's transit queue (10 Mbit/s, 100 KB) congested by
/// background traffic. The sink's hop-latency events carry the delay the queue's own backlog
/// implies (backlog × 8 / rate), the queue events its occupancy, and the calm seconds before
/// the congestion have no latency event above a quarter of the congested queue's delay.
#[test]
fn the_int_demo_shows_latency_and_queue_events_next_to_the_queue() {
    let (v, _) = demo(&["--int", "--before", "2s", "--background", "4s", "--after", "2s"]);
    let secs = v.as_array().unwrap();
    assert_eq!(secs.len(), 8);
    let on: Vec<&serde_json::Value> = secs.iter().filter(|s| s["background"] == true).collect();
    let worst_delay = on.iter().map(|s| u(&s["backlog_delay_ns"])).max().unwrap();
    assert!(worst_delay > 50_000_000, "the queue filled: {worst_delay} ns");
    assert!(on.iter().map(|s| u(&s["drops"])).sum::<u64>() > 0, "and dropped");
    let latency = on.iter().map(|s| u(&s["latency_max_ns"])).max().unwrap();
    // The frame waits for the backlog ahead of it, plus its own time on the 10 Mbit/s link
    // and what the path adds without a queue: the switches' hops and wakeups, as large as
    // the calm seconds' largest event on this machine at this moment (up to 8 ms on a loaded
    // CI machine, when the queue's 80 ms came out as 94 ms).
    let calm = secs[..2].iter().map(|s| u(&s["latency_max_ns"])).max().unwrap();
    assert!(
        latency >= worst_delay * 95 / 100 && latency <= worst_delay + calm + 10_000_000,
        "largest latency event {latency} ns, queue delay {worst_delay} ns, calm {calm} ns"
    );
    let occupancy = on.iter().map(|s| u(&s["queue_max_bytes"])).max().unwrap();
    assert!(occupancy > 50_000 && occupancy <= 100_000, "queue events up to {occupancy} B");
    // The calm seconds are told apart from the congestion: their largest event is a small
    // part of the full queue's delay. (Not "a few ms": on this shared 2-core machine a hop
    // waits for a CPU now and then, 8-18 ms in CI runs, as ping's maximum through a Linux
    // bridge reaches 4.7 ms in eval/latency.py.)
    for s in &secs[..2] {
        assert!(u(&s["latency_max_ns"]) < worst_delay / 4, "calm: {s}");
        assert_eq!(u(&s["drops"]), 0);
    }
}
