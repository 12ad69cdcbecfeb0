//! The chain testbed (testbed/chain.sh) for the tests that drive it: three Telemark switches
//! with a routed hop, A ─ [s1] ─ link 1 ─ [s2] ─ router ─ link 2 ─ [s3] ─ G, in namespaces
//! (root, iproute2, nftables), with nftables counting every chosen flow into and out of each
//! link: the ground truth.

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use telemark_agent::{Agent, FileConfig};
use telemark_lab::traffic::{self, FlowSpec};
use telemark_wire::FlowKey;

pub const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../testbed/chain.sh");

/// The testbed, removed when dropped.
pub struct Chain {
    pub prefix: String,
    /// One testbed at a time: the tests measure, and two would load the machine.
    _one: std::sync::MutexGuard<'static, ()>,
}

static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Chain {
    /// Builds the testbed with counters for flows of source ports `sports`.
    pub fn up(tag: &str, sports: &[u16]) -> Chain {
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let prefix = format!("tm{tag}{}-", std::process::id() % 100_000);
        let c = Chain { prefix, _one: one };
        c.run(&["up", &ports(sports)]);
        c
    }
}

impl Chain {
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("bash").arg(SCRIPT).arg(&self.prefix).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "chain.sh {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(SCRIPT).arg(&self.prefix).arg("down").status();
    }
}

pub fn ports(p: &[u16]) -> String {
    p.iter().map(u16::to_string).collect::<Vec<_>>().join(" ")
}

/// Switch `name` of the chain, marking on `mark`, with `[loss]` and `[export]` settings.
pub fn agent(prefix: &str, name: &str, mark: &str, url: &str, loss: &str, export: &str) -> Agent {
    let toml = format!(
        "agent = \"{name}\"\nnetns = \"{prefix}{name}\"\n\
         [[pair]]\na = \"{name}a\"\nb = \"{name}b\"\nmark = \"{mark}\"\n\
         [loss]\n{loss}\n\
         [export]\ncollector = \"{url}\"\ninterval = \"500ms\"\n{export}\n"
    );
    Agent::start(FileConfig::parse(&toml).unwrap().validate().unwrap()).unwrap()
}

pub fn key(sport: u16) -> FlowKey {
    FlowKey {
        src: "10.9.1.1".parse().unwrap(),
        dst: "10.9.2.7".parse().unwrap(),
        sport,
        dport: 7000,
        proto: 17,
        spi: None,
        si: None,
    }
}

/// Host A sends each flow of `sports` (UDP, 100-byte payloads, to the router's MAC) at `pps`
/// for `secs`, all at once; returns how many packets each sent.
pub fn send_flows(prefix: &str, sports: &[u16], pps: u64, secs: u64) -> Vec<u64> {
    let senders: Vec<_> = sports
        .iter()
        .map(|&sport| {
            let ns = format!("{prefix}a");
            std::thread::spawn(move || {
                let spec = FlowSpec {
                    key: key(sport),
                    src_mac: [2, 0, 0, 0, 1, 1],
                    dst_mac: [2, 0, 0, 0, 1, 0xfe],
                    payload: 100,
                    pps,
                    catch_up: traffic::catch_up(pps),
                    churn: false,
                };
                let stop = AtomicBool::new(false);
                traffic::send(Some(&ns), "a0", &spec, Duration::from_secs(secs), &stop).unwrap()
            })
        })
        .collect();
    senders.into_iter().map(|s| s.join().unwrap().sent).collect()
}

pub fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

pub fn capture(ns: String, iface: &'static str, stop: Arc<AtomicBool>) -> JoinHandle<Vec<Vec<u8>>> {
    use telemark_datapath::afpacket;
    let (mut rx, _tx) = afpacket::open(iface, Some(&ns), afpacket::RingConfig::default()).unwrap();
    std::thread::spawn(move || {
        let mut frames = Vec::new();
        loop {
            let done = stop.load(std::sync::atomic::Ordering::Acquire);
            while rx.rx_ready(|f, _| frames.push(f.to_vec())) > 0 {}
            if done {
                return frames;
            }
            afpacket::wait_readable(&[rx.fd()], 10);
        }
    })
}

/// UDP source port of a frame (the flow key Telemark's parser reads).
pub fn udp_sport(f: &[u8]) -> Option<u16> {
    let key = telemark_wire::flow::extract(f, telemark_wire::flow::LinkType::Ethernet).ok()?.key;
    (key.proto == 17).then_some(key.sport)
}
