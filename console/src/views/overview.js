// Overview: loss over time at every segment and per agent, packets measured, lossy batches,
// and the flows that lost most, in the chosen range.
import { get, ns } from "../api.js";
import { timeAxes } from "../charts.js";
import { h, count, num, big, percent, table, row, numCell, flowName, inPrefix, time } from "../util.js";
import { bucketMs, withFlow } from "../state.js";

// A segment's name: its downstream point, and where it starts.
export function segmentName(s) {
  const up = !s.upstream || s.upstream === "marker" ? "marker" : s.upstream.includes("/") ? s.upstream : `${s.agent}/${s.upstream}`;
  return `${up} → ${s.agent}/${s.point}` + (s.scope === "path" ? " (from the marking)" : "");
}

const FIELDS = ["batches", "lossy_batches", "expected", "lost", "uncertain"];

// Segments (or "other"s) summed, exactly: their totals and their buckets.
function sumSegments(list, segments) {
  const total = Object.fromEntries(FIELDS.map(f => [f, 0n]));
  const at = new Map();
  for (const s of list) {
    for (const f of FIELDS) total[f] += big(s.total[f]);
    for (const b of s.buckets) {
      const a = at.get(String(b.t_ns)) || Object.fromEntries([["t_ns", b.t_ns], ...FIELDS.map(f => [f, 0n])]);
      for (const f of FIELDS) a[f] += big(b[f]);
      at.set(String(b.t_ns), a);
    }
  }
  const str = o => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, typeof v === "bigint" ? v.toString() : v]));
  return { segments, total: str(total), buckets: [...at.values()].sort((a, b) => num(a.t_ns) - num(b.t_ns)).map(str) };
}

export async function render(ctx) {
  const { state, win, root, link } = ctx;
  const bucket = bucketMs(win.toMs - win.fromMs);
  const [ov, flows] = await Promise.all([
    get("/api/v1/overview", { from: ns(win.fromMs), to: ns(win.toMs), bucket_ns: ns(bucket), agent: state.agent, proto: state.proto, top: 100 }),
    get("/api/v1/flows", { from: ns(win.fromMs), to: ns(win.toMs), lossy: true, limit: 100 }),
  ]);
  const t = ov.total;
  const card = (id, label, value, note) => h("div", { class: "card", "data-stat": id }, h("div", { class: "label" }, label), h("div", { class: "value" }, value), note ? h("div", { class: "note" }, note) : null);
  root.append(h("section", { class: "cards", "aria-label": "totals in the range" },
    card("expected", "packets measured", count(t.expected), "at segments' starts, once per segment"),
    card("lost", "packets lost", count(t.lost), percent(t.lost, t.expected)),
    card("uncertain", "loss uncertain", count(t.uncertain)),
    card("lossy_batches", "lossy batches", count(t.lossy_batches), `of ${count(t.batches)} stored`)));

  // Lost packets over time per segment: the eight that lost most, the rest as "other" (the
  // server's other, beyond its hundred, and the hundred's rest).
  const DRAWN = 8;
  const rest = [...ov.segments.slice(DRAWN), ...(ov.other ? [ov.other] : [])];
  const other = rest.length ? sumSegments(rest, ov.segments.slice(DRAWN).length + (ov.other ? ov.other.segments : 0)) : null;
  const series = ov.segments.slice(0, DRAWN).map(s => ({ name: segmentName(s), buckets: s.buckets }));
  if (other) series.push({ name: `other (${other.segments} segments)`, buckets: other.buckets });
  const bucketNote = `buckets of ${bucket >= 3600e3 ? bucket / 3600e3 + " h" : bucket >= 60e3 ? bucket / 60e3 + " min" : bucket / 1e3 + " s"}` + (ov.source === "hourly_sums" ? " (hourly sums)" : "");
  const lossEl = h("div", { class: "chart", id: "chart-loss" });
  const volEl = h("div", { class: "chart small", id: "chart-measured" });
  root.append(h("section", {}, h("h2", {}, "Packets lost per segment ", h("span", { class: "muted" }, bucketNote)), lossEl));
  ctx.chart(lossEl, {
    ...timeAxes("packets lost", win.fromMs, win.toMs),
        series: series.map(s => ({ name: s.name, type: "bar", stack: "lost", barMaxWidth: 24, data: s.buckets.map(b => [num(b.t_ns) / 1e6, num(b.lost)]) })),
  }, state.tz, "packets lost per time bucket, stacked by segment");

  // Packets measured and lossy batches, all segments.
  const all = new Map();
  for (const s of [...ov.segments.slice(0, DRAWN), ...(other ? [other] : [])]) for (const b of s.buckets) {
    const a = all.get(b.t_ns) || { expected: 0n, lossy: 0n };
    a.expected += big(b.expected); a.lossy += big(b.lossy_batches);
    all.set(b.t_ns, a);
  }
  const pts = [...all.entries()].sort((a, b) => num(a[0]) - num(b[0]));
  root.append(h("section", {}, h("h2", {}, "Packets measured and lossy batches"), volEl));
  ctx.chart(volEl, {
    ...timeAxes("packets", win.fromMs, win.toMs),
    yAxis: [{ type: "value", name: "packets", minInterval: 1 }, { type: "value", name: "lossy batches", minInterval: 1 }],
    series: [
      { name: "packets measured", type: "line", showSymbol: false, data: pts.map(([t, a]) => [num(t) / 1e6, Number(a.expected)]) },
      { name: "lossy batches", type: "bar", yAxisIndex: 1, barMaxWidth: 12, data: pts.map(([t, a]) => [num(t) / 1e6, Number(a.lossy)]) },
    ],
  }, state.tz, "packets measured and lossy batches per time bucket");

  // The segments and per-agent sums.
  const segRows = ov.segments.slice(0, DRAWN).map(s => row([segmentName(s), s.agent, numCell(s.total.expected), numCell(s.total.lost), numCell(s.total.uncertain), { cls: "num", v: percent(s.total.lost, s.total.expected) }, numCell(s.total.lossy_batches)], s, { "data-segment": segmentName(s) }));
  if (other) segRows.push(row([`other (${other.segments} segments)`, "", numCell(other.total.expected), numCell(other.total.lost), numCell(other.total.uncertain), { cls: "num", v: percent(other.total.lost, other.total.expected) }, numCell(other.total.lossy_batches)], { total: other.total, agent: "", point: "" }));
  const perAgent = new Map();
  for (const s of ov.segments) {
    const a = perAgent.get(s.agent) || { lost: 0n, expected: 0n, uncertain: 0n, lossy: 0n };
    a.lost += big(s.total.lost); a.expected += big(s.total.expected); a.uncertain += big(s.total.uncertain); a.lossy += big(s.total.lossy_batches);
    perAgent.set(s.agent, a);
  }
  const keys = [r => r.agent + r.point, r => r.agent, r => num(r.total.expected), r => num(r.total.lost), r => num(r.total.uncertain), r => num(r.total.lost) / Math.max(1, num(r.total.expected)), r => num(r.total.lossy_batches)];
  root.append(h("section", { class: "half" }, h("h2", {}, "Segments"),
    table([["segment"], ["agent"], ["measured", "num"], ["lost", "num"], ["uncertain", "num"], ["loss", "num"], ["lossy batches", "num"]], segRows, { keys, class: "segments", empty: "no loss records in this range" })));
  root.append(h("section", { class: "half" }, h("h2", {}, "Per agent ", h("span", { class: "muted" }, ov.other ? `(its segments' sums; ${ov.other.segments} segments beyond the first hundred not counted)` : "(its segments' sums)")),
    table([["agent"], ["measured", "num"], ["lost", "num"], ["uncertain", "num"], ["lossy batches", "num"]],
      [...perAgent.entries()].map(([a, v]) => row([a, numCell(v.expected), numCell(v.lost), numCell(v.uncertain), numCell(v.lossy)], { a, ...v }, { "data-agent": a })),
      { keys: [r => r.a, r => Number(r.expected), r => Number(r.lost), r => Number(r.uncertain), r => Number(r.lossy)], class: "agents", empty: "no agents with loss records" })));

  // The flows that lost most, filtered as asked.
  const shown = flows.filter(f => (!state.proto || String(f.flow.proto) === state.proto) && (!state.prefix || inPrefix(f.flow.src, state.prefix) || inPrefix(f.flow.dst, state.prefix))).slice(0, 25);
  const flowRows = shown.map(f => {
    const a = link(withFlow(state, f.flow), flowName(f.flow));
    return row([h("td", {}, a), numCell(f.packets), numCell(f.lost), numCell(f.uncertain), { cls: "num", v: percent(f.lost, f.packets) }, numCell(f.lossy_batches), time(f.last_ns, state.tz)], f, { "data-flow": flowName(f.flow) });
  });
  root.append(h("section", { class: "wide" }, h("h2", {}, "Flows that lost most ", h("span", { class: "muted" }, "(whole path, each packet once; choose one for its path)")),
    table([["flow"], ["packets", "num"], ["lost", "num"], ["uncertain", "num"], ["loss", "num"], ["lossy batches", "num"], ["last batch"]], flowRows,
      { keys: [r => flowName(r.flow), r => num(r.packets), r => num(r.lost), r => num(r.uncertain), r => num(r.lost) / Math.max(1, num(r.packets)), r => num(r.lossy_batches), r => num(r.last_ns)], class: "flows", empty: "no flow lost packets in this range" })));
}
