#!/usr/bin/env python3
"""What a switch adds to a packet's round trip, next to the kernel's own bridge (run as root).

    sudo eval/latency.py [--binary target/release/telemark] [--against OTHER_BINARY]
                         [--seconds 5] [--out docs/eval/latency.txt]

Two hosts in network namespaces, joined through two veths by, in turn, a Linux bridge, the
Telemark agent's AF_PACKET switch (loss monitor on, marking at the first port), and, with
--against, another build of the agent (to compare before and after a change in one run):

    ns PFXa 10.44.0.1 ── a0 ═══ pa ─┐            ┌─ pb ═══ b0 ── ns PFXb 10.44.0.2
                                    └─ switch ───┘   (pa, pb in ns PFXs)

Per switch: `ping -i 0.01` (100 round trips a second), flowgrind request/response at about
10,000 transactions a second (512-byte requests, 1,024-byte responses), and iperf3 TCP bulk.
The same veths serve every switch; GRO/GSO/TSO and checksum offload are off on them so that
every switch handles MTU-sized frames. Prints one table (and writes it to --out).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PFX = f"lat{os.getpid() % 100000}"
NS_A, NS_B, NS_S = f"{PFX}a", f"{PFX}b", f"{PFX}s"
A_IP, B_IP = "10.44.0.1", "10.44.0.2"


def sh(*cmd: str, check: bool = True, timeout: float = 60) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def ns(name: str, *cmd: str, **kw) -> str:
    return sh("ip", "netns", "exec", name, *cmd, **kw)


def up() -> None:
    down()
    for n in (NS_A, NS_B, NS_S):
        sh("ip", "netns", "add", n)
        ns(n, "ip", "link", "set", "lo", "up")
    for host, hip, port in ((NS_A, A_IP, "pa"), (NS_B, B_IP, "pb")):
        peer = "a0" if port == "pa" else "b0"
        sh("ip", "link", "add", f"{PFX}{port}", "type", "veth", "peer", "name", f"{PFX}{peer}")
        sh("ip", "link", "set", f"{PFX}{port}", "netns", NS_S, "name", port)
        sh("ip", "link", "set", f"{PFX}{peer}", "netns", host, "name", peer)
        ns(host, "ip", "addr", "add", f"{hip}/24", "dev", peer)
        ns(host, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        ns(NS_S, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1")
        for n, dev in ((host, peer), (NS_S, port)):
            ns(n, "ethtool", "-K", dev, "tx", "off", "gro", "off", "gso", "off", "tso", "off",
               check=False)
            ns(n, "ip", "link", "set", dev, "up")
    # Static neighbours: no ARP on the measured path.
    mac = {h: json.loads(ns(h, "ip", "-j", "link", "show", d))[0]["address"]
           for h, d in ((NS_A, "a0"), (NS_B, "b0"))}
    ns(NS_A, "ip", "neigh", "replace", B_IP, "lladdr", mac[NS_B], "dev", "a0")
    ns(NS_B, "ip", "neigh", "replace", A_IP, "lladdr", mac[NS_A], "dev", "b0")


def down() -> None:
    for n in (NS_A, NS_B, NS_S):
        sh("ip", "netns", "del", n, check=False)


class Bridge:
    label = "Linux bridge"

    def start(self) -> None:
        ns(NS_S, "ip", "link", "add", "br0", "type", "bridge")
        for d in ("pa", "pb"):
            ns(NS_S, "ip", "link", "set", d, "master", "br0")
        ns(NS_S, "ip", "link", "set", "br0", "up")
        time.sleep(0.5)

    def stop(self) -> None:
        ns(NS_S, "ip", "link", "del", "br0", check=False)

    def cpu_s(self) -> float:
        return 0.0


class Agent:
    def __init__(self, binary: str, label: str, workdir: Path):
        self.binary, self.label, self.workdir = binary, label, workdir
        self.proc = None

    def start(self) -> None:
        conf = self.workdir / "agent.toml"
        conf.write_text(f'agent = "lat"\nnetns = "{NS_S}"\nmeasure = true\n\n'
                        '[[pair]]\na = "pa"\nb = "pb"\nmark = "a"\n')
        err = open(self.workdir / "agent.err", "w")
        self.proc = subprocess.Popen([self.binary, "agent", "--config", str(conf)],
                                     stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if " running " in (self.workdir / "agent.err").read_text():
                time.sleep(0.3)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"agent did not start: {(self.workdir / 'agent.err').read_text()}")

    def cpu_s(self) -> float:
        """The agent's CPU time so far (utime + stime of all its threads), in seconds."""
        f = open(f"/proc/{self.proc.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def switch_packets() -> int:
    """Frames the switch's two veths received."""
    return sum(json.loads(ns(NS_S, "ip", "-s", "-j", "link", "show", d))[0]["stats64"]["rx"]
               ["packets"] for d in ("pa", "pb"))


def ping(seconds: float) -> dict:
    n = int(seconds * 100)
    out = ns(NS_A, "ping", "-q", "-i", "0.01", "-c", str(n), "-W", "1", B_IP,
             timeout=seconds + 30, check=False)
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", out)
    loss = re.search(r"([\d.]+)% packet loss", out)
    if not m:
        return {"ping_avg_ms": None}
    return {"ping_avg_ms": float(m.group(2)), "ping_max_ms": float(m.group(3)),
            "ping_loss_pct": float(loss.group(1)) if loss else None}


def flowgrind(seconds: float) -> dict:
    # Request/response as the cost paper's Fig. 3: a 512-byte request, a 1,024-byte response,
    # a new request every 0.1 ms (about 10,000 transactions a second).
    out = ns(NS_A, "flowgrind", "-H", f"s={A_IP},d={B_IP}", "-T", f"s={seconds}",
             "-G", "s=q:C:512", "-G", "s=p:C:1024", "-G", "s=g:C:0.0001", "-Q",
             timeout=seconds + 60, check=False)
    # The source's line (`# ID 0 S: ...`): its transactions and round-trip times.
    src = re.search(r"^# ID\s+\d+ S: (.*)$", out, re.M)
    line = src.group(1) if src else ""
    tps = re.search(r"transactions/s = ([\d.]+)", line)
    rtt = re.search(r"RTT = ([\d.]+)/([\d.]+)/([\d.]+)", line)
    return {"rr_tps": float(tps.group(1)) if tps else None,
            "rr_rtt_avg_ms": float(rtt.group(2)) if rtt else None,
            "rr_rtt_max_ms": float(rtt.group(3)) if rtt else None}


def iperf(seconds: float) -> dict:
    srv = subprocess.Popen(["ip", "netns", "exec", NS_B, "iperf3", "-s", "-1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    try:
        out = ns(NS_A, "iperf3", "-c", B_IP, "-t", str(int(seconds)), "-J",
                 timeout=seconds + 30, check=False)
        gbps = json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e9
    except (ValueError, KeyError):
        gbps = None
    finally:
        srv.kill()
        srv.wait()
    return {"tcp_gbps": gbps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="target/release/telemark")
    ap.add_argument("--against", help="another telemark binary, measured in the same run")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--out", help="also write the table here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("run as root (network namespaces)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="tm-latency-"))
    switches = [Bridge(), Agent(os.path.abspath(a.binary), "Telemark", work)]
    if a.against:
        switches.append(Agent(os.path.abspath(a.against), f"Telemark ({a.against})", work))
    rows = []
    up()
    try:
        for fg in ("a", "b"):
            ns(NS_A if fg == "a" else NS_B, "flowgrindd", "-p", "5999", check=False)
        for sw in switches:
            sw.start()
            try:
                r = {"switch": sw.label}
                r.update(ping(a.seconds))
                pkts, cpu = switch_packets(), sw.cpu_s()
                r.update(flowgrind(a.seconds))
                pkts, cpu = switch_packets() - pkts, sw.cpu_s() - cpu
                r["rr_kpps"] = pkts / a.seconds / 1e3
                r["rr_cpu_us_per_pkt"] = cpu * 1e6 / pkts if pkts and cpu else None
                r.update(iperf(a.seconds))
                rows.append(r)
            finally:
                sw.stop()
    finally:
        sh("pkill", "-f", "flowgrindd -p 5999", check=False)
        down()
    head = ("switch", "ping avg ms", "ping max ms", "req/resp tps", "req/resp RTT avg ms",
            "req/resp RTT max ms", "req/resp kpkt/s", "switch CPU µs/pkt", "TCP Gbit/s")
    keys = ("switch", "ping_avg_ms", "ping_max_ms", "rr_tps", "rr_rtt_avg_ms",
            "rr_rtt_max_ms", "rr_kpps", "rr_cpu_us_per_pkt", "tcp_gbps")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k)
            cells.append(v if isinstance(v, str) else "n/a" if v is None else f"{v:.3f}"
                         if k != "rr_tps" else f"{v:,.0f}")
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    if a.out:
        Path(a.out).write_text(f"`sudo eval/latency.py --seconds {a.seconds:g}`, "
                               f"{time.strftime('%Y-%m-%d')}:\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
