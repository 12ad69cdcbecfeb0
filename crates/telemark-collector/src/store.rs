//! The collector's store: one SQLite database (WAL, `synchronous = FULL`), written in one
//! transaction per ingest request and committed before the request is acknowledged.
//!
//! Every record an agent sends carries (agent, boot, seq): the agent's name, a number that
//! changes every time the agent starts, and the record's position in that run. The triple is
//! the primary key, so a batch the agent sends again after a lost acknowledgement is taken once
//! and counted as duplicate: at-least-once delivery, exactly-once storage.
//!
//! Queries do not hold the writer: they run on [`Readers`], read-only connections of their own
//! (WAL readers never block the writer, nor it them), each request's reading under a time
//! budget (docs/collector.md, "Queries"). Sums of stored counts never fail: `usum`.

use crate::flows::{DomainKey, Protocol, Remembered};
use crate::link::{Batch, Period};
use crate::path::PointRecords;
use rusqlite::functions::{Aggregate, Context, FunctionFlags};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, ToSql};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};
use telemark_core::records::{
    Direction, EventRecord, Flow, FlowRecord, HealthRecord, PointHealth, Record, Scope,
};
use telemark_kafka::{Message, Origin};
use telemark_wire::ipfix::{Template, TemplateRecord};

/// A storage failure: the request is not acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed (disk full, I/O error, …).
    #[error("database: {0}")]
    Sql(rusqlite::Error),
    /// A query ran past its budget and was stopped (`--query-budget`).
    #[error(
        "the query took longer than the collector's budget for one request (--query-budget): \
         ask for a shorter window or fewer flows"
    )]
    OverBudget,
    /// Every reader connection was busy with another query (`--query-readers`).
    #[error("all {readers} query connections are busy: retry shortly (--query-readers)")]
    Busy {
        /// Reader connections.
        readers: usize,
    },
    /// The file failed SQLite's integrity check at start.
    #[error(
        "database {path} is damaged ({detail}): restore it from a backup, or move it away to \
         start with an empty one"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What SQLite's check said first.
        detail: String,
    },
    /// The file was removed or replaced while the collector had it open: what it would store
    /// now would vanish at the next restart, so it stores nothing.
    #[error(
        "database file {0} was removed or replaced while the collector ran: nothing more is \
         stored until the collector restarts"
    )]
    Gone(PathBuf),
    /// The shared PostgreSQL store failed (unreachable, refused, …).
    #[error("postgresql: {0}")]
    Postgres(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        // The progress handler stopped it: the budget, not the database, failed.
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::OperationInterrupted) => StoreError::OverBudget,
            _ => StoreError::Sql(e),
        }
    }
}

impl StoreError {
    /// Whether the store cannot take writes until an operator acts (as opposed to one
    /// request's failure).
    pub fn unavailable(&self) -> bool {
        matches!(self, StoreError::Gone(_) | StoreError::Corrupt { .. })
    }

    /// Whether the reading was refused for lack of time or of a connection, not for a fault:
    /// worth a retry shortly (503).
    pub fn overloaded(&self) -> bool {
        matches!(self, StoreError::OverBudget | StoreError::Busy { .. })
    }
}

/// Which file a path names: (device, inode).
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// One agent run's records read from Kafka: (agent, boot, each record with its sequence
/// number).
pub type NumberedRun<'a> = (&'a str, u64, Vec<(u64, Record)>);

/// What one ingest stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stored {
    /// Records stored now.
    pub accepted: u64,
    /// Records already stored earlier (a retry), ignored.
    pub duplicates: u64,
    /// Records refused (a count over [`crate::validate::MAX_COUNT`]): from exporters only,
    /// whose records are not checked before (agents' and Kafka's are, whole).
    pub refused: u64,
    /// Which of the request's records were stored now (the others were duplicates).
    pub new: Vec<bool>,
}

/// A registered agent and its health.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Agent {
    /// Name.
    pub agent: String,
    /// Software version it reported.
    pub version: String,
    /// Its current run.
    pub boot: u64,
    /// When it registered first (ns since the epoch).
    pub first_seen_ns: u64,
    /// Its last request.
    pub last_seen_ns: u64,
    /// Records stored from it.
    pub records: u64,
    /// Telemetry it reported having dropped (export buffer full), from its last request.
    pub export_dropped: u64,
}

/// One point of a flow's loss time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesPoint {
    /// Agent.
    pub agent: String,
    /// Observation point.
    pub point: String,
    /// Start of the time bucket (ns).
    pub t_ns: u64,
    /// Batches stored in the bucket (lossy ones, unless the agent reports all).
    pub batches: u64,
    /// Packets expected.
    pub expected: u64,
    /// Packets lost.
    pub lost: u64,
    /// Packets late.
    pub late: u64,
    /// Packets whose loss is uncertain.
    pub uncertain: u64,
    /// Which stretch of the path the point's figures cover: `path` for a point that measures
    /// against B, from the marking switch (see `/api/v1/localise` for its segment).
    pub scope: Scope,
}

/// A flow with its loss totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowSummary {
    /// The flow.
    pub flow: Flow,
    /// Lossy batches stored at the point that stored the most.
    pub lossy_batches: u64,
    /// Packets sent into the flow's path (the most any point expected), in batches stored.
    pub packets: u64,
    /// Packets lost on the flow's whole path, each once.
    pub lost: u64,
    /// Packets whose loss is uncertain, on the whole path.
    pub uncertain: u64,
    /// `lost / packets` (0 without packets).
    pub ratio: f64,
    /// First and last batch time.
    pub first_ns: u64,
    /// Last batch time.
    pub last_ns: u64,
}

/// The embedded SQLite database: the writer's connection, or (from [`Sqlite::readers`]) a
/// read-only one.
pub struct Sqlite {
    db: Connection,
    path: PathBuf,
    /// The file opened (device, inode), to notice it being removed or replaced; `None` for an
    /// in-memory database.
    file: Option<(u64, u64)>,
    /// Rows in `loss` and `other` (kept here: counting 10 M rows takes a second), shared by
    /// the writer and its readers.
    rows: Arc<[AtomicU64; 2]>,
    /// When publishing to Kafka: the outbox's state, shared with the publisher.
    publishing: Option<Arc<Publishing>>,
    /// When the reading in progress must stop ([`mono_ns`]; 0: no limit, as for writes).
    deadline: Arc<AtomicU64>,
}

/// The collector's store: the embedded SQLite database (one collector), or a PostgreSQL
/// database that any number of collectors share ([`crate::pg`], docs/scale.md). Every query
/// the API, the page and `/metrics` make goes through here; the rules that turn stored rows
/// into answers are written once, whichever database holds them.
// A collector holds a handful (its writer and its readers), each behind a mutex: their
// size does not matter, and boxing would only add an indirection to every query.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    /// One collector's own file.
    Sqlite(Sqlite),
    /// A database shared by collectors.
    Postgres(crate::pg::PgStore),
}

/// Whether `db` names a PostgreSQL database (a URL) rather than a SQLite file.
pub fn is_postgres(db: &Path) -> bool {
    let t = db.to_string_lossy();
    t.starts_with("postgres://") || t.starts_with("postgresql://")
}

/// `db` as logs and errors show it: a URL's password, in its user part or as a `password`
/// parameter, masked.
pub fn describe(db: &Path) -> String {
    let t = db.to_string_lossy().into_owned();
    if !is_postgres(db) {
        return t;
    }
    let (url, query) = match t.split_once('?') {
        Some((u, q)) => (u.to_string(), Some(q)),
        None => (t.clone(), None),
    };
    let url = match url.split_once("://").and_then(|(scheme, rest)| {
        let (auth, host) = rest.rsplit_once('@')?;
        let (user, _) = auth.split_once(':')?;
        Some(format!("{scheme}://{user}:***@{host}"))
    }) {
        Some(masked) => masked,
        None => url,
    };
    match query {
        None => url,
        Some(q) => {
            let params: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{url}?{}", params.join("&"))
        }
    }
}

/// `$e` on whichever backend `$store` is, bound to `$s`.
macro_rules! each {
    ($store:expr, $s:ident => $e:expr) => {
        match $store {
            Store::Sqlite($s) => $e,
            Store::Postgres($s) => $e,
        }
    };
}

impl Store {
    /// Opens the store `db` names: a `postgres://` or `postgresql://` URL, or a SQLite file
    /// (created if needed; `":memory:"` for a throw-away one).
    pub fn open(db: &Path) -> Result<Store, StoreError> {
        Store::open_with(db, None)
    }

    /// [`Store::open`], with PostgreSQL's password given apart from the URL.
    pub fn open_with(db: &Path, password: Option<&str>) -> Result<Store, StoreError> {
        if is_postgres(db) {
            let url = db.to_string_lossy();
            return Ok(Store::Postgres(crate::pg::PgStore::connect(&url, password)?));
        }
        Ok(Store::Sqlite(Sqlite::open(db)?))
    }

    /// `n` connections for queries, each request's reading limited to `budget`.
    pub fn readers(&self, n: usize, budget: Duration) -> Result<Readers, StoreError> {
        each!(self, s => s.readers(n, budget))
    }

    fn set_deadline(&self, at: u64) {
        if let Store::Sqlite(s) = self {
            s.deadline.store(at, Ordering::Relaxed);
        }
    }

    /// Whether the store is still the one opened (a SQLite file not removed or replaced).
    pub fn check_file(&self) -> Result<(), StoreError> {
        each!(self, s => s.check_file())
    }

    /// Whether the store can take writes and answer reads now.
    pub fn ready(&self) -> Result<(), StoreError> {
        each!(self, s => s.ready())
    }

    /// From now on, records stored from agents also go to the outbox, for Kafka.
    pub fn publish(&mut self, max: u64) -> Result<Arc<Publishing>, StoreError> {
        each!(self, s => s.publish(max))
    }

    /// Registers `agent` (or updates it on a new run).
    pub fn register(
        &mut self,
        agent: &str,
        version: &str,
        boot: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        each!(self, s => s.register(agent, version, boot, now))
    }

    /// The run `agent` registered last and when it was last heard from.
    pub fn registered(&self, agent: &str) -> Result<Option<(u64, u64)>, StoreError> {
        each!(self, s => s.registered(agent))
    }

    /// Stores `records` numbered from `seq` of `agent`'s run `boot`, durably.
    pub fn ingest(
        &mut self,
        agent: &str,
        boot: u64,
        seq: u64,
        records: &[Record],
        export_dropped: u64,
        now: u64,
    ) -> Result<Stored, StoreError> {
        each!(self, s => s.ingest(agent, boot, seq, records, export_dropped, now))
    }

    /// Keeps what flow exporters' templates and options data taught the decoders.
    pub fn remember_flow_state(&mut self, changes: &[Remembered]) -> Result<(), StoreError> {
        each!(self, s => s.remember_flow_state(changes))
    }

    /// What [`Store::remember_flow_state`] kept, newest first, at most `limit` rows.
    pub fn flow_state(&self, limit: usize) -> Result<Vec<Remembered>, StoreError> {
        each!(self, s => s.flow_state(limit))
    }

    /// Deletes old flow state; returns how many rows went.
    pub fn prune_flow_state(&mut self, before_ns: u64, max_bytes: u64) -> Result<u64, StoreError> {
        each!(self, s => s.prune_flow_state(before_ns, max_bytes))
    }

    /// Stores records read from Kafka, each numbered in `agent`'s run `boot`.
    pub fn ingest_numbered(
        &mut self,
        agent: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        each!(self, s => s.ingest_numbered(agent, boot, records, now))
    }

    /// Stores several agents' runs of records read from Kafka (one poll): on PostgreSQL in
    /// one transaction (a commit per agent would bound a fleet's ingest by commits per
    /// second); on SQLite one transaction per run, as [`Store::ingest_numbered`]. Returns the
    /// outcome of each run stored, in order, and the error that stopped the rest, if one did
    /// (on SQLite the runs before it are stored; they are found again as duplicates when
    /// the poll is read again).
    pub fn ingest_numbered_runs(
        &mut self,
        runs: &[NumberedRun<'_>],
        now: u64,
    ) -> (Vec<Stored>, Option<StoreError>) {
        match self {
            Store::Sqlite(s) => {
                let mut done = Vec::with_capacity(runs.len());
                for (agent, boot, records) in runs {
                    match s.ingest_numbered(agent, *boot, records, now) {
                        Ok(st) => done.push(st),
                        Err(e) => return (done, Some(e)),
                    }
                }
                (done, None)
            }
            Store::Postgres(s) => match s.ingest_numbered_runs(runs, now) {
                Ok(done) => (done, None),
                Err(e) => (Vec::new(), Some(e)),
            },
        }
    }

    /// Stores flows decoded from an exporter's datagrams.
    pub fn ingest_flows(
        &mut self,
        exporter: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        each!(self, s => s.ingest_flows(exporter, boot, records, now))
    }

    /// Settles the segments between agents due by `now_ns` (`crate::settle`).
    pub fn settle(&mut self, now_ns: u64) -> Result<crate::settle::Pass, StoreError> {
        each!(self, s => s.settle(now_ns))
    }

    /// Deletes records whose time is before `before_ns`; returns how many.
    pub fn expire(&mut self, before_ns: u64) -> Result<u64, StoreError> {
        each!(self, s => s.expire(before_ns))
    }

    /// The registered agents.
    pub fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        each!(self, s => s.agents())
    }

    /// Flows with batches in `w`, most lost first (see [`Sqlite::flows`]).
    pub fn flows(
        &self,
        w: Window,
        lossy_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<FlowSummary>, StoreError> {
        each!(self, s => s.flows(w, lossy_only, offset, limit))
    }

    /// `flow`'s loss per agent and point in buckets of `bucket_ns`, in `w`.
    pub fn series(
        &self,
        flow: &Flow,
        w: Window,
        bucket_ns: u64,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        each!(self, s => s.series(flow, w, bucket_ns))
    }

    /// Loss records of every flow summed per segment and time bucket (`crate::overview`).
    pub fn overview(
        &self,
        q: &crate::overview::OverviewQuery,
    ) -> Result<Vec<crate::overview::OverviewRow>, StoreError> {
        each!(self, s => s.overview(q))
    }

    /// `flow`'s loss records since `since_ns`, per point.
    pub fn points(&self, flow: &Flow, since_ns: u64) -> Result<Vec<PointRecords>, StoreError> {
        self.points_in(flow, Window::since(since_ns))
    }

    /// `flow`'s loss records in `w`, per point, each point's batches in order of first packet.
    pub fn points_in(&self, flow: &Flow, w: Window) -> Result<Vec<PointRecords>, StoreError> {
        each!(self, s => s.points_in(flow, w))
    }

    /// Each agent's health since `since_ns`.
    pub fn health(&self, since_ns: u64) -> Result<Vec<HealthRecord>, StoreError> {
        each!(self, s => s.health(since_ns))
    }

    /// INT events in `w`, newest first, at most `limit`, optionally of one detector or flow.
    pub fn events(
        &self,
        w: Window,
        detector: Option<&str>,
        agent: Option<&str>,
        flow: Option<&Flow>,
        limit: u64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        each!(self, s => s.events(w, detector, agent, flow, limit))
    }

    /// The `limit` flows with the most bytes or packets in `w`.
    pub fn top_talkers(
        &self,
        w: Window,
        filter: &TopFilter<'_>,
        by: TopBy,
        limit: u64,
    ) -> Result<Vec<TopTalker>, StoreError> {
        each!(self, s => s.top_talkers(w, filter, by, limit))
    }

    /// The `flow` records that match `filter` in `w`, a page after `after`.
    pub fn flow_records(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
        after: Option<&RecordCursor>,
        limit: u64,
    ) -> Result<Vec<(FlowRecord, RecordCursor)>, StoreError> {
        each!(self, s => s.flow_records(w, filter, after, limit))
    }

    /// What the `flow` records that match `filter` in `w` add up to.
    pub fn flow_totals(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
    ) -> Result<FlowTotals, StoreError> {
        each!(self, s => s.flow_totals(w, filter))
    }

    /// Frames `agent`'s own receive rings dropped since `since_ns`.
    pub fn ring_drops(&self, agent: &str, since_ns: u64) -> Result<u64, StoreError> {
        each!(self, s => s.ring_drops(agent, since_ns))
    }

    /// Records stored: (loss batches, other records).
    pub fn counts(&self) -> Result<(u64, u64), StoreError> {
        each!(self, s => s.counts())
    }
}

/// Longest a request waits for a free reader connection before it is answered 503.
pub const READER_WAIT: Duration = Duration::from_millis(100);

/// How long one request may read, unless configured (`--query-budget`).
pub const DEFAULT_QUERY_BUDGET: Duration = Duration::from_secs(10);

/// Nanoseconds on a monotonic clock (never 0).
fn mono_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let ns = START.get_or_init(Instant::now).elapsed().as_nanos();
    u64::try_from(ns).unwrap_or(u64::MAX).saturating_add(1)
}

/// What every connection gets: `usum`, and a progress handler that stops a statement once the
/// connection's `deadline` passed (SQLite's progress callback: a non-zero return interrupts,
/// <https://sqlite.org/c3ref/progress_handler.html>); checked every 10,000 VM steps, tens of
/// microseconds.
fn prepare(db: &Connection, deadline: &Arc<AtomicU64>) -> Result<(), StoreError> {
    db.create_aggregate_function(
        "usum",
        1,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        USum,
    )?;
    let d = deadline.clone();
    db.progress_handler(
        10_000,
        Some(move || {
            let at = d.load(Ordering::Relaxed);
            at != 0 && mono_ns() > at
        }),
    );
    Ok(())
}

/// `usum(x)`: SQLite's `SUM` without its failures, for stored counts. `SUM` stops the whole
/// query with "integer overflow" past 2^63 and turns real once any value is (a count beyond
/// 2^63 stored as JSON), which no count column reads back; here integers add exactly (in 128
/// bits), a real counts as the integer it rounds to, and the total saturates at 2^63 − 1.
/// NULL when no row has a value, as `SUM`.
struct USum;

impl Aggregate<Option<i128>, Option<i64>> for USum {
    fn init(&self, _: &mut Context<'_>) -> rusqlite::Result<Option<i128>> {
        Ok(None)
    }

    fn step(&self, ctx: &mut Context<'_>, acc: &mut Option<i128>) -> rusqlite::Result<()> {
        let v = match ctx.get_raw(0) {
            ValueRef::Integer(v) => i128::from(v),
            // Saturating, NaN as 0.
            ValueRef::Real(f) => f.round() as i128,
            _ => return Ok(()),
        };
        *acc = Some(acc.unwrap_or(0).saturating_add(v));
        Ok(())
    }

    fn finalize(
        &self,
        _: &mut Context<'_>,
        acc: Option<Option<i128>>,
    ) -> rusqlite::Result<Option<i64>> {
        Ok(acc
            .flatten()
            .map(|v| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })))
    }
}

/// Read-only connections to the database, for queries: a request reads on one of its own, so
/// no query waits for the writer nor holds it (SQLite's WAL: readers and the writer do not
/// block each other, <https://sqlite.org/wal.html>). At most as many requests read at once as
/// there are connections; one more waits at most [`READER_WAIT`], then is refused
/// ([`StoreError::Busy`]), so that queries never hold every request thread from the writers.
/// An in-memory database (tests) has no second connection: its requests read on the writer's,
/// under the same budget.
pub struct Readers {
    conns: Vec<Mutex<Store>>,
    /// Longest one request may read.
    pub budget: Duration,
}

impl Default for Readers {
    /// None: read on the writer's connection, under [`DEFAULT_QUERY_BUDGET`].
    fn default() -> Self {
        Readers { conns: Vec::new(), budget: DEFAULT_QUERY_BUDGET }
    }
}

impl Readers {
    /// Connections of a backend's own.
    pub(crate) fn of(conns: Vec<Mutex<Store>>, budget: Duration) -> Readers {
        Readers { conns, budget }
    }

    /// A connection for one request's reading, its budget starting now: one of the readers,
    /// or the writer's (`writer`) when there are none.
    pub fn get<'a>(&'a self, writer: &'a Mutex<Store>) -> Result<Reader<'a>, StoreError> {
        let budget = u64::try_from(self.budget.as_nanos()).unwrap_or(u64::MAX);
        let guard = if self.conns.is_empty() {
            writer.lock().unwrap_or_else(|p| p.into_inner())
        } else {
            let free = || {
                self.conns.iter().find_map(|c| match c.try_lock() {
                    Ok(g) => Some(g),
                    // A panic in another request left no transaction open on a read-only
                    // connection.
                    Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
                    Err(TryLockError::WouldBlock) => None,
                })
            };
            // A short wait, for the page's few queries at once; bounded, so a flood of
            // queries holds request threads for at most this long each.
            let until = Instant::now() + READER_WAIT;
            loop {
                match free() {
                    Some(g) => break g,
                    None if Instant::now() >= until => {
                        return Err(StoreError::Busy { readers: self.conns.len() })
                    }
                    None => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        };
        guard.set_deadline(mono_ns().saturating_add(budget));
        Ok(Reader(guard))
    }

    /// Reader connections (0: reads use the writer's).
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// Whether reads use the writer's connection.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }
}

/// One request's connection for reading ([`Readers::get`]); its budget ends when dropped.
pub struct Reader<'a>(MutexGuard<'a, Store>);

impl std::ops::Deref for Reader<'_> {
    type Target = Store;

    fn deref(&self) -> &Store {
        &self.0
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        self.0.set_deadline(0);
    }
}

/// The outbox of records stored and not yet acknowledged by Kafka (docs/kafka.md, "From the
/// collector"): ingest adds a row in the transaction that stores the record, the publisher
/// removes it once Kafka acknowledged the record.
#[derive(Debug)]
pub struct Publishing {
    /// Rows in the outbox.
    pub pending: AtomicU64,
    /// Most rows kept: past it, records are stored but not published, and counted.
    pub max: u64,
    /// Records stored but not published because the outbox was full.
    pub skipped: AtomicU64,
}

/// One record waiting in the outbox. Ids only grow (AUTOINCREMENT: a drained outbox does
/// not hand out an id the publisher already passed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    /// Its place in the outbox (increasing).
    pub id: i64,
    /// Agent.
    pub agent: String,
    /// Run.
    pub boot: u64,
    /// Sequence number in the run.
    pub seq: u64,
    /// Record kind.
    pub kind: String,
    /// Partitioning key.
    pub key: String,
    /// The record's JSON.
    pub json: String,
}

/// The publisher's own connection to the outbox (the same database file).
pub struct Outbox {
    db: Connection,
}

impl Outbox {
    /// Opens the outbox of the database at `path` (a file: an in-memory database has no
    /// outbox another connection could read).
    pub fn open(path: &Path) -> Result<Outbox, StoreError> {
        let db = Connection::open(path)?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        // A removal lost to a crash publishes a record again: a duplicate the (agent, boot,
        // seq) key absorbs, not a loss; no need to wait for the disk.
        db.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(Outbox { db })
    }

    /// Up to `limit` rows after `id`, in order.
    pub fn after(&self, id: i64, limit: usize) -> Result<Vec<OutboxRow>, StoreError> {
        let mut q = self.db.prepare_cached(
            "SELECT id, agent, boot, seq, kind, key, json FROM outbox WHERE id > ?1
             ORDER BY id LIMIT ?2",
        )?;
        let rows = q.query_map(params![id, i(limit as u64)], |r| {
            Ok(OutboxRow {
                id: r.get(0)?,
                agent: r.get(1)?,
                boot: u(r.get(2)?),
                seq: u(r.get(3)?),
                kind: r.get(4)?,
                key: r.get(5)?,
                json: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Removes the rows `ids` (acknowledged), in one transaction.
    pub fn remove(&mut self, ids: &[i64]) -> Result<(), StoreError> {
        let tx = self.db.transaction()?;
        {
            let mut del = tx.prepare_cached("DELETE FROM outbox WHERE id = ?1")?;
            for id in ids {
                del.execute([id])?;
            }
        }
        tx.commit()?;
        Ok(())
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agents (
    agent TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    boot INTEGER NOT NULL,
    first_seen_ns INTEGER NOT NULL,
    last_seen_ns INTEGER NOT NULL,
    records INTEGER NOT NULL DEFAULT 0,
    export_dropped INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS loss (
    agent TEXT NOT NULL, boot INTEGER NOT NULL, seq INTEGER NOT NULL,
    port TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT,
    src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
    proto INTEGER NOT NULL, spi INTEGER, si INTEGER,
    color INTEGER NOT NULL, batch INTEGER NOT NULL, first_ns INTEGER NOT NULL,
    last_ns INTEGER NOT NULL, expected INTEGER, observed INTEGER NOT NULL,
    lost INTEGER NOT NULL, late INTEGER NOT NULL, uncertain INTEGER NOT NULL DEFAULT 0,
    scope TEXT NOT NULL DEFAULT 'segment', tail INTEGER NOT NULL DEFAULT 0, drops TEXT,
    period_ns INTEGER, incomplete INTEGER NOT NULL DEFAULT 0, ttl INTEGER,
    own_colour INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, boot, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS loss_flow ON loss (src, dst, sport, dport, proto, first_ns);
CREATE INDEX IF NOT EXISTS loss_time ON loss (first_ns);
CREATE TABLE IF NOT EXISTS other (
    agent TEXT NOT NULL, boot INTEGER NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, time_ns INTEGER NOT NULL, json TEXT NOT NULL,
    PRIMARY KEY (agent, boot, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS other_time ON other (time_ns);
CREATE TABLE IF NOT EXISTS flows (
    time_ns INTEGER NOT NULL, agent TEXT NOT NULL, boot INTEGER NOT NULL, seq INTEGER NOT NULL,
    port TEXT NOT NULL, point TEXT NOT NULL, direction TEXT,
    src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
    proto INTEGER NOT NULL, packets INTEGER NOT NULL, bytes INTEGER NOT NULL,
    exact INTEGER NOT NULL, error_bound INTEGER NOT NULL,
    PRIMARY KEY (time_ns, agent, boot, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS flows_egress ON flows (time_ns) WHERE direction = 'egress';
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL, boot INTEGER NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, key TEXT NOT NULL, json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS flow_state (
    exporter TEXT NOT NULL, domain INTEGER NOT NULL, kind TEXT NOT NULL, id INTEGER NOT NULL,
    options INTEGER NOT NULL DEFAULT 0, value BLOB NOT NULL, seen_ns INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (exporter, domain, kind, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS flow_hours (
    hour INTEGER NOT NULL,
    src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
    proto INTEGER NOT NULL, spi INTEGER NOT NULL, si INTEGER NOT NULL,
    agent TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT NOT NULL, scope TEXT NOT NULL,
    batches INTEGER NOT NULL, lossy_batches INTEGER NOT NULL, expected INTEGER NOT NULL,
    lost INTEGER NOT NULL, uncertain INTEGER NOT NULL,
    first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL,
    PRIMARY KEY (hour, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS flow_days (
    day INTEGER NOT NULL,
    src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
    proto INTEGER NOT NULL, spi INTEGER NOT NULL, si INTEGER NOT NULL,
    agent TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT NOT NULL, scope TEXT NOT NULL,
    batches INTEGER NOT NULL, lossy_batches INTEGER NOT NULL, expected INTEGER NOT NULL,
    lost INTEGER NOT NULL, uncertain INTEGER NOT NULL,
    first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL,
    PRIMARY KEY (day, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS link_sums (
    slot_ns INTEGER NOT NULL,
    src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
    proto INTEGER NOT NULL, spi INTEGER NOT NULL, si INTEGER NOT NULL,
    agent TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT NOT NULL,
    periods INTEGER NOT NULL, lossy_periods INTEGER NOT NULL, expected INTEGER NOT NULL,
    lost INTEGER NOT NULL, first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL,
    PRIMARY KEY (slot_ns, src, dst, sport, dport, proto, spi, si, agent, point, upstream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settled (name TEXT PRIMARY KEY, upto_ns INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS segment_hours (
    hour INTEGER NOT NULL, agent TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT NOT NULL,
    scope TEXT NOT NULL, proto INTEGER NOT NULL,
    batches INTEGER NOT NULL, lossy_batches INTEGER NOT NULL, expected INTEGER NOT NULL,
    lost INTEGER NOT NULL, uncertain INTEGER NOT NULL,
    PRIMARY KEY (hour, agent, point, upstream, scope, proto)
) WITHOUT ROWID;
";

/// The flow-state row key of a session's domain: its address and port, and the protocol's
/// version above the domain's 32 bits. Only v9 and IPFIX have templates to keep.
pub(crate) fn flow_state_key(k: &DomainKey) -> Option<(String, i64)> {
    let version: i64 = match k.protocol {
        Protocol::NetflowV9 => 9,
        Protocol::Ipfix => 10,
        _ => return None,
    };
    Some((k.session.to_string(), (version << 32) | i64::from(k.domain)))
}

/// The domain a flow-state row's key names ([`flow_state_key`] read back); `None` for a row
/// that does not read (or was written by a collector that keyed templates by address alone).
pub(crate) fn flow_state_domain(session: &str, domain: i64) -> Option<DomainKey> {
    let session = session.parse::<std::net::SocketAddr>().ok()?;
    let protocol = match domain >> 32 {
        9 => Protocol::NetflowV9,
        10 => Protocol::Ipfix,
        _ => return None,
    };
    Some(DomainKey { session, protocol, domain: (domain & 0xffff_ffff) as u32, agent: None })
}

fn table_exists(db: &Connection, name: &str) -> Result<bool, StoreError> {
    let n: i64 = db.query_row(
        "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        [name],
        |r| r.get(0),
    )?;
    Ok(n > 0)
}

/// Sums the hours `?1 .. ?2` (end excluded) of `flow_hours` into `flow_days`, whose rows of those
/// days must not exist.
const DAYS_FROM_HOURS: &str = "INSERT INTO flow_days
    SELECT hour / 24, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope,
           SUM(batches), SUM(lossy_batches), usum(expected), usum(lost), usum(uncertain),
           MIN(first_ns), MAX(last_ns)
    FROM flow_hours WHERE hour >= ?1 AND hour < ?2 GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12";

/// Adds one transaction's sums (`crate::rollup`) to their tables, each row once; sums saturate
/// at 2^63 - 1 (read back with `usum`).
fn add_sums(
    tx: &rusqlite::Transaction<'_>,
    sums: &crate::rollup::Rollup,
) -> Result<(), StoreError> {
    let sat = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
    const ADD: &str = "batches = batches + excluded.batches,
        lossy_batches = lossy_batches + excluded.lossy_batches,
        expected = MIN(expected + excluded.expected, 9223372036854775807),
        lost = MIN(lost + excluded.lost, 9223372036854775807),
        uncertain = MIN(uncertain + excluded.uncertain, 9223372036854775807)";
    for (table, period, rows) in
        [("flow_hours", "hour", &sums.flow_hours), ("flow_days", "day", &sums.flow_days)]
    {
        let mut st = tx.prepare_cached(&format!(
            "INSERT INTO {table} ({period}, src, dst, sport, dport, proto, spi, si, agent, point,
                upstream, scope, batches, lossy_batches, expected, lost, uncertain, first_ns,
                last_ns)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
                ?18, ?19)
             ON CONFLICT DO UPDATE SET {ADD}, first_ns = MIN(first_ns, excluded.first_ns),
                last_ns = MAX(last_ns, excluded.last_ns)"
        ))?;
        for (k, v) in rows {
            st.execute(params![
                k.period,
                k.src,
                k.dst,
                k.sport,
                k.dport,
                k.proto,
                k.spi,
                k.si,
                k.agent,
                k.point,
                k.upstream,
                k.scope,
                v.batches,
                v.lossy_batches,
                sat(v.expected),
                sat(v.lost),
                sat(v.uncertain),
                v.first_ns,
                v.last_ns,
            ])?;
        }
    }
    let mut st = tx.prepare_cached(&format!(
        "INSERT INTO segment_hours (hour, agent, point, upstream, scope, proto, batches,
            lossy_batches, expected, lost, uncertain)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT DO UPDATE SET {ADD}"
    ))?;
    for (k, v) in &sums.segment_hours {
        st.execute(params![
            k.hour,
            k.agent,
            k.point,
            k.upstream,
            k.scope,
            k.proto,
            v.batches,
            v.lossy_batches,
            sat(v.expected),
            sat(v.lost),
            sat(v.uncertain),
        ])?;
    }
    Ok(())
}

/// Fills `flows` from the `flow` records a collector stored in `other` before `flows` existed.
fn backfill_flows(db: &Connection) -> Result<(), StoreError> {
    db.execute_batch(
        "INSERT OR IGNORE INTO flows
         SELECT time_ns, agent, boot, seq, json_extract(json, '$.port'),
                json_extract(json, '$.point'), json_extract(json, '$.direction'),
                json_extract(json, '$.flow.src'), json_extract(json, '$.flow.dst'),
                json_extract(json, '$.flow.sport'), json_extract(json, '$.flow.dport'),
                json_extract(json, '$.flow.proto'), json_extract(json, '$.packets'),
                json_extract(json, '$.bytes'), json_extract(json, '$.exact'),
                json_extract(json, '$.error_bound')
         FROM other WHERE kind = 'flow'",
    )?;
    Ok(())
}

/// Adds `seen_ns` to a `flow_state` table written before it existed.
fn migrate_flow_state(db: &Connection) -> Result<(), StoreError> {
    let has: bool = db.query_row(
        "SELECT COUNT(*) FROM pragma_table_info('flow_state') WHERE name = 'seen_ns'",
        [],
        |r| r.get::<_, i64>(0),
    )? > 0;
    if !has {
        db.execute_batch("ALTER TABLE flow_state ADD COLUMN seen_ns INTEGER NOT NULL DEFAULT 0")?;
    }
    Ok(())
}

use crate::rollup::{DAY_NS, HOUR_NS};

/// Columns of `loss` added after its first release, oldest first.
/// A loss record's drop reasons as stored: `{"NETFILTER_DROP": 30}`, or NULL for none.
pub(crate) fn drops_json(d: &[telemark_core::records::DropCount]) -> Option<String> {
    if d.is_empty() {
        return None;
    }
    let m: std::collections::BTreeMap<&str, u64> =
        d.iter().map(|c| (c.reason.as_str(), c.packets)).collect();
    serde_json::to_string(&m).ok()
}

/// The stored form back (a row that does not parse names no reasons).
pub(crate) fn drops_from_json(s: &str) -> std::collections::BTreeMap<String, u64> {
    serde_json::from_str(s).unwrap_or_default()
}

const ADDED_COLUMNS: [(&str, &str); 8] = [
    ("uncertain", "INTEGER NOT NULL DEFAULT 0"),
    ("scope", "TEXT NOT NULL DEFAULT 'segment'"),
    ("tail", "INTEGER NOT NULL DEFAULT 0"),
    // The kernel's drop reasons, as JSON ({"NETFILTER_DROP": 30}); NULL: none named.
    ("drops", "TEXT"),
    // The marking period of batches that are periods of time (`batch` is then its number).
    ("period_ns", "INTEGER"),
    // The point may have missed some of the batch (records' `incomplete`).
    ("incomplete", "INTEGER NOT NULL DEFAULT 0"),
    // The flow's TTL (hop limit) at the point (records' `ttl`); NULL: not known.
    ("ttl", "INTEGER"),
    // Packets a marker left as their sender coloured them, unmeasured (records' `own_colour`).
    ("own_colour", "INTEGER NOT NULL DEFAULT 0"),
];

/// A time window: records whose time (a batch's first packet, a summary's end) is in
/// `from_ns..to_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Start, included (ns since the epoch).
    pub from_ns: u64,
    /// End, excluded.
    pub to_ns: u64,
}

impl Window {
    /// From `from_ns` on.
    pub fn since(from_ns: u64) -> Window {
        Window { from_ns, to_ns: u64::MAX }
    }

    fn args(&self) -> (i64, i64) {
        (i(self.from_ns), i(self.to_ns))
    }
}

/// One flow's loss records in a window (see [`flow_args`]).
const FLOW_IN: &str = "src = :src AND dst = :dst AND sport = :sport AND dport = :dport
    AND proto = :proto AND spi IS :spi AND si IS :si AND first_ns >= :from AND first_ns < :to";

/// The arguments of [`FLOW_IN`].
fn flow_args<'a>(f: &'a Flow, w: &'a (i64, i64)) -> [(&'static str, &'a dyn ToSql); 9] {
    [
        (":src", &f.src),
        (":dst", &f.dst),
        (":sport", &f.sport),
        (":dport", &f.dport),
        (":proto", &f.proto),
        (":spi", &f.spi),
        (":si", &f.si),
        (":from", &w.0),
        (":to", &w.1),
    ]
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

impl Sqlite {
    /// Opens (creating if needed) the database at `path`; `":memory:"` for a throw-away one.
    pub fn open(path: &Path) -> Result<Sqlite, StoreError> {
        let db = Connection::open(path)?;
        let deadline = Arc::new(AtomicU64::new(0));
        prepare(&db, &deadline)?;
        // A damaged file is refused at start, not discovered by the first query that touches
        // the damage (quick_check: every page and record, not the index contents).
        let check = db
            .query_row("PRAGMA quick_check", [], |r| r.get::<_, String>(0))
            .unwrap_or_else(|e| e.to_string());
        if check != "ok" {
            return Err(StoreError::Corrupt { path: path.to_path_buf(), detail: check });
        }
        db.pragma_update(None, "journal_mode", "WAL")?;
        db.pragma_update(None, "synchronous", "FULL")?;
        db.busy_timeout(std::time::Duration::from_secs(5))?;
        let had_flows = table_exists(&db, "flows")?;
        db.execute_batch(SCHEMA)?;
        migrate_flow_state(&db)?;
        if !had_flows {
            backfill_flows(&db)?;
        }
        // Databases written by an older collector get the columns added since, in the order
        // the schema has them (with their defaults for the rows already there).
        for (column, decl) in ADDED_COLUMNS {
            let has: bool = db.query_row(
                "SELECT COUNT(*) FROM pragma_table_info('loss') WHERE name = ?1",
                [column],
                |r| r.get::<_, i64>(0),
            )? > 0;
            if !has {
                db.execute_batch(&format!("ALTER TABLE loss ADD COLUMN {column} {decl}"))?;
            }
        }
        let in_memory = path.as_os_str() == ":memory:";
        let mut store = Sqlite {
            db,
            path: path.to_path_buf(),
            file: None,
            rows: Arc::default(),
            publishing: None,
            deadline,
        };
        if !in_memory {
            store.file = identity(path);
        }
        store.backfill_sums()?;
        let count = |t: &str| -> Result<u64, StoreError> {
            Ok(u(store.db.query_row(&format!("SELECT COUNT(*) FROM {t}"), [], |r| r.get(0))?))
        };
        store.rows[0].store(count("loss")?, Ordering::Relaxed);
        store.rows[1].store(count("other")?, Ordering::Relaxed);
        Ok(store)
    }

    /// `n` read-only connections to this database, each request's reading limited to
    /// `budget`; none for an in-memory database (its reads use this connection).
    pub fn readers(&self, n: usize, budget: Duration) -> Result<Readers, StoreError> {
        let mut conns = Vec::new();
        if self.file.is_some() {
            for _ in 0..n.max(1) {
                let db = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                // A WAL reader waits only while the writer recovers or restarts the log.
                db.busy_timeout(Duration::from_secs(5))?;
                let deadline = Arc::new(AtomicU64::new(0));
                prepare(&db, &deadline)?;
                conns.push(Mutex::new(Store::Sqlite(Sqlite {
                    db,
                    path: self.path.clone(),
                    file: self.file,
                    rows: self.rows.clone(),
                    publishing: None,
                    deadline,
                })));
            }
        }
        Ok(Readers { conns, budget })
    }

    /// A database from before the sums (`crate::rollup`) gets them filled, once: `flow_hours`
    /// from its batches, the others from `flow_hours`.
    fn backfill_sums(&mut self) -> Result<(), StoreError> {
        let empty = |t: &str| -> Result<bool, StoreError> {
            let q = format!("SELECT NOT EXISTS (SELECT 1 FROM {t})");
            Ok(self.db.query_row(&q, [], |r| r.get(0))?)
        };
        if empty("flow_hours")? && !empty("loss")? {
            self.db.execute(
                &format!(
                    "INSERT INTO flow_hours
                     SELECT first_ns / {HOUR_NS}, src, dst, sport, dport, proto,
                            COALESCE(spi, -1), COALESCE(si, -1), agent, point,
                            COALESCE(upstream, ''), scope, COUNT(*), SUM(lost > 0),
                            usum(COALESCE(expected, 0)), usum(lost), usum(uncertain),
                            MIN(first_ns), MAX(last_ns)
                     FROM loss GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12"
                ),
                [],
            )?;
        }
        if empty("flow_days")? && !empty("flow_hours")? {
            self.db.execute(DAYS_FROM_HOURS, [i64::MIN, i64::MAX])?;
        }
        if empty("segment_hours")? && !empty("flow_hours")? {
            self.db.execute(
                "INSERT INTO segment_hours
                 SELECT hour, agent, point, upstream, scope, proto, SUM(batches),
                        SUM(lossy_batches), usum(expected), usum(lost), usum(uncertain)
                 FROM flow_hours GROUP BY 1, 2, 3, 4, 5, 6",
                [],
            )?;
        }
        Ok(())
    }

    /// Whether the file opened is still the one at the path (not removed or replaced).
    pub fn check_file(&self) -> Result<(), StoreError> {
        match self.file {
            Some(f) if identity(&self.path) != Some(f) => Err(StoreError::Gone(self.path.clone())),
            _ => Ok(()),
        }
    }

    /// Whether the store can take writes and answer reads now.
    pub fn ready(&self) -> Result<(), StoreError> {
        self.check_file()?;
        self.db.query_row("SELECT 1", [], |_| Ok(()))?;
        Ok(())
    }

    /// From now on, every record stored from an agent also goes into the outbox (at most
    /// `max` rows), for a publisher to send to Kafka.
    pub fn publish(&mut self, max: u64) -> Result<Arc<Publishing>, StoreError> {
        let pending: i64 = self.db.query_row("SELECT COUNT(*) FROM outbox", [], |r| r.get(0))?;
        let p = Arc::new(Publishing {
            pending: AtomicU64::new(u(pending)),
            max,
            skipped: AtomicU64::new(0),
        });
        self.publishing = Some(p.clone());
        Ok(p)
    }

    /// Registers `agent` (or updates it on a new run).
    pub fn register(
        &mut self,
        agent: &str,
        version: &str,
        boot: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        self.check_file()?;
        self.db.execute(
            "INSERT INTO agents (agent, version, boot, first_seen_ns, last_seen_ns)
             VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (agent) DO UPDATE SET version = ?2, boot = ?3, last_seen_ns = ?4",
            params![agent, version, i(boot), i(now)],
        )?;
        Ok(())
    }

    /// The run `agent` registered last and when it was last heard from: (boot, last_seen_ns).
    pub fn registered(&self, agent: &str) -> Result<Option<(u64, u64)>, StoreError> {
        Ok(self
            .db
            .query_row("SELECT boot, last_seen_ns FROM agents WHERE agent = ?1", [agent], |r| {
                Ok((u(r.get(0)?), u(r.get(1)?)))
            })
            .optional()?)
    }

    /// Stores `records` numbered `seq`, `seq + 1`, … of `agent`'s run `boot`, durably, in one
    /// transaction; `export_dropped` is the agent's own count of records it had to drop. When
    /// publishing, the records stored now go into the outbox in the same transaction.
    pub fn ingest(
        &mut self,
        agent: &str,
        boot: u64,
        seq: u64,
        records: &[Record],
        export_dropped: u64,
        now: u64,
    ) -> Result<Stored, StoreError> {
        let numbered = records.iter().enumerate().map(|(n, r)| (seq.saturating_add(n as u64), r));
        let publishing = self.publishing.clone();
        self.store(agent, boot, numbered, Some(export_dropped), publishing.as_deref(), now)
    }

    /// Keeps what flow exporters' templates and options data taught the decoders
    /// (docs/flows.md), in one transaction; each row remembers when it was last written.
    pub fn remember_flow_state(&mut self, changes: &[Remembered]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        self.check_file()?;
        let now = i(crate::now_ns());
        let tx = self.db.transaction()?;
        for c in changes {
            match c {
                Remembered::Template(key, r) => {
                    let Some((ip, domain)) = flow_state_key(key) else { continue };
                    match r {
                        TemplateRecord::Define(t) => tx.execute(
                            "INSERT OR REPLACE INTO flow_state \
                             (exporter, domain, kind, id, options, value, seen_ns) \
                             VALUES (?1, ?2, 'template', ?3, ?4, ?5, ?6)",
                            params![ip, domain, t.id, t.options, t.to_bytes(), now],
                        )?,
                        TemplateRecord::Withdraw(id) => tx.execute(
                            "DELETE FROM flow_state WHERE exporter = ?1 AND domain = ?2 \
                             AND kind = 'template' AND id = ?3",
                            params![ip, domain, id],
                        )?,
                        TemplateRecord::WithdrawAll { options } => tx.execute(
                            "DELETE FROM flow_state WHERE exporter = ?1 AND domain = ?2 \
                             AND kind = 'template' AND options = ?3",
                            params![ip, domain, options],
                        )?,
                    };
                }
                Remembered::Sampler(key, sampler, rate) => {
                    let Some((ip, domain)) = flow_state_key(key) else { continue };
                    // No sampler (the domain's rate) is id -1; ids are kept bit for bit.
                    let id = sampler.map_or(-1, |s| s as i64);
                    tx.execute(
                        "INSERT OR REPLACE INTO flow_state \
                         (exporter, domain, kind, id, options, value, seen_ns) \
                         VALUES (?1, ?2, 'sampler', ?3, 0, ?4, ?5)",
                        params![ip, domain, id, rate, now],
                    )?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// What [`Store::remember_flow_state`] kept, newest first, at most `limit` rows, to give
    /// decoders back at start; rows that do not read (or were written by a collector that
    /// keyed templates by address alone) are skipped.
    pub fn flow_state(&self, limit: usize) -> Result<Vec<Remembered>, StoreError> {
        let mut q = self.db.prepare(
            "SELECT exporter, domain, kind, id, value FROM flow_state \
             ORDER BY seen_ns DESC LIMIT ?1",
        )?;
        let rows = q.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, rusqlite::types::Value>(4)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (session, domain, kind, id, value) = row?;
            let Some(key) = flow_state_domain(&session, domain) else { continue };
            match (kind.as_str(), value) {
                ("template", rusqlite::types::Value::Blob(b)) => {
                    if let Some(t) = Template::from_bytes(&b) {
                        out.push(Remembered::Template(key, TemplateRecord::Define(t)));
                    }
                }
                ("sampler", rusqlite::types::Value::Integer(rate)) => {
                    let sampler = (id != -1).then_some(id as u64);
                    let rate = u32::try_from(rate).unwrap_or(u32::MAX).max(1);
                    out.push(Remembered::Sampler(key, sampler, rate));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Deletes the flow state not written since `before_ns` (0: none by age), rows of the
    /// old address-only keying, and the oldest rows past `max_bytes` of values; returns how
    /// many rows went.
    pub fn prune_flow_state(&mut self, before_ns: u64, max_bytes: u64) -> Result<u64, StoreError> {
        let mut n = self.db.execute(
            "DELETE FROM flow_state WHERE seen_ns < ?1 OR domain < 4294967296",
            [i(before_ns)],
        )?;
        n += self.db.execute(
            "DELETE FROM flow_state WHERE (exporter, domain, kind, id) IN (
                SELECT exporter, domain, kind, id FROM (
                    SELECT exporter, domain, kind, id, SUM(length(value)) OVER (
                        ORDER BY seen_ns DESC, exporter, domain, kind, id
                        ROWS UNBOUNDED PRECEDING) AS total
                    FROM flow_state)
                WHERE total > ?1)",
            [i(max_bytes)],
        )?;
        Ok(n as u64)
    }

    /// Stores records read from Kafka, each numbered in `agent`'s run `boot` (not in order,
    /// not consecutive: a partition carries some of a run's records). The agent is registered
    /// if it was not. They are not published again.
    pub fn ingest_numbered(
        &mut self,
        agent: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        self.check_file()?;
        self.register_run(agent, "kafka", boot, now)?;
        let numbered = records.iter().map(|(s, r)| (*s, r));
        self.store(agent, boot, numbered, None, None, now)
    }

    /// Registers `agent` (as `version`) if it was not, and its run `boot` if newer, for
    /// records that come without a registration (from Kafka, from an exporter).
    fn register_run(
        &self,
        agent: &str,
        version: &str,
        boot: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        self.db.execute(
            "INSERT INTO agents (agent, version, boot, first_seen_ns, last_seen_ns)
             VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (agent) DO UPDATE SET boot = MAX(boot, ?3), last_seen_ns = ?4",
            params![agent, version, i(boot), i(now)],
        )?;
        Ok(())
    }

    /// Stores flows decoded from an exporter's datagrams, numbered in the flow listener's
    /// run `boot` for `exporter`, registering it if need be; published to Kafka like
    /// records an agent sent, when the collector publishes.
    pub fn ingest_flows(
        &mut self,
        exporter: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        self.check_file()?;
        self.register_run(exporter, "exporter", boot, now)?;
        // The one rule for counts (`validate::counts`): a record an exporter sent with a count
        // no reader could hold (a packetDeltaCount of 2^64 - 1) is refused, counted, and the
        // others stored.
        let (fit, refused): (Vec<_>, Vec<_>) =
            records.iter().partition(|(_, r)| crate::validate::counts(r).is_ok());
        let numbered = fit.into_iter().map(|(s, r)| (*s, r));
        let publishing = self.publishing.clone();
        let mut st = self.store(exporter, boot, numbered, None, publishing.as_deref(), now)?;
        st.refused = refused.len() as u64;
        Ok(st)
    }

    fn store<'r>(
        &mut self,
        agent: &str,
        boot: u64,
        records: impl Iterator<Item = (u64, &'r Record)>,
        export_dropped: Option<u64>,
        publishing: Option<&Publishing>,
        now: u64,
    ) -> Result<Stored, StoreError> {
        self.check_file()?;
        let tx = self.db.transaction()?;
        let mut st = Stored::default();
        let mut new_rows = (0, 0);
        let (mut published, mut unpublished) = (0u64, 0u64);
        {
            let mut loss = tx.prepare_cached(
                "INSERT OR IGNORE INTO loss (agent, boot, seq, port, point, upstream,
                    src, dst, sport, dport, proto, spi, si, color, batch, first_ns, last_ns,
                    expected, observed, lost, late, uncertain, scope, tail, drops, period_ns,
                    incomplete, ttl, own_colour)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29)",
            )?;
            let mut other = tx.prepare_cached(
                "INSERT OR IGNORE INTO other (agent, boot, seq, kind, time_ns, json)
                    VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut flows = tx.prepare_cached(
                "INSERT OR IGNORE INTO flows (time_ns, agent, boot, seq, port, point, direction,
                    src, dst, sport, dport, proto, packets, bytes, exact, error_bound)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?;
            let mut sums = crate::rollup::Rollup::default();
            let mut outbox = tx.prepare_cached(
                "INSERT INTO outbox (agent, boot, seq, kind, key, json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            for (seq, r) in records {
                let s = i(seq);
                // Every record but loss is kept whole, as JSON, under its kind and time.
                let mut as_other = |kind: &str, t: u64| {
                    let json = serde_json::to_string(r).unwrap_or_default();
                    other.execute(params![agent, i(boot), s, kind, i(t), json])
                };
                let added = match r {
                    Record::Loss(l) => loss.execute(params![
                        agent,
                        i(boot),
                        s,
                        l.port,
                        l.point,
                        l.upstream,
                        l.flow.src,
                        l.flow.dst,
                        l.flow.sport,
                        l.flow.dport,
                        l.flow.proto,
                        l.flow.spi,
                        l.flow.si,
                        l.color,
                        i(l.batch),
                        i(l.first_ns),
                        i(l.last_ns),
                        l.expected.map(i),
                        i(l.observed),
                        i(l.lost),
                        i(l.late),
                        i(l.uncertain),
                        l.scope.as_str(),
                        l.tail,
                        drops_json(&l.drops),
                        l.period_ns.map(i),
                        l.incomplete,
                        l.ttl,
                        i(l.own_colour),
                    ])?,
                    Record::Summary(x) => as_other("summary", x.interval_end_ns)?,
                    Record::FlowLoss(_) => as_other("flow_loss", now)?,
                    Record::Cost(_) => as_other("cost", now)?,
                    Record::Capture(_) => as_other("capture", now)?,
                    Record::Health(h) => as_other("health", h.interval_end_ns)?,
                    Record::Event(e) => as_other("event", e.time_ns)?,
                    Record::Flow(f) => {
                        let added = as_other("flow", f.window_end_ns)?;
                        // A flow record's key and counts in columns too, for the flow queries.
                        if added == 1 {
                            flows.execute(params![
                                i(f.window_end_ns),
                                agent,
                                i(boot),
                                s,
                                f.port,
                                f.point,
                                f.exported.direction.map(Direction::name),
                                f.flow.src,
                                f.flow.dst,
                                f.flow.sport,
                                f.flow.dport,
                                f.flow.proto,
                                i(f.packets),
                                i(f.bytes),
                                f.exact,
                                i(f.error_bound),
                            ])?;
                        }
                        added
                    }
                };
                if let (1, Some(p)) = (added, publishing) {
                    if p.pending.load(Ordering::Relaxed) + published < p.max {
                        let m = Message::new(r, Origin { agent: agent.into(), boot, seq });
                        let json = String::from_utf8_lossy(&m.payload);
                        outbox.execute(params![agent, i(boot), s, m.kind.name(), m.key, json])?;
                        published += 1;
                    } else {
                        unpublished += 1;
                    }
                }
                if let (1, Record::Loss(l)) = (added, r) {
                    sums.add(agent, l);
                    new_rows.0 += 1;
                } else if added == 1 {
                    new_rows.1 += 1;
                }
                if added == 1 {
                    st.accepted += 1;
                } else {
                    st.duplicates += 1;
                }
                st.new.push(added == 1);
            }
            add_sums(&tx, &sums)?;
            tx.execute(
                "UPDATE agents SET last_seen_ns = ?2, records = records + ?3,
                 export_dropped = COALESCE(?4, export_dropped) WHERE agent = ?1",
                params![agent, i(now), i(st.accepted), export_dropped.map(i)],
            )?;
        }
        tx.commit()?;
        self.rows[0].fetch_add(new_rows.0, Ordering::Relaxed);
        self.rows[1].fetch_add(new_rows.1, Ordering::Relaxed);
        if let Some(p) = publishing {
            p.pending.fetch_add(published, Ordering::Relaxed);
            p.skipped.fetch_add(unpublished, Ordering::Relaxed);
        }
        Ok(st)
    }

    /// Settles the segments between agents whose periods ended [`crate::settle::SETTLE_AFTER`]
    /// before `now_ns` and are not yet settled.
    pub fn settle(&mut self, now_ns: u64) -> Result<crate::settle::Pass, StoreError> {
        use crate::settle::{read_window, span, Pass};
        let settled: Option<i64> = self
            .db
            .query_row("SELECT upto_ns FROM settled WHERE name = 'links'", [], |r| r.get(0))
            .optional()?;
        let Some(((from, to), behind)) = span(settled.map(u), now_ns) else {
            return Ok(Pass::default());
        };
        let candidates = self.query(
            &crate::settle::crossing_flows(":from", ":to"),
            &[(":from", &i(from)), (":to", &i(to))],
            |r| Ok((flow_of(r)?, u(r.get(7)?))),
        )?;
        let mut slots = Vec::new();
        for (flow, period_ns) in candidates {
            let (from_ns, to_ns) = read_window(from, to, period_ns);
            let w = Window { from_ns, to_ns };
            slots.extend(crate::settle::slots(&flow, &self.points_in(&flow, w)?, from, to));
        }
        let tx = self.db.transaction()?;
        let mut sums = crate::rollup::Rollup::default();
        let mut stored = 0;
        {
            let mut st = tx.prepare_cached(
                "INSERT OR IGNORE INTO link_sums (slot_ns, src, dst, sport, dport, proto, spi, si,
                    agent, point, upstream, periods, lossy_periods, expected, lost, first_ns,
                    last_ns)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16,
                    ?17)",
            )?;
            for l in &slots {
                let f = &l.flow;
                let added = st.execute(params![
                    i(l.slot_ns),
                    f.src,
                    f.dst,
                    f.sport,
                    f.dport,
                    f.proto,
                    f.spi.map_or(-1, i64::from),
                    f.si.map_or(-1, i64::from),
                    l.agent,
                    l.point,
                    l.upstream,
                    i(l.periods),
                    i(l.lossy_periods),
                    i(l.expected),
                    i(l.lost),
                    i(l.first_ns),
                    i(l.last_ns),
                ])?;
                if added == 1 {
                    sums.add_link(l);
                    stored += 1;
                }
            }
            add_sums(&tx, &sums)?;
            tx.execute(
                "INSERT INTO settled (name, upto_ns) VALUES ('links', ?1)
                 ON CONFLICT DO UPDATE SET upto_ns = MAX(upto_ns, excluded.upto_ns)",
                [i(to)],
            )?;
        }
        tx.commit()?;
        Ok(Pass { slots: stored, behind })
    }

    /// Deletes records whose time is before `before_ns`; returns how many.
    pub fn expire(&mut self, before_ns: u64) -> Result<u64, StoreError> {
        let a = self.db.execute("DELETE FROM loss WHERE first_ns < ?1", [i(before_ns)])?;
        let b = self.db.execute("DELETE FROM other WHERE time_ns < ?1", [i(before_ns)])?;
        self.db.execute("DELETE FROM flows WHERE time_ns < ?1", [i(before_ns)])?;
        // Hours wholly before the cut go; the hour it falls in stays until it is whole. The
        // day it falls in is summed again from its hours kept, once some of them go (once an
        // hour), so a ranking never counts loss whose batches are gone.
        let (hour, day) = (i(before_ns / HOUR_NS), i(before_ns / DAY_NS));
        let tx = self.db.transaction()?;
        let going: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM flow_hours WHERE hour >= ?1 AND hour < ?2)",
            [day * 24, hour],
            |r| r.get(0),
        )?;
        tx.execute("DELETE FROM flow_hours WHERE hour < ?1", [hour])?;
        tx.execute("DELETE FROM segment_hours WHERE hour < ?1", [hour])?;
        tx.execute("DELETE FROM link_sums WHERE slot_ns < ?1", [i(before_ns)])?;
        tx.execute(
            "DELETE FROM flow_days WHERE day < ?1 OR (?2 AND day = ?1)",
            params![day, going],
        )?;
        if going {
            tx.execute(DAYS_FROM_HOURS, [day * 24, day * 24 + 24])?;
        }
        tx.commit()?;
        for (rows, gone) in self.rows.iter().zip([a as u64, b as u64]) {
            let _ = rows.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(gone))
            });
        }
        Ok((a + b) as u64)
    }

    /// The registered agents.
    pub fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        let mut q = self.db.prepare(
            "SELECT agent, version, boot, first_seen_ns, last_seen_ns, records, export_dropped
             FROM agents ORDER BY agent",
        )?;
        let rows = q.query_map([], |r| {
            Ok(Agent {
                agent: r.get(0)?,
                version: r.get(1)?,
                boot: u(r.get(2)?),
                first_seen_ns: u(r.get(3)?),
                last_seen_ns: u(r.get(4)?),
                records: u(r.get(5)?),
                export_dropped: u(r.get(6)?),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Flows with batches in `w` (only those with loss or uncertain loss when `lossy_only`),
    /// most lost first, `limit` of them after skipping `offset`; each flow's figures cover its
    /// whole path, each segment once: ranked by their path loss
    /// ([`crate::path::path_loss`]), then summed over their segments.
    pub fn flows(
        &self,
        w: Window,
        lossy_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<FlowSummary>, StoreError> {
        // The whole hours `w` touches (its whole days from the daily sums): the ranking may
        // count a little outside `w`; the figures of the flows listed are then read exactly,
        // from their batches.
        const COLUMNS: &str = "src, dst, sport, dport, proto, spi, si, agent, point, upstream,
            scope, lossy_batches, lost, uncertain, first_ns, last_ns, expected";
        let mut q = self.db.prepare_cached(&format!(
            "SELECT src, dst, sport, dport, proto, NULLIF(spi, -1), NULLIF(si, -1), agent, point,
                    NULLIF(upstream, ''), scope, SUM(lossy_batches), usum(lost), usum(uncertain),
                    MIN(first_ns), MAX(last_ns)
                    , usum(expected)
             FROM (SELECT {COLUMNS} FROM flow_days WHERE day >= ?1 AND day <= ?2
                   UNION ALL SELECT {COLUMNS} FROM flow_hours WHERE hour >= ?3 AND hour <= ?4
                   UNION ALL SELECT {COLUMNS} FROM flow_hours WHERE hour >= ?5 AND hour <= ?6)
             GROUP BY src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope
             HAVING ?7 = 0 OR MAX(lost) > 0 OR MAX(uncertain) > 0
             ORDER BY src, dst, sport, dport, proto, spi, si"
        ))?;
        let s = crate::rollup::split_hours(
            i(w.from_ns / HOUR_NS),
            i(w.to_ns.saturating_sub(1) / HOUR_NS),
        );
        let (d, b, a) = (s.days, s.before, s.after);
        let args = params![d.0, d.1, b.0, b.1, a.0, a.1, lossy_only];
        let rows = q.query_map(args, |r| {
            let p = PointRecords {
                agent: r.get(7)?,
                point: r.get(8)?,
                upstream: r.get(9)?,
                scope: scope_of(&r.get::<_, String>(10)?),
                lossy_batches: u(r.get(11)?),
                lost: u(r.get(12)?),
                uncertain: u(r.get(13)?),
                ..PointRecords::default()
            };
            let expected = u(r.get(16)?);
            Ok((flow_of(r)?, PointRecords { expected, ..p }, u(r.get(14)?), u(r.get(15)?)))
        })?;
        let rows = rows.collect::<Result<Vec<_>, _>>()?;
        flows_of(rows, lossy_only, offset, limit, |f| self.points_in(f, w))
    }

    /// Loss records of every flow summed per segment and time bucket: from the records in
    /// buckets shorter than an hour, else from the hourly sums (`crate::overview`).
    pub fn overview(
        &self,
        q: &crate::overview::OverviewQuery,
    ) -> Result<Vec<crate::overview::OverviewRow>, StoreError> {
        use crate::overview::{OverviewRow, OverviewSource, Sums};
        let sql = match q.source() {
            OverviewSource::Batches => {
                "SELECT agent, point, upstream, scope, (first_ns / :bucket) * :bucket AS t,
                        COUNT(*), SUM(lost > 0), usum(COALESCE(expected, 0)),
                        usum(lost), usum(uncertain)
                 FROM loss
                 WHERE first_ns >= :from AND first_ns < :to
                   AND (:agent IS NULL OR agent = :agent) AND (:proto IS NULL OR proto = :proto)
                 GROUP BY agent, point, upstream, scope, t
                 UNION ALL
                 SELECT agent, point, upstream, 'link', (slot_ns / :bucket) * :bucket AS t,
                        SUM(periods), SUM(lossy_periods), usum(expected), usum(lost), 0
                 FROM link_sums
                 WHERE slot_ns >= :from AND slot_ns < :to
                   AND (:agent IS NULL OR agent = :agent) AND (:proto IS NULL OR proto = :proto)
                 GROUP BY agent, point, upstream, t"
            }
            OverviewSource::HourlySums => {
                "SELECT agent, point, NULLIF(upstream, ''), scope,
                        ((hour * :hour) / :bucket) * :bucket AS t,
                        SUM(batches), SUM(lossy_batches), usum(expected), usum(lost),
                        usum(uncertain)
                 FROM segment_hours
                 WHERE hour >= :from AND hour <= :to
                   AND (:agent IS NULL OR agent = :agent) AND (:proto IS NULL OR proto = :proto)
                 GROUP BY agent, point, upstream, scope, t"
            }
        };
        let (from, to) = match q.source() {
            OverviewSource::Batches => q.window.args(),
            OverviewSource::HourlySums => {
                let (a, b) = q.hours();
                (i(a), i(b))
            }
        };
        let (bucket, hour) = (i(q.bucket_ns.max(1)), i(HOUR_NS));
        let proto = q.proto.map(i64::from);
        let mut args: Vec<(&str, &dyn ToSql)> = vec![
            (":bucket", &bucket),
            (":from", &from),
            (":to", &to),
            (":agent", &q.agent),
            (":proto", &proto),
        ];
        if q.source() == OverviewSource::HourlySums {
            args.push((":hour", &hour));
        }
        self.query(sql, &args, |r| {
            Ok(OverviewRow {
                agent: r.get(0)?,
                point: r.get(1)?,
                upstream: r.get(2)?,
                scope: crate::overview::SegmentScope::of(&r.get::<_, String>(3)?),
                t_ns: u(r.get(4)?),
                sums: Sums {
                    batches: u(r.get(5)?),
                    lossy_batches: u(r.get(6)?),
                    expected: u(r.get(7)?),
                    lost: u(r.get(8)?),
                    uncertain: u(r.get(9)?),
                },
            })
        })
    }

    /// `flow`'s loss per agent and point in buckets of `bucket_ns`, in `w`.
    pub fn series(
        &self,
        flow: &Flow,
        w: Window,
        bucket_ns: u64,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        let sql = format!(
            "SELECT agent, point, (first_ns / :bucket) * :bucket AS t, COUNT(*),
                    usum(COALESCE(expected, 0)), usum(lost), usum(late), MAX(scope), usum(uncertain)
             FROM loss WHERE {FLOW_IN} GROUP BY agent, point, t ORDER BY t, agent, point"
        );
        let (bucket, range) = (i(bucket_ns.max(1)), w.args());
        let mut args = flow_args(flow, &range).to_vec();
        args.push((":bucket", &bucket));
        self.query(&sql, &args, |r| {
            Ok(SeriesPoint {
                agent: r.get(0)?,
                point: r.get(1)?,
                t_ns: u(r.get(2)?),
                batches: u(r.get(3)?),
                expected: u(r.get(4)?),
                lost: u(r.get(5)?),
                late: u(r.get(6)?),
                scope: scope_of(&r.get::<_, String>(7)?),
                uncertain: u(r.get(8)?),
            })
        })
    }

    /// `flow`'s loss records since `since_ns`, per point, each point's batches in order of
    /// first packet.
    pub fn points(&self, flow: &Flow, since_ns: u64) -> Result<Vec<PointRecords>, StoreError> {
        self.points_in(flow, Window::since(since_ns))
    }

    /// `flow`'s loss records in `w`, per point, each point's batches in order of first packet.
    pub fn points_in(&self, flow: &Flow, w: Window) -> Result<Vec<PointRecords>, StoreError> {
        let sql = format!(
            "SELECT agent, point, port, upstream, scope, color, first_ns, last_ns, observed,
                    late, COALESCE(expected, 0), lost, uncertain, tail, drops, boot, batch,
                    period_ns, incomplete, ttl, own_colour
             FROM loss WHERE {FLOW_IN} ORDER BY agent, point, first_ns, seq"
        );
        let range = w.args();
        let rows = self.query(&sql, &flow_args(flow, &range), |r| {
            let number = u(r.get(16)?);
            let period = r.get::<_, Option<i64>>(17)?.map(u).filter(|t| *t > 0);
            Ok(LossRow {
                agent: r.get(0)?,
                point: r.get(1)?,
                port: r.get(2)?,
                upstream: r.get(3)?,
                scope: r.get(4)?,
                batch: Batch {
                    color: r.get(5)?,
                    first_ns: u(r.get(6)?),
                    last_ns: u(r.get(7)?),
                    observed: u(r.get(8)?),
                    late: u(r.get(9)?),
                    boot: u(r.get(15)?),
                    period: period.map(|length_ns| Period { length_ns, number }),
                    incomplete: r.get(18)?,
                },
                expected: u(r.get(10)?),
                lost: u(r.get(11)?),
                uncertain: u(r.get(12)?),
                tail: r.get(13)?,
                drops: r.get(14)?,
                ttl: r.get(19)?,
                own_colour: u(r.get(20)?),
            })
        })?;
        Ok(points_of(rows))
    }

    /// Each agent's health since `since_ns`: its `health` records' counters summed, per point
    /// too; `flows`, `capacity` and `export_dropped` as the latest record has them.
    pub fn health(&self, since_ns: u64) -> Result<Vec<HealthRecord>, StoreError> {
        let rows = self.query(
            "SELECT json FROM other WHERE kind = 'health' AND time_ns >= :since
             ORDER BY agent, time_ns, seq",
            &[(":since", &i(since_ns))],
            |r| r.get::<_, String>(0),
        )?;
        Ok(health_of(rows))
    }

    /// INT events in `w`, newest first, at most `limit`, optionally of one detector or flow.
    pub fn events(
        &self,
        w: Window,
        detector: Option<&str>,
        agent: Option<&str>,
        flow: Option<&Flow>,
        limit: u64,
    ) -> Result<Vec<EventRecord>, StoreError> {
        // The filters in SQL, so the limit counts matching events only.
        let src = flow.map(|f| f.src.as_str());
        let dst = flow.map(|f| f.dst.as_str());
        let ports = flow.map(|f| (i64::from(f.sport), i64::from(f.dport), i64::from(f.proto)));
        let rows = self.query(
            "SELECT json FROM other WHERE kind = 'event' AND time_ns >= :from AND time_ns < :to
               AND (:det IS NULL OR json_extract(json, '$.detector') = :det)
               AND (:agent IS NULL OR agent = :agent)
               AND (:src IS NULL OR (json_extract(json, '$.flow.src') = :src
                    AND json_extract(json, '$.flow.dst') = :dst
                    AND json_extract(json, '$.flow.sport') = :sport
                    AND json_extract(json, '$.flow.dport') = :dport
                    AND json_extract(json, '$.flow.proto') = :proto))
             ORDER BY time_ns DESC, agent, seq LIMIT :limit",
            &[
                (":from", &i(w.from_ns)),
                (":to", &i(w.to_ns)),
                (":det", &detector),
                (":agent", &agent),
                (":src", &src),
                (":dst", &dst),
                (":sport", &ports.map(|p| p.0)),
                (":dport", &ports.map(|p| p.1)),
                (":proto", &ports.map(|p| p.2)),
                (":limit", &i(limit)),
            ],
            |r| r.get::<_, String>(0),
        )?;
        Ok(events_of(rows))
    }

    /// Whether any `flow` record in `w` was observed at egress ([`counted_once`]).
    fn egress_in(&self, w: Window) -> Result<bool, StoreError> {
        let found = self.query(
            "SELECT EXISTS (SELECT 1 FROM flows
               WHERE direction = 'egress' AND time_ns >= :from AND time_ns < :to)",
            &[(":from", &i(w.from_ns)), (":to", &i(w.to_ns))],
            |r| r.get::<_, bool>(0),
        )?;
        Ok(found.first().copied().unwrap_or(true))
    }

    /// The `limit` flows with the most bytes or packets in window `w`, summed over the `flow`
    /// records that match `filter`; a sampled total's `error_bound` adds its records' bounds
    /// in quadrature (independent samples).
    pub fn top_talkers(
        &self,
        w: Window,
        filter: &TopFilter<'_>,
        by: TopBy,
        limit: u64,
    ) -> Result<Vec<TopTalker>, StoreError> {
        let order = match by {
            TopBy::Bytes => "bytes DESC, packets DESC",
            TopBy::Packets => "packets DESC, bytes DESC",
        };
        // Each flow counted once per observation point ([`counted_once`]).
        let sql = format!(
            "{}
             SELECT src, dst, sport, dport, proto, usum(packets) AS packets,
                    usum(bytes) AS bytes, SUM(records), MIN(exact), TOTAL(var)
             FROM kept GROUP BY 1, 2, 3, 4, 5 ORDER BY {order} LIMIT :limit",
            counted_once(
                self.egress_in(w)?,
                "time_ns >= :from AND time_ns < :to
                 AND (:exporter IS NULL OR agent = :exporter)
                 AND (:interface IS NULL OR port = :interface)
                 AND (:point IS NULL OR point = :point)"
            )
        );
        self.query(
            &sql,
            &[
                (":from", &i(w.from_ns)),
                (":to", &i(w.to_ns)),
                (":exporter", &filter.exporter),
                (":interface", &filter.interface),
                (":point", &filter.point),
                (":limit", &i(limit)),
            ],
            |r| {
                Ok(TopTalker {
                    flow: Flow {
                        src: r.get(0)?,
                        dst: r.get(1)?,
                        sport: r.get(2)?,
                        dport: r.get(3)?,
                        proto: r.get(4)?,
                        spi: None,
                        si: None,
                    },
                    packets: u(r.get(5)?),
                    bytes: u(r.get(6)?),
                    records: u(r.get(7)?),
                    exact: r.get::<_, Option<i64>>(8)?.unwrap_or(0) != 0,
                    error_bound: r.get::<_, Option<f64>>(9)?.unwrap_or(0.0).sqrt().round() as u64,
                })
            },
        )
    }

    /// The `flow` records that match `filter` and end in window `w`, oldest first (then in
    /// the order stored), `limit` of them after `after` (the last of the page before), each
    /// with its own place to continue from.
    pub fn flow_records(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
        after: Option<&RecordCursor>,
        limit: u64,
    ) -> Result<Vec<(FlowRecord, RecordCursor)>, StoreError> {
        // The table's own order: a page starts where the last one ended, without counting the
        // rows before it.
        let sql = format!(
            "SELECT (SELECT json FROM other o
                     WHERE o.agent = f.agent AND o.boot = f.boot AND o.seq = f.seq),
                    time_ns, agent, boot, seq
             FROM flows f WHERE {RECORDS_MATCH}
               AND (:after_time IS NULL
                    OR (time_ns, agent, boot, seq) > (:after_time, :after_agent, :after_boot,
                                                      :after_seq))
             ORDER BY time_ns, agent, boot, seq LIMIT :limit"
        );
        let (from, to, limit) = (i(w.from_ns), i(w.to_ns), i(limit));
        let mut args = filter.args(&from, &to);
        args.push((":limit", &limit));
        let at = after.map(|c| (c.time_ns, c.agent.as_str(), c.boot, c.seq));
        let (t, a, bt, sq) = (at.map(|c| c.0), at.map(|c| c.1), at.map(|c| c.2), at.map(|c| c.3));
        args.push((":after_time", &t));
        args.push((":after_agent", &a));
        args.push((":after_boot", &bt));
        args.push((":after_seq", &sq));
        let rows = self.query(&sql, &args, |r| {
            Ok((
                r.get::<_, Option<String>>(0)?,
                RecordCursor {
                    time_ns: r.get(1)?,
                    agent: r.get(2)?,
                    boot: r.get(3)?,
                    seq: r.get(4)?,
                },
            ))
        })?;
        // Stored only after it parsed as a record: a row that does not is skipped.
        Ok(rows
            .into_iter()
            .filter_map(|(json, c)| match serde_json::from_str::<Record>(json.as_deref()?) {
                Ok(Record::Flow(f)) => Some((f, c)),
                _ => None,
            })
            .collect())
    }

    /// What the `flow` records that match `filter` in window `w` add up to, each flow counted
    /// once per observation point ([`counted_once`]).
    pub fn flow_totals(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
    ) -> Result<FlowTotals, StoreError> {
        let sql = format!(
            "{}
             SELECT (SELECT COALESCE(SUM(records), 0) FROM per), COALESCE(SUM(records), 0),
                    COALESCE(usum(packets), 0), COALESCE(usum(bytes), 0)
             FROM kept",
            counted_once(self.egress_in(w)?, RECORDS_MATCH)
        );
        let (from, to) = (i(w.from_ns), i(w.to_ns));
        let t = self.query(&sql, &filter.args(&from, &to), |r| {
            Ok(FlowTotals {
                records: u(r.get(0)?),
                counted: u(r.get(1)?),
                packets: u(r.get(2)?),
                bytes: u(r.get(3)?),
            })
        })?;
        Ok(t.into_iter().next().unwrap_or_default())
    }

    /// Frames `agent`'s own receive rings dropped since `since_ns`, from its health records.
    pub fn ring_drops(&self, agent: &str, since_ns: u64) -> Result<u64, StoreError> {
        let n: i64 = self.db.query_row(
            "SELECT COALESCE(usum(json_extract(json, '$.rx_ring_drops')), 0) FROM other
             WHERE agent = ?1 AND kind = 'health' AND time_ns >= ?2",
            params![agent, i(since_ns)],
            |r| r.get(0),
        )?;
        Ok(u(n))
    }

    fn query<T>(
        &self,
        sql: &str,
        args: &[(&str, &dyn ToSql)],
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let mut q = self.db.prepare_cached(sql)?;
        let rows = q.query_map(args, row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Records stored, per table.
    pub fn counts(&self) -> Result<(u64, u64), StoreError> {
        Ok((self.rows[0].load(Ordering::Relaxed), self.rows[1].load(Ordering::Relaxed)))
    }
}

/// Per flow and point, its sums in a window (`flow_days` and `flow_hours`): the flow, the
/// point's figures, its first and last batch time.
pub(crate) type HourRow = (Flow, PointRecords, u64, u64);

/// The flows of `rows` (ordered by flow) ranked most lost first, `limit` of them after
/// `offset`, each flow's figures covering its whole path, each segment once: ranked by their
/// path loss ([`crate::path::path_loss`]), then read exactly from the batches of the
/// window (`points_in`) and summed over their segments.
pub(crate) fn flows_of(
    rows: Vec<HourRow>,
    lossy_only: bool,
    offset: usize,
    limit: usize,
    points_in: impl Fn(&Flow) -> Result<Vec<PointRecords>, StoreError>,
) -> Result<Vec<FlowSummary>, StoreError> {
    let mut out: Vec<FlowSummary> = Vec::new();
    let mut points: Vec<PointRecords> = Vec::new();
    let finish = |out: &mut Vec<FlowSummary>, points: &mut Vec<PointRecords>| {
        if let Some(f) = out.last_mut() {
            (f.lost, f.uncertain) = crate::path::path_loss(points);
            f.packets = points.iter().map(|p| p.expected).max().unwrap_or(0);
            f.lossy_batches = points.iter().map(|p| p.lossy_batches).max().unwrap_or(0);
        }
        points.clear();
    };
    for (flow, p, first, last) in rows {
        match out.last_mut() {
            Some(f) if f.flow == flow => {
                f.first_ns = f.first_ns.min(first);
                f.last_ns = f.last_ns.max(last);
            }
            _ => {
                finish(&mut out, &mut points);
                out.push(FlowSummary {
                    flow,
                    lossy_batches: 0,
                    packets: 0,
                    lost: 0,
                    uncertain: 0,
                    ratio: 0.0,
                    first_ns: first,
                    last_ns: last,
                });
            }
        }
        points.push(p);
    }
    finish(&mut out, &mut points);
    let rank = |a: &FlowSummary, b: &FlowSummary| {
        b.lost.cmp(&a.lost).then(b.uncertain.cmp(&a.uncertain)).then(b.packets.cmp(&a.packets))
    };
    out.sort_by(rank);
    let out: Vec<FlowSummary> = out.into_iter().skip(offset).take(limit).collect();
    // The listed flows' figures from their segments, which line batches up where the
    // points report every batch (path figures against B miss a flow's last batch).
    // A flow counted in the hours but with no batch in `w` itself (or none lossy, when
    // only lossy ones are asked for) is left out: a page may then hold fewer than `limit`.
    let mut exact = Vec::with_capacity(out.len());
    for mut f in out {
        let points = points_in(&f.flow)?;
        if points.is_empty() {
            continue;
        }
        let segs = crate::path::segments(&points);
        f.lost = segs.iter().fold(0, |a, s| a.saturating_add(s.lost));
        f.uncertain = segs.iter().fold(0, |a, s| a.saturating_add(s.uncertain));
        f.packets = points.iter().map(|p| p.expected).max().unwrap_or(0);
        f.ratio = if f.packets > 0 { f.lost as f64 / f.packets as f64 } else { 0.0 };
        if !lossy_only || f.lost > 0 || f.uncertain > 0 {
            exact.push(f);
        }
    }
    Ok(exact)
}

/// One stored loss batch as the queries read it (either database).
pub(crate) struct LossRow {
    pub agent: String,
    pub point: String,
    pub port: String,
    pub upstream: Option<String>,
    pub scope: String,
    pub batch: Batch,
    pub expected: u64,
    pub lost: u64,
    pub uncertain: u64,
    pub tail: bool,
    /// The drop reasons as stored ([`drops_json`]).
    pub drops: Option<String>,
    /// The flow's TTL at the point, if known.
    pub ttl: Option<u8>,
    /// Packets a marker left as their sender coloured them.
    pub own_colour: u64,
}

/// A flow's loss batches, ordered by (agent, point, first_ns, seq), grouped per point: each
/// point's batches in order of first packet, its sums, and its drop reasons.
pub(crate) fn points_of(rows: Vec<LossRow>) -> Vec<PointRecords> {
    let mut out: Vec<PointRecords> = Vec::new();
    for row in rows {
        let p = match out.last_mut() {
            Some(p) if p.agent == row.agent && p.point == row.point => p,
            _ => {
                out.push(PointRecords {
                    agent: row.agent,
                    point: row.point,
                    port: row.port,
                    upstream: row.upstream,
                    scope: scope_of(&row.scope),
                    ..PointRecords::default()
                });
                let Some(p) = out.last_mut() else { break };
                p
            }
        };
        p.batches.push(row.batch);
        p.ended = row.tail;
        p.expected = p.expected.saturating_add(row.expected);
        p.lost = p.lost.saturating_add(row.lost);
        p.uncertain = p.uncertain.saturating_add(row.uncertain);
        p.lossy_batches += u64::from(row.lost > 0);
        p.every_batch |= row.lost == 0 && row.uncertain == 0;
        p.ttl = p.ttl.or(row.ttl);
        p.own_colour = p.own_colour.saturating_add(row.own_colour);
        for (reason, n) in row.drops.as_deref().map(drops_from_json).unwrap_or_default() {
            let e = p.drops.entry(reason).or_default();
            *e = e.saturating_add(n);
        }
    }
    for p in &mut out {
        p.every_batch |= crate::path::unbroken(&p.batches);
    }
    out
}

/// Stored `health` records (JSON, ordered by agent, time, seq) summed per agent, per point
/// too; `flows`, `capacity` and `export_dropped` as the latest record has them.
pub(crate) fn health_of(rows: Vec<String>) -> Vec<HealthRecord> {
    let mut out: Vec<HealthRecord> = Vec::new();
    for json in rows {
        // Stored only after it parsed as a record: a row that does not is skipped.
        let Ok(Record::Health(h)) = serde_json::from_str::<Record>(&json) else { continue };
        let sum = match out.last_mut() {
            Some(s) if s.agent == h.agent => s,
            _ => {
                out.push(HealthRecord {
                    agent: h.agent.clone(),
                    interval_start_ns: h.interval_start_ns,
                    ..HealthRecord::default()
                });
                let Some(s) = out.last_mut() else { break };
                s
            }
        };
        sum.interval_end_ns = h.interval_end_ns;
        // Saturating: a sum of stored counts is never wrapped round.
        sum.rx = sum.rx.saturating_add(h.rx);
        sum.rx_ring_drops = sum.rx_ring_drops.saturating_add(h.rx_ring_drops);
        sum.tx_drops = sum.tx_drops.saturating_add(h.tx_drops);
        sum.events_lost = sum.events_lost.saturating_add(h.events_lost);
        sum.export_dropped = h.export_dropped;
        for p in h.points {
            let at = sum.points.iter().position(|q| q.point == p.point && q.port == p.port);
            let q = match at {
                Some(k) => &mut sum.points[k],
                None => {
                    sum.points.push(PointHealth {
                        point: p.point.clone(),
                        port: p.port.clone(),
                        ..PointHealth::default()
                    });
                    let Some(q) = sum.points.last_mut() else { break };
                    q
                }
            };
            q.flows_admitted = q.flows_admitted.saturating_add(p.flows_admitted);
            q.flows_evicted = q.flows_evicted.saturating_add(p.flows_evicted);
            q.packets_refused = q.packets_refused.saturating_add(p.packets_refused);
            q.packets_unselected = q.packets_unselected.saturating_add(p.packets_unselected);
            (q.flows, q.capacity) = (p.flows, p.capacity);
        }
    }
    out
}

/// Stored `event` records (JSON) back.
pub(crate) fn events_of(rows: Vec<String>) -> Vec<EventRecord> {
    // Stored only after it parsed as a record: a row that does not is skipped.
    rows.iter()
        .filter_map(|json| match serde_json::from_str::<Record>(json) {
            Ok(Record::Event(e)) => Some(e),
            _ => None,
        })
        .collect()
}

/// A stored scope back (anything unknown, as old rows have none, is a segment).
/// A stored scope as a record's. A settled segment between agents (scope `link` in the sums,
/// `crate::settle`) reads as a segment whose upstream point is not in its agent: in a flow's
/// ranking its loss counts as its own.
pub(crate) fn scope_of(s: &str) -> Scope {
    if s == Scope::Path.as_str() {
        Scope::Path
    } else {
        Scope::Segment
    }
}

fn flow_of(r: &rusqlite::Row<'_>) -> rusqlite::Result<Flow> {
    Ok(Flow {
        src: r.get(0)?,
        dst: r.get(1)?,
        sport: r.get(2)?,
        dport: r.get(3)?,
        proto: r.get(4)?,
        spi: r.get(5)?,
        si: r.get(6)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Store {
        fn sqlite(&self) -> &Sqlite {
            match self {
                Store::Sqlite(s) => s,
                Store::Postgres(_) => panic!("a SQLite store"),
            }
        }
    }
    use telemark_core::records::{FlowRecord, LossRecord};

    fn flow_record(sport: u16, packets: u64) -> Record {
        Record::Flow(FlowRecord {
            agent: "192.0.2.1".into(),
            port: "1".into(),
            point: "ipfix".into(),
            flow: Flow {
                src: "10.0.0.1".into(),
                dst: "10.0.0.2".into(),
                sport,
                dport: 80,
                proto: 6,
                spi: None,
                si: None,
            },
            window_start_ns: 1_000,
            window_end_ns: 2_000,
            packets,
            bytes: packets,
            exact: true,
            error_bound: 0,
            truth_packets: None,
            truth_bytes: None,
            exported: Default::default(),
            heavy: Default::default(),
        })
    }

    #[test]
    fn readers_are_their_own_connections_and_one_too_many_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = Mutex::new(Store::Sqlite(Sqlite::open(&path).unwrap()));
        let readers = writer.lock().unwrap().readers(2, DEFAULT_QUERY_BUDGET).unwrap();
        assert_eq!(readers.len(), 2);
        let a = readers.get(&writer).unwrap();
        let b = readers.get(&writer).unwrap();
        assert!(matches!(readers.get(&writer), Err(StoreError::Busy { readers: 2 })));
        // Both readers held, the writer is free and writes; the readers see it once committed.
        writer.lock().unwrap().register("a", "1", 7, 0).unwrap();
        assert_eq!(a.agents().unwrap().len(), 1);
        // A reader cannot write.
        assert!(a.sqlite().db.execute("DELETE FROM agents", []).is_err());
        drop((a, b));
        assert!(readers.get(&writer).is_ok());
        // In memory there is no second connection: reads take the writer's.
        let mem = Mutex::new(Store::Sqlite(Sqlite::open(Path::new(":memory:")).unwrap()));
        let none = mem.lock().unwrap().readers(2, DEFAULT_QUERY_BUDGET).unwrap();
        assert!(none.is_empty());
        let r = none.get(&mem).unwrap();
        assert!(mem.try_lock().is_err(), "the reader holds the writer's connection");
        drop(r);
        assert!(mem.try_lock().is_ok());
    }

    /// Batch `b` of UDP flow 10.0.0.1:`sport` → 10.0.0.2:80 at agent a's ingress, measured
    /// from the marking, begun at `first_ns`, `lost` of 100 lost.
    fn loss_record(b: u64, sport: u16, first_ns: u64, lost: u64) -> Record {
        Record::Loss(LossRecord {
            agent: "a".into(),
            port: "1".into(),
            point: "ingress".into(),
            upstream: None,
            flow: Flow {
                src: "10.0.0.1".into(),
                dst: "10.0.0.2".into(),
                sport,
                dport: 80,
                proto: 17,
                spi: None,
                si: None,
            },
            color: (b % 2) as u8,
            batch: b,
            period_ns: None,
            first_ns,
            last_ns: first_ns + 1,
            expected: Some(100),
            observed: 100 - lost,
            lost,
            late: 0,
            uncertain: 0,
            scope: Scope::Path,
            tail: false,
            incomplete: false,
            drops: Vec::new(),
            ttl: None,
            own_colour: 0,
        })
    }

    /// A database from before the daily and per-segment sums gets them from its hourly sums
    /// when opened: the same flows list and overview as sums written with the records.
    #[test]
    fn sums_added_later_are_filled_from_the_hourly_ones() {
        const HOUR: u64 = crate::rollup::HOUR_NS;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let batch = |b: u64, sport: u16, lost: u64| {
            loss_record(b, sport, 30 * 24 * HOUR + b * 7 * HOUR, lost)
        };
        let recs: Vec<Record> = (0..40).map(|b| batch(b, 1 + (b % 3) as u16, b % 5)).collect();
        let w = Window { from_ns: 30 * 24 * HOUR + 5 * HOUR, to_ns: 38 * 24 * HOUR };
        let q = crate::overview::OverviewQuery {
            window: w,
            bucket_ns: 24 * HOUR,
            agent: None,
            proto: None,
        };
        let answers = |s: &Sqlite| {
            let flows: Vec<_> =
                s.flows(w, true, 0, 10).unwrap().into_iter().map(|f| (f.flow, f.lost)).collect();
            let mut o = s.overview(&q).unwrap();
            o.sort_by_key(|r| (r.agent.clone(), r.point.clone(), r.t_ns));
            (flows, o)
        };
        let want = {
            let mut s = Sqlite::open(&path).unwrap();
            s.register("a", "1", 1, 0).unwrap();
            s.ingest("a", 1, 0, &recs, 0, 1).unwrap();
            let want = answers(&s);
            assert!(want.0.len() == 3 && !want.1.is_empty(), "{want:?}");
            s.db.execute_batch("DELETE FROM flow_days; DELETE FROM segment_hours").unwrap();
            want
        };
        assert_eq!(answers(&Sqlite::open(&path).unwrap()), want);
    }

    /// Retention inside a day: the day's sums lose the hours whose batches went, so a ranking
    /// over that day does not put a flow first for loss no longer stored.
    #[test]
    fn retention_takes_the_hours_it_deletes_out_of_their_day() {
        const HOUR: u64 = crate::rollup::HOUR_NS;
        let day = 40 * 24 * HOUR;
        let lossy = |b: u64, sport: u16, hour: u64, lost: u64| {
            loss_record(b, sport, day + hour * HOUR, lost)
        };
        let mut s = Sqlite::open(Path::new(":memory:")).unwrap();
        s.register("a", "1", 1, 0).unwrap();
        s.ingest("a", 1, 0, &[lossy(0, 1, 2, 50), lossy(1, 2, 12, 10)], 0, 1).unwrap();
        assert_eq!(s.expire(day + 5 * HOUR).unwrap(), 1);
        // The window is two whole days: read from the daily sums.
        let w = Window { from_ns: day, to_ns: day + 48 * HOUR };
        let top: Vec<_> =
            s.flows(w, true, 0, 1).unwrap().into_iter().map(|f| (f.flow.sport, f.lost)).collect();
        assert_eq!(top, [(2, 10)]);
        // Another pass in the same hour changes nothing; the day goes once wholly past.
        s.expire(day + 5 * HOUR + 1).unwrap();
        assert_eq!(s.flows(w, true, 0, 5).unwrap().len(), 1);
        s.expire(day + 24 * HOUR).unwrap();
        assert!(s.flows(w, true, 0, 5).unwrap().is_empty());
    }

    #[test]
    fn a_query_past_its_budget_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let writer = Mutex::new(Store::Sqlite(Sqlite::open(&path).unwrap()));
        let readers = writer.lock().unwrap().readers(1, Duration::from_millis(1)).unwrap();
        let r = readers.get(&writer).unwrap();
        // Far more than 1 ms of work (a billion-row recursive count).
        let slow = r.sqlite().db.query_row(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 1e9)
             SELECT COUNT(*) FROM c",
            [],
            |row| row.get::<_, i64>(0),
        );
        assert!(matches!(StoreError::from(slow.unwrap_err()), StoreError::OverBudget));
        drop(r);
        // The writer has no budget: the same statement there is not stopped by one.
        assert_eq!(writer.lock().unwrap().sqlite().deadline.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn sums_of_stored_counts_never_fail_nor_wrap() {
        // Rows a collector stored before counts were held to 2^53 - 1 (and Kafka-era rows):
        // SQLite's SUM failed on them ("integer overflow", "Invalid column type Real").
        let mut s = Sqlite::open(Path::new(":memory:")).unwrap();
        let recs = vec![
            flow_record(1, i64::MAX as u64),
            flow_record(1, 5),
            flow_record(2, u64::MAX),
            flow_record(2, u64::MAX),
            flow_record(3, (1 << 53) - 1),
            flow_record(3, 5),
        ];
        s.ingest("192.0.2.1", 1, 0, &recs, 0, 1).unwrap();
        let top = s.top_talkers(Window::since(0), &TopFilter::default(), TopBy::Packets, 10);
        let top = top.unwrap();
        let packets = |sport: u16| top.iter().find(|t| t.flow.sport == sport).unwrap().packets;
        assert_eq!(packets(1), i64::MAX as u64, "saturated");
        assert_eq!(packets(2), i64::MAX as u64, "saturated");
        // Above 2^53 and still exact.
        assert_eq!(packets(3), (1 << 53) + 4);
        let health = |rx: u64| {
            Record::Health(HealthRecord {
                agent: "a".into(),
                interval_start_ns: 1,
                interval_end_ns: 2,
                rx,
                ..HealthRecord::default()
            })
        };
        s.register("a", "1", 1, 0).unwrap();
        s.ingest("a", 1, 0, &[health(u64::MAX), health(u64::MAX)], 0, 3).unwrap();
        assert_eq!(s.health(0).unwrap()[0].rx, u64::MAX, "saturated, not wrapped");
    }

    #[test]
    fn a_flow_seen_both_ways_at_one_point_counts_once_also_in_a_database_from_before_flows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let with = |sport: u16, packets: u64, d: Option<Direction>, end: u64| {
            let Record::Flow(mut f) = flow_record(sport, packets) else { unreachable!() };
            f.exported.direction = d;
            f.window_end_ns = end;
            Record::Flow(f)
        };
        let (ing, eg) = (Some(Direction::Ingress), Some(Direction::Egress));
        let recs = vec![
            // Window 1: sport 1 reported once each way (Open vSwitch), sport 2 at egress
            // alone, sport 3 without a direction.
            with(1, 10, ing, 2_000),
            with(1, 10, eg, 2_000),
            with(2, 7, eg, 2_000),
            with(3, 5, None, 2_000),
            // Window 2: no egress record at all.
            with(1, 4, ing, 9_000),
            with(3, 6, None, 9_000),
        ];
        let top = |s: &Sqlite, from: u64, to: u64| {
            let w = Window { from_ns: from, to_ns: to };
            let mut t: Vec<(u16, u64, u64)> = s
                .top_talkers(w, &TopFilter::default(), TopBy::Packets, 10)
                .unwrap()
                .iter()
                .map(|t| (t.flow.sport, t.packets, t.records))
                .collect();
            t.sort_unstable();
            let totals = s.flow_totals(w, &RecordFilter::default()).unwrap();
            (t, (totals.records, totals.counted, totals.packets))
        };
        let want_1 = (vec![(1, 10, 1), (2, 7, 1), (3, 5, 1)], (4, 3, 22));
        let want_2 = (vec![(1, 4, 1), (3, 6, 1)], (2, 2, 10));
        {
            let mut s = Sqlite::open(&path).unwrap();
            s.ingest("192.0.2.1", 1, 0, &recs, 0, 1).unwrap();
            assert_eq!(top(&s, 0, 5_000), want_1);
            assert_eq!(top(&s, 5_000, 10_000), want_2);
            // A database written before the flow columns existed.
            s.db.execute_batch("DROP TABLE flows").unwrap();
        }
        let s = Sqlite::open(&path).unwrap();
        assert_eq!(top(&s, 0, 5_000), want_1, "filled from the stored records at start");
        assert_eq!(top(&s, 5_000, 10_000), want_2);
    }

    #[test]
    fn flow_record_pages_follow_one_another_from_their_cursor() {
        let mut s = Sqlite::open(Path::new(":memory:")).unwrap();
        let recs: Vec<Record> = (1..=7).map(|p| flow_record(p as u16, p)).collect();
        s.ingest("agent.with/odd name", 1, 0, &recs, 0, 1).unwrap();
        let (w, f) = (Window::since(0), RecordFilter::default());
        let (mut seen, mut after) = (Vec::new(), None::<RecordCursor>);
        loop {
            let page = s.flow_records(w, &f, after.as_ref(), 3).unwrap();
            let Some((_, last)) = page.last() else { break };
            // A cursor goes out as text and comes back as the same place.
            let text = last.to_string();
            assert_eq!(text.parse::<RecordCursor>().unwrap(), *last, "{text}");
            after = Some(last.clone());
            seen.extend(page.iter().map(|(r, _)| r.packets));
        }
        assert_eq!(seen, (1..=7).collect::<Vec<u64>>(), "every record once, in order");
        for bad in ["", "1.2.3", "x.1.2.61", "1.2.3.6", "1.2.3.zz", "1.2.3.ff"] {
            assert!(bad.parse::<RecordCursor>().is_err(), "{bad:?}");
        }
    }

    /// What a flow's answer is made of does not depend on the order records arrive in, nor
    /// on records arriving again (Kafka re-sends what an outage left unacknowledged after
    /// newer records): a store fed one run in order and one fed it shuffled, in chunks, every
    /// chunk twice, give the same flows, points, segments, series and top talkers.
    #[test]
    fn answers_do_not_depend_on_arrival_order_or_redelivery() {
        let flow = Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.0.2".into(),
            sport: 4000,
            dport: 80,
            proto: 17,
            spi: None,
            si: None,
        };
        let loss = |agent: &str, point: &str, upstream: Option<&str>, b: u64, lost: u64| {
            Record::Loss(LossRecord {
                agent: agent.into(),
                port: "p".into(),
                point: point.into(),
                upstream: upstream.map(str::to_string),
                flow: flow.clone(),
                color: (b % 2) as u8,
                batch: b,
                period_ns: None,
                first_ns: 1_000_000_000 * b,
                last_ns: 1_000_000_000 * b + 900_000_000,
                expected: Some(100),
                observed: 100 - lost,
                lost,
                late: 0,
                uncertain: 0,
                scope: Scope::Segment,
                tail: false,
                incomplete: false,
                drops: Vec::new(),
                ttl: None,
                own_colour: 0,
            })
        };
        // Two agents on one path, 40 batches each point, loss on a few; flow records too.
        let mut runs: Vec<(&str, Vec<(u64, Record)>)> = Vec::new();
        let mut a = Vec::new();
        let mut b = Vec::new();
        for k in 0..40u64 {
            a.push((2 * k, loss("a", "ingress", None, k, 0)));
            a.push((2 * k + 1, loss("a", "egress", Some("ingress"), k, u64::from(k % 7 == 3))));
            b.push((k, loss("b", "ingress", Some("a/egress"), k, u64::from(k % 5 == 1) * 2)));
        }
        for k in 0..10u64 {
            b.push((100 + k, flow_record(4000 + (k % 3) as u16, 10 * k + 1)));
        }
        runs.push(("a", a));
        runs.push(("b", b));

        let mut in_order = Sqlite::open(Path::new(":memory:")).unwrap();
        for (agent, recs) in &runs {
            in_order.ingest_numbered(agent, 1, recs, 1).unwrap();
        }
        let mut shuffled = Sqlite::open(Path::new(":memory:")).unwrap();
        let mut all: Vec<(&str, (u64, Record))> = runs
            .iter()
            .flat_map(|(agent, recs)| recs.iter().map(move |r| (*agent, r.clone())))
            .collect();
        // A fixed permutation (multiplicative, so the test is the same every run).
        let n = all.len();
        let mut order: Vec<usize> = (0..n).map(|i| (i * 37 + 11) % n).collect();
        order.dedup();
        assert_eq!(order.iter().collect::<std::collections::BTreeSet<_>>().len(), n);
        all = order.into_iter().map(|i| all[i].clone()).collect();
        for chunk in all.chunks(7).rev() {
            for _ in 0..2 {
                for (agent, r) in chunk {
                    shuffled.ingest_numbered(agent, 1, std::slice::from_ref(r), 1).unwrap();
                }
            }
        }
        let w = Window::since(0);
        let answer = |s: &Sqlite| {
            let points = s.points_in(&flow, w).unwrap();
            format!(
                "{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
                s.flows(w, false, 0, 100).unwrap(),
                points,
                crate::path::segments(&points),
                s.series(&flow, w, 5_000_000_000).unwrap(),
                s.top_talkers(w, &TopFilter::default(), TopBy::Packets, 10).unwrap(),
            )
        };
        let want = answer(&in_order);
        assert!(
            want.contains("lost: 6") || want.contains("lost: 12"),
            "loss in the answer: {want}"
        );
        assert_eq!(answer(&shuffled), want);
    }

    #[test]
    fn a_database_url_is_shown_without_its_password() {
        let d = |s: &str| describe(Path::new(s));
        assert_eq!(
            d("postgresql://tm:s3cret@db:5432/telemark"),
            "postgresql://tm:***@db:5432/telemark"
        );
        assert_eq!(d("postgres://tm@db/telemark"), "postgres://tm@db/telemark");
        assert_eq!(d("/var/lib/telemark/a:b@c.db"), "/var/lib/telemark/a:b@c.db");
        assert_eq!(d("postgresql://tm:p@ss@db/t"), "postgresql://tm:***@db/t");
        assert_eq!(
            d("postgresql://tm@db/t?sslmode=disable&password=s3cret"),
            "postgresql://tm@db/t?sslmode=disable&password=***"
        );
    }

    #[test]
    fn same_seq_is_stored_once() {
        let mut s = Sqlite::open(Path::new(":memory:")).unwrap();
        s.register("a", "1", 7, 0).unwrap();
        let r = Record::Loss(LossRecord {
            agent: "a".into(),
            port: "p".into(),
            point: "ingress".into(),
            upstream: None,
            flow: Flow {
                src: "1.1.1.1".into(),
                dst: "2.2.2.2".into(),
                sport: 1,
                dport: 2,
                proto: 6,
                spi: None,
                si: None,
            },
            color: 0,
            batch: 0,
            period_ns: None,
            first_ns: 5,
            last_ns: 6,
            expected: Some(100),
            observed: 99,
            lost: 1,
            late: 0,
            uncertain: 0,
            scope: Scope::Segment,
            tail: false,
            incomplete: false,
            drops: Vec::new(),
            ttl: None,
            own_colour: 0,
        });
        let recs = vec![r.clone(), r.clone(), r.clone()];
        assert_eq!(
            s.ingest("a", 7, 0, &recs, 0, 1).unwrap(),
            Stored { accepted: 3, duplicates: 0, refused: 0, new: vec![true; 3] }
        );
        assert_eq!(
            s.ingest("a", 7, 1, &recs[..1], 0, 1).unwrap(),
            Stored { accepted: 0, duplicates: 1, refused: 0, new: vec![false] }
        );
        assert_eq!(
            s.ingest("a", 8, 1, &recs[..1], 0, 1).unwrap(),
            Stored { accepted: 1, duplicates: 0, refused: 0, new: vec![true] }
        );
        assert_eq!(s.counts().unwrap(), (4, 0));
    }
}

/// What [`Store::top_talkers`] ranks by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopBy {
    /// Bytes, then packets.
    Bytes,
    /// Packets, then bytes.
    Packets,
}

/// Which `flow` records [`Store::top_talkers`] sums (`None`: any).
#[derive(Debug, Clone, Copy, Default)]
pub struct TopFilter<'a> {
    /// The record's agent: an exporter's address, or an agent's name.
    pub exporter: Option<&'a str>,
    /// The record's port: an exporter's input interface index, or an agent's port.
    pub interface: Option<&'a str>,
    /// The record's point: `ipfix`, `netflow9`, `netflow5`, `sflow`, or an agent's point.
    pub point: Option<&'a str>,
}

/// Where a page of [`Store::flow_records`] continues: just after this stored record. Written
/// as `TIME.BOOT.SEQ.AGENT_HEX`; opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordCursor {
    pub(crate) time_ns: i64,
    pub(crate) agent: String,
    pub(crate) boot: i64,
    pub(crate) seq: i64,
}

impl std::fmt::Display for RecordCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}.", self.time_ns, self.boot, self.seq)?;
        self.agent.bytes().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for RecordCursor {
    type Err = String;

    fn from_str(s: &str) -> Result<RecordCursor, String> {
        let bad = || format!("bad cursor {s:?} (give a next_cursor as it came)");
        let mut parts = s.splitn(4, '.');
        let mut num = || parts.next().and_then(|p| p.parse::<i64>().ok()).ok_or_else(bad);
        let (time_ns, boot, seq) = (num()?, num()?, num()?);
        let hex = parts.next().ok_or_else(bad)?;
        if hex.len() % 2 != 0 || hex.len() > 512 {
            return Err(bad());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|k| u8::from_str_radix(hex.get(k..k + 2).unwrap_or("x"), 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        let agent = String::from_utf8(bytes).map_err(|_| bad())?;
        Ok(RecordCursor { time_ns, agent, boot, seq })
    }
}

/// Which `flow` records [`Store::flow_records`] lists (`None`: any).
#[derive(Debug, Clone, Default)]
pub struct RecordFilter<'a> {
    /// The record's agent: an exporter's address, or an agent's name.
    pub exporter: Option<&'a str>,
    /// The record's port: an exporter's input interface index, or an agent's port.
    pub interface: Option<&'a str>,
    /// The record's point: `ipfix`, `netflow9`, `netflow5`, `sflow`, or an agent's point.
    pub point: Option<&'a str>,
    /// Source address (as records write it).
    pub src: Option<String>,
    /// Destination address.
    pub dst: Option<String>,
    /// Source port.
    pub sport: Option<i64>,
    /// Destination port (ICMP: type × 256 + code).
    pub dport: Option<i64>,
    /// IP protocol.
    pub proto: Option<i64>,
    /// `ingress`, `egress` or `unknown` (the exporter did not say).
    pub direction: Option<&'a str>,
}

impl RecordFilter<'_> {
    /// The named parameters of [`RECORDS_MATCH`], the window's ends `from` and `to`.
    fn args<'s>(&'s self, from: &'s i64, to: &'s i64) -> Vec<(&'static str, &'s dyn ToSql)> {
        vec![
            (":from", from),
            (":to", to),
            (":exporter", &self.exporter),
            (":interface", &self.interface),
            (":point", &self.point),
            (":src", &self.src),
            (":dst", &self.dst),
            (":sport", &self.sport),
            (":dport", &self.dport),
            (":proto", &self.proto),
            (":direction", &self.direction),
        ]
    }
}

/// What [`Store::flow_totals`] adds up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FlowTotals {
    /// Records that match.
    pub records: u64,
    /// Of them, the ones counted (a flow's egress records are not where the same point
    /// reported it at ingress too).
    pub counted: u64,
    /// Packets (estimated where sampled).
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// The condition on `other`'s `flow` rows that [`RecordFilter`] sets.
const RECORDS_MATCH: &str = "time_ns >= :from AND time_ns < :to
    AND (:exporter IS NULL OR agent = :exporter)
    AND (:interface IS NULL OR port = :interface)
    AND (:point IS NULL OR point = :point)
    AND (:src IS NULL OR src = :src)
    AND (:dst IS NULL OR dst = :dst)
    AND (:sport IS NULL OR sport = :sport)
    AND (:dport IS NULL OR dport = :dport)
    AND (:proto IS NULL OR proto = :proto)
    AND (:direction IS NULL OR COALESCE(direction, 'unknown') = :direction)";

/// The `flow` rows matching `cond`, as two tables for a query to read: `per` sums them per
/// (agent, port, flow key, egress or not), and `kept` holds the sums that count. A flow an
/// exporter reported at both ingress and egress of one observation point (Open vSwitch's IPFIX
/// with its default sampling: every packet once each way, with the same ingress interface) is
/// counted once, at ingress: a point's egress records count only where it reported the flow
/// nowhere else (an exporter that samples at egress alone). Records without a direction count
/// as ingress does. `egress`: whether the window holds egress records at all; without them
/// every row counts, and `per` and `kept` are the rows themselves (no grouping per point,
/// which is most of the query's time: 1 M records in 1.6 s instead of 4.4 s here).
fn counted_once(egress: bool, cond: &str) -> String {
    if !egress {
        return format!(
            "WITH per AS (
               SELECT src, dst, sport, dport, proto, packets, bytes, 1 AS records, exact,
                      CAST(error_bound AS REAL) * error_bound AS var
               FROM flows WHERE {cond}),
             kept AS (SELECT * FROM per)"
        );
    }
    format!(
        "WITH per AS (
           SELECT agent, port, src, dst, sport, dport, proto, direction IS 'egress' AS egress,
                  usum(packets) AS packets, usum(bytes) AS bytes, COUNT(*) AS records,
                  MIN(exact) AS exact, TOTAL(CAST(error_bound AS REAL) * error_bound) AS var
           FROM flows WHERE {cond}
           GROUP BY 1, 2, 3, 4, 5, 6, 7, 8),
         kept AS (
           SELECT * FROM (
             SELECT *, MIN(egress) OVER (PARTITION BY agent, port, src, dst, sport, dport, proto)
               AS only_egress
             FROM per)
           WHERE egress = only_egress)"
    )
}

/// One flow of the top talkers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopTalker {
    /// The flow.
    pub flow: Flow,
    /// Packets in the window (sampled counts scaled).
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Flow records summed.
    pub records: u64,
    /// Whether every record counted every packet.
    pub exact: bool,
    /// Half-width of the 95 % interval of `packets` (0 when exact).
    pub error_bound: u64,
}
