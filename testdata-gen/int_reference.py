#!/usr/bin/env python3
"""Reference evaluation of the INT paper's detectors over Telemetry Reports a sink sent.

Reads report datagrams (one hex string per line), decodes them from the specifications
(Telemetry Report v2.0 §3: group header, individual report, RepMdBits; INT v2.1 §5: shim,
INT-MD header, per-hop stack), not from Telemark's code, and evaluates the detectors of the
INT paper (§III-C) on each packet's path: the sink's own metadata (the report's) first, then
the stack as it arrived, newest first.

    int_reference.py REPORTS.hex RULES.json      prints JSON {"packets": [...], "events": [...]}

RULES.json maps a UDP source port to a detector:
    {"4031": {"detector": "per_hop", "metric": "hop_latency", "threshold": 500000}, ...}
with detectors per_hop, per_flow, ewma (with "alpha"), noop and complex ("all": a list of
[metric, op, value] that must all hold, each over the largest value on the path).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from int_vectors import _parse_hop  # noqa: E402  (the spec's per-hop field table)

UNAVAILABLE = {"hop_latency": 0xFFFFFFFF, "queue_occupancy": 0xFFFFFF, "tx_utilization": 0xFFFFFFFF}


def be(b, at, n):
    return int.from_bytes(b[at:at + n], "big")


def decode(d):
    """One report datagram: (seq, node, sink hop, flow sport, stack hops newest first)."""
    ver = d[0] >> 4
    assert ver == 2, f"report version {ver}"
    seq = be(d, 0, 4) & 0x3FFFFF
    node = be(d, 4, 4)
    rep = d[8:]
    rep_type, in_type = rep[0] >> 4, rep[0] & 0x0F
    assert (rep_type, in_type) == (1, 3), "INT report with an Ethernet inner packet"
    body_len, md_len = rep[1] * 4, rep[2] * 4
    rep_md_bits = be(rep, 4, 2)
    assert rep_md_bits & 0x8000 == 0, "RepMdBits bit 0 is reserved (node ID is in the group)"
    sink, used = _parse_hop(rep[12:12 + md_len], rep_md_bits & 0x7FFE)
    assert used == md_len
    sink["node_id"] = node
    inner = rep[12 + md_len:4 + body_len]
    # Ethernet / IPv4 / UDP / INT shim (type 1 = INT-MD, NPT 0 = DSCP) / INT-MD header / stack
    assert be(inner, 12, 2) == 0x0800
    ip = inner[14:]
    ihl = (ip[0] & 0x0F) * 4
    assert ip[9] == 17
    udp = ip[ihl:]
    sport = be(udp, 0, 2)
    shim = udp[8:]
    assert shim[0] >> 4 == 1, "INT-MD shim"
    length = shim[1] * 4  # shim, header and stack, in bytes
    md = shim[4:]
    hop_ml = (md[2] & 0x1F) * 4
    instructions = be(md, 4, 2)
    stack = shim[16:length]
    hops = []
    for at in range(0, len(stack), hop_ml):
        h, used = _parse_hop(stack[at:at + hop_ml], instructions)
        assert used == hop_ml
        hops.append(h)
    return seq, node, sink, sport, hops


def available(hop, metric):
    v = hop.get(metric)
    return None if v is None or v == UNAVAILABLE.get(metric) else v


class Flow:
    def __init__(self, rule):
        self.rule = rule
        self.stored = 0  # per_flow / ewma: the last value that was an event
        self.per_switch = {}  # per_hop: switch ID -> the last value that was an event
        self.avg = 0  # ewma, in 1/65536ths

    def detect(self, path):
        r = self.rule
        m, t = r.get("metric"), r.get("threshold", 0)
        kind = r["detector"]
        if kind == "noop":
            return 0
        if kind == "per_hop":
            first = None
            for h in path:
                v = available(h, m)
                if v is None:
                    continue
                last = self.per_switch.get(h["node_id"], 0)
                if abs(v - last) > t:
                    self.per_switch[h["node_id"]] = v
                    if first is None:
                        first = v
            return first
        values = [v for v in (available(h, m) for h in path) if v is not None] if m else []
        if kind == "per_flow":
            s = sum(values)
            if abs(s - self.stored) > t:
                self.stored = s
                return s
            return None
        if kind == "ewma":
            a = round(r["alpha"] * 65536)
            self.avg = (self.avg * (65536 - a) + (sum(values) << 16) * a) >> 16
            avg = self.avg >> 16
            if abs(avg - self.stored) > t:
                self.stored = avg
                return avg
            return None
        if kind == "complex":
            ops = {">": lambda x, y: x > y, "<": lambda x, y: x < y}
            for metric, op, value in r["all"]:
                vs = [v for v in (available(h, metric) for h in path) if v is not None]
                if not vs or not ops[op](max(vs), value):
                    return None
            return 0
        raise ValueError(kind)


def main():
    lines = [ln.strip() for ln in open(sys.argv[1]) if ln.strip()]
    rules = {int(k): v for k, v in json.load(open(sys.argv[2])).items()}
    flows = {}
    packets, events, seqs = [], [], []
    for ln in lines:
        seq, node, sink, sport, hops = decode(bytes.fromhex(ln))
        seqs.append(seq)
        path = [sink] + hops
        time = sink["egress_ts"]
        packets.append({"sport": sport, "time": time, "path": path})
        if sport in rules:
            f = flows.setdefault(sport, Flow(rules[sport]))
            v = f.detect(path)
            if v is not None:
                events.append({"sport": sport, "time": time, "detector": rules[sport]["detector"],
                               "value": v})
    json.dump({"packets": packets, "events": events, "seqs": seqs}, sys.stdout)


if __name__ == "__main__":
    main()
