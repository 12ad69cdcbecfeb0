#!/usr/bin/env python3
"""The cost of measuring, after "The cost of measuring with sFlow and IPFIX" (sections IV-V,
Figs. 2, 3, 8, 9), on two software switches side by side: the Telemark agent (an AF_PACKET
switch) and Open vSwitch's userspace datapath (testbed/ovs.sh).

Both switches join the same two hosts (namespaces PREFIXa 10.33.0.1 and PREFIXb 10.33.0.2,
veths PREFIXpa/PREFIXpb in the host namespace). Each configuration runs three workloads: TCP
bulk (iperf3), request/response (flowgrind) and UDP at 100 Mbit/s (iperf3). The switch runs on
core 1, the generators on core 0. Measured per workload: the switch process's CPU time (utime +
stime of every thread) per packet the switch received, the generators' results, and the
datagrams and bytes the exporter sent to 127.0.0.1:PORT as the kernel counted them (nftables).
For Telemark also the fast path's own per-stage cost records.

Writes OUT/cost-study.md (tables) and OUT/eval/cost-study.csv (one row per workload run).
Run as root: sudo eval/cost-study.sh [--seconds 5] [--rounds 1] [--configs none,sflow:64] ...
Python 3 standard library only.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
OVS_SH = ROOT / "testbed" / "ovs.sh"

IP_A, IP_B = "10.33.0.1", "10.33.0.2"
SWITCH_CORE, GEN_CORE = 1, 0
SFLOW_RATES = [1 << i for i in range(11)]  # 1, 2, 4, ..., 1024
IPFIX_RATES = [1, 4, 16, 64, 256, 1024]
WORKLOADS = ("tcp", "rr", "udp")
WORKLOAD_TITLE = {"tcp": "TCP bulk", "rr": "request/response", "udp": "UDP 100 Mbit/s"}
# After a workload: sFlow datagrams leave at most 0.5 s after their first sample, IPFIX
# caches report every 2 s (active and idle timeout), Telemark's cost records every second.
SETTLE_S = 2.5
FLOWGRIND_PORT = 5999
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class StudyError(Exception):
    """A step that failed; the message says what and why."""


def run(cmd: list[str], timeout: float = 60, env: Optional[dict] = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Runs a command with a timeout; a failure raises StudyError with the end of its stderr."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise StudyError(f"timed out after {timeout:g} s: {shlex.join(cmd)}") from None
    except OSError as e:
        raise StudyError(f"cannot run {cmd[0]}: {e}") from None
    if check and p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise StudyError(f"{shlex.join(cmd)} exited {p.returncode}: {' | '.join(tail)}")
    return p


def netns(ns: str, *cmd: str, core: Optional[int] = GEN_CORE) -> list[str]:
    """A command line that runs CMD in namespace NS, pinned to CORE."""
    pin = ["taskset", "-c", str(core)] if core is not None else []
    return ["ip", "netns", "exec", ns, *pin, *cmd]


def stop_process(p: Optional[subprocess.Popen], grace: float = 5) -> None:
    """SIGTERM, then SIGKILL after GRACE seconds; reaps it."""
    if p is None or p.poll() is not None:
        return
    try:
        p.terminate()
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} did not die after SIGKILL")
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------------------------
# Configurations


@dataclass(frozen=True)
class Config:
    """One measurement setting: `none`, `sflow:64`, `ipfix-cache:16`, `loss`, `all:1`, ..."""

    kind: str  # none | sflow | ipfix-cache | ipfix-nocache | loss | hh | all
    rate: Optional[int] = None

    @property
    def name(self) -> str:
        return self.kind if self.rate is None else f"{self.kind}:{self.rate}"

    @staticmethod
    def parse(text: str) -> "Config":
        kind, _, rate = text.strip().partition(":")
        if kind in ("none", "loss", "hh") and not rate:
            return Config(kind)
        if kind in ("sflow", "ipfix-cache", "ipfix-nocache", "all") and rate.isdigit() \
                and int(rate) >= 1:
            return Config(kind, int(rate))
        raise ValueError(f"unknown configuration {text!r} (none, sflow:N, ipfix-cache:N, "
                         "ipfix-nocache:N, loss, hh, all:N)")


def default_configs(switch: str) -> list[Config]:
    cs = [Config("none")]
    cs += [Config("sflow", n) for n in SFLOW_RATES]
    cs += [Config("ipfix-cache", n) for n in IPFIX_RATES]
    cs += [Config("ipfix-nocache", n) for n in IPFIX_RATES]
    if switch == "telemark":
        cs += [Config("loss"), Config("hh"), Config("all", 1), Config("all", 64)]
    return cs


# ------------------------------------------------------------------------------------------
# Results


@dataclass
class Result:
    """One workload run on one switch in one configuration."""

    switch: str
    config: str
    workload: str
    round: int
    workload_s: int = 0  # the generator's duration (--seconds)
    seconds: float = 0.0  # the measured window: starting the generators, the workload, settling
    switch_packets: Optional[int] = None  # rx_packets of PREFIXpa + PREFIXpb
    cpu_ns_per_pkt: Optional[float] = None  # utime + stime of the switch process
    sched_ns_per_pkt: Optional[float] = None  # the same from schedstat (ns resolution)
    tcp_gbps: Optional[float] = None
    rr_tps: Optional[float] = None
    rr_rtt_ms: Optional[float] = None  # average
    rr_mbps: Optional[float] = None  # responses, Mbit/s received by the client
    udp_mbps: Optional[float] = None  # received
    udp_lost_pct: Optional[float] = None
    exp_datagrams: Optional[int] = None
    exp_bytes: Optional[int] = None  # IP bytes, as nftables counts them
    drops: Optional[int] = None  # Telemark: rx ring drops + tx drops (health records)
    stages: dict = field(default_factory=dict)  # Telemark: stage -> [packets, ns]
    error: str = ""

    def stage_ns(self, stage: str) -> Optional[float]:
        p, c = self.stages.get(stage, (0, 0))
        return c / p if p else None

    def csv_row(self) -> dict:
        row = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stages"}
        row["stages"] = ";".join(f"{s}={p}/{c}" for s, (p, c) in self.stages.items())
        row["stage_ns_per_pkt"] = ";".join(
            f"{s}={self.stage_ns(s):.1f}" for s in self.stages if self.stage_ns(s) is not None)
        for k, v in row.items():
            if isinstance(v, float):
                row[k] = f"{v:.6g}"
            elif v is None:
                row[k] = ""
        return row


CSV_FIELDS = [f.name for f in fields(Result) if f.name != "stages"] + ["stages",
                                                                        "stage_ns_per_pkt"]


# ------------------------------------------------------------------------------------------
# What the kernel counts


def proc_cpu_ns(pid: int) -> int:
    """utime + stime (fields 14 and 15 of /proc/PID/stat) of the whole process, in ns."""
    text = Path(f"/proc/{pid}/stat").read_text()
    rest = text[text.rindex(")") + 2:].split()  # rest[0] is field 3
    return (int(rest[11]) + int(rest[12])) * 1_000_000_000 // CLK_TCK


def sched_ns(pid: int) -> int:
    """Run time of the process's live threads from schedstat, ns (a finer cross-check)."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((t / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def core_busy_ns(core: int) -> int:
    """Time core CORE was not idle (user, nice, system, irq, softirq, steal), ns."""
    for line in Path("/proc/stat").read_text().splitlines():
        f = line.split()
        if f[0] == f"cpu{core}":
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, f[1:9])
            busy = user + nice + system + irq + softirq + steal
            return busy * 1_000_000_000 // CLK_TCK
    raise StudyError(f"no cpu{core} in /proc/stat")


def machine_busy(seconds: float = 1.0) -> float:
    """Share of both cores busy over SECONDS (0 to 1): another job (a build) skews the study."""
    def sample() -> int:
        return sum(core_busy_ns(c) for c in (GEN_CORE, SWITCH_CORE))
    a = sample()
    time.sleep(seconds)
    return (sample() - a) / (2 * seconds * 1e9)


def rx_packets(dev: str) -> int:
    return int(Path(f"/sys/class/net/{dev}/statistics/rx_packets").read_text())


class ExportSink:
    """A UDP socket on 127.0.0.1 that exporters send to (never drained: the kernel drops what
    overflows its buffer, the senders see no error), and an nftables counter of what is sent
    to it, in the host namespace's output hook."""

    def __init__(self, table: str):
        self.table = table
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.installed = False

    def install(self) -> None:
        rules = (f"table inet {self.table} {{\n"
                 f"  counter exp {{}}\n"
                 f"  chain out {{ type filter hook output priority 0; "
                 f"ip daddr 127.0.0.1 udp dport {self.port} counter name exp; }}\n"
                 f"}}\n")
        self.remove()
        p = subprocess.run(["nft", "-f", "-"], input=rules, text=True, capture_output=True,
                           timeout=20)
        if p.returncode != 0:
            raise StudyError(f"nft: {p.stderr.strip()}")
        self.installed = True

    def counts(self) -> tuple[int, int]:
        """(datagrams, bytes) sent to the sink so far."""
        out = run(["nft", "-j", "list", "counters", "table", "inet", self.table], 20).stdout
        for item in json.loads(out)["nftables"]:
            c = item.get("counter")
            if c and c.get("name") == "exp":
                return int(c["packets"]), int(c["bytes"])
        raise StudyError("nft: counter exp not found")

    def remove(self) -> None:
        try:
            subprocess.run(["nft", "delete", "table", "inet", self.table], capture_output=True,
                           timeout=20)
        except subprocess.TimeoutExpired:
            log(f"nft: deleting table inet {self.table} timed out")
        self.installed = False

    def close(self) -> None:
        self.remove()
        self.sock.close()


# ------------------------------------------------------------------------------------------
# The two hosts, shared by both switches


class Hosts:
    """Namespaces PREFIXa and PREFIXb (testbed/ovs.sh) and the flowgrind daemons in them."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.ns_a, self.ns_b = f"{prefix}a", f"{prefix}b"
        self.ports = [f"{prefix}pa", f"{prefix}pb"]
        self.flowgrindd: list[subprocess.Popen] = []

    def ovs_sh(self, *args: str, env: Optional[dict] = None, timeout: float = 120) -> None:
        run([str(OVS_SH), self.prefix, *args], timeout, env={**os.environ, **(env or {})})

    def offloads_off(self) -> None:
        """The switch must see MTU-sized frames: no GRO/GSO/TSO on the switch side of the
        veths (ovs.sh already turns tx checksum offload off on both sides)."""
        for dev in self.ports:
            run(["ethtool", "-K", dev, "gro", "off", "gso", "off", "tso", "off"], 20)

    def rx_packets(self) -> int:
        return sum(rx_packets(d) for d in self.ports)

    def start_flowgrindd(self) -> None:
        if not shutil.which("flowgrindd"):
            return
        for ns in (self.ns_a, self.ns_b):
            # -d: stay in the foreground (and log to stderr), so the pid is the daemon's.
            self.flowgrindd.append(subprocess.Popen(
                netns(ns, "flowgrindd", "-d", "-p", str(FLOWGRIND_PORT)),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.5)

    def stop_flowgrindd(self) -> None:
        for p in self.flowgrindd:
            stop_process(p, 3)
        self.flowgrindd = []

    def down(self) -> None:
        self.stop_flowgrindd()
        try:
            self.ovs_sh("down", timeout=90)
        except StudyError as e:
            log(f"teardown: {e}")


# ------------------------------------------------------------------------------------------
# Workloads: each returns the generator's figures


def wait_listening(ns: str, port: int, proto: str = "t", timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = run(["ip", "netns", "exec", ns, "ss", "-Hln" + proto, f"sport = :{port}"], 10,
                check=False)
        if p.stdout.strip():
            return
        time.sleep(0.1)
    raise StudyError(f"nothing listens on port {port} in {ns} after {timeout:g} s")


def iperf3(hosts: Hosts, seconds: int, *client_args: str) -> dict:
    """iperf3 -s -1 in B (foreground, under timeout), a client in A; the client's JSON."""
    server = subprocess.Popen(
        ["ip", "netns", "exec", hosts.ns_b, "timeout", str(seconds + 30),
         "taskset", "-c", str(GEN_CORE), "iperf3", "-s", "-1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(hosts.ns_b, 5201)
        p = run(netns(hosts.ns_a, "iperf3", "-c", IP_B, "-t", str(seconds), "-J", *client_args),
                seconds + 25, check=False)
        try:
            data = json.loads(p.stdout)
        except json.JSONDecodeError:
            raise StudyError(f"iperf3 client exited {p.returncode}: "
                             f"{(p.stderr or p.stdout).strip()[-200:]}") from None
        if "error" in data:
            raise StudyError(f"iperf3: {data['error']}")
        return data
    finally:
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            stop_process(server, 2)


def workload_tcp(hosts: Hosts, seconds: int) -> dict:
    """Figs. 2 and 9: one TCP flow as fast as it goes."""
    end = iperf3(hosts, seconds)["end"]
    return {"tcp_gbps": end["sum_received"]["bits_per_second"] / 1e9}


def workload_udp(hosts: Hosts, seconds: int) -> dict:
    """Fig. 8a: one UDP flow at 100 Mbit/s, 1400-byte datagrams."""
    end = iperf3(hosts, seconds, "-u", "-b", "100M", "-l", "1400")["end"]
    rcv = end.get("sum_received") or end["sum"]
    return {"udp_mbps": rcv["bits_per_second"] / 1e6,
            "udp_lost_pct": end["sum"].get("lost_percent")}


FLOWGRIND_S = re.compile(r"^# ID\s+\d+ S: (?P<line>.*)$", re.M)


def parse_flowgrind(out: str) -> dict:
    """The source's (S:) line: `through = OUT/IN [Mbit/s] (out/in)`, `transactions/s = T [#]`,
    `RTT = MIN/AVG/MAX [ms] (min/avg/max)`."""
    m = FLOWGRIND_S.search(out)
    if not m:
        raise StudyError(f"flowgrind printed no source line: {out.strip()[-300:]!r}")
    line = m.group("line")

    def num(pattern: str, group: int = 1) -> Optional[float]:
        g = re.search(pattern, line)
        try:
            return float(g.group(group)) if g else None
        except ValueError:  # "inf", "nan" when nothing was measured
            return None

    r = {"rr_tps": num(r"transactions/s = ([\d.]+)"),
         "rr_rtt_ms": num(r"RTT = ([\d.infa]+)/([\d.infa]+)/([\d.infa]+)", 2),
         "rr_mbps": num(r"through = ([\d.]+)/([\d.]+) \[Mbit/s\]", 2)}
    if r["rr_tps"] is None:
        raise StudyError(f"flowgrind: no transactions/s in {line[:200]!r}")
    return r


def workload_rr(hosts: Hosts, seconds: int) -> dict:
    """Fig. 3: flowgrind request/response, 512-byte requests, 4096-byte responses, 0.1 ms
    between requests (about 10k transactions/s at most)."""
    if not hosts.flowgrindd:
        raise StudyError("flowgrindd is not installed")
    p = run(netns(hosts.ns_a, "flowgrind", "-H", f"s={IP_A},d={IP_B}", "-T", f"s={seconds}",
                  "-G", "s=q:C:512", "-G", "s=p:C:4096", "-G", "s=g:C:0.0001", "-Q"),
            seconds + 30, check=False)
    if p.returncode != 0:
        raise StudyError(f"flowgrind exited {p.returncode}: "
                         f"{(p.stderr or p.stdout).strip()[-300:]}")
    return parse_flowgrind(p.stdout)


WORKLOAD_FNS: dict[str, Callable[[Hosts, int], dict]] = {
    "tcp": workload_tcp, "rr": workload_rr, "udp": workload_udp}


# ------------------------------------------------------------------------------------------
# The switches


class Switch:
    """A switch between the two hosts; `apply` sets it up in one configuration."""

    name = ""
    label = ""

    def __init__(self, hosts: Hosts, sink: ExportSink):
        self.hosts, self.sink = hosts, sink

    @staticmethod
    def supports(cfg: Config) -> bool:
        raise NotImplementedError

    def build(self) -> None:
        raise NotImplementedError

    def apply(self, cfg: Config) -> None:
        raise NotImplementedError

    def pid(self) -> int:
        raise NotImplementedError

    def mark(self) -> int:
        """A position in the switch's own records (Telemark's cost records)."""
        return 0

    def own_records(self, since: int) -> tuple[dict, Optional[int]]:
        """Per-stage [packets, ns] and drops since a mark."""
        return {}, None

    def teardown(self) -> None:
        self.hosts.down()


class TelemarkSwitch(Switch):
    name, label = "telemark", "Telemark"

    def __init__(self, hosts: Hosts, sink: ExportSink, binary: Path, workdir: Path):
        super().__init__(hosts, sink)
        self.binary, self.workdir = binary, workdir
        self.proc: Optional[subprocess.Popen] = None
        self.errlog = workdir / "agent.err"
        self.errfile = None
        self.records: list[dict] = []  # cost and health records, in arrival order
        self.lock = threading.Lock()

    @staticmethod
    def supports(cfg: Config) -> bool:
        return True

    def build(self) -> None:
        self.hosts.ovs_sh("hosts")
        self.hosts.offloads_off()
        self.hosts.start_flowgrindd()

    def config_toml(self, cfg: Config) -> str:
        pa, pb = self.hosts.ports
        sink = f'["127.0.0.1:{self.sink.port}"]'
        measure = cfg.kind in ("loss", "all")
        t = [f'agent = "cost"', f"measure = {'true' if measure else 'false'}", "",
             "[[pair]]", f'a = "{pa}"', f'b = "{pb}"', 'mark = "a"', "",
             "[export]", 'summary_interval = "1s"', ""]
        if cfg.kind == "sflow":
            t += ["[sflow]", f"collectors = {sink}", f"sampling = {cfg.rate}",
                  'polling = "10s"', ""]
        if cfg.kind in ("ipfix-cache", "ipfix-nocache", "all"):
            # idle_timeout 2 s as well: OvS reports every cached flow 2 s after it opened, and
            # the next workload's window must not get this one's last records.
            t += ["[ipfix]", f"collectors = {sink}", f"sampling = {cfg.rate}",
                  'active_timeout = "2s"', 'idle_timeout = "2s"',
                  f"max_flows = {0 if cfg.kind == 'ipfix-nocache' else 4096}", ""]
        if cfg.kind in ("hh", "all"):
            t += ["[heavy_hitters]", 'window = "1s"', ""]
        return "\n".join(t)

    def apply(self, cfg: Config) -> None:
        self.stop_agent()
        conf = self.workdir / "agent.toml"
        conf.write_text(self.config_toml(cfg))
        with self.lock:
            self.records = []
        self.errfile = open(self.errlog, "w")
        self.proc = subprocess.Popen(
            ["taskset", "-c", str(SWITCH_CORE), str(self.binary), "agent", "--config",
             str(conf)],
            stdout=subprocess.PIPE, stderr=self.errfile, text=True, bufsize=1)
        threading.Thread(target=self.read_records, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StudyError(f"agent exited {self.proc.returncode} at start: "
                                 f"{self.err_tail()}")
            if " running " in self.errlog.read_text():
                break
            time.sleep(0.1)
        else:
            raise StudyError(f"agent did not start within 10 s: {self.err_tail()}")
        run(["taskset", "-a", "-p", "-c", str(SWITCH_CORE), str(self.proc.pid)], 10)
        time.sleep(1)

    def err_tail(self) -> str:
        """The agent's complaint: its first error line and its last line."""
        try:
            lines = [ln.strip() for ln in self.errlog.read_text().splitlines() if ln.strip()]
        except OSError:
            lines = []
        if not lines:
            return "(no log)"
        first = next((ln for ln in lines if ln.startswith("telemark:") or " ERROR " in ln),
                     lines[-1])
        parts = [first] if first == lines[-1] else [first, lines[-1]]
        # Drop the log's time stamp and level: "2026-...Z ERROR telemark::agent: why".
        return " ".join(re.sub(r"^\S+Z\s+\w+\s+", "", ln) for ln in parts)[:400]

    def read_records(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            if '"kind":"cost"' in line or '"kind":"health"' in line:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                with self.lock:
                    if proc is self.proc:
                        self.records.append(rec)

    def pid(self) -> int:
        if self.proc is None or self.proc.poll() is not None:
            raise StudyError(f"agent is not running: {self.err_tail()}")
        return self.proc.pid

    def mark(self) -> int:
        with self.lock:
            return len(self.records)

    def own_records(self, since: int) -> tuple[dict, Optional[int]]:
        stages: dict[str, list[int]] = {}
        drops = 0
        with self.lock:
            recs = self.records[since:]
        for r in recs:
            if r.get("kind") == "cost":
                s = stages.setdefault(r["stage"], [0, 0])
                s[0] += int(r["packets"])
                s[1] += int(r["cycles"])
            elif r.get("kind") == "health":
                drops += int(r.get("rx_ring_drops", 0)) + int(r.get("tx_drops", 0))
        return stages, drops

    def stop_agent(self) -> None:
        # SIGTERM: the agent closes its batches and exports for up to 5 s.
        stop_process(self.proc, 8)
        self.proc = None
        if self.errfile:
            self.errfile.close()
            self.errfile = None

    def teardown(self) -> None:
        self.stop_agent()
        super().teardown()


class OvsSwitch(Switch):
    name, label = "ovs", "OvS"

    def __init__(self, hosts: Hosts, sink: ExportSink):
        super().__init__(hosts, sink)
        self.dir = Path(f"/tmp/{hosts.prefix}-ovs")

    @staticmethod
    def supports(cfg: Config) -> bool:
        return cfg.kind in ("none", "sflow", "ipfix-cache", "ipfix-nocache")

    def build(self) -> None:
        self.hosts.ovs_sh("up", env={"OVS_DATAPATH": "dummy"})
        self.hosts.offloads_off()
        self.hosts.start_flowgrindd()
        self.pin()

    def pin(self) -> None:
        # Configuration changes start threads: pin every thread again after each.
        run(["taskset", "-a", "-p", "-c", str(SWITCH_CORE), str(self.pid())], 10)

    def vsctl(self, *args: str) -> None:
        env = {**os.environ, **{k: str(self.dir) for k in
                                ("OVS_RUNDIR", "OVS_LOGDIR", "OVS_DBDIR", "OVS_SYSCONFDIR")}}
        run(["ovs-vsctl", f"--db=unix:{self.dir}/db.sock", "--timeout=25", *args], 30, env=env)

    def apply(self, cfg: Config) -> None:
        self.vsctl("clear", "Bridge", f"br-{self.hosts.prefix}", "sflow", "ipfix")
        port = str(self.sink.port)
        if cfg.kind == "sflow":
            self.hosts.ovs_sh("sflow", port, str(cfg.rate))
        elif cfg.kind == "ipfix-cache":
            self.hosts.ovs_sh("ipfix", port, str(cfg.rate), "in")
        elif cfg.kind == "ipfix-nocache":
            # OvS: cache_max_flows=0 and cache_active_timeout=0 turn the cache off.
            self.hosts.ovs_sh("ipfix", port, str(cfg.rate), "in",
                              env={"IPFIX_CACHE_FLOWS": "0", "IPFIX_ACTIVE_TIMEOUT": "0"})
        time.sleep(1)
        self.pin()

    def pid(self) -> int:
        try:
            pid = int((self.dir / "ovs-vswitchd.pid").read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            raise StudyError("ovs-vswitchd is not running") from None
        return pid


# ------------------------------------------------------------------------------------------
# Measuring one workload


@dataclass
class Snapshot:
    t: float
    cpu_ns: int
    sched_ns: int
    rx: int
    exp: tuple[int, int]
    mark: int

    @staticmethod
    def take(sw: Switch) -> "Snapshot":
        pid = sw.pid()
        return Snapshot(time.monotonic(), proc_cpu_ns(pid), sched_ns(pid),
                        sw.hosts.rx_packets(), sw.sink.counts(), sw.mark())


def measure(sw: Switch, cfg: Config, workload: str, rnd: int, seconds: int) -> Result:
    res = Result(sw.name, cfg.name, workload, rnd, workload_s=seconds)
    try:
        before = Snapshot.take(sw)
        figures = WORKLOAD_FNS[workload](sw.hosts, seconds)
        time.sleep(SETTLE_S)  # exports and cost records of the workload's last packets
        after = Snapshot.take(sw)
    except Exception as e:  # a broken run is a row with its reason, never the end of the study
        res.error = error_text(e)
        return res
    for k, v in figures.items():
        setattr(res, k, v)
    res.seconds = after.t - before.t
    pkts = after.rx - before.rx
    res.switch_packets = pkts
    if pkts > 0:
        res.cpu_ns_per_pkt = (after.cpu_ns - before.cpu_ns) / pkts
        res.sched_ns_per_pkt = (after.sched_ns - before.sched_ns) / pkts
    else:
        res.error = "the switch received no packets"
    res.exp_datagrams = after.exp[0] - before.exp[0]
    res.exp_bytes = after.exp[1] - before.exp[1]
    res.stages, res.drops = sw.own_records(before.mark)
    return res


def error_text(e: Exception) -> str:
    return str(e) if isinstance(e, StudyError) else f"{type(e).__name__}: {e}"


def describe(r: Result) -> str:
    if r.error:
        return f"ERROR {r.error}"
    main = {"tcp": lambda: f"{r.tcp_gbps:.2f} Gbit/s",
            "rr": lambda: f"{r.rr_tps:.0f} tps, RTT {r.rr_rtt_ms} ms",
            "udp": lambda: f"{r.udp_mbps:.1f} Mbit/s"}[r.workload]()
    cpu = f"{r.cpu_ns_per_pkt:.0f}" if r.cpu_ns_per_pkt is not None else "-"
    st = " ".join(f"{s}={r.stage_ns(s):.0f}" for s in r.stages if r.stage_ns(s) is not None)
    return (f"{main}, {r.switch_packets} pkts, {cpu} ns/pkt"
            f"{' [' + st + ']' if st else ''}, exported {r.exp_datagrams} dgrams "
            f"{r.exp_bytes} B")


def run_switch(sw: Switch, configs: list[Config], args, results: list[Result],
               progress: list[int]) -> None:
    """Every configuration on one switch: build it, then each config, each round, each
    workload. A configuration that fails to start becomes error rows, never a crash."""
    log(f"{sw.label}: building the testbed ({sw.hosts.prefix})")
    sw.build()
    for cfg in configs:
        try:
            log(f"{sw.label} {cfg.name}: configuring")
            sw.apply(cfg)
            start_error = ""
        except Exception as e:
            start_error = f"switch did not start: {error_text(e)}"
            log(f"{sw.label} {cfg.name}: {start_error}")
        for rnd in range(1, args.rounds + 1):
            for w in WORKLOADS:
                progress[0] += 1
                if start_error:
                    r = Result(sw.name, cfg.name, w, rnd, error=start_error)
                else:
                    r = measure(sw, cfg, w, rnd, args.seconds)
                results.append(r)
                log(f"[{progress[0]}/{progress[1]}] {sw.label} {cfg.name} {w} "
                    f"round {rnd}: {describe(r)}")


# ------------------------------------------------------------------------------------------
# Medians and tables

# The switch CPU per packet the tables show: schedstat's run time, to the nanosecond (utime +
# stime, in 10 ms ticks, is in the CSV beside it; the two agree within a few per cent).
CPU = "sched_ns_per_pkt"

NUMERIC = [f.name for f in fields(Result)
           if f.name not in ("switch", "config", "workload", "round", "stages", "error")]


@dataclass
class Median:
    """The median over rounds of one (switch, config, workload)."""

    values: dict
    stages: dict  # stage -> median ns/packet
    error: str
    rounds: int


def medians(results: list[Result]) -> dict[tuple[str, str, str], Median]:
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.switch, r.config, r.workload), []).append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if not r.error]
        vals = {}
        for name in NUMERIC:
            xs = [getattr(r, name) for r in ok if getattr(r, name) is not None]
            vals[name] = statistics.median(xs) if xs else None
        stage_names = [s for r in ok for s in r.stages]
        stages = {}
        for s in dict.fromkeys(stage_names):
            xs = [r.stage_ns(s) for r in ok if r.stage_ns(s) is not None]
            stages[s] = statistics.median(xs) if xs else None
        err = "" if ok else rs[0].error
        out[key] = Median(vals, stages, err, len(ok))
    return out


def fmt_ns(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def fmt_gbps(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.2f}" if v >= 0.1 else f"{v:.3f}")


def fmt_int(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:,.0f}"


def fmt_ms(v: Optional[float]) -> str:
    return "–" if v is None else (f"{v:.2f}" if v >= 0.1 else f"{v:.3f}")


def fmt_bytes(v: Optional[float]) -> str:
    if v is None:
        return "–"
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


class Tables:
    """Markdown tables from the medians; a missing run is "–", a failed one "error"."""

    def __init__(self, med: dict, switches: list[str], results: list[Result]):
        self.med, self.switches, self.results = med, switches, results

    def cell(self, sw: str, cfg: str, w: str, value: str,
             fmt: Callable[[Optional[float]], str]) -> str:
        m = self.med.get((sw, cfg, w))
        if m is None:
            return "–"
        if m.error:
            return "error"
        return fmt(m.values.get(value))

    def rates(self, kinds: tuple[str, ...]) -> list[int]:
        rs = set()
        for (_, cfg, _) in self.med:
            c = Config.parse(cfg)
            if c.kind in kinds and c.rate is not None:
                rs.add(c.rate)
        return sorted(rs)

    @staticmethod
    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        align = ["---"] + ["---:"] * (len(head) - 1)
        return ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"] + \
               ["| " + " | ".join(r) + " |" for r in rows]

    def cols(self, *pairs: tuple[str, str]) -> list[tuple[str, str, str]]:
        """(switch, kind, heading) for the switches in this run."""
        label = {"telemark": "Telemark", "ovs": "OvS"}
        return [(sw, kind, f"{label[sw]} {title}") for kind, title in pairs
                for sw in ("telemark", "ovs") if sw in self.switches]

    def rate_rows(self, kinds: tuple[str, ...]) -> list[tuple[str, Optional[int]]]:
        return [("off", None)] + [(f"1:{n}", n) for n in self.rates(kinds)]

    def throughput(self) -> list[str]:
        cols = self.cols(("sflow", "sFlow"), ("ipfix-cache", "IPFIX cache"),
                         ("ipfix-nocache", "IPFIX no cache"))
        rows = []
        for label, n in self.rate_rows(("sflow", "ipfix-cache", "ipfix-nocache")):
            rows.append([label] + [
                self.cell(sw, "none" if n is None else f"{kind}:{n}", "tcp", "tcp_gbps",
                          fmt_gbps) for sw, kind, _ in cols])
        return self.table(["sampling"] + [c[2] for c in cols], rows)

    def request_response(self) -> list[str]:
        head, spec = ["sFlow sampling"], []
        for sw in self.switches:
            lab = {"telemark": "Telemark", "ovs": "OvS"}[sw]
            for value, title, fmt in ((CPU, "ns/pkt", fmt_ns),
                                      ("switch_packets", "kpkt/s", None),
                                      ("rr_tps", "trans/s", fmt_int),
                                      ("rr_rtt_ms", "RTT ms", fmt_ms)):
                head.append(f"{lab} {title}")
                spec.append((sw, value, fmt))
        rows = []
        for label, n in self.rate_rows(("sflow",)):
            cfg = "none" if n is None else f"sflow:{n}"
            row = [label]
            for sw, value, fmt in spec:
                if fmt is None:  # packets per second of the switch
                    m = self.med.get((sw, cfg, "rr"))
                    if m is None or m.error:
                        row.append("–" if m is None else "error")
                    else:
                        p, s = m.values["switch_packets"], m.values["workload_s"]
                        row.append(f"{p / s / 1e3:.1f}" if p and s else "–")
                else:
                    row.append(self.cell(sw, cfg, "rr", value, fmt))
            rows.append(row)
        return self.table(head, rows)

    def udp(self, kind: str) -> list[str]:
        head, spec = ["sampling"], []
        for sw in self.switches:
            lab = {"telemark": "Telemark", "ovs": "OvS"}[sw]
            for value, title, fmt in ((CPU, "ns/pkt", fmt_ns),
                                      ("exp_datagrams", "datagrams", fmt_int),
                                      ("exp_bytes", "bytes", fmt_bytes)):
                head.append(f"{lab} {title}")
                spec.append((sw, value, fmt))
        rows = []
        for label, n in self.rate_rows((kind,)):
            cfg = "none" if n is None else f"{kind}:{n}"
            rows.append([label] + [self.cell(sw, cfg, "udp", v, f) for sw, v, f in spec])
        return self.table(head, rows)

    def stages(self) -> list[str]:
        wanted = ["none", "loss", "hh", "all:1", "all:64"]
        keys = [("telemark", c, w) for c in wanted for w in WORKLOADS
                if ("telemark", c, w) in self.med]
        names = list(dict.fromkeys(s for k in keys for s in self.med[k].stages))
        head = ["config", "workload", "result", "process CPU ns/pkt"] + \
               [f"`{s}` ns/pkt" for s in names]
        rows = []
        for k in keys:
            m = self.med[k]
            _, c, w = k
            if m.error:
                rows.append([c, WORKLOAD_TITLE[w], "error", "–"] + ["–"] * len(names))
                continue
            v = m.values
            result = {"tcp": f"{fmt_gbps(v['tcp_gbps'])} Gbit/s",
                      "rr": f"{fmt_int(v['rr_tps'])} trans/s",
                      "udp": f"{v['udp_mbps']:.0f} Mbit/s" if v['udp_mbps'] else "–"}[w]
            rows.append([c, WORKLOAD_TITLE[w], result, fmt_ns(v[CPU])] +
                        [fmt_ns(m.stages.get(s)) for s in names])
        return self.table(head, rows)

    def headline(self) -> list[str]:
        ovs = self.med.get(("ovs", "sflow:64", "tcp"))
        lines = []
        for cfg, what in (("all:1", "loss + heavy hitters + IPFIX 1:1"),
                          ("all:64", "loss + heavy hitters + IPFIX 1:64")):
            tm = self.med.get(("telemark", cfg, "tcp"))
            if tm is None or ovs is None:
                continue
            if tm.error or ovs.error:
                why = tm.error or ovs.error
                lines.append(f"- Telemark `{cfg}` ({what}) vs OvS sFlow 1:64: not measured "
                             f"({why}).")
                continue
            tc, oc = tm.values[CPU], ovs.values[CPU]
            tg, og = tm.values["tcp_gbps"], ovs.values["tcp_gbps"]
            lines.append(
                f"- **Telemark `{cfg}` ({what}) vs OvS sFlow 1:64**, TCP bulk: "
                f"{fmt_ns(tc)} vs {fmt_ns(oc)} ns of switch CPU per packet "
                f"(**{tc / oc:.2f}×**), {fmt_gbps(tg)} vs {fmt_gbps(og)} Gbit/s "
                f"(**{tg / og:.2f}×**).")
        # The measurement alone: each switch against its own forwarding, so that a faster
        # forwarding path does not pass for cheaper measurement.
        tm0 = self.med.get(("telemark", "none", "tcp"))
        ovs0 = self.med.get(("ovs", "none", "tcp"))
        tm = self.med.get(("telemark", "all:64", "tcp"))
        if all(m is not None and not m.error for m in (tm0, ovs0, tm, ovs)):
            def added(sw: str, cfg: str, m, base) -> str:
                d = m.values[CPU] - base.values[CPU]
                share = d / base.values[CPU]
                rate = m.values["tcp_gbps"] / base.values["tcp_gbps"]
                return (f"{fmt_ns(d)} ns per packet ({share:+.0%}; rounds {self.spread(sw, cfg)}"
                        f" against {self.spread(sw, 'none')} ns without it), throughput "
                        f"{rate:.2f}× its own")
            lines.append(
                f"- **The measurement alone**, each switch against itself forwarding without "
                f"it (TCP bulk): Telemark `all:64` adds {added('telemark', 'all:64', tm, tm0)}; "
                f"OvS sFlow 1:64 adds {added('ovs', 'sflow:64', ovs, ovs0)}. Where the rounds' "
                f"ranges overlap, the difference is inside this machine's run-to-run noise.")
        return lines or ["- (needs Telemark `all:1`/`all:64` and OvS `sflow:64` in the run)"]

    def spread(self, sw: str, cfg: str, workload: str = "tcp") -> str:
        """The lowest and highest CPU ns/packet over the rounds of one setting."""
        xs = [getattr(r, CPU) for r in self.results
              if (r.switch, r.config, r.workload) == (sw, cfg, workload) and not r.error
              and getattr(r, CPU) is not None]
        return f"{fmt_ns(min(xs))}–{fmt_ns(max(xs))}" if xs else "–"

    def errors(self) -> list[str]:
        seen = {}
        for (sw, cfg, w), m in sorted(self.med.items()):
            if m.error:
                seen.setdefault((sw, cfg, m.error), []).append(w)
        return [f"- {sw} `{cfg}` ({', '.join(ws)}): {err}"
                for (sw, cfg, err), ws in seen.items()]


def versions(args) -> str:
    """What ran: the commit, the binaries' versions and the kernel."""
    def first_line(cmd: list[str]) -> str:
        try:
            p = run(cmd, 10, check=False)
            return (p.stdout or p.stderr).strip().splitlines()[0]
        except (StudyError, IndexError):
            return "?"
    parts = [f"commit {first_line(['git', '-C', str(ROOT), 'rev-parse', '--short', 'HEAD'])}"]
    if "telemark" in args.switches:
        parts.append(first_line([str(args.binary), "--version"]))
    if "ovs" in args.switches:
        parts.append(first_line(["ovs-vswitchd", "--version"]))
    parts += [first_line(["iperf3", "--version"]).split(" (")[0], first_line(["flowgrind", "-v"]),
              f"Linux {os.uname().release}"]
    return ", ".join(parts)


def write_markdown(path: Path, results: list[Result], meta: dict, partial: bool) -> None:
    """The tables, from the results and the run's facts (`meta`: switches, seconds, rounds,
    busy_before, elapsed_s, command, ran)."""
    t = Tables(medians(results), meta["switches"], results)
    cmd, elapsed, seconds = meta["command"], meta["elapsed_s"], meta["seconds"]
    md = [
        "# The cost of measuring: Telemark and Open vSwitch",
        "",
        "<!-- Generated by eval/cost_study.py; edits are overwritten. -->",
        "",
        "What sFlow, IPFIX and Telemark's own measurements cost the switch that runs them, "
        "after \"The cost of measuring with sFlow and IPFIX\" (sections IV and V, Figs. 2, 3, 8 "
        "and 9), on two software switches side by side: the Telemark agent (`telemark agent`, "
        "an AF_PACKET switch, docs/agent.md) and Open vSwitch's userspace datapath "
        "(`testbed/ovs.sh`, OVS_DATAPATH=dummy).",
        "",
        "**How.** Two hosts (namespaces, 10.33.0.1 and 10.33.0.2) are joined by the switch "
        "through two veths, GRO/GSO/TSO off on the switch side so every switch handles "
        "MTU-sized frames. The switch process (all its threads) runs on core 1; iperf3, "
        "flowgrind and flowgrindd on core 0. Every configuration runs three workloads of "
        f"{seconds} s each: "
        "TCP bulk (`iperf3`, one flow), request/response (`flowgrind`, 512-byte requests, "
        "4096-byte responses, 0.1 ms gap: at most about 10k transactions/s, so a slower switch "
        "shows as RTT, not as fewer transactions) and UDP at 100 Mbit/s (`iperf3 -u -l 1400`).",
        "",
        "- **CPU ns/pkt**: the switch process's run time (the kernel's schedstat, summed over "
        f"its threads) over the workload and {SETTLE_S:g} s after it (exports still in "
        "flight), divided by the packets the switch received (rx_packets of both veths). For "
        "Telemark this includes its aggregator and export threads; for OvS every ovs-vswitchd "
        "thread. The CSV has utime + stime beside it (`cpu_ns_per_pkt`, in "
        f"{1000 // CLK_TCK} ms ticks); the two agree within a few per cent.",
        "- **Exported**: datagrams and IP bytes sent to the collector's port on 127.0.0.1, "
        "counted by an nftables counter (the kernel's count, not the exporter's). Nothing "
        "reads them.",
        "- **Stages** (Telemark only): the fast path's own `cost` records, per stage, busy ns "
        "divided by packets (docs/records.md).",
        "- Settings: sFlow 128-byte headers, counters every 10 s; IPFIX cache 4,096 flows, "
        "active timeout 2 s (Telemark also idle timeout 2 s); \"no cache\" is one record per "
        "sampled packet (Telemark `max_flows = 0`, OvS `cache_max_flows=0`, "
        "`cache_active_timeout=0`). `loss` is Telemark's loss monitor (`measure = true`), "
        "`hh` its heavy hitters (`[heavy_hitters] window = \"1s\"`), `all:N` both plus IPFIX "
        "1:N with the cache. `off` is the switch forwarding only.",
        "",
        f"**Caveat.** One machine with 2 cores shared by switch and generators, one run of "
        f"this script, medians of {meta['rounds']} round{'s' if meta['rounds'] > 1 else ''} "
        "(`--rounds`). Compare columns with each other, "
        "not with the paper's absolute numbers (8 cores, VMs, 10 Gbit/s jumbo TCP). "
        f"Before the run the two cores were {meta['busy_before']:.0%} busy with other work"
        + (" (**too busy: the numbers are noisy**)." if meta["busy_before"] > 0.15 else "."),
        "Open vSwitch here is its userspace datapath reading veths through AF_PACKET from its "
        "main thread (no kernel module, no DPDK, no PMD thread): its forwarding cost is in "
        "ovs-vswitchd's CPU, which it would not be with the kernel datapath, and a DPDK "
        "deployment forwards far faster. The comparison is of two AF_PACKET switches.",
        "",
        f"Regenerate (as root; {elapsed / 60:.0f} min for this run): `{cmd}`. The tables "
        "alone, from the run's CSV: `python3 eval/cost_study.py --tables-from docs`.",
        "",
        f"Ran: {meta['ran']}.",
        "",
    ]
    if partial:
        md += ["**This run was interrupted: the tables are incomplete.**", ""]
    md += ["## TCP throughput by sampling rate (Figs. 2 and 9)", "",
           "Gbit/s received by iperf3.", ""]
    md += t.throughput()
    md += ["", "## Request/response under sFlow (Fig. 3)", "",
           "Switch CPU per packet, the switch's packet rate, flowgrind's transactions per "
           "second and average RTT.", ""]
    md += t.request_response()
    md += ["", "Telemark's RTT is longer than Open vSwitch's at the same transaction rate: its "
           "AF_PACKET receive rings (TPACKET_V3) hand the switch a block of frames when the "
           "block is full or 2 ms after its first frame, so at a few tens of thousands of "
           "packets a second a frame can wait up to 2 ms in each direction. Bulk traffic "
           "fills blocks and does not wait."]
    md += ["", "## UDP at 100 Mbit/s: CPU and exported reports (Fig. 8a)", ""]
    for kind, title in (("sflow", "sFlow"), ("ipfix-cache", "IPFIX with cache"),
                        ("ipfix-nocache", "IPFIX without cache")):
        md += [f"### {title}", ""] + t.udp(kind) + [""]
    md += ["## Telemark's own measurements, per stage", "",
           "Process CPU is the whole agent per packet received; a stage's ns/pkt is its busy "
           "time in the fast path per packet it handled (packets counted in both "
           "directions).", ""]
    md += t.stages()
    md += ["", "## Headline", ""] + t.headline()
    errs = t.errors()
    if errs:
        md += ["", "## Runs that failed", ""] + errs
    md.append("")
    path.write_text("\n".join(md))


def write_csv(path: Path, results: list[Result]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in results:
            w.writerow(r.csv_row())


# ------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=5, help="length of each workload (5)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per configuration; "
                    "tables show medians (1)")
    ap.add_argument("--switches", default="telemark,ovs",
                    help="comma list of telemark, ovs (both)")
    ap.add_argument("--configs", default="",
                    help="comma list, e.g. none,sflow:64,all:1 (default: the whole study)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs",
                    help="writes OUT/cost-study.md and OUT/eval/cost-study.csv (docs/)")
    ap.add_argument("--binary", type=Path, default=ROOT / "target" / "release" / "telemark")
    ap.add_argument("--tables-from", type=Path, metavar="DIR",
                    help="measure nothing: write DIR/cost-study.md again from "
                         "DIR/eval/cost-study.csv and .json (a run's results)")
    a = ap.parse_args()
    if a.seconds < 1 or a.rounds < 1:
        ap.error("--seconds and --rounds must be 1 or more")
    a.switches = [s.strip() for s in a.switches.split(",") if s.strip()]
    for s in a.switches:
        if s not in ("telemark", "ovs"):
            ap.error(f"--switches: unknown switch {s!r} (telemark, ovs)")
    try:
        a.configs = [Config.parse(c) for c in a.configs.split(",") if c.strip()]
    except ValueError as e:
        ap.error(f"--configs: {e}")
    return a


def preflight(args) -> None:
    if os.geteuid() != 0:
        sys.exit("cost_study: run as root (namespaces, AF_PACKET, nftables, taskset)")
    if os.cpu_count() is None or os.cpu_count() < 2:
        sys.exit("cost_study: needs 2 cores (switch on core 1, generators on core 0)")
    tools = ["ip", "ethtool", "taskset", "nft", "iperf3", "ss", "timeout"]
    if "ovs" in args.switches:
        tools += ["ovs-vsctl", "ovs-vswitchd", "ovsdb-server", "ovsdb-tool", "ovs-ofctl"]
    missing = [t for t in tools if not shutil.which(t)]
    if missing:
        sys.exit(f"cost_study: missing tools: {', '.join(missing)}")
    if not shutil.which("flowgrind") or not shutil.which("flowgrindd"):
        log("flowgrind/flowgrindd not found: the request/response rows will be errors")
    if "telemark" in args.switches and not os.access(args.binary, os.X_OK):
        sys.exit(f"cost_study: no telemark binary at {args.binary} "
                 "(cargo build --release -p telemark, or --binary)")


def read_csv(path: Path) -> list[Result]:
    """Results as write_csv wrote them."""
    types = {f.name: f.type for f in fields(Result)}
    out = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            r = Result(row["switch"], row["config"], row["workload"], int(row["round"]))
            for name, text in row.items():
                if name in ("switch", "config", "workload", "round", "stage_ns_per_pkt"):
                    continue
                if name == "stages":
                    r.stages = {k: [int(x) for x in v.split("/")] for k, v in
                                (e.split("=") for e in text.split(";") if e)}
                elif name == "error":
                    r.error = text
                elif text != "":
                    kind = float if "float" in str(types[name]) else int
                    setattr(r, name, kind(float(text)))
            out.append(r)
    return out


def main() -> None:
    args = parse_args()
    if args.tables_from:
        # The tables again from a run's CSV and facts (no root, nothing measured).
        csv_path = args.tables_from / "eval" / "cost-study.csv"
        meta = json.loads(csv_path.with_suffix(".json").read_text())
        write_markdown(args.tables_from / "cost-study.md", read_csv(csv_path), meta, False)
        log(f"wrote {args.tables_from / 'cost-study.md'} from {csv_path}")
        return
    preflight(args)
    args.binary = args.binary.resolve()
    prefix = f"tmcost{os.getpid() % 1000}"
    workdir = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
    # This script and what it starts run on the generators' core unless pinned elsewhere.
    os.sched_setaffinity(0, {GEN_CORE})

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)

    classes = {"telemark": TelemarkSwitch, "ovs": OvsSwitch}
    plan = []
    for name in args.switches:
        cs = args.configs or default_configs(name)
        plan.append((name, [c for c in cs if classes[name].supports(c)]))
    progress = [0, sum(len(cs) for _, cs in plan) * len(WORKLOADS) * args.rounds]
    log(f"cost study: {progress[1]} workload runs of {args.seconds} s, prefix {prefix}")
    args.busy_before = machine_busy()
    if args.busy_before > 0.15:
        log(f"warning: the machine is already {args.busy_before:.0%} busy (both cores): "
            "something else runs, the results will be noisy")

    results: list[Result] = []
    sink = ExportSink(prefix)
    hosts = Hosts(prefix)
    started = time.monotonic()
    partial = False
    try:
        sink.install()
        for name, cs in plan:
            sw: Switch = TelemarkSwitch(hosts, sink, args.binary, workdir) \
                if name == "telemark" else OvsSwitch(hosts, sink)
            try:
                run_switch(sw, cs, args, results, progress)
            except Exception as e:  # the testbed itself failed: the rest of this switch
                why = error_text(e)
                log(f"{sw.label}: {why}; skipping the rest of this switch")
                done = {(r.config, r.workload) for r in results if r.switch == name}
                results += [Result(name, c.name, w, 1, error=why) for c in cs
                            for w in WORKLOADS if (c.name, w) not in done]
            finally:
                log(f"{sw.label}: tearing down")
                sw.teardown()
    except KeyboardInterrupt:
        partial = True
        log("interrupted: tearing down, writing what was measured")
    finally:
        hosts.down()
        sink.close()
        shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    if not results:
        sys.exit("cost_study: nothing measured")
    md, csv_path = args.out / "cost-study.md", args.out / "eval" / "cost-study.csv"
    meta = {"switches": args.switches, "seconds": args.seconds, "rounds": args.rounds,
            "busy_before": args.busy_before, "elapsed_s": elapsed,
            "command": shlex.join(["sudo", "eval/cost-study.sh"] + sys.argv[1:]),
            "ran": versions(args)}
    write_csv(csv_path, results)
    csv_path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    write_markdown(md, results, meta, partial)
    log(f"wrote {md} and {csv_path} ({elapsed / 60:.1f} min)")
    sys.exit(130 if partial else 0)


if __name__ == "__main__":
    main()
