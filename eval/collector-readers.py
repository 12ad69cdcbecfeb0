#!/usr/bin/env python3
"""Readers against writers (docs/collector.md, "Queries"): a collector over 1 M stored flow
records, READERS clients (default 4) looping GET /api/v1/flows/top, while an authenticated agent
posts 10 health records every 200 ms (5 s timeout) and a probe asks /healthz every 200 ms;
prints each one's count, p50, p99, max latency and statuses.

usage: eval/collector-readers.py BINARY DB SECONDS [collector flags...]
(DB is created and filled with 1 M flow records of the last hour if missing; the token file
and the collector's log go beside it.)
"""
import http.client, json, os, random, sqlite3, subprocess, sys, threading, time

exe, db, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
extra = sys.argv[4:]
PORT = 19000 + os.getpid() % 1000
tok = os.path.join(os.path.dirname(os.path.abspath(db)), "tokens.toml")
with open(tok, "w") as f:
    f.write('[agents]\nsw-a = "agent-token-0123456789abcdef0123456789"\n[readers]\nr = "reader-token-0123456789abcdef0123456789"\n')
AG = {"Authorization": "Bearer agent-token-0123456789abcdef0123456789", "Content-Type": "application/json"}
RD = {"Authorization": "Bearer reader-token-0123456789abcdef0123456789"}


def start():
    p = subprocess.Popen([exe, "collector", "--listen", f"127.0.0.1:{PORT}", "--db", db,
                          "--retention", "0", "--auth", tok] + extra,
                         stdout=subprocess.DEVNULL, stderr=open(db + ".log", "a"))
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=1)
            c.request("GET", "/healthz")
            if c.getresponse().status == 200:
                return p
        except OSError:
            time.sleep(0.1)
    raise SystemExit("collector did not start")


def fill():
    p = start()
    p.terminate(); p.wait()
    now = time.time_ns()
    con = sqlite3.connect(db)
    rows = []
    rng = random.Random(1)
    for n in range(1_000_000):
        f = rng.randrange(50_000)
        t = now - rng.randrange(3_000) * 1_000_000_000
        rec = {"kind": "flow", "agent": "192.0.2.1", "port": str(f % 8), "point": "ipfix",
               "flow": {"src": f"10.{f >> 16}.{(f >> 8) & 255}.{f & 255}", "dst": "10.200.0.1",
                        "sport": 1000 + f % 5000, "dport": 443, "proto": 6, "spi": None, "si": None},
               "window_start_ns": t - 1_000_000_000, "window_end_ns": t,
               "packets": 1 + rng.randrange(1000), "bytes": 64 + rng.randrange(1_000_000),
               "exact": True, "error_bound": 0}
        rows.append(("192.0.2.1", 1, n, "flow", t, json.dumps(rec)))
    con.executemany("INSERT INTO other VALUES (?,?,?,?,?,?)", rows)
    # The collector fills its flow columns from these rows at its next start, as it does for
    # a database an older collector wrote.
    con.execute("DROP TABLE IF EXISTS flows")
    con.commit()
    con.close()


if not os.path.exists(db):
    fill()

p = start()
stop = threading.Event()
res = {"ingest": [], "healthz": [], "top": []}
lock = threading.Lock()


def call(kind, method, path, body, headers, timeout):
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
        c.request(method, path, body=body, headers=headers)
        r = c.getresponse()
        r.read()
        out = (time.monotonic() - t0, r.status)
    except OSError as e:  # timeouts included
        out = (time.monotonic() - t0, "timeout" if "timed out" in str(e) else str(e))
    with lock:
        res[kind].append(out)
    return out


boot = time.time_ns()
s, _ = call("ingest", "POST", "/api/v1/agents",
            json.dumps({"agent": "sw-a", "version": "1", "boot": boot}), AG, 30)
res["ingest"].clear()
# One query alone first: its time, and that it found the flows.
t0 = time.monotonic()
c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=300)
c.request("GET", "/api/v1/flows/top?from=0&limit=10", headers=RD)
r = c.getresponse()
top = json.loads(r.read() or b"{}")
alone = time.monotonic() - t0
flows = top.get("flows", [])
print(f"one top-talkers query alone: {alone * 1e3:.0f} ms, status {r.status}, {len(flows)} flows, "
      f"largest {flows[0]['packets'] if flows else None} packets in {flows[0]['records'] if flows else None} records")


def reader():
    while not stop.is_set():
        call("top", "GET", "/api/v1/flows/top?from=0&limit=10", None, RD, 120)


def ingester():
    seq = 0
    while not stop.is_set():
        now = time.time_ns()
        recs = [{"kind": "health", "agent": "sw-a", "interval_start_ns": now - 10**9,
                 "interval_end_ns": now, "rx": 100, "rx_ring_drops": 0, "tx_drops": 0,
                 "events_lost": 0, "export_dropped": 0, "points": []} for _ in range(10)]
        body = json.dumps({"agent": "sw-a", "boot": boot, "seq": seq, "export_dropped": 0,
                           "records": recs})
        call("ingest", "POST", "/api/v1/ingest", body, AG, 5)
        seq += 10
        time.sleep(0.2)


def prober():
    while not stop.is_set():
        call("healthz", "GET", "/healthz", None, {}, 5)
        time.sleep(0.2)


nreaders = int(os.environ.get("READERS", "4"))
ts = [threading.Thread(target=reader) for _ in range(nreaders)]
ts += [threading.Thread(target=ingester), threading.Thread(target=prober)]
for t in ts:
    t.start()
time.sleep(seconds)
stop.set()
for t in ts:
    t.join()
p.terminate(); p.wait()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


print(f"{exe} {' '.join(extra)}: {nreaders} readers, {seconds:.0f} s")
for k in ("ingest", "healthz", "top"):
    lat = [d for d, st in res[k]]
    statuses = {}
    for _, st in res[k]:
        statuses[st] = statuses.get(st, 0) + 1
    print(f"  {k:8} n={len(lat):4}  p50={pct(lat, .5)*1000:8.1f} ms  p99={pct(lat, .99)*1000:8.1f} ms"
          f"  max={max(lat, default=0)*1000:8.1f} ms  {statuses}")
