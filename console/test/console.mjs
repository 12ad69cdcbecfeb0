// Drives the console in a real browser (Debian's chromium, through playwright-core; no
// browser is downloaded) and reports, as JSON on stdout, what each view shows: the numbers
// read from the DOM, the marks in each chart, console errors, and every request that went
// anywhere but the collector. The checks against the API and the traffic's truth are the
// caller's (crates/telemark/tests/console.rs); this script only reads the page.
//
//   node test/console.mjs BASE_URL OUT_DIR [JSON_OF_OPTIONS]
//
// Options: {"token": "...", "flow": {src, dst, sport, dport, proto}, "before": {"from", "to"},
// "agent": "s3", "range": "1h", "timingsOnly": false, "steer": {"agents": [..], "watch": [..]},
// "dist": "console/dist"} — `steer`: only replace those agents' watch rules from the health
// view and report what each agent then holds; `flow`: the
// flow whose path the URL-restore check opens; `before`: a typed range before the traffic (the
// range check); `agent`: the one the filter check chooses; `range`: the preset every view is
// read in; `timingsOnly`: load and switch views, time them, and stop; `dist`: serve the script
// and style sheet from here instead of the collector (to try a build without rebuilding it).
import { chromium } from "playwright-core";
import { mkdirSync } from "node:fs";

const [base, out, optText] = process.argv.slice(2);
const opt = optText ? JSON.parse(optText) : {};
mkdirSync(out, { recursive: true });
const frag = opt.token ? `#token=${opt.token}` : "";
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
const report = { errors: [], foreign: [], views: {}, checks: {}, timings: {} };
const origin = new URL(base).origin;
const range = opt.range || "1h";

async function newPage() {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  page.on("console", m => { if (m.type() === "error" || m.type() === "warning") report.errors.push(`${m.type()}: ${m.text()}`); });
  page.on("pageerror", e => report.errors.push("pageerror: " + e.message));
  page.on("request", r => { if (!r.url().startsWith(origin) && !r.url().startsWith("data:")) report.foreign.push(r.url()); });
  if (opt.dist) {
    await page.route("**/console.js", r => r.fulfill({ path: `${opt.dist}/console.js`, contentType: "text/javascript" }));
    await page.route("**/console.css", r => r.fulfill({ path: `${opt.dist}/console.css`, contentType: "text/css" }));
  }
  return page;
}

// Waits for the view's drawing number `n` (or any, when null) to finish.
async function drawn(page, after) {
  await page.waitForFunction(n => document.body.dataset.ready && Number(document.body.dataset.drawn || 0) > n, after ?? 0, { timeout: 30000 });
  return page.evaluate(() => ({ ready: document.body.dataset.ready, drawn: Number(document.body.dataset.drawn), error: (document.querySelector(".error") || {}).textContent || null }));
}

// What a view shows: cards, tables (rows of cell texts, with the row's data-* name), the
// path's drawn segments, and per chart the marks it drew.
const read = page => page.evaluate(() => {
  const text = el => (el ? el.textContent.trim() : null);
  const cards = {};
  for (const c of document.querySelectorAll("[data-stat]")) cards[c.dataset.stat] = text(c.querySelector(".value"));
  const tables = {};
  document.querySelectorAll("table").forEach((t, i) => {
    const name = t.className || `table${i}`;
    tables[name] = [...t.querySelectorAll("tbody tr")].map(tr => ({ key: tr.dataset.segment || tr.dataset.flow || tr.dataset.agent || tr.dataset.group || tr.dataset.exporter || null, cells: [...tr.children].map(td => td.textContent.trim()) }));
  });
  const charts = {};
  for (const c of document.querySelectorAll(".chart")) {
    // Marks: the drawn shapes with a fill that is neither none nor white (bars, heat cells,
    // sankey nodes), and stroked lines of series; axes and grid lines are drawn in greys.
    const shapes = [...c.querySelectorAll("path, rect")].filter(p => {
      const fill = (p.getAttribute("fill") || "").toLowerCase(), stroke = (p.getAttribute("stroke") || "").toLowerCase();
      const grey = v => /^#(e0e6f1|6e7079|333|ccc|fff|ffffff|000|aaa)$/.test(v) || v.startsWith("rgba(0,0,0") || v === "transparent";
      return (fill && fill !== "none" && !grey(fill)) || (stroke && stroke !== "none" && !grey(stroke) && (p.getAttribute("stroke-width") || "1") !== "0");
    });
    charts[c.id] = { marks: shapes.length, label: c.getAttribute("aria-label") };
  }
  const svgSegments = [...document.querySelectorAll("svg.path g.segment")].map(g => ({ name: g.dataset.segment, lost: g.dataset.lost, label: text(g.querySelector("text.seg-label")), reasons: text(g.querySelector("text.seg-reasons")) }));
  return { title: document.title, url: location.pathname + location.search, cards, tables, charts, svgSegments, verdict: text(document.getElementById("verdict")), flow: text(document.getElementById("path-flow")), caveats: [...document.querySelectorAll(".caveat")].map(text), error: text(document.querySelector(".error")) };
});

// Steering: each agent's watch rules replaced from the health view, as an operator does.
if (opt.steer) {
  const page = await newPage();
  await page.goto(`${base}/?view=health&refresh=off${frag}`);
  await drawn(page, 0);
  report.steer = {};
  for (const a of opt.steer.agents) {
    await page.fill(`#watch-${a}`, JSON.stringify(opt.steer.watch));
    await page.click(`#save-watch-${a}`);
    const status = `#status-watch-${a}`;
    await page.waitForFunction(sel => { const t = document.querySelector(sel).textContent; return t && t !== "saving…"; }, status, { timeout: 15000 });
    report.steer[a] = { status: await page.textContent(status), rules: JSON.parse(await page.inputValue(`#watch-${a}`)) };
  }
  await page.screenshot({ path: `${out}/steering.png`, fullPage: true });
  await browser.close();
  console.log(JSON.stringify(report));
  process.exit(0);
}

const page = await newPage();
// Each view from a fresh load of its address: load time, what it shows, a screenshot.
for (const v of ["overview", "path", "traffic", "int", "health"]) {
  const t0 = Date.now();
  await page.goto(`${base}/?view=${v}&range=${range}&refresh=off${frag}`);
  const d = await drawn(page, 0);
  report.timings[`load_${v}_ms`] = Date.now() - t0;
  report.views[v] = { ...(await read(page)), ...d };
  await page.screenshot({ path: `${out}/${v}.png`, fullPage: true });
}

// Switching views by the tabs, as a user does: the time each takes, and the address each
// leaves (the state of the view).
await page.goto(`${base}/?view=overview&range=${range}&refresh=off${frag}`);
let d = await drawn(page, 0);
for (const v of ["path", "traffic", "int", "health", "overview"]) {
  const t0 = Date.now();
  await page.click(`#tab-${v}`);
  d = await drawn(page, d.drawn);
  report.timings[`switch_${v}_ms`] = Date.now() - t0;
}

if (opt.timingsOnly) {
  await browser.close();
  console.log(JSON.stringify(report));
  process.exit(0);
}

// A flow chosen in the overview's list opens its path, and the address says which.
await page.click("table.flows tbody tr a");
d = await drawn(page, d.drawn);
report.checks.clicked_flow = await read(page);

// The time range: a typed range before the traffic shows none of it.
if (opt.before) {
  await page.goto(`${base}/?view=overview&refresh=off${frag}`);
  d = await drawn(page, 0);
  await page.fill("#range-from", opt.before.from);
  await page.fill("#range-to", opt.before.to);
  await page.click("form.typed button");
  d = await drawn(page, d.drawn);
  report.checks.before = await read(page);
  await page.click('button[data-range="1h"]');
  d = await drawn(page, d.drawn);
  report.checks.last_hour_again = await read(page);
}

// The filter: a protocol with no traffic, then one agent.
await page.goto(`${base}/?view=overview&range=1h&refresh=off${frag}`);
d = await drawn(page, 0);
await page.selectOption("#f-proto", "6");
await page.click("form.filter button");
d = await drawn(page, d.drawn);
report.checks.proto_tcp = await read(page);
await page.selectOption("#f-proto", "");
await page.selectOption("#f-agent", opt.agent || "s3");
await page.click("form.filter button");
d = await drawn(page, d.drawn);
report.checks.one_agent = await read(page);

// An address restores a view: the path of `flow`, in a fresh page.
if (opt.flow) {
  const f = opt.flow;
  const q = new URLSearchParams({ view: "path", range: "1h", refresh: "off", src: f.src, dst: f.dst, sport: f.sport, dport: f.dport, fproto: f.proto });
  const fresh = await newPage();
  await fresh.goto(`${base}/?${q}${frag}`);
  await drawn(fresh, 0);
  report.checks.restored = await read(fresh);
  await fresh.screenshot({ path: `${out}/path-restored.png`, fullPage: true });
  await fresh.close();
}

await browser.close();
console.log(JSON.stringify(report));
