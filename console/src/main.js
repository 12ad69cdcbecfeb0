// The collector's console (docs/console.md): five views over the JSON API, one time range
// and one filter shared by all of them, every view's state in the address.
import * as state from "./state.js";
import { get } from "./api.js";
import { chart, show, dispose } from "./charts.js";
import { h, zoneName, time } from "./util.js";
import * as overview from "./views/overview.js";
import * as path from "./views/path.js";
import * as traffic from "./views/traffic.js";
import * as int from "./views/int.js";
import * as health from "./views/health.js";

const VIEWS = { overview: ["Overview", overview], path: ["Path", path], traffic: ["Traffic", traffic], int: ["INT", int], health: ["Health", health] };
let S = state.read();
let timer = null, drawing = 0;

// A link within the console: to state `s`, without reloading.
function link(s, text, attrs = {}) {
  const a = h("a", { href: state.href(s), ...attrs }, text);
  a.addEventListener("click", e => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey) return;
    e.preventDefault();
    go(s);
  });
  return a;
}

function go(s, replace = false) {
  S = s;
  state.write(S, replace);
  draw();
}

const set = patch => go({ ...S, ...patch });

// A select bound to state key `key`.
function control(key, label, options) {
  const sel = h("select", { id: "ctl-" + key, "aria-label": label }, options.map(([v, t]) => h("option", { value: v, selected: S[key] === v }, t)));
  sel.addEventListener("change", () => set({ [key]: sel.value }));
  return h("label", {}, label + " ", sel);
}

// The bar, for drawing number `mine` (nothing, if a newer drawing started meanwhile).
async function chrome(mine) {
  const nav = h("nav", { "aria-label": "views" }, Object.entries(VIEWS).map(([k, [name]]) => link({ ...S, view: k }, name, { class: k === S.view ? "tab on" : "tab", "aria-current": k === S.view ? "page" : null, id: "tab-" + k })));
  const presets = h("div", { class: "presets", role: "group", "aria-label": "time range" }, state.PRESETS.map(p => {
    const b = h("button", { type: "button", class: S.range === p ? "on" : "", "aria-pressed": S.range === p ? "true" : "false", "data-range": p }, "last " + p);
    b.addEventListener("click", () => set({ range: p, from: "", to: "" }));
    return b;
  }));
  const from = h("input", { id: "range-from", "aria-label": "from", placeholder: "from: now-2h or 2026-11-28 03:00", value: S.range === "custom" ? S.from : "", size: 22 });
  const to = h("input", { id: "range-to", "aria-label": "to", placeholder: "to: now", value: S.range === "custom" ? S.to : "", size: 16 });
  const typed = h("form", { class: "typed" }, from, to, h("button", { type: "submit" }, "apply"));
  typed.addEventListener("submit", e => { e.preventDefault(); set({ range: "custom", from: from.value, to: to.value }); });

  let agents = [];
  try { agents = (await get("/api/v1/agents")).map(a => a.agent.agent); } catch (_) { /* shown by the view */ }
  if (mine !== drawing) return;
  const filter = h("form", { class: "filter", "aria-label": "filter" },
    h("label", {}, "agent ", h("select", { id: "f-agent", name: "agent" }, h("option", { value: "" }, "all"), agents.map(a => h("option", { value: a, selected: S.agent === a }, a)))),
    h("label", {}, "protocol ", h("select", { id: "f-proto", name: "proto" }, [["", "all"], ["6", "TCP"], ["17", "UDP"], ["1", "ICMP"], ["58", "ICMPv6"], ["132", "SCTP"]].map(([v, t]) => h("option", { value: v, selected: S.proto === v }, t)))),
    h("label", {}, "prefix ", h("input", { id: "f-prefix", name: "prefix", value: S.prefix, placeholder: "10.0.0.0/8", size: 14 })),
    h("label", {}, "exporter ", h("input", { id: "f-exporter", name: "exporter", value: S.exporter, placeholder: "192.0.2.1", size: 12 })),
    h("button", { type: "submit" }, "filter"));
  filter.addEventListener("submit", e => {
    e.preventDefault();
    const f = new FormData(filter);
    set({ agent: f.get("agent"), proto: f.get("proto"), prefix: f.get("prefix").trim(), exporter: f.get("exporter").trim() });
  });
  const refresh = control("refresh", "refresh", state.REFRESH.map(r => [r, r === "off" ? "off" : "every " + r]));
  const tz = control("tz", "times in", [["local", zoneName("local")], ["utc", "UTC"]]);
  document.getElementById("top").replaceChildren(h("h1", {}, "Telemark"), nav, h("span", { id: "updated", class: "muted", "aria-live": "polite" }));
  document.getElementById("bar").replaceChildren(presets, typed, refresh, tz, filter);
}

// Draws the view; the bar too, unless this is a refresh (which keeps what is being typed).
async function draw(refresh = false) {
  clearTimeout(timer);
  // Never over rules being edited: try again at the next tick.
  if (refresh && document.querySelector("textarea[data-dirty], textarea:focus")) {
    timer = setTimeout(() => draw(true), state.duration(S.refresh) || 30000);
    return;
  }
  const mine = ++drawing;
  if (!refresh) await chrome(mine);
  const root = document.getElementById("view");
  const win = state.window(S, Date.now());
  const started = performance.now();
  const next = h("div", { class: "grid", "data-view": S.view });
  const charts = new Set();
  let error = win.error;
  if (!error) {
    try {
      await VIEWS[S.view][1].render({ state: S, win, root: next, link, control, chart: (...a) => chart(charts, ...a), withFlow: f => state.withFlow(S, f) });
    } catch (e) {
      error = e.message;
    }
  }
  if (mine !== drawing) { dispose(charts); return; } // a newer draw started meanwhile
  root.replaceChildren(next);
  show(charts);
  const upd = document.getElementById("updated");
  upd.textContent = error ? "" : `updated ${time(BigInt(Date.now()) * 1000000n, S.tz, false)} in ${Math.round(performance.now() - started)} ms`;
  document.body.dataset.ready = error ? "error" : "ok";
  document.body.dataset.drawn = String(mine);
  if (error) root.prepend(h("p", { class: "error", role: "alert" }, error));
  document.title = `Telemark · ${VIEWS[S.view][0]}`;
  const every = S.refresh !== "off" ? state.duration(S.refresh) : null;
  if (every && S.range !== "custom") timer = setTimeout(() => draw(true), every);
}

addEventListener("popstate", () => { S = state.read(); draw(); });
draw();
