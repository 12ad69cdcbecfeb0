// The collector's JSON API, read with the reader token given as …/#token=… (the fragment
// never leaves the browser). Integers beyond 2^53 come as strings (ints=string): exact.

const TOKEN = new URLSearchParams(location.hash.slice(1)).get("token");

export class ApiError extends Error {
  constructor(url, status, text) {
    super(`${url.split("?")[0]}: ${status}${text ? " " + text : ""}`);
    this.status = status;
  }
}

export async function get(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) q.set(k, String(v));
  q.set("ints", "string");
  const url = path + "?" + q.toString();
  const r = await fetch(url, TOKEN ? { headers: { Authorization: "Bearer " + TOKEN } } : {});
  if (!r.ok) {
    let why = "";
    try { why = (await r.json()).error || ""; } catch (_) { /* not JSON */ }
    throw new ApiError(url, r.status, why);
  }
  const type = r.headers.get("content-type") || "";
  return type.includes("json") ? r.json() : r.text();
}

// A change: `method` on `path` with a JSON body; the answer, or an ApiError with the reason.
export async function send(method, path, params = {}, body = undefined) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v != null) q.set(k, String(v));
  const url = path + (q.toString() ? "?" + q.toString() : "");
  const headers = { "Content-Type": "application/json" };
  if (TOKEN) headers.Authorization = "Bearer " + TOKEN;
  const r = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  let answer = null;
  try { answer = await r.json(); } catch (_) { /* not JSON */ }
  if (!r.ok) throw new ApiError(url, r.status, (answer && answer.error) || "");
  return answer;
}

// Time window as the API takes it (ns since the epoch, exact).
export const ns = ms => (BigInt(Math.round(ms)) * 1000000n).toString();

// A flow's query fields.
export function flowParams(f) {
  const p = { src: f.src, dst: f.dst, sport: f.sport, dport: f.dport, proto: f.proto };
  if (f.spi != null) { p.spi = f.spi; p.si = f.si; }
  return p;
}
