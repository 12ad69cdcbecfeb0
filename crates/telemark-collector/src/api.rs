//! The HTTP API, as a function from a request to a response (no sockets here, so the tests and
//! the server call the same code). Routes (docs/collector.md has the details):
//!
//! - `POST /api/v1/agents` — an agent registers: `{"agent", "version", "boot"}`.
//! - `POST /api/v1/ingest` — records: `{"agent", "boot", "seq", "export_dropped", "records": […]}`;
//!   stored durably, then acknowledged with `{"accepted", "duplicates", "next_seq"}`.
//! - `GET /api/v1/agents`, `GET /api/v1/flows`, `GET /api/v1/loss?<flow>`,
//!   `GET /api/v1/localise?<flow>` — JSON; `<flow>` is `src=…&dst=…&sport=…&dport=…&proto=…`
//!   (plus `spi`, `si` for NSH flows).
//! - `GET /api/v1/link?<flow>&up=AGENT/POINT&down=AGENT/POINT[&skew_ns=…]` — the flow's
//!   batches at `down` lined up with those at `up`, in another agent (`link.rs`): exact loss
//!   between them, whole batches included, when both report every batch.
//! - `GET /metrics` — OpenMetrics text (Prometheus); `GET /` — the page.

use crate::auth::{Auth, Identity};
use crate::ingest::Ingest;
use telemark_core::records::valid_agent_name;

use crate::store::{Store, StoreError, Window};
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use telemark_core::records::{Flow, Record};
use telemark_transport::http::Handler;
use telemark_transport::metrics::Exposition;
use telemark_transport::server::ServerStats;
use telemark_transport::wire::{Ack, Register};

/// Every path served.
const ROUTES: &[&str] = &[
    "/api/v1/agents",
    "/api/v1/ingest",
    "/api/v1/flows",
    "/api/v1/flows/top",
    "/api/v1/flows/records",
    "/api/v1/loss",
    "/api/v1/localise",
    "/api/v1/link",
    "/api/v1/health",
    "/api/v1/events",
    "/api/v1/overview",
    "/api/v1/control",
    "/api/v1/control/watch",
    "/api/v1/control/int",
    "/api/v1/control/heaviest",
    "/metrics",
    "/healthz",
    "/readyz",
    "/",
    "/console.js",
    "/console.css",
    "/console.js.LEGAL.txt",
    "/favicon.svg",
];

/// What the page may load and run: its own script, style sheet and the API, nothing else
/// (styles inline too: the charts library sets element styles).
const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
    style-src 'self' 'unsafe-inline'; img-src 'self'; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

pub use telemark_transport::http::{Request, Response};

/// Most buckets one overview may ask for.
const MAX_BUCKETS: u64 = 10_000;

/// Most buckets in one overview's answer, over its segments and "other" (about 100 bytes of
/// JSON each).
const MAX_SERIES_BUCKETS: u64 = 200_000;

/// What a request for steering hears when it is off.
const STEERING_OFF: &str = "steering is off: start the collector with --control FILE";

/// Largest number of records in one ingest request.
pub const MAX_RECORDS: usize = 10_000;

/// Most JSON values (numbers, strings, arrays, objects, keys) in one ingest request: 100 per
/// record of the largest request.
pub const MAX_VALUES: u64 = 100 * MAX_RECORDS as u64;

/// Most JSON values of ingest requests being parsed at once (some 60 bytes each in memory).
const PARSING_MAX_VALUES: u64 = 2 * MAX_VALUES;

/// JSON values of ingest requests being parsed now.
static PARSING: Mutex<u64> = Mutex::new(0);

/// A request's share of [`PARSING_MAX_VALUES`], given back on drop.
struct Parsing(u64);

impl Parsing {
    fn take(values: u64) -> Option<Parsing> {
        let mut p = PARSING.lock().unwrap_or_else(|e| e.into_inner());
        (*p + values <= PARSING_MAX_VALUES).then(|| {
            *p += values;
            Parsing(values)
        })
    }
}

impl Drop for Parsing {
    fn drop(&mut self) {
        let mut p = PARSING.lock().unwrap_or_else(|e| e.into_inner());
        *p = p.saturating_sub(self.0);
    }
}

/// How many JSON values `b` holds, counted without parsing it: one, plus one for every `,`,
/// `:`, `[` and `{` outside strings (an upper bound for valid JSON). Counting stops where
/// arrays and objects nest deeper than the parser goes (serde_json's 128 levels): the parser
/// refuses such a body there, as malformed, before it has built anything much.
fn json_values(b: &[u8]) -> u64 {
    const PARSER_DEPTH: u32 = 128;
    let (mut n, mut in_str, mut esc, mut depth) = (1u64, false, false, 0u32);
    for &c in b {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
        } else {
            match c {
                b'"' => in_str = true,
                b',' | b':' => n += 1,
                b'[' | b'{' => {
                    n += 1;
                    depth += 1;
                    if depth > PARSER_DEPTH {
                        break;
                    }
                }
                b']' | b'}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    n
}

/// A static document, with the page's content security policy.
fn document(content_type: &'static str, body: &str) -> Response {
    let mut r = Response::text(content_type, body.to_string());
    r.headers.push(("Content-Security-Policy", CSP.into()));
    r.headers.push(("X-Content-Type-Options", "nosniff".into()));
    r
}

/// Everything a request may touch.
pub struct Api {
    /// Where records are stored and counted (shared with Kafka and the flow listener).
    pub ingest: Arc<Ingest>,
    /// Read-only connections for queries, each request's reading under a time budget.
    pub readers: crate::store::Readers,
    /// Agents silent for longer than this are reported unhealthy.
    pub stale_ns: u64,
    /// Tokens (`None`: everyone is trusted, loopback only).
    pub auth: RwLock<Option<Auth>>,
    /// What the HTTP server saw (connections, refusals, latency), shown in `/metrics`.
    pub transport: Arc<ServerStats>,
    /// What publishing to and consuming from Kafka did, shown in `/metrics` when on.
    pub kafka: Arc<crate::kafka::KafkaStats>,
    /// Flow-export listener counters.
    pub flows: Arc<crate::flow_listen::FlowStats>,
    /// The agents the console may steer (`--control`), if any.
    pub steering: Option<Arc<crate::steer::Steering>>,
}

impl Handler for Api {
    fn handle(&self, req: &Request<'_>, now: u64) -> Response {
        Api::handle(self, req, now)
    }

    fn route(&self, path: &str) -> &'static str {
        route_of(path)
    }

    fn admit(&self, method: &str, path: &str, token: Option<&str>) -> Option<Response> {
        let refusal = self.access(method, path, token).err()?;
        Some(self.refused(route_of(path), refusal))
    }
}

/// Why a request is refused from its head alone: its answer, and the error counter it counts
/// under (if any).
struct Refusal(Option<&'static str>, Response);

/// The metrics label of `path`: itself when served, else `other`.
fn route_of(path: &str) -> &'static str {
    ROUTES.iter().find(|r| **r == path).copied().unwrap_or("other")
}

/// An ingest request; its records are parsed one by one, so that each can be checked against
/// what it parsed as.
type IngestBody = telemark_transport::wire::Ingest<serde_json::Value>;

impl Api {
    /// Answers one request. `now` is the wall clock in ns since the epoch.
    pub fn handle(&self, req: &Request<'_>, now: u64) -> Response {
        let (path, query) = req.url.split_once('?').unwrap_or((req.url, ""));
        // Unknown paths share one metrics label, so a scan cannot grow the metrics.
        let route = route_of(path);
        let who = match self.access(req.method, path, req.token) {
            Ok(who) => who,
            Err(refusal) => return self.refused(route, refusal),
        };
        let r = match (req.method, path, who) {
            // The page holds no data (it reads the API with the token it is given).
            ("GET", "/", _) => document("text/html; charset=utf-8", crate::page::HTML),
            ("GET", "/console.js", _) => {
                document("text/javascript; charset=utf-8", crate::page::SCRIPT)
            }
            ("GET", "/console.css", _) => document("text/css; charset=utf-8", crate::page::STYLE),
            ("GET", "/favicon.svg", _) => document("image/svg+xml", crate::page::ICON),
            ("GET", "/console.js.LEGAL.txt", _) => {
                document("text/plain; charset=utf-8", crate::page::LEGAL)
            }
            // Probes (for a load balancer, systemd or Kubernetes) need no token and say
            // nothing but whether the process runs and whether its storage works.
            ("GET", "/healthz", _) => Response::json(200, &json!({ "status": "ok" })),
            // (Why, with the file's path, only to a writer, in the answer to its write.)
            ("GET", "/readyz", _) => match self.storage_ready() {
                true => Response::json(200, &json!({ "status": "ready" })),
                false => Response::error(503, "the database cannot take writes"),
            },
            (_, _, None) => Response::error(404, format!("no such endpoint: {path}")),
            ("POST", "/api/v1/ingest", Some(who)) => self.ingest(req.body, &who, now),
            ("POST", "/api/v1/agents", Some(who)) => self.register(req.body, &who, now),
            ("GET", "/api/v1/agents", _) => self.agents(now),
            ("GET", "/api/v1/flows", _) => self.flows(query, now),
            ("GET", "/api/v1/flows/top", _) => self.top_talkers(query, now),
            ("GET", "/api/v1/flows/records", _) => self.flow_records(query, now),
            ("GET", "/api/v1/loss", _) => self.loss(query),
            ("GET", "/api/v1/localise", _) => self.localise(query),
            ("GET", "/api/v1/link", _) => self.link(query),
            ("GET", "/api/v1/health", _) => self.health(query),
            ("GET", "/api/v1/events", _) => self.events(query, now),
            ("GET", "/api/v1/overview", _) => self.overview(query, now),
            ("GET", "/api/v1/control", _) => self.control(query),
            ("PUT", "/api/v1/control/watch", Some(who)) => {
                self.steer(&who, query, req.body, crate::steer::RuleSet::Watch, now)
            }
            ("PUT", "/api/v1/control/int", Some(who)) => {
                self.steer(&who, query, req.body, crate::steer::RuleSet::Int, now)
            }
            ("POST", "/api/v1/control/heaviest", Some(who)) => self.heaviest(&who, query, now),
            ("GET", "/metrics", _) => self.metrics_page(),
            _ => Response::error(405, format!("{} is not allowed on {path}", req.method)),
        };
        self.ingest.metrics.request(route, r.status);
        r
    }

    /// Who a request comes from and whether it may be made, from its method, path and token
    /// alone (the server asks this before it reads a body, [`Handler::admit`], and
    /// [`Api::handle`] again): the API's access rules, all here. `Ok(None)`: a document or a
    /// probe, which needs no token. Whether a writer may write as the agent its body names is
    /// decided once the body is read ([`Api::writes_as`]).
    fn access(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
    ) -> Result<Option<Identity>, Refusal> {
        match (method, path) {
            (
                "GET",
                "/"
                | "/console.js"
                | "/console.css"
                | "/console.js.LEGAL.txt"
                | "/favicon.svg"
                | "/healthz"
                | "/readyz",
            ) => return Ok(None),
            _ if route_of(path) == "other" => {
                return Err(Refusal(
                    None,
                    Response::error(404, format!("no such endpoint: {path}")),
                ))
            }
            _ => {}
        }
        let who = match &*self.auth.read().unwrap_or_else(|p| p.into_inner()) {
            None => Some(Identity::Anyone),
            Some(a) => a.identify(token),
        };
        let Some(who) = who else {
            return Err(Refusal(Some("unauthenticated"), Response::unauthenticated()));
        };
        match (method, path) {
            ("POST", "/api/v1/ingest" | "/api/v1/agents") if !who.may_write() => {
                Err(Refusal(Some("forbidden"), Response::error(403, "this token may only read")))
            }
            ("POST", "/api/v1/ingest" | "/api/v1/agents") => Ok(Some(who)),
            ("PUT", "/api/v1/control/watch" | "/api/v1/control/int")
            | ("POST", "/api/v1/control/heaviest")
                if !who.may_steer() =>
            {
                Err(Refusal(
                    Some("forbidden"),
                    Response::error(
                        403,
                        "changing an agent's rules needs an [operators] token (--auth FILE; \
                         docs/console.md, \"Steering\")",
                    ),
                ))
            }
            ("PUT", "/api/v1/control/watch" | "/api/v1/control/int")
            | ("POST", "/api/v1/control/heaviest") => Ok(Some(who)),
            ("GET", _) if !who.may_read() => Err(Refusal(
                Some("forbidden"),
                Response::error(403, "this token may only send records"),
            )),
            ("GET", _) => Ok(Some(who)),
            (m, _) => {
                Err(Refusal(None, Response::error(405, format!("{m} is not allowed on {path}"))))
            }
        }
    }

    /// A refusal's answer, counted.
    fn refused(&self, route: &'static str, Refusal(reason, r): Refusal) -> Response {
        if let Some(reason) = reason {
            self.ingest.metrics.count_error(reason);
        }
        self.ingest.metrics.request(route, r.status);
        r
    }

    /// Refuses a write as `agent` by a token that is not that agent's (403, counted).
    fn writes_as(&self, who: &Identity, agent: &str) -> Result<(), Response> {
        if who.may_write_as(agent) {
            return Ok(());
        }
        self.ingest.metrics.count_error("forbidden");
        Err(Response::error(403, format!("this token may not write as agent {agent:?}")))
    }

    /// The store (a panic in another request does not make it unusable: every write is one
    /// transaction, so a poisoned lock guards a consistent database).
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.ingest.store()
    }

    /// `f` on a reader connection, under the query budget: never the writer's lock, so a long
    /// query cannot hold up a write (`store::Readers`).
    pub fn read<T>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let st = self.readers.get(self.ingest.writer())?;
        f(&st)
    }

    /// The request body as `T`, or a 400 naming what is wrong with it (counted).
    fn body<T: serde::de::DeserializeOwned>(&self, body: &[u8], what: &str) -> Result<T, Response> {
        serde_json::from_slice(body).map_err(|e| {
            self.ingest.metrics.count_error("bad_json");
            Response::error(400, format!("bad {what}: {e}"))
        })
    }

    /// Whether the database takes writes: the file is there and answers, and the last write
    /// did not fail for want of space or I/O (a full disk).
    pub fn storage_ready(&self) -> bool {
        !self.ingest.metrics.storage_failing() && self.store().ready().is_ok()
    }

    fn db_error(&self, e: StoreError) -> Response {
        if storage_failure(&e) {
            self.ingest.metrics.storage_failed(&e);
        }
        if e.overloaded() {
            // Over the query budget, or every reader busy: not a fault; retry shortly.
            self.ingest.metrics.count_error(match e {
                StoreError::OverBudget => "query_over_budget",
                _ => "query_readers_busy",
            });
            let mut r = Response::error(503, e);
            r.headers.push(("Retry-After", "1".into()));
            return r;
        }
        if e.unavailable() {
            // Not this request's fault, and not worth a retry until an operator acts.
            self.ingest.metrics.count_error("database_unavailable");
            let mut r = Response::error(503, e);
            r.headers.push(("Retry-After", "60".into()));
            return r;
        }
        self.ingest.metrics.count_error("database");
        Response::error(500, e)
    }

    fn register(&self, body: &[u8], who: &Identity, now: u64) -> Response {
        let r: Register = match self.body(body, "registration") {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        if let Err(resp) = self.writes_as(who, &r.agent) {
            return resp;
        }
        if !valid_agent_name(&r.agent) || r.version.len() > 64 {
            self.ingest.metrics.count_error("bad_agent_name");
            return Response::error(
                400,
                "agent names are 1-64 characters of letters, digits and - _ . :",
            );
        }
        let mut st = self.store();
        // One name, one running agent: a run that started before the one registered (its boot
        // is smaller) may not take the name back while that one is alive, so two agents given
        // the same name do not both write (the newer keeps it; the older is told why).
        match st.registered(&r.agent) {
            Ok(Some((boot, seen))) if r.boot < boot && now.saturating_sub(seen) < self.stale_ns => {
                self.ingest.metrics.count_error("name_in_use");
                return Response::error(
                    409,
                    format!(
                        "agent name {:?} is in use by a newer run (boot {boot}) heard from {} s \
                         ago: two agents have this name; give each its own",
                        r.agent,
                        now.saturating_sub(seen) / 1_000_000_000
                    ),
                );
            }
            Ok(_) => {}
            Err(e) => return self.db_error(e),
        }
        match st.register(&r.agent, &r.version, r.boot, now) {
            Ok(()) => {
                self.ingest.metrics.storage_ok();
                Response::json(200, &json!({ "agent": r.agent, "registered": true }))
            }
            Err(e) => self.db_error(e),
        }
    }

    fn ingest(&self, body: &[u8], who: &Identity, now: u64) -> Response {
        // What parsing will cost, counted first: a body of many tiny values (`[0,0,…]`) grows
        // some 16-fold as JSON values; at most MAX_VALUES of them per request and
        // PARSING_MAX_VALUES in all requests being parsed at once.
        let values = json_values(body);
        if values > MAX_VALUES {
            self.ingest.metrics.count_error("too_many_values");
            return Response::error(
                413,
                format!("{values} JSON values in one request; at most {MAX_VALUES}"),
            );
        }
        let Some(_parsing) = Parsing::take(values) else {
            self.ingest.metrics.count_error("parse_budget");
            let mut r = Response::error(503, "too many records being parsed; retry");
            r.headers.push(("Retry-After", "1".into()));
            return r;
        };
        let req: IngestBody = match self.body(body, "ingest request") {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        if let Err(resp) = self.writes_as(who, &req.agent) {
            return resp;
        }
        if req.records.len() > MAX_RECORDS {
            self.ingest.metrics.count_error("too_many_records");
            return Response::error(
                413,
                format!("{} records in one request; at most {MAX_RECORDS}", req.records.len()),
            );
        }
        let records = match self.check_records(&req, now) {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        if req.seq.checked_add(req.records.len() as u64).is_none_or(|e| e > i64::MAX as u64) {
            self.ingest.metrics.count_error("bad_seq");
            return Response::error(400, "seq out of range");
        }
        let mut st = self.store();
        match st.registered(&req.agent) {
            Ok(Some((boot, _))) if boot == req.boot => {}
            Ok(Some((boot, _))) => {
                // Another run registered since: register again (refused if that run is newer
                // and alive).
                self.ingest.metrics.count_error("not_registered_run");
                return Response::error(
                    409,
                    format!(
                        "agent {:?} is registered as run {boot}, not {}: register again",
                        req.agent, req.boot
                    ),
                );
            }
            Ok(None) => {
                self.ingest.metrics.count_error("unknown_agent");
                return Response::error(
                    409,
                    format!(
                        "unknown agent {:?}: register with POST /api/v1/agents first",
                        req.agent
                    ),
                );
            }
            Err(e) => return self.db_error(e),
        }
        match st.ingest(&req.agent, req.boot, req.seq, &records, req.export_dropped, now) {
            Ok(s) => {
                self.ingest.metrics.storage_ok();
                self.ingest.metrics.ingested(&records, &s);
                let next_seq = req.seq + req.records.len() as u64;
                Response::json(
                    200,
                    &Ack { accepted: s.accepted, duplicates: s.duplicates, next_seq },
                )
            }
            Err(e) => self.db_error(e),
        }
    }

    /// Every record of `req`, parsed and checked (`validate`): all, or a 400 naming the first
    /// that is refused and why (nothing of the request is stored then).
    fn check_records(&self, req: &IngestBody, now: u64) -> Result<Vec<Record>, Response> {
        let mut out = Vec::with_capacity(req.records.len());
        for (n, v) in req.records.iter().enumerate() {
            let checked = serde_json::from_value::<Record>(v.clone())
                .map_err(|e| e.to_string())
                .and_then(|r| {
                    let back = serde_json::to_value(&r).unwrap_or_default();
                    match crate::validate::unknown_fields(v, &back, "") {
                        Some(f) => Err(format!("unknown field {f}")),
                        None => Ok(r),
                    }
                })
                .and_then(|r| match r.agent() {
                    Some(a) if a != req.agent => Err(format!(
                        "names agent {a:?}, the request {:?}: an agent sends its own",
                        req.agent
                    )),
                    _ => crate::validate::record(&r, now).map(|()| r),
                });
            match checked {
                Ok(r) => out.push(r),
                Err(e) => {
                    self.ingest.metrics.count_error("bad_record");
                    return Err(Response::error(400, format!("record {n}: {e}")));
                }
            }
        }
        Ok(out)
    }

    fn agents(&self, now: u64) -> Response {
        match self.read(|st| st.agents()) {
            Ok(a) => {
                let v: Vec<_> = a
                    .into_iter()
                    .map(|a| {
                        let healthy = now.saturating_sub(a.last_seen_ns) <= self.stale_ns;
                        json!({ "healthy": healthy, "agent": a })
                    })
                    .collect();
                Response::json(200, &v)
            }
            Err(e) => self.db_error(e),
        }
    }

    fn flows(&self, query: &str, now: u64) -> Response {
        const TAKES: &[&str] = &["from", "to", "since_ns", "limit", "cursor", "lossy", "ints"];
        let parsed = Query::parse(query, TAKES).and_then(|q| {
            // The last hour unless asked: the page polls this.
            let w = q.window(now.saturating_sub(3_600_000_000_000))?;
            let limit = q.u64_or("limit", 100)?.clamp(1, 10_000) as usize;
            let offset = match q.get("cursor") {
                None => 0,
                Some(c) => c.parse::<usize>().map_err(|_| format!("bad cursor {c:?}"))?,
            };
            let lossy = q.bool_or("lossy", false)?;
            Ok((q, w, limit, offset, lossy))
        });
        let (q, w, limit, offset, lossy) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        // One more than asked, to know whether a next page exists.
        let listed = self.read(|st| st.flows(w, lossy, offset, limit + 1));
        match listed {
            Ok(mut f) => {
                let more = f.len() > limit;
                f.truncate(limit);
                let mut r = q.json(200, &f);
                if more {
                    // RFC 8288: the next page, with the window pinned so pages do not shift.
                    let next = format!(
                        "</api/v1/flows?from={}&to={}&limit={limit}&cursor={}&lossy={lossy}>; rel=\"next\"",
                        w.from_ns,
                        w.to_ns.min(now + 1),
                        offset + limit
                    );
                    r.headers.push(("Link", next));
                }
                r
            }
            Err(e) => self.db_error(e),
        }
    }

    fn loss(&self, query: &str) -> Response {
        let takes = [FLOW_KEYS, &["from", "to", "since_ns", "bucket_ns", "ints"]].concat();
        let parsed = Query::parse(query, &takes).and_then(|q| {
            let flow = q.flow()?;
            let w = q.window(0)?;
            match q.u64_or("bucket_ns", 1_000_000_000)? {
                0 => Err("bucket_ns must be positive".to_string()),
                b => Ok((q, flow, w, b)),
            }
        });
        let (q, flow, w, bucket) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        match self.read(|st| st.series(&flow, w, bucket)) {
            Ok(s) => q.json(200, &json!({ "flow": flow, "bucket_ns": bucket, "series": s })),
            Err(e) => self.db_error(e),
        }
    }

    fn localise(&self, query: &str) -> Response {
        let takes = [FLOW_KEYS, &["from", "to", "since_ns", "ints"]].concat();
        let parsed = Query::parse(query, &takes).and_then(|q| Ok((q.flow()?, q.window(0)?, q)));
        let (flow, w, q) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        let since = w.from_ns;
        let st = match self.readers.get(self.ingest.writer()) {
            Ok(st) => st,
            Err(e) => return self.db_error(e),
        };
        let segs = match st.points_in(&flow, w) {
            Ok(points) => crate::path::segments(&points),
            Err(e) => return self.db_error(e),
        };
        let total: u64 = segs.iter().map(|s| s.lost).sum();
        // Every segment that lost a tenth of the packets or more, most first.
        let at: Vec<serde_json::Value> = segs
            .iter()
            .filter(|s| s.lost > 0 && s.lost * 10 >= total)
            .map(|s| {
                // A point's loss may be its own agent's full receive ring, not the link.
                let ring = st.ring_drops(&s.agent, since).unwrap_or(0);
                let caveat = (ring > 0).then(|| {
                    format!(
                        "{} dropped {ring} frames in its own receive rings in this period: \
                         some of this loss may be the switch's, not the link's",
                        s.agent
                    )
                });
                // "30 NETFILTER_DROP, 7 QDISC_DROP": what the kernel said it dropped there.
                let mut reasons: Vec<(&String, &u64)> = s.drops.iter().collect();
                reasons.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                let reasons = (!reasons.is_empty()).then(|| {
                    reasons.iter().map(|(r, n)| format!("{n} {r}")).collect::<Vec<_>>().join(", ")
                });
                json!({ "agent": s.agent, "point": s.point, "from": s.from, "where": place(s),
                        "lost": s.lost, "share": s.lost as f64 / total as f64,
                        "drops": s.drops, "reasons": reasons, "caveat": caveat })
            })
            .collect();
        drop(st);
        let verdict = at.first().map(|top| {
            let mut v = top.clone();
            if at.len() > 1 {
                // Loss spread over several segments: say each, with its share.
                let each: Vec<String> = at
                    .iter()
                    .map(|s| format!("{} ({} lost)", s["where"].as_str().unwrap_or(""), s["lost"]))
                    .collect();
                v["where"] = json!(each.join("; and "));
                v["lost"] = json!(total);
            }
            v["segments"] = json!(at);
            v
        });
        q.json(200, &json!({ "flow": flow, "lost": total, "segments": segs, "verdict": verdict }))
    }

    fn health(&self, query: &str) -> Response {
        let parsed =
            Query::parse(query, &["from", "since_ns", "ints"]).and_then(|q| Ok((q.window(0)?, q)));
        let (w, q) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        let h = self.read(|st| st.health(w.from_ns));
        match h {
            Ok(h) => q.json(200, &h),
            Err(e) => self.db_error(e),
        }
    }

    /// Loss over time at every segment (`crate::overview`): of the last hour unless
    /// `from`/`to` say otherwise, in buckets of `bucket_ns` (default a minute; at most
    /// [`MAX_BUCKETS`] of them), of one `agent` and one `proto` if given; the `top` segments
    /// (default 10, at most 100) that lost most, the rest as `other`.
    fn overview(&self, query: &str, now: u64) -> Response {
        use crate::overview::{overview_of, OverviewQuery};
        const TAKES: &[&str] =
            &["from", "to", "since_ns", "bucket_ns", "agent", "proto", "top", "ints"];
        let parsed = Query::parse(query, TAKES).and_then(|q| {
            let window = q.window(now.saturating_sub(3_600_000_000_000))?;
            let bucket_ns = match q.u64_or("bucket_ns", 60_000_000_000)? {
                0 => return Err("bucket_ns must be positive".to_string()),
                b => b,
            };
            let span = window.to_ns.min(now.max(window.from_ns + 1)) - window.from_ns;
            if span / bucket_ns > MAX_BUCKETS {
                return Err(format!(
                    "{} buckets of {bucket_ns} ns in the window; at most {MAX_BUCKETS}: ask for \
                     longer buckets",
                    span / bucket_ns
                ));
            }
            let agent = q.get("agent").filter(|a| !a.is_empty()).map(str::to_string);
            let proto = q.num::<u8>("proto")?;
            let top = q.u64_or("top", 10)?.clamp(1, 100) as usize;
            // The answer's size: at most this many buckets over all segments shown.
            if (span / bucket_ns + 1) * (top as u64 + 1) > MAX_SERIES_BUCKETS {
                return Err(format!(
                    "{} buckets for each of {top} segments: at most {MAX_SERIES_BUCKETS} in all; \
                     ask for longer buckets or fewer segments (top)",
                    span / bucket_ns + 1
                ));
            }
            Ok((q, OverviewQuery { window, bucket_ns, agent, proto }, top))
        });
        let (q, oq, top) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        match self.read(|st| st.overview(&oq)) {
            Ok(rows) => q.json(200, &overview_of(rows, oq.bucket_ns, oq.source(), top)),
            Err(e) => self.db_error(e),
        }
    }

    /// The steering (or a 404 saying how to turn it on).
    fn steering(&self) -> Result<&crate::steer::Steering, Response> {
        self.steering.as_deref().ok_or_else(|| Response::error(404, STEERING_OFF))
    }

    /// `GET /api/v1/control`: the steered agents and the changes made, newest first; with
    /// `agent=NAME`, that agent's watch and INT rules as it answers them (or why it did not).
    fn control(&self, query: &str) -> Response {
        use crate::steer::RuleSet;
        let Some(s) = self.steering.as_deref() else {
            // Not an error to ask: the console asks to know whether to show steering.
            return Response::json(
                200,
                &json!({ "agents": [], "changes": [], "off": STEERING_OFF }),
            );
        };
        let agent = match Query::parse(query, &["agent", "ints"]) {
            Ok(q) => q.get("agent").map(str::to_string),
            Err(e) => return self.bad_query(e),
        };
        let Some(a) = agent else {
            let agents: Vec<&str> = s.agents().collect();
            return Response::json(200, &json!({ "agents": agents, "changes": s.changes() }));
        };
        let part = |set| match s.get(&a, set) {
            Ok(v) => Ok((v, None)),
            Err(e @ crate::steer::SteerError::UnknownAgent(_)) => Err(Response::error(404, e)),
            Err(e) => Ok((serde_json::Value::Null, Some(e.to_string()))),
        };
        match (part(RuleSet::Watch), part(RuleSet::Int)) {
            // Each set's own reason, and the first of them as the answer's.
            (Ok((watch, e1)), Ok((int, e2))) => Response::json(
                200,
                &json!({
                    "agent": a, "watch": watch, "int": int, "watch_error": e1, "int_error": e2,
                    "error": e1.clone().or(e2.clone()),
                }),
            ),
            (Err(r), _) | (_, Err(r)) => r,
        }
    }

    /// `PUT /api/v1/control/{watch,int}?agent=NAME`: the body (the rules, as the agent's own
    /// control API takes them) relayed to that agent, for `who`; the agent's answer (its rules
    /// in force), or its refusal (400 with its reason) or absence (502).
    fn steer(
        &self,
        who: &crate::auth::Identity,
        query: &str,
        body: &[u8],
        set: crate::steer::RuleSet,
        now: u64,
    ) -> Response {
        let s = match self.steering() {
            Ok(s) => s,
            Err(r) => return r,
        };
        let agent = match Query::parse(query, &["agent"]).and_then(|q| {
            q.get("agent").map(str::to_string).ok_or_else(|| "agent= is needed".to_string())
        }) {
            Ok(a) => a,
            Err(e) => return self.bad_query(e),
        };
        if !s.knows(&agent) {
            return relayed(Err(crate::steer::SteerError::UnknownAgent(agent)));
        }
        if body.len() > crate::steer::MAX_RULES {
            return Response::error(
                413,
                format!(
                    "rules of {} bytes; an agent takes at most {}",
                    body.len(),
                    crate::steer::MAX_RULES
                ),
            );
        }
        let rules: serde_json::Value = match self.body(body, "rules") {
            Ok(r) => r,
            Err(resp) => return resp,
        };
        relayed(s.put(who.name(), &agent, set, &rules, now))
    }

    /// `POST /api/v1/control/heaviest?n=N[&agent=NAME]`: the N flows with the most packets in
    /// the flow records of the last five minutes (the flow listener's, the agents' heavy
    /// hitters) become the watch rules of the agent named, or of every steered agent.
    fn heaviest(&self, who: &crate::auth::Identity, query: &str, now: u64) -> Response {
        const WINDOW_NS: u64 = 300_000_000_000;
        let s = match self.steering() {
            Ok(s) => s,
            Err(r) => return r,
        };
        let parsed = Query::parse(query, &["n", "agent"]).and_then(|q| {
            // 500 exact rules of IPv6 flows stay inside an agent's 64 KiB body limit.
            let n = q.u64_or("n", 10)?;
            if !(1..=500).contains(&n) {
                return Err("n: 1 to 500 flows".to_string());
            }
            Ok((n as usize, q.get("agent").map(str::to_string)))
        });
        let (n, agent) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        let w = Window { from_ns: now.saturating_sub(WINDOW_NS), to_ns: u64::MAX };
        let every = crate::store::TopFilter { exporter: None, interface: None, point: None };
        let top = match self
            .read(|st| st.top_talkers(w, &every, crate::store::TopBy::Packets, n as u64))
        {
            Ok(t) => t,
            Err(e) => return self.db_error(e),
        };
        if top.is_empty() {
            return Response::error(
                409,
                "no flow records in the last 5 minutes: the heaviest flows come from the flow \
                 listener's records and the agents' heavy hitters (docs/flows.md)",
            );
        }
        let flows: Vec<Flow> = top.into_iter().map(|t| t.flow).collect();
        let rules = crate::steer::watch_rules_for(&flows);
        let targets: Vec<String> = match agent {
            Some(a) => vec![a],
            None => s.agents().map(str::to_string).collect(),
        };
        let results: Vec<serde_json::Value> = targets
            .iter()
            .map(|a| match s.put(who.name(), a, crate::steer::RuleSet::Watch, &rules, now) {
                Ok(_) => json!({ "agent": a, "result": "ok" }),
                Err(e) => json!({ "agent": a, "result": e.to_string() }),
            })
            .collect();
        Response::json(200, &json!({ "flows": flows, "watch": rules, "agents": results }))
    }

    /// INT events, newest first: of the last hour unless `from`/`to` say otherwise, of one
    /// `detector`, one `agent` (the name an int-collector or agent stores them under) or one
    /// flow (all five flow keys) if given, at most `limit` (default 1000).
    fn events(&self, query: &str, now: u64) -> Response {
        const HOUR_NS: u64 = 3600 * 1_000_000_000;
        const MAX_LIMIT: u64 = 10_000;
        let takes =
            [FLOW_KEYS, &["from", "to", "since_ns", "detector", "agent", "limit", "ints"]].concat();
        let parsed = Query::parse(query, &takes).and_then(|q| {
            // Any flow key asks for one flow, and then all five are needed (never ignored).
            let one_flow = FLOW_KEYS.iter().any(|k| q.get(k).is_some());
            let flow = if one_flow { Some(q.flow()?) } else { None };
            let w = q.window(now.saturating_sub(HOUR_NS))?;
            match q.u64_or("limit", 1000)? {
                l @ 1..=MAX_LIMIT => Ok((q, flow, w, l)),
                l => Err(format!("limit {l} (1 to {MAX_LIMIT})")),
            }
        });
        let (q, flow, w, limit) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        match self.read(|st| st.events(w, q.get("detector"), q.get("agent"), flow.as_ref(), limit))
        {
            Ok(ev) => q.json(200, &json!({ "events": ev })),
            Err(e) => self.db_error(e),
        }
    }

    /// `GET /api/v1/flows/top`: the flows with the most bytes (or packets) in a window, over
    /// every `flow` record stored (exporters' flows and agents' heavy hitters), optionally of
    /// one exporter (`exporter`, its address or agent name), one interface (`interface`, the
    /// record's port) and one source (`point`: `ipfix`, `sflow`, `netflow9`, …).
    fn top_talkers(&self, query: &str, now: u64) -> Response {
        const HOUR_NS: u64 = 3600 * 1_000_000_000;
        let takes =
            ["from", "to", "since_ns", "exporter", "interface", "point", "by", "limit", "ints"];
        let parsed = Query::parse(query, &takes).and_then(|q| {
            let w = q.window(now.saturating_sub(HOUR_NS))?;
            let by = match q.get("by").unwrap_or("bytes") {
                "bytes" => crate::store::TopBy::Bytes,
                "packets" => crate::store::TopBy::Packets,
                other => return Err(format!("by {other:?}: bytes or packets")),
            };
            match q.u64_or("limit", 10)? {
                l @ 1..=1000 => Ok((q, w, by, l)),
                l => Err(format!("limit {l} (1 to 1000)")),
            }
        });
        let (q, w, by, limit) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        let filter = crate::store::TopFilter {
            exporter: q.get("exporter"),
            interface: q.get("interface"),
            point: q.get("point"),
        };
        match self.read(|st| st.top_talkers(w, &filter, by, limit)) {
            Ok(top) => q.json(
                200,
                &json!({ "from_ns": w.from_ns, "to_ns": w.to_ns, "by": q.get("by").unwrap_or("bytes"), "flows": top }),
            ),
            Err(e) => self.db_error(e),
        }
    }

    /// `GET /api/v1/flows/records`: the `flow` records stored (exporters' flows and agents'
    /// heavy hitters) that end in a window (the last hour unless asked), oldest first, a page
    /// at a time, filtered by exporter, interface, point, direction and any of the flow key's
    /// fields; with what all of them (not only the page) add up to, each flow counted once
    /// per observation point (docs/flows.md, "Flow records").
    fn flow_records(&self, query: &str, now: u64) -> Response {
        const HOUR_NS: u64 = 3600 * 1_000_000_000;
        let takes = [
            "from",
            "to",
            "since_ns",
            "exporter",
            "interface",
            "point",
            "direction",
            "src",
            "dst",
            "sport",
            "dport",
            "proto",
            "limit",
            "cursor",
            "ints",
        ];
        let q = match Query::parse(query, &takes) {
            Ok(q) => q,
            Err(e) => return self.bad_query(e),
        };
        let parsed = (|| {
            let w = q.window(now.saturating_sub(HOUR_NS))?;
            let limit = match q.u64_or("limit", 100)? {
                l @ 1..=1000 => l,
                l => return Err(format!("limit {l} (1 to 1000)")),
            };
            let after =
                q.get("cursor").map(str::parse::<crate::store::RecordCursor>).transpose()?;
            let addr = |k: &str| -> Result<Option<String>, String> {
                q.get(k)
                    .map(|v| {
                        v.parse::<std::net::IpAddr>()
                            .map(|a| a.to_string())
                            .map_err(|_| format!("bad {k}: {v:?}"))
                    })
                    .transpose()
            };
            let direction = match q.get("direction") {
                None => None,
                Some(d @ ("ingress" | "egress" | "unknown")) => Some(d),
                Some(d) => return Err(format!("direction {d:?}: ingress, egress or unknown")),
            };
            let filter = crate::store::RecordFilter {
                exporter: q.get("exporter"),
                interface: q.get("interface"),
                point: q.get("point"),
                src: addr("src")?,
                dst: addr("dst")?,
                sport: q.num::<u16>("sport")?.map(i64::from),
                dport: q.num::<u16>("dport")?.map(i64::from),
                proto: match q.get("proto") {
                    None => None,
                    Some(p) => {
                        Some(telemark_core::watch::parse_proto(p).map(i64::from).map_err(|e| e.0)?)
                    }
                },
                direction,
            };
            Ok((w, limit, after, filter))
        })();
        let (w, limit, after, filter) = match parsed {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        // One more than asked, to know whether a next page exists.
        let read = self.read(|st| {
            Ok((
                st.flow_records(w, &filter, after.as_ref(), limit + 1)?,
                st.flow_totals(w, &filter)?,
            ))
        });
        match read {
            Ok((mut page, totals)) => {
                let more = page.len() as u64 > limit;
                page.truncate(limit as usize);
                let next = if more { page.last().map(|(_, c)| c.to_string()) } else { None };
                let records: Vec<_> = page.into_iter().map(|(r, _)| r).collect();
                let mut r = q.json(
                    200,
                    &json!({
                        "from_ns": w.from_ns,
                        "to_ns": w.to_ns,
                        "totals": totals,
                        "records": records,
                        "next_cursor": next,
                    }),
                );
                if let Some(next) = &next {
                    // RFC 8288: the next page, with the window pinned so pages do not shift.
                    let mut link = format!(
                        "/api/v1/flows/records?from={}&to={}&limit={limit}&cursor={next}",
                        w.from_ns,
                        w.to_ns.min(now + 1),
                    );
                    for (k, v) in &q.0 {
                        if !["from", "to", "since_ns", "limit", "cursor"].contains(&k.as_str()) {
                            link.push_str(&format!("&{k}={}", encode(v)));
                        }
                    }
                    r.headers.push(("Link", format!("<{link}>; rel=\"next\"")));
                }
                r
            }
            Err(e) => self.db_error(e),
        }
    }

    fn link(&self, query: &str) -> Response {
        let takes =
            [FLOW_KEYS, &["up", "down", "from", "to", "since_ns", "skew_ns", "ints"]].concat();
        let (q, flow, w) = match Query::parse(query, &takes)
            .and_then(|q| Ok((q.flow()?, q.window(0)?)).map(|(f, w)| (q, f, w)))
        {
            Ok(x) => x,
            Err(e) => return self.bad_query(e),
        };
        let point = |k: &str| -> Result<(String, String), String> {
            let v =
                q.get(k).ok_or_else(|| format!("missing {k} (AGENT/POINT, e.g. sw-b/egress)"))?;
            match v.split_once('/') {
                Some((a, p)) if !a.is_empty() && !p.is_empty() => Ok((a.into(), p.into())),
                _ => Err(format!("bad {k}: {v:?} (AGENT/POINT, e.g. sw-b/egress)")),
            }
        };
        // No skew asked for: the rule for the two points' clocks (`path::line_up`).
        let args = (point("up"), point("down"), q.num::<u64>("skew_ns"));
        let ((ua, up), (da, dp), skew) = match args {
            (Ok(u), Ok(d), Ok(t)) => (u, d, t),
            (Err(e), ..) | (_, Err(e), _) | (.., Err(e)) => return self.bad_query(e),
        };
        let points = match self.read(|st| st.points_in(&flow, w)) {
            Ok(p) => p,
            Err(e) => return self.db_error(e),
        };
        let find = |a: &str, p: &str| points.iter().find(|x| x.agent == a && x.point == p);
        let (u, d) = (find(&ua, &up), find(&da, &dp));
        let empty = crate::path::PointRecords::default();
        let (u, d) = (u.unwrap_or(&empty), d.unwrap_or(&empty));
        let m = crate::path::line_up(u, d, skew);
        let skew = skew.unwrap_or_else(|| crate::path::skew_ns(u, d));
        let lost: u64 = m.iter().map(|b| b.lost).sum();
        let whole = m.iter().filter(|b| b.whole).count();
        q.json(
            200,
            &json!({ "flow": flow, "up": format!("{ua}/{up}"), "down": format!("{da}/{dp}"),
                     "skew_ns": skew, "lost": lost, "whole_batches_lost": whole,
                     "batches": m }),
        )
    }

    fn metrics_page(&self) -> Response {
        let st = self.store();
        let agents = st.agents().unwrap_or_default();
        let counts = st.counts().unwrap_or_default();
        let ready = st.ready().is_ok() && !self.ingest.metrics.storage_failing();
        drop(st);
        let mut page = Exposition::default();
        self.ingest.metrics.render(&mut page, &agents, counts);
        page.gauge(
            "telemark_collector_storage_ready",
            "Whether the database takes writes (0: removed, replaced, full or failing; see \
             /readyz).",
            &[],
        )
        .value(u64::from(ready));
        self.transport.render("telemark_collector", &mut page);
        self.kafka.render(&mut page);
        self.flows.render(&mut page);
        page.response()
    }

    fn bad_query(&self, e: String) -> Response {
        self.ingest.metrics.count_error("bad_query");
        Response::error(400, e)
    }
}

/// Whether `e` says the storage cannot take writes (disk full: SQLITE_FULL; an I/O error such
/// as ENOSPC on a journal; a read-only file), as opposed to one request's failure.
fn storage_failure(e: &StoreError) -> bool {
    use rusqlite::ErrorCode as C;
    match e {
        StoreError::Sql(rusqlite::Error::SqliteFailure(f, _)) => {
            matches!(f.code, C::DiskFull | C::SystemIoFailure | C::ReadOnly | C::CannotOpen)
        }
        _ => e.unavailable(),
    }
}

/// A parsed query string.
struct Query(Vec<(String, String)>);

impl Query {
    /// Parses `q`, refusing any parameter not in `takes` (a typo must not be ignored).
    fn parse(q: &str, takes: &[&str]) -> Result<Query, String> {
        let mut v = Vec::new();
        for part in q.split('&').filter(|p| !p.is_empty()) {
            let (k, val) = part.split_once('=').unwrap_or((part, ""));
            let k = decode(k)?;
            if !takes.contains(&k.as_str()) {
                return Err(format!(
                    "unknown parameter {k:?}; this endpoint takes {}",
                    takes.join(", ")
                ));
            }
            v.push((k, decode(val)?));
        }
        Ok(Query(v))
    }

    /// The time window of `from` and `to` (each ns since the epoch or RFC 3339, e.g.
    /// `2026-11-24T10:00:00Z`; `since_ns` is the old name of `from`); `from` defaults to
    /// `default_from`, `to` to no end.
    fn window(&self, default_from: u64) -> Result<Window, String> {
        let from = match (self.get("from"), self.get("since_ns")) {
            (Some(v), _) => time("from", v)?,
            (None, Some(v)) => v.parse().map_err(|_| "since_ns must be a non-negative integer")?,
            (None, None) => default_from,
        };
        let to = self.get("to").map(|v| time("to", v)).transpose()?.unwrap_or(u64::MAX);
        if from >= to {
            return Err(format!("from ({from}) must be before to ({to})"));
        }
        Ok(Window { from_ns: from, to_ns: to })
    }

    fn bool_or(&self, k: &str, default: bool) -> Result<bool, String> {
        match self.get(k) {
            None => Ok(default),
            Some("true" | "1") => Ok(true),
            Some("false" | "0") => Ok(false),
            Some(v) => Err(format!("{k} must be true or false, not {v:?}")),
        }
    }

    /// `v` as JSON; with `ints=string`, integers beyond 2^53 (which JavaScript's numbers cannot
    /// hold exactly: nanosecond times, for one) are written as strings.
    fn json<T: serde::Serialize>(&self, status: u16, v: &T) -> Response {
        if self.get("ints") != Some("string") {
            return Response::json(status, v);
        }
        let mut v = serde_json::to_value(v).unwrap_or_default();
        big_ints_as_strings(&mut v);
        Response::json(status, &v)
    }

    fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    fn u64_or(&self, k: &str, default: u64) -> Result<u64, String> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("{k} must be a non-negative integer")),
        }
    }

    fn num<T: std::str::FromStr>(&self, k: &str) -> Result<Option<T>, String> {
        match self.get(k) {
            None | Some("") => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| format!("bad {k}: {v:?}")),
        }
    }

    fn flow(&self) -> Result<Flow, String> {
        let need = |k: &str| {
            self.get(k)
                .ok_or_else(|| format!("missing {k} (a flow is src, dst, sport, dport, proto)"))
        };
        let addr = |k: &str| -> Result<String, String> {
            let v = need(k)?;
            v.parse::<std::net::IpAddr>()
                .map(|a| a.to_string())
                .map_err(|_| format!("bad {k}: {v:?}"))
        };
        Ok(Flow {
            src: addr("src")?,
            dst: addr("dst")?,
            sport: self.num("sport")?.ok_or("missing sport")?,
            dport: self.num("dport")?.ok_or("missing dport")?,
            // The names the agent's watch rules take (udp, tcp, …), or a number.
            proto: telemark_core::watch::parse_proto(need("proto")?).map_err(|e| e.0)?,
            spi: self.num("spi")?,
            si: self.num("si")?,
        })
    }
}

/// The parameters that name a flow.
const FLOW_KEYS: &[&str] = &["src", "dst", "sport", "dport", "proto", "spi", "si"];

/// A time parameter: ns since the epoch, or RFC 3339.
fn time(k: &str, v: &str) -> Result<u64, String> {
    if let Ok(ns) = v.parse::<u64>() {
        return Ok(ns);
    }
    let t = time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("{k}: {v:?} is neither ns since the epoch nor RFC 3339 ({e})"))?;
    u64::try_from(t.unix_timestamp_nanos()).map_err(|_| format!("{k}: {v:?} is before 1970"))
}

/// Integers JavaScript cannot hold exactly (beyond 2^53 - 1) as strings, anywhere in `v`.
fn big_ints_as_strings(v: &mut serde_json::Value) {
    const EXACT: u64 = (1 << 53) - 1;
    match v {
        serde_json::Value::Number(n) if n.as_u64().is_some_and(|x| x > EXACT) => {
            *v = serde_json::Value::String(n.to_string());
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(big_ints_as_strings),
        serde_json::Value::Object(o) => o.values_mut().for_each(big_ints_as_strings),
        _ => {}
    }
}

/// Where a segment is, in words.
fn place(s: &crate::path::Segment) -> String {
    use crate::path::Method;
    let to = format!("{} {} (port {})", s.agent, s.point, s.port);
    match (s.method, &s.from) {
        (Method::InSwitch, Some(u)) => {
            format!(
                "inside {} ({} → {})",
                s.agent,
                u.split_once('/').map_or(u.as_str(), |x| x.1),
                s.point
            )
        }
        (Method::FromMarking, Some(u)) => {
            format!(
                "between the marking switch and {to} (its last stretch from {})",
                u.replacen('/', " ", 1)
            )
        }
        (Method::FromMarking | Method::InSwitch, _) => {
            format!("on the path from the marking switch to {to}")
        }
        (_, Some(u)) => format!("on the path from {} to {to}", u.replacen('/', " ", 1)),
        (_, None) => format!("upstream of {to}"),
    }
}

/// Percent-encoding of one query component (RFC 3986: all but the unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Percent-decoding of one query component (`+` is a space).
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        match c {
            b'%' => {
                let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                let v = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
                out.push(v.ok_or_else(|| format!("bad percent escape in {s:?}"))?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            _ => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("query is not UTF-8: {s:?}"))
}

/// A relayed change's answer: the agent's, or why there is none.
fn relayed(r: Result<serde_json::Value, crate::steer::SteerError>) -> Response {
    use crate::steer::SteerError;
    match r {
        Ok(v) => Response::json(200, &v),
        Err(e @ SteerError::UnknownAgent(_)) => Response::error(404, e),
        Err(SteerError::Busy) => {
            let mut r = Response::error(503, SteerError::Busy);
            r.headers.push(("Retry-After", "1".into()));
            r
        }
        // The agent's own answer to the rules: refused (400), none to change (409), too large.
        Err(e @ SteerError::Refused { status: s @ (400 | 409 | 413), .. }) => Response::error(s, e),
        Err(e) => Response::error(502, e),
    }
}

#[cfg(test)]
mod tests {
    use super::json_values;

    /// The count bounds what serde_json builds for valid JSON, and stops where nesting goes
    /// past the parser's depth (serde_json refuses the body there: 400, not 413).
    #[test]
    fn json_values_bound_the_parse_and_stop_at_the_parser_depth() {
        for body in [&b"[0,0,{\"a\":[1,\"x,y\"]}]"[..], b"{}", b"0"] {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            let mut built = 0u64;
            let mut stack = vec![&v];
            while let Some(x) = stack.pop() {
                built += 1;
                match x {
                    serde_json::Value::Array(a) => stack.extend(a),
                    serde_json::Value::Object(o) => stack.extend(o.values()),
                    _ => {}
                }
            }
            assert!(json_values(body) >= built, "{}", String::from_utf8_lossy(body));
        }
        let deep = vec![b'['; 8 << 20];
        assert!(json_values(&deep) <= 130);
        assert!(serde_json::from_slice::<serde_json::Value>(&deep).is_err());
    }
}
