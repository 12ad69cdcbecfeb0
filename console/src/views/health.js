// Health: agents (last seen, drops in their rings, refusals, export backlog), flow exporters
// (datagrams, loss, templates), Kafka and storage, from the API and the collector's own
// /metrics.
import { get, ns } from "../api.js";
import { h, count, num, big, table, row, numCell, time } from "../util.js";
import { section as steering } from "./steer.js";

// OpenMetrics text → [{name, labels, value}] (values as text: exact).
export function parseMetrics(text) {
  const out = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
    out.push({ name: m[1], labels, value: m[4] });
  }
  return out;
}

export async function render(ctx) {
  const { state, win, root } = ctx;
  const [agents, health, metricsText, ready] = await Promise.all([
    get("/api/v1/agents"),
    get("/api/v1/health", { from: ns(win.fromMs) }),
    get("/metrics").catch(() => ""),
    fetch("/readyz").then(r => r.ok).catch(() => false),
  ]);
  const metrics = parseMetrics(metricsText);
  const metric = (name, pred = () => true) => metrics.filter(m => m.name === name && pred(m.labels));
  const sum = (name, pred) => metric(name, pred).reduce((s, m) => s + big(m.value.split(".")[0]), 0n);

  // Per agent, its health records in the range summed, and its points' tables as last told.
  const per = new Map();
  for (const r of health) {
    const a = per.get(r.agent) || { rx: 0n, ring: 0n, tx: 0n, events: 0n, refused: 0n, unselected: 0n, points: new Map(), last: 0 };
    a.rx += big(r.rx); a.ring += big(r.rx_ring_drops); a.tx += big(r.tx_drops); a.events += big(r.events_lost);
    for (const p of r.points) { a.refused += big(p.packets_refused); a.unselected += big(p.packets_unselected); if (num(r.interval_end_ns) >= a.last) a.points.set(p.point, p); }
    a.last = Math.max(a.last, num(r.interval_end_ns));
    per.set(r.agent, a);
  }
  root.append(h("section", { class: "cards" },
    h("div", { class: "card", "data-stat": "storage" }, h("div", { class: "label" }, "storage"), h("div", { class: "value " + (ready ? "good" : "bad") }, ready ? "takes writes" : "not ready")),
    h("div", { class: "card", "data-stat": "agents" }, h("div", { class: "label" }, "agents"), h("div", { class: "value" }, `${agents.filter(a => a.healthy).length} of ${agents.length} heard from`)),
    h("div", { class: "card", "data-stat": "records" }, h("div", { class: "label" }, "records stored"), h("div", { class: "value" }, count(sum("telemark_collector_stored_records"))))));

  const rows = agents.map(({ agent: a, healthy }) => {
    const p = per.get(a.agent);
    return row([a.agent, h("td", { class: healthy ? "good" : "bad" }, healthy ? "✓ heard from" : "✗ silent"), time(a.last_seen_ns, state.tz), a.version, numCell(a.records),
      numCell(p ? p.ring : null), numCell(p ? p.tx : null), numCell(p ? p.events : null), numCell(p ? p.refused : null), numCell(a.export_dropped)], a, { "data-agent": a.agent });
  });
  root.append(h("section", { class: "wide" }, h("h2", {}, "Agents ", h("span", { class: "muted" }, "(drops and refusals summed over the range, from their health records)")),
    table([["agent"], ["state"], ["last seen"], ["version"], ["records", "num"], ["ring drops", "num"], ["tx drops", "num"], ["events lost", "num"], ["packets refused", "num"], ["export dropped", "num"]], rows,
      { keys: [a => a.agent, a => a.last_seen_ns, a => num(a.last_seen_ns), a => a.version, a => num(a.records), null, null, null, null, a => num(a.export_dropped)], class: "agents", empty: "no agent has registered" })));

  const tables = [];
  for (const [agent, a] of per) for (const p of a.points.values()) tables.push({ agent, ...p });
  root.append(h("section", { class: "wide" }, h("h2", {}, "Flow tables ", h("span", { class: "muted" }, "(each point, as last reported)")),
    table([["agent"], ["point"], ["port"], ["flows", "num"], ["capacity", "num"], ["admitted", "num"], ["evicted", "num"], ["refused packets", "num"]],
      tables.map(t => row([t.agent, t.point, t.port, numCell(t.flows), numCell(t.capacity), numCell(t.flows_admitted), numCell(t.flows_evicted), numCell(t.packets_refused)], t)),
      { keys: [t => t.agent, t => t.point, t => t.port, t => num(t.flows), t => num(t.capacity), null, null, t => num(t.packets_refused)], empty: "no health records in this range" })));

  const exporters = new Map();
  for (const m of metrics) {
    const k = m.labels.exporter;
    if (!k || !m.name.startsWith("telemark_collector_flow_exporter_")) continue;
    const e = exporters.get(k) || { exporter: k, datagrams: 0n, flows: 0n, lost: 0n };
    const v = big(m.value.split(".")[0]);
    if (m.name.endsWith("_datagrams_total")) e.datagrams += v;
    else if (m.name.endsWith("_flows_total")) e.flows += v;
    else if (m.name.endsWith("_lost_total")) e.lost += v;
    exporters.set(k, e);
  }
  root.append(h("section", { class: "half" }, h("h2", {}, "Flow exporters ", h("span", { class: "muted" }, "(since the collector started)")),
    table([["exporter"], ["datagrams", "num"], ["flows", "num"], ["lost (sequence numbers)", "num"]],
      // "other" (exporters past the label limit) only once it has counted something.
      [...exporters.values()].filter(e => e.exporter !== "other" || e.datagrams || e.flows || e.lost).map(e => row([e.exporter, numCell(e.datagrams), numCell(e.flows), numCell(e.lost)], e, { "data-exporter": e.exporter })),
      { keys: [e => e.exporter, e => Number(e.datagrams), e => Number(e.flows), e => Number(e.lost)], empty: "no flow exporter has sent (or the flow listener is off)" }),
    h("p", { class: "muted" }, `templates: ${count(sum("telemark_collector_flow_template_fields"))} fields held; refused: ${count(sum("telemark_collector_flow_refused_total"))} datagrams or sets`)));

  const lag = metric("telemark_collector_kafka_consumer_lag");
  root.append(h("section", { class: "half" }, h("h2", {}, "Kafka"),
    metrics.some(m => m.name.startsWith("telemark_collector_kafka_"))
      ? h("p", { "data-stat": "kafka_lag" }, "consumer lag: ", h("span", { class: "value" }, lag.length ? count(sum("telemark_collector_kafka_consumer_lag")) + " records" : "– (not consuming)"))
      : h("p", { class: "muted" }, "Kafka is off on this collector."),
    h("p", { class: "muted" }, `published ${count(sum("telemark_collector_kafka_published_total"))}, consumed ${count(sum("telemark_collector_kafka_consumed_total"))}, outbox ${count(sum("telemark_collector_kafka_outbox_records"))}`)));
  root.append(await steering(ctx));
}
