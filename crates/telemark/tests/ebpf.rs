//! `telemark agent` on the eBPF datapath, on real interfaces (needs root, iproute2, nftables
//! and bpftool, as CI has): sender → router namespace → receiver; the agent attaches to the
//! router's two interfaces (marking where traffic comes in, unmarking where it leaves) and
//! nftables drops a share of one flow in the router's forward chain. Ground truth: nftables'
//! own counter, and the datagrams the receiver got.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::Duration;

struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("tme-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(Stdio::null()).status();
        sh(&format!("ip netns add {name}"));
        Netns(name)
    }
    fn exec(&self, cmd: &str) -> String {
        sh(&format!("ip netns exec {} {cmd}", self.0))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed (this test needs root, iproute2, nftables, bpftool): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `f` on a thread inside namespace `ns`.
fn in_ns<R: Send>(ns: &str, f: impl FnOnce() -> R + Send) -> R {
    telemark_datapath::ebpf::in_netns(Some(ns), f).expect("enter the namespace")
}

#[test]
fn the_agent_finds_the_routers_loss_and_leaves_nothing_behind() {
    let (s, r, d) = (Netns::new("s"), Netns::new("r"), Netns::new("d"));
    let pid = std::process::id();
    sh(&format!("ip link add tme{pid}a netns {} type veth peer name r-in netns {}", s.0, r.0));
    sh(&format!("ip link add tme{pid}b netns {} type veth peer name r-out netns {}", d.0, r.0));
    s.exec(&format!("ip link set tme{pid}a name s0"));
    d.exec(&format!("ip link set tme{pid}b name d0"));
    for (ns, dev, addr, gw) in
        [(&s, "s0", "10.78.1.1/24", "10.78.1.254"), (&d, "d0", "10.78.2.2/24", "10.78.2.254")]
    {
        ns.exec(&format!("ip addr add {addr} dev {dev}"));
        ns.exec(&format!("ip link set {dev} up"));
        ns.exec(&format!("ip route add default via {gw}"));
    }
    r.exec("ip addr add 10.78.1.254/24 dev r-in");
    r.exec("ip addr add 10.78.2.254/24 dev r-out");
    r.exec("ip link set r-in up");
    r.exec("ip link set r-out up");
    r.exec("sysctl -qw net.ipv4.ip_forward=1");
    r.exec(
        "nft 'add table inet tme; add chain inet tme fw { type filter hook forward priority 0; }; \
         add rule inet tme fw udp dport 7777 numgen random mod 20 == 0 counter drop'",
    );

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!(
            "agent = \"h1\"\n[ebpf]\nperiod = \"50ms\"\n\
             [[port]]\ninterface = \"r-in\"\nnetns = \"{0}\"\nmark = true\n\
             [[port]]\ninterface = \"r-*\"\nnetns = \"{0}\"\nunmark = true\n",
            r.0
        ),
    )
    .unwrap();
    let mut agent = Command::new(env!("CARGO_BIN_EXE_telemark"))
        .args(["agent", "--config", cfg.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let links = sh("bpftool link show");
    assert!(
        links.matches("tcx").count() >= 4
            || links.matches("type 11").count() >= 4
            || links.contains("tm_ingress"),
        "{links}"
    );

    let rx = {
        let d = d.0.clone();
        std::thread::spawn(move || {
            in_ns(&d, || {
                let sock = UdpSocket::bind("10.78.2.2:7777").unwrap();
                sock.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
                let mut buf = [0u8; 2048];
                let mut n = 0u64;
                while sock.recv(&mut buf).is_ok() {
                    n += 1;
                }
                n
            })
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    const SENT: u64 = 5000;
    in_ns(&s.0, || {
        let sock = UdpSocket::bind("10.78.1.1:6666").unwrap();
        for i in 0..SENT {
            sock.send_to(&i.to_be_bytes(), "10.78.2.2:7777").unwrap();
            if i % 25 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    let received = rx.join().unwrap();
    let nft = r.exec("nft list chain inet tme fw");
    let dropped: u64 = nft
        .split("packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("nft counter");
    assert_eq!(received + dropped, SENT);

    // SIGTERM: the agent reads its last periods, then removes its hooks.
    sh(&format!("kill -TERM {}", agent.id()));
    let stdout = agent.stdout.take().unwrap();
    let lines: Vec<String> = BufReader::new(stdout).lines().map_while(Result::ok).collect();
    let status = agent.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut agent.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "agent: {status}: {err}");

    let (mut lost, mut uncertain, mut lossy_elsewhere) = (0u64, 0u64, 0u64);
    let mut reasons = std::collections::BTreeMap::<String, u64>::new();
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        if v["kind"] != "loss" || v["flow"]["dport"] != 7777 {
            continue;
        }
        if v["point"] == format!("out:{}:r-out", r.0) {
            assert_eq!(v["upstream"], format!("mark:{}:r-in", r.0), "{v}");
            lost += v["lost"].as_u64().unwrap();
            uncertain += v["uncertain"].as_u64().unwrap();
            for d in v["drops"].as_array().into_iter().flatten() {
                *reasons.entry(d["reason"].as_str().unwrap().to_string()).or_default() +=
                    d["packets"].as_u64().unwrap();
            }
        } else {
            lossy_elsewhere += v["lost"].as_u64().unwrap();
        }
    }
    eprintln!("nft dropped {dropped}; agent: lost {lost}, uncertain {uncertain}");
    assert_eq!(
        lost + uncertain,
        dropped,
        "lost {lost} + uncertain {uncertain} against nft's {dropped}"
    );
    assert!(lost * 100 >= dropped * 97, "lost {lost} of {dropped}");
    assert_eq!(lossy_elsewhere, 0, "loss reported at another point");
    // The kernel's reason for every drop: the nftables rule's.
    assert_eq!(reasons, std::collections::BTreeMap::from([("NETFILTER_DROP".into(), dropped)]));

    // Nothing left behind: no program, no filter.
    let progs = sh("bpftool prog show");
    assert!(!progs.contains("tm_ingress") && !progs.contains("tm_egress"), "{progs}");
    for dev in ["r-in", "r-out"] {
        for dir in ["ingress", "egress"] {
            let f = r.exec(&format!("tc filter show dev {dev} {dir}"));
            assert!(!f.contains("tm_"), "{dev} {dir}: {f}");
        }
    }
}
