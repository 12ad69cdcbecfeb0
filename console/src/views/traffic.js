// Traffic: top talkers from the flow listener and the agents' flow records (their heavy
// hitters among them), by bytes or packets, grouped by flow, source or destination prefix or
// protocol, with "other"; and a sankey from sources to destinations. One exporter's, with the
// exporter filter.
import { get, ns } from "../api.js";
import { COLORS } from "../charts.js";
import { h, count, num, big, bytes, table, row, numCell, flowName, proto, inPrefix, prefixOf } from "../util.js";

// Group name, its plural, and a flow's group.
const GROUPS = {
  flow: ["flow", "talkers", t => flowName(t.flow)],
  src: ["source prefix", "source prefixes", t => prefixOf(t.flow.src, 24, 64)],
  dst: ["destination prefix", "destination prefixes", t => prefixOf(t.flow.dst, 24, 64)],
  proto: ["protocol", "protocols", t => proto(t.flow.proto)],
};
const TOP = 10;

export async function render(ctx) {
  const { state, win, root, control } = ctx;
  const by = state.by === "packets" ? "packets" : "bytes";
  const { flows: talkers } = await get("/api/v1/flows/top", { from: ns(win.fromMs), to: ns(win.toMs), by, limit: 1000, exporter: state.exporter });
  const list = talkers.filter(t => (!state.proto || String(t.flow.proto) === state.proto) && (!state.prefix || inPrefix(t.flow.src, state.prefix) || inPrefix(t.flow.dst, state.prefix)));
  const [groupName, plural, keyOf] = GROUPS[state.group] || GROUPS.flow;
  const groups = new Map();
  for (const t of list) {
    const k = keyOf(t);
    // Error bounds of independent estimates add in quadrature (as the API's totals do).
    const g = groups.get(k) || { key: k, bytes: 0n, packets: 0n, flows: 0, exact: true, var: 0 };
    g.bytes += big(t.bytes); g.packets += big(t.packets); g.flows += 1; g.exact &&= t.exact; g.var += num(t.error_bound) ** 2;
    groups.set(k, g);
  }
  const ranked = [...groups.values()].sort((a, b) => (b[by] > a[by] ? 1 : b[by] < a[by] ? -1 : 0));
  const top = ranked.slice(0, TOP);
  const rest = ranked.slice(TOP);
  const total = ranked.reduce((s, g) => s + g[by], 0n);
  if (rest.length) top.push(rest.reduce((o, g) => ({ ...o, bytes: o.bytes + g.bytes, packets: o.packets + g.packets, flows: o.flows + g.flows, exact: o.exact && g.exact, var: o.var + g.var }), { key: `other (${rest.length})`, other: true, bytes: 0n, packets: 0n, flows: 0, exact: true, var: 0 }));

  root.append(h("section", { class: "wide controls-row" },
    control("by", "rank by", [["bytes", "bytes"], ["packets", "packets"]]),
    control("group", "group by", Object.entries(GROUPS).map(([k, [n]]) => [k, n])),
    h("span", { class: "muted" }, `${count(list.length)} flows in this range` + (talkers.length >= 1000 ? " (the 1,000 largest)" : "") + (state.exporter ? ` from exporter ${state.exporter}` : ""))));

  const rows = top.map(g => row([g.key, numCell(g.bytes), h("td", { class: "num" }, bytes(g.bytes)), numCell(g.packets), g.exact ? "exact" : `± ${count(Math.round(Math.sqrt(g.var)))} packets`, numCell(g.flows), { cls: "num", v: total ? (Number((g[by] * 10000n) / total) / 100).toFixed(2) + " %" : "–" }], g, { "data-group": g.key }));
  root.append(h("section", { class: "half" }, h("h2", {}, `Top ${plural} by ${by}`),
    table([[groupName], ["bytes", "num"], ["", "num"], ["packets", "num"], ["accuracy"], ["flows", "num"], ["share", "num"]], rows,
      { keys: [r => r.key, r => Number(r.bytes), null, r => Number(r.packets), null, r => r.flows, r => Number(r[by])], class: "talkers", empty: "no flow records in this range" })));

  const barEl = h("div", { class: "chart", id: "chart-talkers" });
  root.append(h("section", { class: "half" }, h("h2", {}, `Share of ${by}`), barEl));
  ctx.chart(barEl, {
    grid: { left: 200, right: 24, top: 30, bottom: 40 },
    tooltip: { trigger: "item" },
    xAxis: { type: "value", name: by, nameLocation: "end" },
    yAxis: { type: "category", inverse: true, data: top.map(g => g.key), axisLabel: { width: 180, overflow: "truncate" } },
    series: [{ type: "bar", name: by, data: top.map(g => Number(g[by])) }],
  }, state.tz, `top ${groupName}s by ${by}`);

  // Sources to destinations: the top flows' /24 (/64) prefixes, the rest as other.
  const links = new Map();
  const topFlows = [...list].sort((a, b) => num(b[by]) - num(a[by]));
  topFlows.forEach((t, i) => {
    const s = i < 20 ? "from " + prefixOf(t.flow.src, 24, 64) : "from other";
    const d = i < 20 ? "to " + prefixOf(t.flow.dst, 24, 64) : "to other";
    const k = s + "\u0000" + d;
    links.set(k, (links.get(k) || 0) + num(t[by]));
  });
  const names = new Set();
  for (const k of links.keys()) k.split("\u0000").forEach(n => names.add(n));
  const sankeyEl = h("div", { class: "chart", id: "chart-sankey" });
  root.append(h("section", { class: "wide" }, h("h2", {}, `From sources to destinations, by ${by}`), sankeyEl));
  ctx.chart(sankeyEl, {
    tooltip: { trigger: "item" },
    series: [{ type: "sankey", left: 20, right: 160, nodeGap: 10, emphasis: { focus: "adjacency" }, lineStyle: { color: "source", opacity: 0.35 },
      data: [...names].map((name, i) => ({ name, itemStyle: { color: COLORS[i % (COLORS.length - 1)] } })),
      links: [...links.entries()].map(([k, value]) => { const [source, target] = k.split("\u0000"); return { source, target, value }; }) }],
  }, state.tz, `traffic from source prefixes to destination prefixes by ${by}`);
}
