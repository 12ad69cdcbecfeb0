//! The collector's console in a real browser (Debian's chromium driven by playwright-core from
//! npm: console/test/console.mjs), against a collector filled by live runs on the chain testbed
//! (root, iproute2, nftables, softflowd, node; .ci/run installs them and runs `npm ci` in
//! console/):
//!
//! - loss: three switches, two flows dropped at random on link 2 by nftables, one clean;
//! - INT: the same chain as source, transit (a 2 Mbit/s queue) and sink, calm then congested;
//! - flows: softflowd, a real exporter, reading what host G received, to the flow listener.
//!
//! Every number the page shows is read from its DOM and held against the collector's API and
//! against the traffic's truth (nftables' counters, the capture at G). Screenshots of every
//! view go to target/console-screenshots (or $TELEMARK_SCREENSHOTS), which the test prints.

mod common;

use common::chain::*;
use common::{collector, write_ethernet_pcap};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use telemark_agent::{Agent, FileConfig};
use telemark_collector::now_ns;

/// Flows lossy on link 2; clean; INT probes (hop latency, queue occupancy); a flow the agents
/// watch only once the console told them to.
const LOSSY: [u16; 2] = [4011, 4012];
const CLEAN: u16 = 4001;
const INT_PROBES: [u16; 2] = [4031, 4032];
const STEERED: u16 = 4050;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The operator's token: the console steers with it (and reads, as operators may).
const OPERATOR: &str = "0p0p0p0p0p0p0p0p0p0p0p0p0p0p0p0p";

fn api(base: &str, path: &str) -> Value {
    let r = ureq::get(&format!("{base}{path}"))
        .set("Authorization", &format!("Bearer {OPERATOR}"))
        .call()
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&r.into_string().unwrap()).unwrap()
}

/// A count as the page writes it ("9,911") as a number.
fn shown(s: &str) -> u64 {
    s.replace(',', "").parse().unwrap_or_else(|_| panic!("not a count on the page: {s:?}"))
}

fn screenshots() -> PathBuf {
    std::env::var_os("TELEMARK_SCREENSHOTS").map(PathBuf::from).unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots")
    })
}

/// The console, driven by node: what every view showed (console/test/console.mjs).
fn drive(base: &str, out: &Path, options: &Value) -> Value {
    let console = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../console");
    assert!(
        console.join("node_modules/playwright-core").exists(),
        "console/node_modules is missing: run `npm ci` in console/ (.ci/run does)"
    );
    let o = Command::new("node")
        .current_dir(&console)
        .arg("test/console.mjs")
        .arg(base)
        .arg(out)
        .arg(options.to_string())
        .output()
        .expect("node runs (apt-get install nodejs)");
    assert!(o.status.success(), "console.mjs: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!("console.mjs said no JSON ({e}): {}", String::from_utf8_lossy(&o.stdout))
    })
}

/// Rows of a table the page showed, by their key.
fn rows<'a>(view: &'a Value, table: &str) -> BTreeMap<String, &'a Vec<Value>> {
    view["tables"][table]
        .as_array()
        .unwrap_or_else(|| panic!("no table {table}: {view}"))
        .iter()
        .filter_map(|r| Some((r["key"].as_str()?.to_string(), r["cells"].as_array()?)))
        .collect()
}

fn cell(row: &[Value], i: usize) -> &str {
    row[i].as_str().unwrap()
}

/// softflowd exporting `frames` (as captured at G) to the flow listener on `port`.
fn softflowd(dir: &Path, frames: &[Vec<u8>], port: u16) {
    let t0 = now_ns() - 5_000_000_000;
    let timed: Vec<(u64, Vec<u8>)> =
        frames.iter().enumerate().map(|(i, f)| (t0 + i as u64 * 1_000, f.clone())).collect();
    let trace = dir.join("at-g.pcap");
    write_ethernet_pcap(&trace, &timed);
    let ctl = dir.join("sf.ctl");
    let mut child = Command::new("softflowd")
        .args(["-d", "-r"])
        .arg(&trace)
        .args(["-n", &format!("127.0.0.1:{port}"), "-v", "10", "-c"])
        .arg(&ctl)
        .arg("-p")
        .arg(dir.join("sf.pid"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("softflowd runs (apt-get install softflowd)");
    // With -r it waits on its control socket before each batch: step it to the end.
    let until = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < until, "softflowd did not finish");
        let _ = Command::new("softflowctl").arg("-c").arg(&ctl).arg("expire-all").output();
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn every_view_shows_what_the_traffic_did() {
    let all = [&[CLEAN][..], &LOSSY, &INT_PROBES, &[STEERED]].concat();
    let chain = Chain::up("cs", &all);
    let p = chain.prefix.clone();
    chain.run(&["loss", "2", "20", &ports(&LOSSY)]);
    let dir = tempfile::tempdir().unwrap();
    // The agents' control APIs, for the console to steer them through the collector.
    let token = dir.path().join("control.token");
    std::fs::write(&token, "control-token-0123456789abcdef0123456789").unwrap();
    let names = ["s1", "s2", "s3"];
    let control: Vec<u16> = names.iter().map(|_| free_port()).collect();
    let control_file = dir.path().join("control.toml");
    let entries: String = names
        .iter()
        .zip(&control)
        .map(|(n, port)| {
            format!("[agents.{n}]\nurl = \"http://127.0.0.1:{port}\"\ntoken_file = {token:?}\n")
        })
        .collect();
    std::fs::write(&control_file, entries).unwrap();
    // Tokens: each agent's, and an operator's (steering needs one).
    let agent_token = |n: &str| format!("{n}-token-{}", "a".repeat(32));
    let mut tokens = String::from("[agents]\n");
    for n in names {
        tokens += &format!("{n} = \"{}\"\n", agent_token(n));
        std::fs::write(dir.path().join(format!("{n}.token")), agent_token(n)).unwrap();
    }
    tokens += &format!("[operators]\nops = \"{OPERATOR}\"\n");
    let auth = dir.path().join("tokens.toml");
    std::fs::write(&auth, tokens).unwrap();
    let export_token =
        |n: &str| format!("token_file = {:?}\n", dir.path().join(format!("{n}.token")));
    let (_c, base, flow_port) = collector(
        &dir.path().join("c.db"),
        &["--control", control_file.to_str().unwrap(), "--auth", auth.to_str().unwrap()],
    );
    let started = now_ns();

    // Run 1, loss: every batch of the watched flows reported, G's traffic captured for
    // softflowd.
    let watched: String = [&[CLEAN][..], &LOSSY]
        .concat()
        .iter()
        .map(|s| format!("[[watch]]\nsport = {s}\n"))
        .collect();
    let agents: Vec<Agent> = [("s1", "a"), ("s2", "none"), ("s3", "none")]
        .iter()
        .zip(&control)
        .map(|((n, mark), port)| {
            let metrics = format!(
                "[metrics]\nlisten = \"127.0.0.1:{port}\"\n[control]\ntoken_file = {token:?}\n"
            );
            let loss = format!("batch = 100\n{watched}");
            agent(
                &p,
                n,
                mark,
                &base,
                &loss,
                &format!("report_all = true\n{}{metrics}", export_token(n)),
            )
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let at_g = capture(format!("{p}g"), "g0", stop.clone());
    let sent = send_flows(&p, &[&[CLEAN][..], &LOSSY].concat(), 500, 6);
    std::thread::sleep(Duration::from_millis(700));

    // Steering: a flow no rule watches is not measured, until the console adds it to every
    // agent's watch rules; then it is, from the packets sent after the change.
    let k = key(STEERED);
    let q = format!("src={}&dst={}&sport={STEERED}&dport=7000&proto=17", k.src, k.dst);
    let unwatched = send_flows(&p, &[STEERED], 500, 2)[0];
    std::thread::sleep(Duration::from_millis(700));
    let seen = api(&base, &format!("/api/v1/localise?{q}"));
    assert_eq!(seen["segments"], serde_json::json!([]), "an unwatched flow was measured");
    let rules: Vec<Value> = [&[CLEAN][..], &LOSSY, &[STEERED]]
        .concat()
        .iter()
        .map(|s| serde_json::json!({ "sport": s }))
        .collect();
    let out = screenshots();
    let _ = std::fs::remove_dir_all(&out);
    let steer = drive(
        &base,
        &out,
        &serde_json::json!({"token": OPERATOR, "steer": {"agents": names, "watch": rules}}),
    );
    for n in names {
        let s = &steer["steer"][n];
        assert_eq!(s["status"], "saved: the agent's rules now", "{n}: {s}");
        assert_eq!(s["rules"].as_array().unwrap().len(), 4, "{n}: {s}");
    }
    let after = send_flows(&p, &[STEERED], 500, 2)[0];
    // Its batches reach the collector as they close and are exported.
    let s1_ingress = || -> Option<Value> {
        let m = api(&base, &format!("/api/v1/localise?{q}"));
        m["segments"]
            .as_array()?
            .iter()
            .find(|s| s["agent"] == "s1" && s["point"] == "ingress")
            .cloned()
    };
    let until = Instant::now() + Duration::from_secs(10);
    let at_s1 = loop {
        let got = s1_ingress();
        if got.as_ref().is_some_and(|s| u(&s["expected"]) + 100 >= after) || Instant::now() > until
        {
            break got.unwrap_or_else(|| panic!("the steered flow was not measured at s1"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("steered flow: {unwatched} sent unwatched, {after} watched; s1 ingress {at_s1}");
    // Its packets since the change (the last batch may still be open), none from before.
    assert!(
        u(&at_s1["expected"]) <= after && u(&at_s1["expected"]) + 100 >= after,
        "measured {} of the {after} sent after the change ({unwatched} before)",
        at_s1["expected"]
    );
    let changes = api(&base, "/api/v1/control")["changes"].clone();
    assert_eq!(changes.as_array().unwrap().len(), 3, "{changes}");
    assert!(changes.as_array().unwrap().iter().all(|c| c["result"] == "ok" && c["who"] == "ops"));
    let own: u64 = agents
        .into_iter()
        .map(|a| {
            let s = a.stop();
            s.path.rx_ring_drops + s.path.tx_drops
        })
        .sum();
    stop.store(true, Ordering::Release);
    let frames: Vec<Vec<u8>> = at_g.join().unwrap();
    let truth: Value = serde_json::from_str(&chain.run(&["truth"])).unwrap();
    println!("sent {sent:?}; the switches' own drops {own}");

    // Run 2, INT (as `telemark demo --int`): per-hop detectors at the sink, s2's queue
    // congested in the middle.
    let switch = |name: &str, int: &str| {
        let toml = format!(
            "agent = \"{name}\"\nnetns = \"{p}{name}\"\nmeasure = false\n\
             [[pair]]\na = \"{name}a\"\nb = \"{name}b\"\n\
             [export]\ncollector = \"{base}\"\ninterval = \"200ms\"\n{}{int}",
            export_token(name)
        );
        Agent::start(FileConfig::parse(&toml).unwrap().validate().unwrap()).unwrap()
    };
    let int_agents = [
        switch(
            "s1",
            "[int]\nnode_id = 1\n[[int.rule]]\nflows = \"dst=10.9.2.0/24\"\nrole = \"source\"\n",
        ),
        switch(
            "s2",
            "[[queue]]\nport = \"s2b\"\nrate = \"2Mbit\"\nlimit = \"20KB\"\n\
             [int]\nnode_id = 2\n[[int.rule]]\nrole = \"transit\"\n",
        ),
        switch(
            "s3",
            &format!(
                "[int]\nnode_id = 3\n[[int.rule]]\nflows = \"dst=10.9.2.0/24\"\nrole = \"sink\"\n\
                 [[int.detect]]\nflows = \"sport={}\"\ndetector = \"per_hop\"\n\
                 metric = \"hop_latency\"\nthreshold = \"2ms\"\n\
                 [[int.detect]]\nflows = \"sport={}\"\ndetector = \"per_hop\"\n\
                 metric = \"queue_occupancy\"\nthreshold = \"4KB\"\n",
                INT_PROBES[0], INT_PROBES[1]
            ),
        ),
    ];
    for (pps, secs) in [(100, 2), (900, 2), (100, 2)] {
        send_flows(&p, &INT_PROBES, pps, secs);
    }
    std::thread::sleep(Duration::from_millis(700));
    for a in int_agents {
        a.stop();
    }
    drop(chain);

    // Run 3, flows: softflowd reads what G received.
    softflowd(dir.path(), &frames, flow_port);
    let mut at_g_per_flow: BTreeMap<u16, u64> = BTreeMap::new();
    for f in &frames {
        if let Some(s) = udp_sport(f) {
            *at_g_per_flow.entry(s).or_default() += 1;
        }
    }
    // The collector has stored the flow records once they are listed.
    let until = Instant::now() + Duration::from_secs(20);
    while api(&base, "/api/v1/flows/top?from=0")["flows"].as_array().unwrap().len() < 3 {
        assert!(Instant::now() < until, "softflowd's flows never reached the collector");
        std::thread::sleep(Duration::from_millis(200));
    }

    // The browser.
    let k = key(LOSSY[1]);
    let options = serde_json::json!({
        "token": OPERATOR,
        "agent": "s3",
        "before": {"from": "now-3h", "to": "now-2h"},
        "flow": {"src": k.src.to_string(), "dst": k.dst.to_string(), "sport": LOSSY[1],
                 "dport": 7000, "proto": 17},
    });
    let report = drive(&base, &out, &options);
    println!("screenshots: {}", out.display());
    println!("timings: {}", report["timings"]);

    // Nothing but the collector was asked, and the page logged no error.
    assert_eq!(report["errors"], serde_json::json!([]), "console errors");
    assert_eq!(report["foreign"], serde_json::json!([]), "requests that left the collector");
    for v in ["overview", "path", "traffic", "int", "health"] {
        assert_eq!(report["views"][v]["ready"], "ok", "{v}: {}", report["views"][v]["error"]);
        assert!(out.join(format!("{v}.png")).exists(), "no screenshot of {v}");
    }
    let dropped = |sport: u16| {
        let t = &truth[sport.to_string()];
        u(&t["in2"]) - u(&t["out2"])
    };
    let within = |got: u64, want: u64| got.abs_diff(want) <= (want as f64 * 0.03) as u64 + own;

    // Overview: totals and segments as the API has them, the lossy segment's loss as nftables
    // counted it, the flows that lost (and only those) as nftables counted them.
    let ov = &report["views"]["overview"];
    let o = api(&base, &format!("/api/v1/overview?from={}", started - 60_000_000_000));
    for stat in ["lost", "expected", "uncertain", "lossy_batches"] {
        assert_eq!(shown(ov["cards"][stat].as_str().unwrap()), u(&o["total"][stat]), "{stat}");
    }
    let link2: u64 = LOSSY.iter().map(|&s| dropped(s)).sum();
    assert!(link2 > 0, "nftables dropped nothing on link 2: {truth}");
    let segs = rows(ov, "segments");
    let (name, row) = segs
        .iter()
        .find(|(n, _)| n.ends_with("s3/ingress (from the marking)"))
        .unwrap_or_else(|| panic!("no s3 ingress segment on the page: {segs:?}"));
    // The point's own records, summed: never more than nftables dropped, and most of it. A
    // point measured from the marking reports each flow's last (short) batch without an
    // expected count, so its loss is not in these sums (docs/console.md, "Limits"): 107, 113,
    // 129 and 115 of 116, 117, 132 and 119 in four runs. The path view below lines the switches'
    // batches up and is held to 3 %.
    let got = shown(cell(row, 3));
    assert!(
        got <= link2 + own && got + (link2 as f64 * 0.1).ceil() as u64 >= link2,
        "{name}: {row:?} against nftables' {link2}"
    );
    for (n, r) in &segs {
        if !n.contains("s3/ingress") {
            assert_eq!(shown(cell(r, 3)), 0, "{n} lost nothing: {r:?}");
        }
    }
    assert!(ov["charts"]["chart-loss"]["marks"].as_u64().unwrap() > 0, "an empty loss chart");
    let flows = rows(ov, "flows");
    assert_eq!(flows.len(), LOSSY.len(), "the flows that lost: {flows:?}");
    for s in LOSSY {
        let (_, r) = flows.iter().find(|(n, _)| n.contains(&format!(":{s} →"))).unwrap();
        assert!(within(shown(cell(r, 2)), dropped(s)), "flow {s}: {r:?}, nftables {}", dropped(s));
    }

    // Path (the flow that lost most, by default): the lossy segment drawn and named.
    let path = &report["views"]["path"];
    let verdict = path["verdict"].as_str().unwrap();
    assert!(verdict.contains("s2 egress") && verdict.contains("s3 ingress"), "{verdict}");
    let drawn: Vec<&Value> = path["svgSegments"].as_array().unwrap().iter().collect();
    assert_eq!(drawn.len(), 6, "three switches, two points each: {drawn:?}");
    for s in &drawn {
        let lost: u64 = s["lost"].as_str().unwrap().parse().unwrap();
        if s["name"] == "s2/egress → s3/ingress" {
            let sport: u16 = path["flow"]
                .as_str()
                .unwrap()
                .split(" → ")
                .next()
                .unwrap()
                .rsplit(':')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!(within(lost, dropped(sport)), "{s}: nftables {}", dropped(sport));
        } else {
            assert_eq!(lost, 0, "{s}");
        }
    }
    // Chosen in the overview, and restored from an address: the same views.
    let clicked = &report["checks"]["clicked_flow"];
    assert!(clicked["url"].as_str().unwrap().contains("view=path"), "{}", clicked["url"]);
    let restored = &report["checks"]["restored"];
    assert!(restored["flow"].as_str().unwrap().contains(&format!(":{} →", LOSSY[1])));
    let seg = restored["svgSegments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "s2/egress → s3/ingress")
        .unwrap();
    assert!(within(seg["lost"].as_str().unwrap().parse().unwrap(), dropped(LOSSY[1])), "{seg}");

    // Traffic: softflowd's flows, each with the packets G received, as the API ranks them.
    let tr = &report["views"]["traffic"];
    let talkers = rows(tr, "talkers");
    let top = api(&base, "/api/v1/flows/top?from=0&limit=1000");
    for s in [&[CLEAN][..], &LOSSY].concat() {
        let (_, r) = talkers
            .iter()
            .find(|(n, _)| n.contains(&format!(":{s} →")))
            .unwrap_or_else(|| panic!("flow {s} not among the talkers: {talkers:?}"));
        assert_eq!(shown(cell(r, 3)), at_g_per_flow[&s], "flow {s}: packets at G");
        let api_row = top["flows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["flow"]["sport"] == s && t["flow"]["proto"] == 17)
            .unwrap();
        assert_eq!(shown(cell(r, 1)), u(&api_row["bytes"]), "flow {s}: bytes");
    }
    for c in ["chart-talkers", "chart-sankey"] {
        assert!(tr["charts"][c]["marks"].as_u64().unwrap() > 0, "{c} empty");
    }

    // INT: the events the collector stored, and both heat maps drawn.
    let int = &report["views"]["int"];
    let events = api(&base, &format!("/api/v1/events?from={started}&limit=10000"));
    let n = events["events"].as_array().unwrap().len();
    assert!(n > 0, "no INT event stored");
    let listed = int["tables"]["events"].as_array().unwrap().len();
    assert_eq!(listed, n.min(500), "events listed");
    for c in ["chart-latency", "chart-queue"] {
        assert!(int["charts"][c]["marks"].as_u64().unwrap() > 0, "{c} empty");
    }

    // Health: the three agents, with the records the collector stored from each.
    let health = &report["views"]["health"];
    let agents = rows(health, "agents");
    let registered = api(&base, "/api/v1/agents");
    for a in registered.as_array().unwrap() {
        let name = a["agent"]["agent"].as_str().unwrap();
        let r = agents.get(name).unwrap_or_else(|| panic!("agent {name} not shown"));
        assert_eq!(shown(cell(r, 4)), u(&a["agent"]["records"]), "{name}: records");
    }
    // The three switches, and softflowd's address (an exporter is listed as an agent).
    assert_eq!(agents.len(), registered.as_array().unwrap().len());
    assert!(["s1", "s2", "s3"].iter().all(|a| agents.contains_key(*a)), "{agents:?}");

    // The time range: before the runs, nothing; the last hour again, the same as first.
    let before = &report["checks"]["before"];
    assert_eq!(before["cards"]["lost"], "0");
    assert!(before["url"].as_str().unwrap().contains("range=custom"));
    assert_eq!(report["checks"]["last_hour_again"]["cards"], ov["cards"]);
    // The filter: no TCP flow lost anything; one agent's segments only.
    let tcp = &report["checks"]["proto_tcp"];
    assert_eq!(tcp["cards"]["lost"], "0");
    assert!(rows(tcp, "flows").is_empty());
    let one = &report["checks"]["one_agent"];
    assert!(one["url"].as_str().unwrap().contains("agent=s3"));
    for (n, r) in rows(one, "segments") {
        assert_eq!(cell(r, 1), "s3", "{n}");
    }
}
