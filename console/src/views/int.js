// INT: per-hop latency and queue occupancy over time per node, as heatmaps, from the paths the
// INT events carry; and the events, filtered.
import { get, ns } from "../api.js";
import { h, count, num, table, row, numCell, flowName, time, inPrefix } from "../util.js";
import { bucketMs } from "../state.js";

function heat(ctx, el, cells, nodes, buckets, tz, label, unit) {
  const max = Math.max(1, ...cells.map(c => c[2]));
  ctx.chart(el, {
    grid: { left: 90, right: 24, top: 20, bottom: 90 },
    tooltip: { position: "top" },
    xAxis: { type: "category", data: buckets.map(b => time(BigInt(b) * 1000000n, tz, false)), name: "time", nameLocation: "middle", nameGap: 30 },
    yAxis: { type: "category", data: nodes.map(n => "node " + n), name: "node" },
    visualMap: { min: 0, max, calculable: true, orient: "horizontal", left: "center", bottom: 0, text: [`${count(max)} ${unit}`, "0"], formatter: v => count(Math.round(v)), inRange: { color: ["#f7fbff", "#6baed6", "#08306b"] } },
    series: [{ type: "heatmap", name: label, data: cells, emphasis: { itemStyle: { borderColor: "#000", borderWidth: 1 } } }],
  }, tz, label);
}

export async function render(ctx) {
  const { state, win, root } = ctx;
  const ev = await get("/api/v1/events", { from: ns(win.fromMs), to: ns(win.toMs), agent: state.agent, limit: 10000 });
  const events = ev.events.filter(e => (!state.proto || String(e.flow.proto) === state.proto) && (!state.prefix || inPrefix(e.flow.src, state.prefix) || inPrefix(e.flow.dst, state.prefix)));
  const bucket = bucketMs(win.toMs - win.fromMs);
  // Per node and bucket, the largest value its hops reported.
  const lat = new Map(), queue = new Map(), nodes = new Set(), times = new Set();
  for (const e of events) {
    const b = Math.floor(num(e.time_ns) / 1e6 / bucket) * bucket;
    for (const hop of e.path || []) {
      if (hop.switch_id == null) continue;
      nodes.add(hop.switch_id); times.add(b);
      const k = hop.switch_id + "/" + b;
      if (hop.hop_latency != null) lat.set(k, Math.max(lat.get(k) || 0, num(hop.hop_latency)));
      if (hop.queue_occupancy != null) queue.set(k, Math.max(queue.get(k) || 0, num(hop.queue_occupancy)));
    }
  }
  // Every bucket of the range on the time axis (a quiet bucket shows empty), unless the range
  // has too many of them for a chart: then the buckets with events.
  const first = Math.floor(win.fromMs / bucket) * bucket;
  const every = (win.toMs - first) / bucket <= 2000;
  if (every) for (let b = first; b < win.toMs; b += bucket) times.add(b);
  const ns_ = [...nodes].sort((a, b) => a - b), ts = [...times].sort((a, b) => a - b);
  const cells = m => [...m.entries()].map(([k, v]) => { const [n, b] = k.split("/").map(Number); return [ts.indexOf(b), ns_.indexOf(n), v]; });
  const latEl = h("div", { class: "chart", id: "chart-latency" }), qEl = h("div", { class: "chart", id: "chart-queue" });
  root.append(h("section", { class: "half" }, h("h2", {}, "Hop latency per node ", h("span", { class: "muted" }, "(ns, largest in each bucket)")), ns_.length ? latEl : h("p", { class: "muted" }, "No INT events with hop metadata in this range.")));
  root.append(h("section", { class: "half" }, h("h2", {}, "Queue occupancy per node ", h("span", { class: "muted" }, "(largest in each bucket)")), ns_.length ? qEl : h("p", { class: "muted" }, "No INT events with hop metadata in this range.")));
  if (ns_.length) {
    heat(ctx, latEl, cells(lat), ns_, ts, state.tz, "hop latency per node over time", "ns");
    heat(ctx, qEl, cells(queue), ns_, ts, state.tz, "queue occupancy per node over time", "");
  }
  const detectors = [...new Set(events.map(e => e.detector))].sort();
  const sel = h("select", { id: "detector-filter", "aria-label": "detector" }, h("option", { value: "" }, "every detector"), detectors.map(d => h("option", { value: d }, d)));
  const tableBox = h("div");
  const draw = () => {
    const shown = events.filter(e => !sel.value || e.detector === sel.value);
    tableBox.replaceChildren(table([["time"], ["agent"], ["flow"], ["detector"], ["where"], ["value", "num"], ["threshold", "num"]],
      shown.slice(0, 500).map(e => row([time(e.time_ns, state.tz), e.agent, flowName(e.flow), e.detector + (e.metric ? " " + e.metric : ""), e.switch_id != null ? `node ${e.switch_id} (hop ${e.hop})` : "path", numCell(e.value), numCell(e.threshold)], e, { "data-event": "" })),
      { keys: [e => num(e.time_ns), e => e.agent, e => flowName(e.flow), e => e.detector, e => e.switch_id ?? -1, e => num(e.value), e => num(e.threshold)], class: "events", empty: "no INT events in this range" }),
      h("p", { class: "muted" }, `${count(shown.length)} events` + (shown.length > 500 ? " (the newest 500 shown)" : "")));
  };
  sel.addEventListener("change", draw);
  draw();
  root.append(h("section", { class: "wide" }, h("h2", {}, "INT events"), h("label", {}, "detector ", sel), tableBox));
}
