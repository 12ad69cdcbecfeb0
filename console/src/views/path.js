// Path: one flow's path as its points and the segments between them, each segment coloured
// by the share of packets it lost, with lost and uncertain counts, the kernel's drop reasons
// and the collector's caveats; and the flow's loss over time at each point.
import { get, ns, flowParams } from "../api.js";
import { timeAxes } from "../charts.js";
import { h, count, num, percent, table, row, numCell, flowName } from "../util.js";
import { bucketMs, flowOf } from "../state.js";

const METHOD = { in_switch: "inside the agent", lined_up: "batches lined up", difference: "difference of points", from_marking: "from the marking" };

// Green when clean, then amber, then red by the share lost.
function lossColour(lost, expected) {
  if (num(lost) === 0) return "#009E73";
  const r = num(lost) / Math.max(1, num(expected));
  return r >= 0.01 ? "#C0392B" : "#E69F00";
}

// The points in path order: each segment's upstream end before its downstream end.
function order(segs) {
  const nodes = [], seen = new Set();
  const add = n => { if (!seen.has(n)) { seen.add(n); nodes.push(n); } };
  const rank = s => (s.from ? 1 : 0);
  const byDown = new Map(segs.map(s => [`${s.agent}/${s.point}`, s]));
  const visit = (n, depth = 0) => {
    const s = byDown.get(n);
    if (s && s.from && depth < 64 && !seen.has(s.from)) visit(s.from, depth + 1);
    add(n);
  };
  if (segs.some(s => !s.from)) add("marker");
  for (const s of [...segs].sort((a, b) => rank(a) - rank(b))) visit(`${s.agent}/${s.point}`);
  return nodes;
}

function drawPath(segs) {
  const nodes = order(segs);
  const W = 180, gap = 60, H = 230, y = 150;
  const x = i => 20 + i * (W + gap);
  const width = x(nodes.length) - gap + 20;
  // Drawn to fit the page's width, down to 3/4 of its size; a longer path scrolls, to its
  // segment that lost most (below).
  const avail = Math.max(600, document.documentElement.clientWidth - 64);
  const scale = Math.min(1, Math.max(0.75, avail / width));
  const svg = h("svg", { viewBox: `0 0 ${width} ${H}`, width: Math.round(width * scale), height: Math.round(H * scale), class: "path", role: "img", "aria-label": "the flow's path: points and segments coloured by loss" });
  let worst = null;
  const idx = new Map(nodes.map((n, i) => [n, i]));
  segs.forEach((s, k) => {
    const to = idx.get(`${s.agent}/${s.point}`), from = idx.get(s.from || "marker");
    if (to == null || from == null) return;
    const c = lossColour(s.lost, s.expected);
    const x1 = x(from) + W, x2 = x(to);
    const adjacent = to === from + 1;
    const lift = adjacent ? 0 : 40 + 12 * (k % 3);
    const d = adjacent ? `M${x1} ${y} L${x2 - 8} ${y}` : `M${x(from) + W / 2} ${y - 30} C${x(from) + W / 2} ${y - 30 - lift * 2}, ${x(to) + W / 2} ${y - 30 - lift * 2}, ${x(to) + W / 2} ${y - 36}`;
    const label = `lost ${count(s.lost)}` + (num(s.uncertain) ? `, uncertain ${count(s.uncertain)}` : "");
    const reasons = Object.entries(s.drops || {}).sort((a, b) => num(b[1]) - num(a[1])).map(([r, n]) => `${count(n)} ${r}`).join(", ");
    const lx = adjacent ? (x1 + x2) / 2 : (x(from) + x(to) + W) / 2, ly = adjacent ? y - 10 : y - 40 - lift * 1.5;
    if (num(s.lost) && (!worst || num(s.lost) > worst.lost)) worst = { lost: num(s.lost), x: lx * scale };
    svg.append(h("g", { class: "segment", "data-segment": `${s.from || "marker"} → ${s.agent}/${s.point}`, "data-lost": s.lost },
      h("title", {}, `${s.from || "marker"} → ${s.agent}/${s.point}: ${label} of ${count(s.expected)} (${METHOD[s.method] || s.method})` + (reasons ? `; dropped by the kernel: ${reasons}` : "")),
      h("path", { d, fill: "none", stroke: c, "stroke-width": num(s.lost) ? 5 : 3, "marker-end": "" }),
      h("polygon", { points: adjacent ? `${x2 - 10},${y - 6} ${x2},${y} ${x2 - 10},${y + 6}` : `${x(to) + W / 2 - 6},${y - 42} ${x(to) + W / 2},${y - 32} ${x(to) + W / 2 + 6},${y - 42}`, fill: c }),
      h("text", { x: lx, y: ly, "text-anchor": "middle", class: "seg-label", fill: c === "#009E73" ? "#1d6b4f" : c }, label),
      reasons ? h("text", { x: lx, y: ly + 40 + (adjacent ? 24 : 0), "text-anchor": "middle", class: "seg-reasons" }, reasons) : null));
  });
  nodes.forEach((n, i) => {
    const [agent, point] = n === "marker" ? ["marker", "marks the flow"] : [n.split("/")[0], n.split("/").slice(1).join("/")];
    const seg = segs.find(s => `${s.agent}/${s.point}` === n);
    svg.append(h("g", { class: "point", "data-point": n },
      h("rect", { x: x(i), y: y - 30, width: W, height: 60, rx: 6, fill: "#fff", stroke: "#4a5568" }),
      h("text", { x: x(i) + W / 2, y: y - 10, "text-anchor": "middle", class: "pt-agent" }, agent),
      h("text", { x: x(i) + W / 2, y: y + 8, "text-anchor": "middle" }, point),
      seg ? h("text", { x: x(i) + W / 2, y: y + 24, "text-anchor": "middle", class: "pt-port" }, `port ${seg.port}`) : null));
  });
  const box = h("div", { class: "path-scroll" }, svg);
  if (worst) requestAnimationFrame(() => { box.scrollLeft = Math.max(0, worst.x - box.clientWidth / 2); });
  return box;
}

export async function render(ctx) {
  const { state, win, root, link } = ctx;
  // The flow asked for, else the one that lost most; the others that lost, to choose from.
  const lossy = await get("/api/v1/flows", { from: ns(win.fromMs), to: ns(win.toMs), lossy: true, limit: 20 });
  const flow = flowOf(state) || (lossy[0] && lossy[0].flow);
  if (!flow) {
    root.append(h("section", { class: "wide" }, h("h2", {}, "Path"), h("p", { class: "muted" }, "No flow lost packets in this range: choose one from a link, or widen the range.")));
    return;
  }
  const range = { from: ns(win.fromMs), to: ns(win.toMs) };
  const bucket = bucketMs(win.toMs - win.fromMs);
  const [loc, series] = await Promise.all([
    get("/api/v1/localise", { ...flowParams(flow), ...range }),
    get("/api/v1/loss", { ...flowParams(flow), ...range, bucket_ns: ns(bucket) }),
  ]);
  const v = loc.verdict;
  root.append(h("section", { class: "wide" },
    h("h2", {}, "Path of ", h("span", { class: "mono", id: "path-flow" }, flowName(flow))),
    h("p", { id: "verdict", class: v ? "verdict bad" : "verdict" }, v ? `${count(loc.lost)} packets lost; ${count(v.lost)} of them ${v.where}` + (v.reasons ? ` — the kernel: ${v.reasons}` : "") : `${count(loc.lost)} packets lost in this range`),
    ...(v && v.segments ? v.segments.filter(s => s.caveat).map(s => h("p", { class: "caveat" }, "⚠ " + s.caveat)) : []),
    loc.segments.length ? drawPath(loc.segments) : h("p", { class: "muted" }, "No loss records for this flow in this range."),
    h("p", { class: "legend" }, h("span", { class: "sw ok" }), "no loss ", h("span", { class: "sw warn" }), "under 1 % ", h("span", { class: "sw bad" }), "1 % or more")));
  const rows = loc.segments.map(s => row([`${s.from || "marker"} → ${s.agent}/${s.point}`, s.port, METHOD[s.method] || s.method, numCell(s.expected), numCell(s.lost), numCell(s.uncertain), { cls: "num", v: percent(s.lost, s.expected) },
    Object.entries(s.drops || {}).map(([r, n]) => `${count(n)} ${r}`).join(", ")], s, { "data-segment": `${s.from || "marker"} → ${s.agent}/${s.point}` }));
  root.append(h("section", { class: "wide" }, h("h2", {}, "Segments"),
    table([["segment"], ["port"], ["figures"], ["sent in", "num"], ["lost", "num"], ["uncertain", "num"], ["loss", "num"], ["kernel drop reasons"]], rows,
      { keys: [r => r.agent + r.point, r => r.port, r => r.method, r => num(r.expected), r => num(r.lost), r => num(r.uncertain), r => num(r.lost) / Math.max(1, num(r.expected)), null], class: "segments" })));
  const by = new Map();
  for (const p of series.series) {
    const k = `${p.agent}/${p.point}` + (p.scope === "path" ? " (from the marking)" : "");
    if (!by.has(k)) by.set(k, []);
    by.get(k).push([num(p.t_ns) / 1e6, num(p.lost)]);
  }
  const el = h("div", { class: "chart", id: "chart-flow-loss" });
  root.append(h("section", { class: "wide" }, h("h2", {}, "Lost over time at each point"), el));
  ctx.chart(el, { ...timeAxes("packets lost", win.fromMs, win.toMs),     series: [...by.entries()].map(([name, data]) => ({ name, type: "bar", barMaxWidth: 16, data })) }, state.tz, "the flow's packets lost per time bucket at each point");
  root.append(h("section", { class: "wide" }, h("h2", {}, "Other flows that lost packets"),
    h("ul", { class: "choose" }, lossy.filter(f => flowName(f.flow) !== flowName(flow)).map(f => h("li", {}, link(ctx.withFlow(f.flow), flowName(f.flow)), ` — ${count(f.lost)} lost`)))));
}
