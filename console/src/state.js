// The console's state lives in the address (its query string), so a link shows a colleague
// the same picture: the view, the time range, the filter, the flow on the path view. The
// reader token stays in the fragment (#token=…), which never leaves the browser and is not
// part of the state.

export const VIEWS = ["overview", "path", "traffic", "int", "health"];
export const PRESETS = ["15m", "1h", "6h", "24h", "7d"];
export const REFRESH = ["off", "10s", "30s", "1m"];

// What the state holds, with defaults.
const DEFAULTS = {
  view: "overview",
  range: "1h",   // a preset, or "custom" with from/to
  from: "",      // custom range: RFC 3339 or "now-2h"
  to: "",
  refresh: "30s",
  tz: "local",   // or "utc"
  agent: "",
  proto: "",
  prefix: "",    // source or destination in this prefix
  exporter: "",
  by: "bytes",   // traffic: bytes or packets
  group: "flow", // traffic: flow, src, dst, proto, exporter
  // the path view's flow
  src: "", dst: "", sport: "", dport: "", fproto: "", spi: "", si: "",
};

export function read() {
  const q = new URLSearchParams(location.search);
  const s = { ...DEFAULTS };
  for (const k of Object.keys(DEFAULTS)) if (q.has(k)) s[k] = q.get(k);
  if (!VIEWS.includes(s.view)) s.view = DEFAULTS.view;
  if (!REFRESH.includes(s.refresh)) s.refresh = DEFAULTS.refresh;
  if (s.range !== "custom" && !PRESETS.includes(s.range)) s.range = DEFAULTS.range;
  return s;
}

// The address of state `s` (only what differs from the defaults), keeping the fragment.
export function href(s) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(s)) if (v !== DEFAULTS[k] && v !== "" && v != null) q.set(k, v);
  const qs = q.toString();
  return location.pathname + (qs ? "?" + qs : "") + location.hash;
}

export function write(s, replace = false) {
  const u = href(s);
  if (u !== location.pathname + location.search + location.hash) {
    (replace ? history.replaceState : history.pushState).call(history, null, "", u);
  }
}

const UNIT = { s: 1e3, m: 60e3, h: 3600e3, d: 86400e3, w: 7 * 86400e3 };

// "15m" → milliseconds.
export function duration(t) {
  const m = /^(\d+)\s*([smhdw])$/.exec(t.trim());
  if (!m) return null;
  return Number(m[1]) * UNIT[m[2]];
}

// A typed time: "now", "now-2h", "-2h", RFC 3339 ("2026-11-28T03:00:00Z"), or a date and
// time in the chosen zone ("2026-11-28 03:00"). Milliseconds since the epoch, or null.
export function parseTime(t, tz, nowMs) {
  t = t.trim();
  if (t === "now" || t === "") return nowMs;
  let m = /^(?:now)?\s*-\s*(\d+\s*[smhdw])$/.exec(t);
  if (m) return nowMs - duration(m[1]);
  m = /^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2}))?)?$/.exec(t);
  if (m) {
    const [Y, M, D, hh, mm, ss] = m.slice(1).map(x => Number(x || 0));
    return tz === "utc" ? Date.UTC(Y, M - 1, D, hh, mm, ss) : new Date(Y, M - 1, D, hh, mm, ss).getTime();
  }
  const ms = Date.parse(t);
  return Number.isNaN(ms) ? null : ms;
}

// The window state `s` asks for: {fromMs, toMs} or {error}.
export function window(s, nowMs) {
  if (s.range !== "custom") return { fromMs: nowMs - duration(s.range), toMs: nowMs };
  const fromMs = parseTime(s.from, s.tz, nowMs), toMs = parseTime(s.to || "now", s.tz, nowMs);
  if (fromMs == null) return { error: `from: cannot read "${s.from}" (try 2026-11-28 03:00, now-2h or RFC 3339)` };
  if (toMs == null) return { error: `to: cannot read "${s.to}"` };
  if (fromMs >= toMs) return { error: "from must be before to" };
  return { fromMs, toMs };
}

// Buckets for a window: about 120 of them, on round lengths; from 12 h on, whole hours (12 to
// 24 for a day, 2 h for a week), which the collector reads from its hourly sums instead of
// every batch: a day of a busy collector's batches takes seconds to sum, its hours do not.
const STEPS = [1, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map(x => x * 1000);
export function bucketMs(spanMs) {
  const want = spanMs / 120;
  if (spanMs >= 12 * 3600e3) return STEPS.find(s => s >= Math.max(want, 3600e3)) ?? STEPS[STEPS.length - 1];
  return STEPS.find(s => s >= want) ?? STEPS[STEPS.length - 1];
}

// The flow on the path view, if the state names one.
export function flowOf(s) {
  if (!s.src || !s.dst) return null;
  const f = { src: s.src, dst: s.dst, sport: Number(s.sport || 0), dport: Number(s.dport || 0), proto: Number(s.fproto || 0) };
  if (s.spi !== "") { f.spi = Number(s.spi); f.si = Number(s.si || 0); }
  return f;
}

export function withFlow(s, f) {
  return { ...s, view: "path", src: f.src, dst: f.dst, sport: String(f.sport), dport: String(f.dport), fproto: String(f.proto), spi: f.spi != null ? String(f.spi) : "", si: f.si != null ? String(f.si) : "" };
}
