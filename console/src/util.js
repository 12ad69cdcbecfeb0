// Small helpers every view uses: building elements (text is always text, never markup),
// exact number formatting, and time.

// An element: h("td", {class: "num"}, "12"). Children are nodes or text; attributes named
// on* are refused, so nothing a record brings can become a handler.
export function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "g", "rect", "line", "path", "text", "title", "circle", "polygon"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) throw new Error("no handlers in attributes: " + k);
    el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// A count as the API gives it (a number, or a string beyond 2^53 with ints=string), with
// thousands separators, exactly.
export function count(v) {
  if (v == null) return "–";
  const s = typeof v === "bigint" ? v.toString() : typeof v === "string" ? v : Math.round(v).toString();
  if (!/^-?\d+$/.test(s)) return s;
  const neg = s.startsWith("-");
  const d = neg ? s.slice(1) : s;
  return (neg ? "-" : "") + d.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
}

// As a BigInt, exact (for sums and comparisons beyond 2^53).
export const big = v => (v == null ? 0n : BigInt(typeof v === "number" ? Math.round(v) : v));

// For drawing only (a chart cannot tell 2^53 + 1 from 2^53).
export const num = v => (v == null ? 0 : Number(v));

// A ratio as a percentage.
export function percent(part, whole) {
  const w = num(whole);
  if (!w) return "–";
  const p = (100 * num(part)) / w;
  return (p === 0 ? "0" : p < 0.01 ? p.toExponential(1) : p.toPrecision(3)) + " %";
}

export function bytes(v) {
  let n = num(v);
  const units = ["B", "kB", "MB", "GB", "TB", "PB"];
  let i = 0;
  while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return (i ? n.toPrecision(3) : Math.round(n)) + " " + units[i];
}

// Times: ns since the epoch (number or string) shown in the chosen zone, which is said.
export function zoneName(tz) {
  if (tz === "utc") return "UTC";
  const off = -new Date().getTimezoneOffset();
  const sign = off >= 0 ? "+" : "-";
  const hh = String(Math.floor(Math.abs(off) / 60)).padStart(2, "0");
  const mm = String(Math.abs(off) % 60).padStart(2, "0");
  const name = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";
  return `${name} (UTC${sign}${hh}:${mm})`;
}

export function time(ns, tz, withDate = true) {
  const ms = Number(big(ns) / 1000000n);
  const d = new Date(ms);
  const p = n => String(n).padStart(2, "0");
  const [Y, M, D, hh, mm, ss] = tz === "utc"
    ? [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()]
    : [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()];
  const t = `${p(hh)}:${p(mm)}:${p(ss)}`;
  return withDate ? `${Y}-${p(M)}-${p(D)} ${t}` : t;
}

// A flow in words.
export function flowName(f) {
  const host = (a, port) => (a.includes(":") ? `[${a}]:${port}` : `${a}:${port}`);
  return `${host(f.src, f.sport)} → ${host(f.dst, f.dport)} ${proto(f.proto)}` +
    (f.spi != null ? ` spi ${f.spi} si ${f.si}` : "");
}

const PROTOS = { 1: "ICMP", 6: "TCP", 17: "UDP", 58: "ICMPv6", 132: "SCTP" };
export const proto = p => PROTOS[p] ?? `proto ${p}`;

// Whether address `a` is in prefix `p` ("10.1.0.0/16", "2001:db8::/32", or an address).
export function inPrefix(a, p) {
  if (!p) return true;
  const [net, lenText] = p.split("/");
  const A = addrBits(a), N = addrBits(net);
  if (A == null || N == null || A.length !== N.length) return false;
  const len = lenText == null ? A.length : Math.min(A.length, parseInt(lenText, 10));
  return A.slice(0, len) === N.slice(0, len);
}

function addrBits(a) {
  if (a == null) return null;
  if (a.includes(".") && !a.includes(":")) {
    const o = a.split(".").map(Number);
    if (o.length !== 4 || o.some(x => !(x >= 0 && x <= 255))) return null;
    return o.map(x => x.toString(2).padStart(8, "0")).join("");
  }
  if (a.startsWith("::ffff:") && a.includes(".")) return addrBits(a.slice(7));
  let [head, tail] = a.split("::");
  const hs = head ? head.split(":") : [], ts = tail ? tail.split(":") : [];
  if (tail === undefined && hs.length !== 8) return null;
  const groups = [...hs, ...Array(8 - hs.length - ts.length).fill("0"), ...ts];
  if (groups.length !== 8 || groups.some(g => !/^[0-9a-fA-F]{1,4}$/.test(g))) return null;
  return groups.map(g => parseInt(g, 16).toString(2).padStart(16, "0")).join("");
}

// The prefix of `a` of `len` bits (v4) or `len6` bits (v6), for grouping.
export function prefixOf(a, len, len6) {
  const b = addrBits(a);
  if (b == null) return a;
  if (b.length === 32) {
    const m = b.slice(0, len).padEnd(32, "0");
    return [0, 8, 16, 24].map(i => parseInt(m.slice(i, i + 8), 2)).join(".") + "/" + len;
  }
  const m = b.slice(0, len6).padEnd(128, "0");
  const g = [];
  for (let i = 0; i < 128; i += 16) g.push(parseInt(m.slice(i, i + 16), 2).toString(16));
  return g.join(":").replace(/(^|:)0(:0)+(:|$)/, "::") + "/" + len6;
}

// A table: headers ([text, class]) and rows of cells (text or nodes), sortable by a header.
export function table(heads, rows, opts = {}) {
  const tbody = h("tbody");
  let sortBy = opts.sortBy ?? null, desc = true;
  const keys = opts.keys || [];
  const draw = () => {
    tbody.replaceChildren();
    let rs = rows;
    if (sortBy != null && keys[sortBy]) {
      const k = keys[sortBy];
      rs = [...rows].sort((a, b) => {
        const x = k(a.data), y = k(b.data);
        const c = x < y ? -1 : x > y ? 1 : 0;
        return desc ? -c : c;
      });
    }
    if (!rs.length) tbody.append(h("tr", {}, h("td", { colspan: heads.length, class: "muted" }, opts.empty || "nothing in this range")));
    for (const r of rs) tbody.append(r.tr);
  };
  const ths = heads.map(([text, cls], i) => {
    const th = h("th", { class: cls, scope: "col" });
    if (keys[i]) {
      const b = h("button", { type: "button", class: "sort", "aria-label": `sort by ${text}` }, text);
      b.addEventListener("click", () => { desc = sortBy === i ? !desc : true; sortBy = i; draw(); });
      th.append(b);
    } else th.append(text);
    return th;
  });
  draw();
  return h("table", { class: opts.class }, opts.caption ? h("caption", {}, opts.caption) : null, h("thead", {}, h("tr", {}, ths)), tbody);
}

// A row for table(): cells, the data it sorts by, attributes.
export function row(cells, data, attrs = {}) {
  const tr = h("tr", attrs, cells.map(c => (c instanceof Node && c.tagName === "TD" ? c : h("td", { class: typeof c === "object" && c && c.cls ? c.cls : null }, c && c.cls ? c.v : c))));
  return { tr, data };
}

export const numCell = v => ({ cls: "num", v: count(v) });
