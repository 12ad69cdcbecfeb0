#!/usr/bin/env python3
"""Independent INT / Telemetry Report test-vector generator.

Written from the P4.org specifications only (not from any Telemark code):
  * INT Dataplane Specification v2.1 (p4lang/p4-applications telemetry/specs/INT.mdk,
    tag "V2.1" 2020-11-11): 5.7.2 INT over TCP/UDP (shim), 5.8 INT-MD metadata header,
    5.9 INT-MX header, 5.6 Checksum Update, 4 What To Monitor.
  * Telemetry Report Format Specification v2.0 (telemetry_report.mdk, tag "v2.0"
    2020-10-08): 3.2 Group Header, 3.3 Individual Report Header, 3.3.1 RepType INT.

scapy is used only for the outer Ethernet/IPv4/IPv6/UDP/TCP headers and for pcap
writing.  Every INT / report byte is packed here with `struct`.

Usage:
    int_vectors.py OUTDIR              # writes int_md.{pcap,json}, trpt_v2.{pcap,json}
    int_vectors.py OUTDIR --self-check # generate, then re-parse with an independent parser
    int_vectors.py OUTDIR --check-only # only re-parse existing files

Output is fully deterministic (fixed seed, fixed pcap timestamps).

Conventions chosen where the spec leaves things to the deployment (see JSON "conventions"):
  * INT over UDP destination port (INT_TBD, not IANA-assigned): --int-port, default 5000.
  * DSCP value marking INT for NPT=0: 0x17 (value used in the spec's examples); the original
    DSCP is always stored in the shim and restored by the sink.
  * INT stack in TCP is placed after the TCP options (spec allows before or after).
  * Telemetry report UDP destination port: 32766 (spec: user configurable).
  * Truncated-packet inner contents are zero padded to a 4-byte multiple (Report Length
    is in words); the pad is recorded as inner_pad_len.
"""

import argparse
import hashlib
import json
import os
import random
import struct
import sys

try:
    import scapy  # noqa: F401
except ImportError:  # Debian's python3-scapy lives in dist-packages
    sys.path.append("/usr/lib/python3/dist-packages")

from scapy.layers.inet import IP, TCP, UDP  # noqa: E402
from scapy.layers.inet6 import IPv6  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402
from scapy.packet import Raw  # noqa: E402
from scapy.utils import PcapWriter  # noqa: E402

SEED = 0x1E1E_2021
INT_DSCP = 0x17
TRPT_PORT = 32766
PCAP_BASE_SEC = 1_600_000_000

INT_TYPE_MD = 1
INT_TYPE_MX = 3

# ---------------------------------------------------------------------------
# Instruction bitmap (INT v2.1 5.8): bit 0 = MSB of the 16-bit field.
# (bit, size in bytes, [(json field, width in bits), ...])
INSTR = [
    (0, 4, [("node_id", 32)]),
    (1, 4, [("l1_ingress_if", 16), ("l1_egress_if", 16)]),
    (2, 4, [("hop_latency", 32)]),
    (3, 4, [("queue_id", 8), ("queue_occupancy", 24)]),
    (4, 8, [("ingress_ts", 64)]),
    (5, 8, [("egress_ts", 64)]),
    (6, 8, [("l2_ingress_if", 32), ("l2_egress_if", 32)]),
    (7, 4, [("tx_utilization", 32)]),
    (8, 4, [("buffer_id", 8), ("buffer_occupancy", 24)]),
]
RESERVED_BITS = list(range(9, 15))  # 4 bytes each
CSUM_BIT = 15
INSTR_BY_BIT = {b: (sz, f) for b, sz, f in INSTR}

# Telemetry Report v2.0 RepMdBits (3.3.1): bit 0 reserved, 1..8 as INT, 9-14 reserved,
# 15 = Queue ID(8) + Drop reason(8) + Padding(16).
REP_ALLOWED_BITS = [1, 2, 3, 4, 5, 6, 7, 8, 15]
REP_BIT15 = [("drop_queue_id", 8), ("drop_reason", 8), ("drop_padding", 16)]


def bitval(bit):
    return 1 << (15 - bit)


def bits_of(bitmap):
    return [b for b in range(16) if bitmap & bitval(b)]


def hop_md_len(bitmap):
    """Per-hop baseline metadata length in bytes for an INT v2.1 bitmap."""
    n = 0
    for b in bits_of(bitmap):
        n += INSTR_BY_BIT[b][0] if b in INSTR_BY_BIT else 4
    return n


def pack_fields(fields, values):
    """Pack sub-fields (widths summing to 32 or 64 bits) big-endian."""
    total = sum(w for _, w in fields)
    acc = 0
    for name, w in fields:
        v = values[name]
        assert 0 <= v < (1 << w), (name, v)
        acc = (acc << w) | v
    return acc.to_bytes(total // 8, "big")


# ---------------------------------------------------------------------------
# Internet checksum helpers (own implementation, used for checksum complement)


def ones_sum(data):
    if len(data) % 2:
        data += b"\0"
    s = 0
    for (w,) in struct.iter_unpack("!H", data):
        s += w
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def pseudo_header(ipver, src, dst, proto, l4len):
    if ipver == 4:
        return src + dst + struct.pack("!BBH", 0, proto, l4len)
    return src + dst + struct.pack("!I3xB", l4len, proto)


# ---------------------------------------------------------------------------
# INT encoders (INT v2.1)


def enc_shim(int_type, npt, length_words, npt_field):
    """5.7.2: Type(4) NPT(2) R R | Length(8) | 16-bit NPT dependent field."""
    assert 0 <= length_words <= 255
    return struct.pack("!BBH", (int_type << 4) | (npt << 2), length_words, npt_field)


def enc_md_header(md):
    """5.8: Ver(4) D E M Reserved(12) HopML(5) RHC(8) | bitmap | DSID | DS instr | DS flags."""
    w0 = ((md["ver"] << 28) | (md["d"] << 27) | (md["e"] << 26) | (md["m"] << 25)
          | (md["reserved"] << 13) | (md["hop_ml"] << 8) | md["remaining_hop_cnt"])
    return struct.pack("!IHHHH", w0, md["instruction_bitmap"], md["domain_specific_id"],
                       md["ds_instruction"], md["ds_flags"])


def enc_mx_header(mx):
    """5.9: Ver(4) D(1) Reserved(27) | bitmap | DSID | DS instr | DS flags."""
    w0 = (mx["ver"] << 28) | (mx["d"] << 27) | mx["reserved"]
    return struct.pack("!IHHHH", w0, mx["instruction_bitmap"], mx["domain_specific_id"],
                       mx["ds_instruction"], mx["ds_flags"])


def enc_hop(bitmap, hop, ds_md=b""):
    """One hop's metadata: bits 0..14 in order, then DS metadata, then checksum complement."""
    out = b""
    res = list(hop.get("reserved", []))
    for b in bits_of(bitmap):
        if b in INSTR_BY_BIT:
            out += pack_fields(INSTR_BY_BIT[b][1], hop)
        elif b in RESERVED_BITS:
            out += struct.pack("!I", res.pop(0))
    assert not res
    out += ds_md
    if bitmap & bitval(CSUM_BIT):
        out += struct.pack("!I", hop["checksum_complement"])
    return out


# ---------------------------------------------------------------------------
# random value generation


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)

    def u(self, bits, unavailable_p=0.04):
        if self.r.random() < unavailable_p:
            return (1 << bits) - 1  # all-ones "invalid" value (5.8)
        return self.r.getrandbits(bits)

    def hop_values(self, bitmap, hop_no):
        r = self.r
        h = {}
        for b in bits_of(bitmap):
            if b == 0:
                h["node_id"] = self.u(32) if r.random() < 0.5 else 0x1000 + hop_no
            elif b == 1:
                h["l1_ingress_if"] = self.u(16)
                h["l1_egress_if"] = self.u(16)
            elif b == 2:
                h["hop_latency"] = self.u(32)
            elif b == 3:
                h["queue_id"] = self.u(8)
                h["queue_occupancy"] = self.u(24)
            elif b == 4:
                h["ingress_ts"] = self.u(64)
            elif b == 5:
                h["egress_ts"] = self.u(64)
            elif b == 6:
                h["l2_ingress_if"] = self.u(32)
                h["l2_egress_if"] = self.u(32)
            elif b == 7:
                h["tx_utilization"] = self.u(32)
            elif b == 8:
                h["buffer_id"] = self.u(8)
                h["buffer_occupancy"] = self.u(24)
            elif b in RESERVED_BITS:
                # transit nodes write 0xFFFFFFFF for reserved bits; a newer-version node
                # might write a real value -> occasionally random.
                h.setdefault("reserved", []).append(
                    0xFFFFFFFF if r.random() < 0.7 else r.getrandbits(32))
            elif b == CSUM_BIT:
                h["checksum_complement"] = 0xFFFFFFFF  # may be patched later
        return h

    def ipv4(self):
        return "10.%d.%d.%d" % (self.r.randrange(256), self.r.randrange(256), self.r.randrange(1, 255))

    def ipv6(self):
        return "2001:db8:%x:%x::%x" % (self.r.getrandbits(16), self.r.getrandbits(16),
                                       self.r.randrange(1, 0xFFFF))

    def mac(self):
        b = [0x02] + [self.r.randrange(256) for _ in range(5)]
        return ":".join("%02x" % x for x in b)

    def port(self, avoid):
        while True:
            p = self.r.randrange(1024, 65535)
            if p not in avoid:
                return p


# ---------------------------------------------------------------------------
# INT-MD / INT-MX data packets


def ip_layer(ipver, src, dst, dscp, ecn, proto, ident, ttl):
    if ipver == 4:
        return IP(src=src, dst=dst, tos=(dscp << 2) | ecn, proto=proto, id=ident, ttl=ttl, flags="DF")
    return IPv6(src=src, dst=dst, tc=(dscp << 2) | ecn, nh=proto, hlim=ttl, fl=ident & 0xFFFFF)


def l4_layer(proto, sport, dport, seq, tcp_opts, udp_zero_csum):
    if proto == 17:
        return UDP(sport=sport, dport=dport, chksum=0) if udp_zero_csum else UDP(sport=sport, dport=dport)
    return TCP(sport=sport, dport=dport, seq=seq, ack=seq ^ 0x5A5A5A5A, flags="PA", window=8192,
               options=tcp_opts)


def build_int_frame(g, spec, int_port):
    """Build one INT data frame; returns (frame_bytes, record_dict)."""
    r = g.r
    ipver = spec["ipver"]
    carrier = spec["carrier"]  # "udp" or "tcp": the ORIGINAL L4 protocol
    npt = spec["npt"]
    kind = spec["kind"]
    orig_proto = 17 if carrier == "udp" else 6
    src = g.ipv4() if ipver == 4 else g.ipv6()
    dst = g.ipv4() if ipver == 4 else g.ipv6()
    smac, dmac = g.mac(), g.mac()
    sport = g.port({int_port})
    dport = g.port({int_port})
    ecn = r.randrange(4)
    orig_dscp = r.choice([0, 0, 10, 18, 26, 46, r.randrange(64)])
    while orig_dscp == INT_DSCP:
        orig_dscp = r.randrange(64)
    ident = r.getrandbits(16)
    ttl = r.choice([64, 63, 255, 128])
    seq = r.getrandbits(32)
    tcp_opts = []
    if carrier == "tcp" and r.random() < 0.4:
        tcp_opts = [("NOP", None), ("NOP", None), ("Timestamp", (r.getrandbits(32), r.getrandbits(32)))]
    udp_zero = carrier == "udp" and ipver == 4 and r.random() < 0.2 and npt != 2
    plen = spec.get("payload_len")
    if plen is None:
        plen = r.choice([0, 1, 3, 4, 7, 16, 31, 64, r.randrange(8, 120)])
    payload = bytes(r.getrandbits(8) for _ in range(plen))

    eth = Ether(src=smac, dst=dmac, type=0x0800 if ipver == 4 else 0x86DD)
    l4 = l4_layer(orig_proto, sport, dport, seq, tcp_opts, udp_zero)
    orig = eth / ip_layer(ipver, src, dst, orig_dscp, ecn, orig_proto, ident, ttl) / l4 / Raw(payload)
    orig_bytes = bytes(orig)
    iphl = 20 if ipver == 4 else 40
    l4_off = 14 + iphl
    # original L4 header length / checksum as built by scapy
    if carrier == "udp":
        l4hl = 8
        orig_l4_csum = struct.unpack_from("!H", orig_bytes, l4_off + 6)[0]
    else:
        l4hl = (orig_bytes[l4_off + 12] >> 4) * 4
        orig_l4_csum = struct.unpack_from("!H", orig_bytes, l4_off + 16)[0]
    orig_segment = orig_bytes[l4_off:]

    # --- INT headers -----------------------------------------------------------
    bitmap = spec.get("bitmap", 0)
    hops = []
    ds_md_per_hop = []
    if kind == "md":
        nhops = spec["hops"]
        ds_words = spec.get("ds_words", 0)
        hop_ml = (hop_md_len(bitmap) // 4) + ds_words
        assert hop_ml <= 31
        initial_rhc = r.choice([nhops, nhops + 1, 8, 16])
        rhc = initial_rhc - nhops
        e = 1 if (rhc == 0 and r.random() < 0.5) else 0
        dsid = 0 if (ds_words == 0 and r.random() < 0.6) else r.randrange(1, 0x10000)
        md = {
            "ver": 2, "d": 1 if r.random() < 0.15 else 0, "e": e,
            "m": 1 if r.random() < 0.1 else 0, "reserved": 0, "hop_ml": hop_ml,
            "remaining_hop_cnt": rhc, "instruction_bitmap": bitmap,
            "domain_specific_id": dsid,
            "ds_instruction": (r.getrandbits(16) | 0x8000) if ds_words else (r.getrandbits(16) if dsid and r.random() < 0.3 else 0),
            "ds_flags": r.getrandbits(16) if r.random() < 0.5 else 0,
        }
        # wire order: most recent hop first (5.8 "prepend ... push")
        for i in range(nhops):
            hops.append(g.hop_values(bitmap, nhops - i))
            ds_md_per_hop.append(bytes(r.getrandbits(8) for _ in range(4 * ds_words)))
        hdr = enc_md_header(md)
    else:
        si_words = spec.get("si_words", 0)
        dsid = r.randrange(1, 0x10000) if si_words else (0 if r.random() < 0.5 else r.randrange(1, 0x10000))
        md = {
            "ver": 2, "d": 1 if r.random() < 0.2 else 0, "reserved": 0,
            "instruction_bitmap": bitmap, "domain_specific_id": dsid,
            "ds_instruction": (r.getrandbits(16) | 0x0001) if si_words else 0,
            "ds_flags": r.getrandbits(16) if r.random() < 0.5 else 0,
        }
        si = bytes(r.getrandbits(8) for _ in range(4 * si_words))
        hdr = enc_mx_header(md) + si

    def stack_bytes():
        return b"".join(enc_hop(bitmap, h, d) for h, d in zip(hops, ds_md_per_hop))

    length_words = (len(hdr) + len(stack_bytes())) // 4
    if npt == 0:
        npt_field = (orig_dscp << 2)  # byte 2 reserved, byte 3 = DSCP(6) R R
    elif npt == 1:
        npt_field = dport
    else:
        npt_field = orig_proto  # byte 2 reserved, byte 3 = IP protocol
    shim = enc_shim(INT_TYPE_MD if kind == "md" else INT_TYPE_MX, npt, length_words, npt_field)

    # --- checksum handling ---------------------------------------------------------
    has_csum_bit = kind == "md" and bool(bitmap & bitval(CSUM_BIT))
    if npt == 2:
        csum_mode = "outer_udp_zero" if r.random() < 0.7 else "outer_udp_computed"
    elif udp_zero:
        csum_mode = "zero"
    elif has_csum_bit and r.random() < 0.6:
        csum_mode = "complement"
    else:
        csum_mode = "recomputed"

    # --- assemble the INT packet with scapy for the outer headers --------------------
    def assemble():
        int_bytes = shim + hdr + stack_bytes()
        if npt == 2:
            new_sport = 0xC000 | (int.from_bytes(hashlib.sha256(orig_segment[:4] + bytes([orig_proto])).digest()[:2], "big") & 0x3FFF)
            outer_udp = UDP(sport=new_sport, dport=int_port)
            if csum_mode == "outer_udp_zero":
                outer_udp.chksum = 0
            pkt = (eth / ip_layer(ipver, src, dst, orig_dscp, ecn, 17, ident, ttl) / outer_udp
                   / Raw(int_bytes + orig_segment))
        else:
            wire_dscp = INT_DSCP if npt == 0 else orig_dscp
            wire_dport = int_port if npt == 1 else dport
            l4w = l4_layer(orig_proto, sport, wire_dport, seq, tcp_opts, udp_zero)
            if csum_mode == "complement":
                l4w.chksum = orig_l4_csum  # checksum field untouched (checksum-neutral update)
            pkt = (eth / ip_layer(ipver, src, dst, wire_dscp, ecn, orig_proto, ident, ttl) / l4w
                   / Raw(int_bytes + payload))
        return bytes(pkt)

    frame = assemble()
    int_off = l4_off + (8 if npt == 2 else l4hl)
    stack_off = int_off + 4 + len(hdr)
    if csum_mode == "complement":
        # The most recent hop (first in the stack) carries the complement that keeps
        # the unchanged L4 checksum valid; the others chose not to (0xFFFFFFFF).
        cc_off = stack_off + hop_ml * 4 - 4
        assert struct.unpack_from("!I", frame, cc_off)[0] == 0xFFFFFFFF
        fb = bytearray(frame)
        struct.pack_into("!I", fb, cc_off, 0)
        seg = bytes(fb[l4_off:])
        s = ones_sum(pseudo_header(ipver, fb[l4_off - (8 if ipver == 4 else 32):l4_off - (4 if ipver == 4 else 16)],
                                   fb[l4_off - (4 if ipver == 4 else 16):l4_off], orig_proto, len(seg)) + seg)
        x = (~s) & 0xFFFF
        hops[0]["checksum_complement"] = x
        frame = assemble()
        assert struct.unpack_from("!I", frame, cc_off)[0] == x

    # --- record -----------------------------------------------------------------------
    fl = frame
    wire_l4_off = l4_off
    outer = {
        "eth_src": smac, "eth_dst": dmac, "ethertype": 0x0800 if ipver == 4 else 0x86DD,
        "ip_version": ipver, "src": src, "dst": dst,
        "proto": 17 if npt == 2 else orig_proto,
        "dscp": INT_DSCP if npt == 0 else orig_dscp, "ecn": ecn, "ttl": ttl,
        ("ip_total_len" if ipver == 4 else "ipv6_payload_len"):
            struct.unpack_from("!H", fl, 16 if ipver == 4 else 18)[0],
        "l4": "udp" if (npt == 2 or carrier == "udp") else "tcp",
        "l4_offset": wire_l4_off,
    }
    if npt == 2:
        outer["sport"], outer["dport"] = struct.unpack_from("!HH", fl, wire_l4_off)
        outer["udp_len"], outer["l4_checksum"] = struct.unpack_from("!HH", fl, wire_l4_off + 4)
        outer["inner_l4"] = {"proto": orig_proto, "sport": sport, "dport": dport,
                             "header_len": l4hl, "checksum": orig_l4_csum}
    else:
        outer["sport"] = sport
        outer["dport"] = int_port if npt == 1 else dport
        if carrier == "udp":
            outer["udp_len"], outer["l4_checksum"] = struct.unpack_from("!HH", fl, wire_l4_off + 4)
        else:
            outer["tcp_header_len"] = l4hl
            outer["l4_checksum"] = struct.unpack_from("!H", fl, wire_l4_off + 16)[0]
    shim_rec = {"type": INT_TYPE_MD if kind == "md" else INT_TYPE_MX, "npt": npt,
                "length_words": length_words}
    if npt == 0:
        shim_rec["original_dscp"] = orig_dscp
    elif npt == 1:
        shim_rec["original_dport"] = dport
    else:
        shim_rec["original_proto"] = orig_proto
    int_len = 4 + 4 * length_words
    after = fl[int_off + int_len:]
    rec = {
        "kind": "int_md" if kind == "md" else "int_mx",
        "frame_len": len(fl),
        "outer": outer,
        "int_offset": int_off,
        "int_total_len": int_len,
        "shim": shim_rec,
        "checksum_mode": csum_mode,
        "payload_offset": int_off + int_len,
        "payload_hex": after.hex(),
        "stripped_frame_hex": orig_bytes.hex(),
        "frame_hex": fl.hex(),
    }
    if npt == 2:
        rec["payload_is"] = "original L4 header + L4 payload"
        rec["app_payload_hex"] = payload.hex()
    else:
        rec["payload_is"] = "original L4 payload"
    if kind == "md":
        mrec = dict(md)
        del mrec["reserved"]
        rec["md"] = mrec
        rec["md_reserved_bits"] = md["reserved"]
        rec["hops"] = hops
        rec["hop_count"] = len(hops)
        if any(ds_md_per_hop):
            rec["hop_ds_metadata_hex"] = [d.hex() for d in ds_md_per_hop]
    else:
        mrec = dict(md)
        del mrec["reserved"]
        rec["mx"] = mrec
        if spec.get("si_words"):
            rec["mx_source_inserted_hex"] = hdr[12:].hex()
    return fl, rec


def md_specs(g):
    """Deterministic list of frame specifications covering the required matrix."""
    r = g.r
    carriers = [  # (carrier, npt)
        ("udp", 0), ("tcp", 0), ("udp", 1), ("udp", 2), ("tcp", 2),
    ]
    specs = []
    all_bits = sum(bitval(b) for b in list(range(0, 9)) + [15])
    every_bit = 0xFFFF

    def add(bitmap, hops, idx, **kw):
        c, npt = carriers[idx % len(carriers)]
        ipver = 4 if (idx // len(carriers)) % 2 == 0 else 6
        s = {"kind": "md", "bitmap": bitmap, "hops": hops, "carrier": c, "npt": npt, "ipver": ipver}
        s.update(kw)
        specs.append(s)

    # 1. all defined bits, every carrier x IP version (10 frames), hop counts 1..6
    for i in range(10):
        add(all_bits, 1 + i % 6, i)
    # 2. every bit including reserved 9-14
    for i in range(4):
        add(every_bit, 1 + (i * 2) % 6, i * 3)
    # 3. single bits 0-8, 15 -- twice, with different carriers
    n = 0
    for rep in range(2):
        for b in list(range(9)) + [15]:
            add(bitval(b), 1 + (n % 6), n + rep)
            n += 1
    # 4. single reserved bits
    for i, b in enumerate(RESERVED_BITS):
        add(bitval(b) | bitval(0), 1 + i % 6, i + 2)
    # 5. random subsets (some include reserved bits, checksum complement)
    for i in range(40):
        while True:
            bm = r.getrandbits(16)
            if i % 3:
                bm &= ~0x007E  # clear reserved 9-14 in 2/3 of them
            if bm and hop_md_len(bm) // 4 <= 31:
                break
        add(bm, 1 + (i % 6), i)
    # 6. domain-specific metadata per hop (Hop ML > baseline) -- a few
    for i in range(3):
        add(bitval(0) | bitval(3) | (bitval(15) if i == 1 else 0), 2 + i, i, ds_words=1 + i)
    # 7. large payload (used for a Report Length 0xFF report), IPv4 UDP NPT 1
    specs.append({"kind": "md", "bitmap": all_bits, "hops": 5, "carrier": "udp", "npt": 1,
                  "ipver": 4, "payload_len": 1100})
    # 8. INT-MX (no stack)
    for i in range(8):
        c, npt = carriers[i % len(carriers)]
        bm = [bitval(0) | bitval(3), all_bits, 0xFFFF, r.getrandbits(16)][i % 4]
        specs.append({"kind": "mx", "bitmap": bm, "carrier": c, "npt": npt,
                      "ipver": 4 if i < 5 else 6, "si_words": 2 if i in (3, 6) else 0})
    return specs


# ---------------------------------------------------------------------------
# Telemetry Report v2.0


def enc_group(grp):
    """3.2: Ver(4) hw_id(6) Sequence Number(22) | Node ID(32)."""
    return struct.pack("!II", (grp["ver"] << 28) | (grp["hw_id"] << 22) | grp["sequence_number"],
                       grp["node_id"])


def enc_rep_hdr(rh):
    """3.3: RepType(4) InType(4) | Report Length(8) | MD Length(8) | D Q F I Rsvd(4)."""
    return struct.pack("!BBBB", (rh["rep_type"] << 4) | rh["in_type"], rh["report_length"],
                       rh["md_length"], (rh["d"] << 7) | (rh["q"] << 6) | (rh["f"] << 5) | (rh["i"] << 4))


def enc_baseline(rep_md_bits, vals):
    out = b""
    for b in bits_of(rep_md_bits):
        if b == 15:
            out += pack_fields(REP_BIT15, vals)
        else:
            out += pack_fields(INSTR_BY_BIT[b][1], vals)
    return out


def baseline_len(rep_md_bits):
    return sum(8 if b in (4, 5, 6) else 4 for b in bits_of(rep_md_bits))


def build_reports(g, md_frames, md_recs):
    r = g.r
    frames, recs = [], []
    md_idx = [i for i, rec in enumerate(md_recs) if rec["kind"] == "int_md"]
    big_idx = max(md_idx, key=lambda i: len(md_frames[i]))
    seqs = {}
    nodes = [0x0A000001, 0x0A000002, 0xDEADBEEF, 7]
    for fi in range(28):
        node_id = nodes[fi % len(nodes)]
        hw_id = [0, 1, 63, 5][fi % 4]
        key = (node_id, hw_id)
        if key not in seqs:
            seqs[key] = r.choice([0, 1, r.getrandbits(22), (1 << 22) - 2])
        seq = seqs[key]
        seqs[key] = (seq + 1) & 0x3FFFFF
        grp = {"ver": 2, "hw_id": hw_id, "sequence_number": seq, "node_id": node_id}
        nrep = [1, 2, 3, 1, 4][fi % 5]
        use_ff = fi in (9, 21)
        body = enc_group(grp)
        reps = []
        for ri in range(nrep):
            last = ri == nrep - 1
            if use_ff and last:
                src_i = big_idx
            else:
                src_i = md_idx[(fi * 7 + ri * 3) % len(md_idx)]
            src_frame = md_frames[src_i]
            src_rec = md_recs[src_i]
            in_type = 3
            if src_rec["outer"]["ip_version"] == 4 and r.random() < 0.5:
                in_type = 4
            inner_full = src_frame if in_type == 3 else src_frame[14:]
            # baseline metadata
            rep_md_bits = 0
            for b in REP_ALLOWED_BITS:
                if r.random() < 0.4:
                    rep_md_bits |= bitval(b)
            if fi % 6 == 0:
                rep_md_bits = 0
            if fi % 6 == 1 and ri == 0:
                rep_md_bits = sum(bitval(b) for b in REP_ALLOWED_BITS)
            vals = g.hop_values(rep_md_bits & ~bitval(15), 0)
            if rep_md_bits & bitval(15):
                vals.update({"drop_queue_id": r.getrandbits(8), "drop_reason": r.randrange(1, 256),
                             "drop_padding": 0})
            baseline = enc_baseline(rep_md_bits, vals)
            dsid, ds_bits, ds_status, ds_md = 0, 0, 0, b""
            if (fi + ri) % 5 == 2:
                dsid = r.randrange(1, 0x10000)
                ds_bits = 0x8000 | (0x4000 if r.random() < 0.5 else 0)
                ds_status = r.getrandbits(16)
                ds_md = bytes(r.getrandbits(8) for _ in range(4 * (1 + bin(ds_bits).count("1"))))
            md_len = (len(baseline) + len(ds_md)) // 4
            fixed = struct.pack("!HHHH", rep_md_bits, dsid, ds_bits, ds_status)
            if use_ff and last:
                inner = inner_full
                truncated = False
            else:
                max_inner = (254 - 2 - md_len) * 4
                trunc_to = None
                if r.random() < 0.35:
                    trunc_to = r.choice([64, 96, 128, 160]) if in_type == 3 else r.choice([52, 80, 120])
                if len(inner_full) > max_inner:
                    trunc_to = min(trunc_to or max_inner, max_inner)
                if trunc_to is not None and trunc_to < len(inner_full):
                    inner, truncated = inner_full[:trunc_to], True
                else:
                    inner, truncated = inner_full, False
            pad = (-len(inner)) % 4
            inner_padded = inner + b"\0" * pad
            words = (len(fixed) + len(baseline) + len(ds_md) + len(inner_padded)) // 4
            if use_ff and last:
                assert words >= 0xFF
                rl = 0xFF
            else:
                assert words <= 254
                rl = words
            flags = {"d": 1 if rep_md_bits & bitval(15) else (1 if r.random() < 0.1 else 0),
                     "q": 1 if r.random() < 0.3 else 0, "f": 1 if r.random() < 0.85 else 0,
                     "i": 1 if r.random() < 0.2 else 0}
            rh = {"rep_type": 1, "in_type": in_type, "report_length": rl, "md_length": md_len}
            rh.update(flags)
            off_in_payload = len(body)
            body += enc_rep_hdr(rh) + fixed + baseline + ds_md + inner_padded
            rep = dict(rh)
            rep.update({
                "rsvd": 0,
                "report_length_words_actual": words,
                "offset_in_udp_payload": off_in_payload,
                "rep_md_bits": rep_md_bits, "domain_specific_id": dsid,
                "ds_md_bits": ds_bits, "ds_md_status": ds_status,
                "baseline": vals,
                "ds_metadata_hex": ds_md.hex(),
                "inner_offset_in_udp_payload": off_in_payload + 4 + 8 + len(baseline) + len(ds_md),
                "inner_len": len(inner_padded),
                "inner_captured_len": len(inner),
                "inner_pad_len": pad,
                "inner_truncated": truncated,
                "inner_source_frame": src_i,
                "inner_source_offset": 0 if in_type == 3 else 14,
            })
            reps.append(rep)
        ipver = 6 if fi % 4 == 3 else 4
        src = g.ipv4() if ipver == 4 else g.ipv6()
        dst = g.ipv4() if ipver == 4 else g.ipv6()
        smac, dmac = g.mac(), g.mac()
        sport = r.randrange(49152, 65535)
        ipl = (IP(src=src, dst=dst, id=fi + 1, flags="DF", ttl=64) if ipver == 4
               else IPv6(src=src, dst=dst, hlim=64))
        pkt = Ether(src=smac, dst=dmac) / ipl / UDP(sport=sport, dport=TRPT_PORT) / Raw(body)
        fb = bytes(pkt)
        udp_off = 14 + (20 if ipver == 4 else 40)
        pay_off = udp_off + 8
        for rep in reps:
            rep["offset_in_frame"] = pay_off + rep["offset_in_udp_payload"]
            rep["inner_offset_in_frame"] = pay_off + rep["inner_offset_in_udp_payload"]
        recs.append({
            "kind": "trpt_v2",
            "frame_len": len(fb),
            "outer": {"eth_src": smac, "eth_dst": dmac, "ip_version": ipver, "src": src, "dst": dst,
                      "proto": 17, "sport": sport, "dport": TRPT_PORT,
                      "udp_len": struct.unpack_from("!H", fb, udp_off + 4)[0],
                      "l4_offset": udp_off},
            "udp_payload_offset": pay_off,
            "udp_payload_len": len(body),
            "group": grp,
            "reports": reps,
            "frame_hex": fb.hex(),
        })
        frames.append(fb)
    return frames, recs


# ---------------------------------------------------------------------------


def write_pcap(path, frames):
    w = PcapWriter(path, linktype=1, sync=True)
    w.write_header(None)
    for i, f in enumerate(frames):
        w.write_packet(f, sec=PCAP_BASE_SEC + i // 1000, usec=(i % 1000) * 1000)
    w.close()


def conventions(int_port):
    return {
        "int_spec": "INT Dataplane Specification v2.1 (INT-MD/INT-MX over TCP/UDP)",
        "report_spec": "Telemetry Report Format Specification v2.0",
        "seed": SEED,
        "int_udp_port": int_port,
        "int_dscp": INT_DSCP,
        "trpt_udp_port": TRPT_PORT,
        "hop_order": "wire order: most recent hop first, INT source last",
        "tcp_int_position": "after TCP options",
        "dscp_restore": "NPT 0: original DSCP stored in shim and restored by the sink",
        "inner_padding": "truncated-packet inner contents zero padded to 4-byte multiple",
    }


def generate(outdir, int_port):
    os.makedirs(outdir, exist_ok=True)
    g = Gen(SEED)
    md_frames, md_recs = [], []
    for spec in md_specs(g):
        f, rec = build_int_frame(g, spec, int_port)
        rec["index"] = len(md_recs)
        md_frames.append(f)
        md_recs.append(rec)
    tr_frames, tr_recs = build_reports(g, md_frames, md_recs)
    for i, rec in enumerate(tr_recs):
        rec["index"] = i
    write_pcap(os.path.join(outdir, "int_md.pcap"), md_frames)
    write_pcap(os.path.join(outdir, "trpt_v2.pcap"), tr_frames)
    with open(os.path.join(outdir, "int_md.json"), "w") as fh:
        json.dump({"conventions": conventions(int_port), "frames": md_recs}, fh, indent=1, sort_keys=True)
        fh.write("\n")
    with open(os.path.join(outdir, "trpt_v2.json"), "w") as fh:
        json.dump({"conventions": conventions(int_port), "frames": tr_recs}, fh, indent=1, sort_keys=True)
        fh.write("\n")
    print("wrote %d INT frames, %d report frames to %s" % (len(md_frames), len(tr_frames), outdir))


# ===========================================================================
# Independent self-check parser.  Deliberately shares no code with the encoder
# above: own pcap reader, own bit tables, own checksum.
# ===========================================================================


def _pcap_frames(path):
    with open(path, "rb") as fh:
        data = fh.read()
    magic = data[:4]
    assert magic in (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4"), "not a usec pcap"
    e = "<" if magic == b"\xd4\xc3\xb2\xa1" else ">"
    linktype = struct.unpack(e + "I", data[20:24])[0]
    assert linktype == 1
    off, out = 24, []
    while off < len(data):
        _, _, incl, orig = struct.unpack(e + "IIII", data[off:off + 16])
        assert incl == orig
        out.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return out


def _csum(b):
    if len(b) & 1:
        b = b + b"\x00"
    t = sum(int.from_bytes(b[i:i + 2], "big") for i in range(0, len(b), 2))
    while t > 0xFFFF:
        t = (t >> 16) + (t & 0xFFFF)
    return t


_SZ = {0: 4, 1: 4, 2: 4, 3: 4, 4: 8, 5: 8, 6: 8, 7: 4, 8: 4}


def _parse_hop(buf, bm):
    h, p = {}, 0

    def take(n):
        nonlocal p
        v = int.from_bytes(buf[p:p + n], "big")
        p += n
        return v
    for bit in range(15):
        if not (bm >> (15 - bit)) & 1:
            continue
        if bit == 0:
            h["node_id"] = take(4)
        elif bit == 1:
            h["l1_ingress_if"], h["l1_egress_if"] = take(2), take(2)
        elif bit == 2:
            h["hop_latency"] = take(4)
        elif bit == 3:
            v = take(4)
            h["queue_id"], h["queue_occupancy"] = v >> 24, v & 0xFFFFFF
        elif bit == 4:
            h["ingress_ts"] = take(8)
        elif bit == 5:
            h["egress_ts"] = take(8)
        elif bit == 6:
            h["l2_ingress_if"], h["l2_egress_if"] = take(4), take(4)
        elif bit == 7:
            h["tx_utilization"] = take(4)
        elif bit == 8:
            v = take(4)
            h["buffer_id"], h["buffer_occupancy"] = v >> 24, v & 0xFFFFFF
        else:
            h.setdefault("reserved", []).append(take(4))
    return h, p


def _l3(fr):
    et = int.from_bytes(fr[12:14], "big")
    if et == 0x0800:
        ihl = (fr[14] & 0xF) * 4
        return 4, 14, ihl, fr[23], fr[15] >> 2, fr[26:30], fr[30:34]
    assert et == 0x86DD
    return 6, 14, 40, fr[20], ((int.from_bytes(fr[14:16], "big") >> 4) & 0xFF) >> 2, fr[22:38], fr[38:54]


def _l4_ok(fr, ver, l3o, l3l, proto):
    seg = fr[l3o + l3l:]
    if proto == 17 and int.from_bytes(seg[6:8], "big") == 0:
        return True
    ph = (fr[26:34] if ver == 4 else fr[22:54]) + (
        bytes([0, proto]) + len(seg).to_bytes(2, "big") if ver == 4
        else len(seg).to_bytes(4, "big") + bytes([0, 0, 0, proto]))
    return _csum(ph + seg) == 0xFFFF


def _ip_ok(fr, ver, l3o, l3l):
    if ver == 6:
        return int.from_bytes(fr[18:20], "big") == len(fr) - 54
    return _csum(fr[14:14 + l3l]) == 0xFFFF and int.from_bytes(fr[16:18], "big") == len(fr) - 14


def _strip(fr, int_port, dscp_mark):
    """Independent sink: remove INT, restore DSCP/dport/proto, fix lengths and checksums."""
    ver, l3o, l3l, proto, dscp, _, _ = _l3(fr)
    l4o = l3o + l3l
    b = bytearray(fr)
    if proto == 17 and int.from_bytes(fr[l4o + 2:l4o + 4], "big") == int_port:
        io = l4o + 8
    else:
        assert dscp == dscp_mark
        io = l4o + (8 if proto == 17 else (fr[l4o + 12] >> 4) * 4)
    typ, npt, ln = b[io] >> 4, (b[io] >> 2) & 3, b[io + 1]
    tot = 4 + 4 * ln
    if npt == 2:
        newproto = b[io + 3]
        b = b[:l4o] + b[io + tot:]
        if ver == 4:
            b[23] = newproto
        else:
            b[20] = newproto
        proto = newproto
    else:
        field = int.from_bytes(b[io + 2:io + 4], "big")
        del b[io:io + tot]
        if npt == 1:
            b[l4o + 2:l4o + 4] = field.to_bytes(2, "big")
        else:
            odscp = field >> 2 & 0x3F
            if ver == 4:
                b[15] = (odscp << 2) | (b[15] & 3)
            else:
                tc = (odscp << 2) | (((b[14] & 0xF) << 4 | b[15] >> 4) & 3)
                b[14] = (b[14] & 0xF0) | (tc >> 4)
                b[15] = ((tc & 0xF) << 4) | (b[15] & 0xF)
    # lengths
    if ver == 4:
        b[16:18] = (len(b) - 14).to_bytes(2, "big")
        b[24:26] = b"\0\0"
        b[24:26] = ((~_csum(bytes(b[14:14 + l3l]))) & 0xFFFF).to_bytes(2, "big")
    else:
        b[18:20] = (len(b) - 54).to_bytes(2, "big")
    seg_len = len(b) - l4o
    if proto == 17:
        b[l4o + 4:l4o + 6] = seg_len.to_bytes(2, "big")
        co = l4o + 6
        if int.from_bytes(b[co:co + 2], "big") == 0 and ver == 4:
            return bytes(b)
    else:
        co = l4o + 16
    b[co:co + 2] = b"\0\0"
    ph = (bytes(b[26:34]) if ver == 4 else bytes(b[22:54])) + (
        bytes([0, proto]) + seg_len.to_bytes(2, "big") if ver == 4
        else seg_len.to_bytes(4, "big") + bytes([0, 0, 0, proto]))
    c = (~_csum(ph + bytes(b[l4o:]))) & 0xFFFF
    if proto == 17 and c == 0:
        c = 0xFFFF
    b[co:co + 2] = c.to_bytes(2, "big")
    return bytes(b)


def self_check(outdir):
    errs = []

    def chk(cond, msg):
        if not cond:
            errs.append(msg)

    jm = json.load(open(os.path.join(outdir, "int_md.json")))
    conv, recs = jm["conventions"], jm["frames"]
    port, mark = conv["int_udp_port"], conv["int_dscp"]
    frames = _pcap_frames(os.path.join(outdir, "int_md.pcap"))
    chk(len(frames) == len(recs), "int_md frame count")
    seen_bits, seen_hops, seen_npt = set(), set(), set()
    for fr, rec in zip(frames, recs):
        t = "int_md[%d]" % rec["index"]
        chk(fr.hex() == rec["frame_hex"], t + " frame_hex")
        ver, l3o, l3l, proto, dscp, _, _ = _l3(fr)
        o = rec["outer"]
        chk(ver == o["ip_version"] and proto == o["proto"] and dscp == o["dscp"], t + " l3")
        chk(_ip_ok(fr, ver, l3o, l3l), t + " ip len/csum")
        chk(_l4_ok(fr, ver, l3o, l3l, proto), t + " l4 csum")
        l4o = l3o + l3l
        sp, dp = struct.unpack("!HH", fr[l4o:l4o + 4])
        chk((sp, dp) == (o["sport"], o["dport"]), t + " ports")
        if proto == 17:
            chk(int.from_bytes(fr[l4o + 4:l4o + 6], "big") == len(fr) - l4o, t + " udp len")
        # locate INT
        if proto == 17 and dp == port:
            io = l4o + 8
        else:
            chk(dscp == mark, t + " dscp mark")
            io = l4o + (8 if proto == 17 else (fr[l4o + 12] >> 4) * 4)
        chk(io == rec["int_offset"], t + " int offset")
        typ, npt, ln = fr[io] >> 4, (fr[io] >> 2) & 3, fr[io + 1]
        chk(fr[io] & 3 == 0, t + " shim R bits")
        s = rec["shim"]
        chk((typ, npt, ln) == (s["type"], s["npt"], s["length_words"]), t + " shim")
        seen_npt.add((npt, typ, ver, o["l4"]))
        if npt == 0:
            chk(fr[io + 2] == 0 and fr[io + 3] & 3 == 0 and fr[io + 3] >> 2 == s["original_dscp"], t + " npt0")
        elif npt == 1:
            chk(int.from_bytes(fr[io + 2:io + 4], "big") == s["original_dport"], t + " npt1")
        else:
            chk(fr[io + 2] == 0 and fr[io + 3] == s["original_proto"], t + " npt2")
        body = fr[io + 4:io + 4 + 4 * ln]
        w0, bm, dsid, dsi, dsf = struct.unpack("!IHHHH", body[:12])
        chk(w0 >> 28 == 2, t + " ver")
        if typ == 1:
            m = rec["md"]
            got = {"ver": w0 >> 28, "d": w0 >> 27 & 1, "e": w0 >> 26 & 1, "m": w0 >> 25 & 1,
                   "hop_ml": w0 >> 8 & 0x1F, "remaining_hop_cnt": w0 & 0xFF,
                   "instruction_bitmap": bm, "domain_specific_id": dsid,
                   "ds_instruction": dsi, "ds_flags": dsf}
            chk(got == m, t + " md header %r vs %r" % (got, m))
            chk((w0 >> 13) & 0xFFF == rec["md_reserved_bits"], t + " md rsvd")
            hml = 4 * (w0 >> 8 & 0x1F)
            stack = body[12:]
            chk(hml and len(stack) % hml == 0, t + " stack multiple of hop ml")
            hops = []
            base = sum(_SZ.get(b, 4) for b in range(15) if (bm >> (15 - b)) & 1) + (4 if bm & 1 else 0)
            for k in range(len(stack) // hml):
                hb = stack[k * hml:(k + 1) * hml]
                h, used = _parse_hop(hb, bm)
                if bm & 1:
                    h["checksum_complement"] = int.from_bytes(hb[-4:], "big")
                hops.append(h)
                if "hop_ds_metadata_hex" in rec:
                    chk(hb[used:hml - (4 if bm & 1 else 0)].hex() == rec["hop_ds_metadata_hex"][k], t + " ds md")
                else:
                    chk(base == hml, t + " hop ml == baseline")
            chk(hops == rec["hops"], t + " hops")
            seen_hops.add(len(hops))
            for b in range(16):
                if (bm >> (15 - b)) & 1:
                    seen_bits.add(b)
        else:
            m = rec["mx"]
            got = {"ver": w0 >> 28, "d": w0 >> 27 & 1, "instruction_bitmap": bm,
                   "domain_specific_id": dsid, "ds_instruction": dsi, "ds_flags": dsf}
            chk(got == m and w0 & 0x7FFFFFF == 0, t + " mx header")
            chk(body[12:].hex() == rec.get("mx_source_inserted_hex", ""), t + " mx source-inserted")
        chk(fr[io + 4 + 4 * ln:].hex() == rec["payload_hex"], t + " payload")
        stripped = _strip(fr, port, mark)
        chk(stripped.hex() == rec["stripped_frame_hex"], t + " stripped frame")
        v2, a, bl, p2, _, _, _ = _l3(stripped)
        chk(_ip_ok(stripped, v2, a, bl) and _l4_ok(stripped, v2, a, bl, p2), t + " stripped csums")
    need = set(range(16))
    chk(need <= seen_bits, "bits not covered: %s" % sorted(need - seen_bits))
    chk(set(range(1, 7)) <= seen_hops, "hop counts not covered")
    for npt in (0, 1, 2):
        for v in (4, 6):
            chk(any(x[0] == npt and x[2] == v and x[1] == 1 for x in seen_npt), "npt %d v%d missing" % (npt, v))
    chk(any(x[0] == 0 and x[3] == "tcp" for x in seen_npt), "INT over TCP missing")

    # ---- telemetry reports -------------------------------------------------------
    jt = json.load(open(os.path.join(outdir, "trpt_v2.json")))
    trecs = jt["frames"]
    tframes = _pcap_frames(os.path.join(outdir, "trpt_v2.pcap"))
    chk(len(tframes) == len(trecs), "trpt frame count")
    rsz = {b: (8 if b in (4, 5, 6) else 4) for b in range(16)}
    for fr, rec in zip(tframes, trecs):
        t = "trpt[%d]" % rec["index"]
        chk(fr.hex() == rec["frame_hex"], t + " frame_hex")
        ver, l3o, l3l, proto, _, _, _ = _l3(fr)
        chk(proto == 17 and _ip_ok(fr, ver, l3o, l3l) and _l4_ok(fr, ver, l3o, l3l, 17), t + " outer")
        u = l3o + l3l
        chk(int.from_bytes(fr[u + 2:u + 4], "big") == rec["outer"]["dport"], t + " dport")
        pay = fr[u + 8:]
        chk(u + 8 == rec["udp_payload_offset"], t + " payload offset")
        w0, node = struct.unpack("!II", pay[:8])
        g = rec["group"]
        chk({"ver": w0 >> 28, "hw_id": w0 >> 22 & 0x3F, "sequence_number": w0 & 0x3FFFFF,
             "node_id": node} == g, t + " group")
        p, k = 8, 0
        while p < len(pay):
            rp = rec["reports"][k]
            tt = "%s rep%d" % (t, k)
            b0, rl, mdl, fl = pay[p:p + 4]
            chk(p == rp["offset_in_udp_payload"], tt + " offset")
            chk((b0 >> 4, b0 & 15, rl, mdl, fl >> 7, fl >> 6 & 1, fl >> 5 & 1, fl >> 4 & 1, fl & 15) ==
                (rp["rep_type"], rp["in_type"], rp["report_length"], rp["md_length"], rp["d"], rp["q"],
                 rp["f"], rp["i"], 0), tt + " hdr")
            end = len(pay) if rl == 0xFF else p + 4 + 4 * rl
            chk(end <= len(pay), tt + " length overflow")
            rmb, dsid, dsb, dss = struct.unpack("!HHHH", pay[p + 4:p + 12])
            chk((rmb, dsid, dsb, dss) == (rp["rep_md_bits"], rp["domain_specific_id"], rp["ds_md_bits"],
                                          rp["ds_md_status"]), tt + " main fixed")
            chk(not (rmb & 0x8000) and not (rmb & 0x007E), tt + " reserved RepMdBits")
            q = p + 12
            bl = sum(rsz[b] for b in range(16) if (rmb >> (15 - b)) & 1)
            h, used = _parse_hop(pay[q:q + bl], rmb & 0xFFFE)
            if rmb & 1:
                v = int.from_bytes(pay[q + bl - 4:q + bl], "big")
                h.update({"drop_queue_id": v >> 24, "drop_reason": v >> 16 & 0xFF, "drop_padding": v & 0xFFFF})
            chk(h == rp["baseline"], tt + " baseline %r vs %r" % (h, rp["baseline"]))
            chk(mdl * 4 >= bl, tt + " md len")
            chk(pay[q + bl:q + 4 * mdl].hex() == rp["ds_metadata_hex"], tt + " ds md")
            io = q + 4 * mdl
            chk(u + 8 + io == rp["inner_offset_in_frame"] and end - io == rp["inner_len"], tt + " inner span")
            inner = pay[io:end]
            src = bytes.fromhex(recs[rp["inner_source_frame"]]["frame_hex"])[rp["inner_source_offset"]:]
            cap = rp["inner_captured_len"]
            chk(inner[:cap] == src[:cap] and inner[cap:] == b"\0" * rp["inner_pad_len"], tt + " inner bytes")
            chk(rp["inner_truncated"] == (cap < len(src)), tt + " truncated flag")
            # the inner packet must itself parse as INT: starts with Ethernet or IPv4
            first = inner[0] >> 4 if rp["in_type"] == 4 else None
            chk(rp["in_type"] == 3 or first == 4, tt + " inner type")
            p, k = end, k + 1
        chk(k == len(rec["reports"]), t + " report count")
    if errs:
        print("SELF-CHECK FAILED (%d problems):" % len(errs))
        for e in errs[:50]:
            print("  " + e)
        return False
    print("self-check OK: %d INT frames, %d report frames" % (len(recs), len(trecs)))
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--int-port", type=int, default=5000, help="UDP dport (INT_TBD) marking INT, default 5000")
    ap.add_argument("--self-check", action="store_true", help="re-parse output with an independent parser")
    ap.add_argument("--check-only", action="store_true", help="only run the self-check on existing output")
    a = ap.parse_args()
    if not a.check_only:
        generate(a.outdir, a.int_port)
    if a.self_check or a.check_only:
        sys.exit(0 if self_check(a.outdir) else 1)


if __name__ == "__main__":
    main()
