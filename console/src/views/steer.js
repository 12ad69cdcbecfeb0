// Steering, on the health view: each steered agent's watch rules and INT rules, edited here and
// relayed by the collector to the agent's control API (an [operators] token is needed to
// change them); "watch the N heaviest flows" makes agents measure the flows with the most
// packets in the last five minutes; and the changes made, with who made them.
import { get, send } from "../api.js";
import { h, time } from "../util.js";

// An editor of one agent's rules of one set. Rules that could not be read are not offered
// for saving: an empty list saved in their place would watch every flow.
function editor(agent, set, rules, why, label, help, changed) {
  const id = `${set}-${agent}`;
  const area = h("textarea", { id, rows: 6, cols: 60, spellcheck: "false", "aria-label": `${label} of ${agent}` });
  const known = rules != null;
  area.value = known ? JSON.stringify(rules, null, 1) : "";
  area.disabled = !known;
  // The console does not redraw over what is being edited (main.js).
  area.addEventListener("input", () => { area.dataset.dirty = "1"; });
  const status = h("span", { id: `status-${id}`, class: "muted", role: "status" }, known ? "" : why || "not read from the agent");
  const save = h("button", { type: "button", id: `save-${id}`, disabled: !known }, `save ${label}`);
  save.addEventListener("click", async () => {
    let body;
    try { body = JSON.parse(area.value); } catch (e) { status.textContent = "not JSON: " + e.message; status.className = "bad"; return; }
    status.textContent = "saving…"; status.className = "muted";
    try {
      const now = await send("PUT", `/api/v1/control/${set}`, { agent }, body);
      area.value = JSON.stringify(now, null, 1);
      delete area.dataset.dirty;
      status.textContent = "saved: the agent's rules now"; status.className = "good";
    } catch (e) { status.textContent = e.message; status.className = "bad"; }
    changed();
  });
  return h("div", { class: "rules" }, h("label", { for: id }, label, " ", h("span", { class: "muted" }, help)), area, h("div", {}, save, " ", status));
}

export async function section(ctx) {
  const c = await get("/api/v1/control");
  if (c.off) return h("section", { class: "wide", id: "steering" }, h("h2", {}, "Steering"), h("p", { class: "muted" }, `Steering is off: ${c.off} (docs/console.md, "Steering").`));
  const n = h("input", { id: "heaviest-n", type: "number", min: 1, max: 500, value: 10, size: 5, "aria-label": "how many flows" });
  const who = h("select", { id: "heaviest-agent", "aria-label": "which agents" }, h("option", { value: "" }, "every steered agent"), c.agents.map(a => h("option", { value: a }, a)));
  // Each agent's rules, asked of it through the collector one agent at a time (the collector
  // relays only a few requests at once; the first 50 agents).
  const SHOWN = 50;
  const rules = [];
  for (const a of c.agents.slice(0, SHOWN)) rules.push(await get("/api/v1/control", { agent: a }).catch(e => ({ agent: a, error: e.message })));
  // The changes made, newest first; read again after each change made here.
  const changesBox = h("div");
  const listChanges = changes => changesBox.replaceChildren(changes.length
    ? h("ul", { id: "changes" }, changes.slice(0, 50).map(ch => h("li", {}, `${time(ch.time_ns, ctx.state.tz)} ${ch.who} changed ${ch.agent}'s ${ch.rules} rules: ${ch.result}`)))
    : h("p", { class: "muted" }, "No change made through this collector since it started."));
  const changed = () => get("/api/v1/control").then(c => listChanges(c.changes)).catch(() => {});
  listChanges(c.changes);
  const hstatus = h("span", { id: "status-heaviest", class: "muted", role: "status" });
  const go = h("button", { type: "button", id: "heaviest-go" }, "watch them");
  go.addEventListener("click", async () => {
    hstatus.textContent = "choosing…";
    try {
      const r = await send("POST", "/api/v1/control/heaviest", { n: n.value, agent: who.value });
      hstatus.textContent = `${r.flows.length} flows; ` + r.agents.map(a => `${a.agent}: ${a.result}`).join(", ");
      hstatus.className = r.agents.every(a => a.result === "ok") ? "good" : "bad";
    } catch (e) { hstatus.textContent = e.message; hstatus.className = "bad"; }
    changed();
  });
  return h("section", { class: "wide", id: "steering" }, h("h2", {}, "Steering ", h("span", { class: "muted" }, "(the agents' rules, relayed by the collector; changes need an operator token)")),
    h("p", {}, "Watch the ", n, " heaviest flows of the last 5 minutes at ", who, " ", go, " ", hstatus),
    c.agents.length > SHOWN ? h("p", { class: "muted" }, `The first ${SHOWN} of ${c.agents.length} agents.`) : null,
    rules.map(a => h("div", { class: "agent-rules", "data-agent": a.agent },
      // The agent's error once when neither set could be read (it is down); else each set's
      // own (an agent without [int] refuses INT rules).
      h("h3", {}, a.agent, a.error && a.watch == null && a.int == null ? h("span", { class: "bad" }, " — " + a.error) : null),
      h("div", { class: "rules-pair" },
        editor(a.agent, "watch", a.watch, a.watch_error, "watch rules", "(a list; [] watches every flow)", changed),
        editor(a.agent, "int", a.int, a.int_error, "INT rules", "({rule: [...], detect: [...]})", changed)))),
    h("h3", {}, "Changes"), changesBox);
}
