//! The collector's shared store: one PostgreSQL database that any number of collectors write
//! and read (docs/collector.md, "A shared store"), answering every query the embedded SQLite
//! store answers.
//!
//! - **Stored once, whoever stores it.** A record's (agent, boot, seq) goes into `seen` in the
//!   transaction that stores the record; a second collector storing the same record (a Kafka
//!   rebalance, a redelivery) finds the key there, waits for the first transaction if it is
//!   still open, and stores nothing. Each batch takes its keys in key order, so two collectors
//!   with overlapping batches never deadlock.
//! - **Time-partitioned.** Records live in daily partitions of their own time (a batch's first
//!   packet, a summary's end, …), created as records for a day first arrive; retention drops
//!   whole partitions.
//! - **Versioned schema.** `telemark_migrations` lists the migrations applied; a collector
//!   applies the missing ones at start, under an advisory lock, so collectors starting together
//!   apply each once.

use crate::flows::Remembered;
use crate::link::Batch;
use crate::path::PointRecords;
use crate::store::{
    Agent, FlowSummary, FlowTotals, LossRow, Publishing, Readers, RecordCursor, RecordFilter,
    SeriesPoint, Store, StoreError, Stored, TopBy, TopFilter, TopTalker, Window,
};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Row, Transaction};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use telemark_core::records::{Direction, EventRecord, Flow, FlowRecord, HealthRecord, Record};
use telemark_wire::ipfix::{Template, TemplateRecord};

/// A day in nanoseconds: the partitions' width.
const DAY_NS: i64 = 86_400_000_000_000;
/// An hour in nanoseconds (`flow_hours`, `segment_hours`).
const HOUR_NS: i64 = crate::rollup::HOUR_NS as i64;
/// Advisory lock key of schema changes and partition creation ("telemark" in ASCII).
const SCHEMA_LOCK: i64 = 0x7465_6c65_6d61_726b;

/// Migrations, in order; each is applied once, in one transaction.
const MIGRATIONS: [&str; 6] = [
    // 1: the first schema. Text in byte order (COLLATE "C"), as SQLite compares it: lists
    // sort alike on either store, whatever the database's locale.
    r#"CREATE TABLE agents (
        agent TEXT COLLATE "C" PRIMARY KEY, version TEXT COLLATE "C" NOT NULL, boot BIGINT NOT NULL,
        first_seen_ns BIGINT NOT NULL, last_seen_ns BIGINT NOT NULL,
        records BIGINT NOT NULL DEFAULT 0, export_dropped BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE seen (
        agent TEXT COLLATE "C" NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL, time_ns BIGINT NOT NULL,
        PRIMARY KEY (agent, boot, seq)
    );
    CREATE INDEX seen_time ON seen (time_ns);
    CREATE TABLE loss (
        agent TEXT COLLATE "C" NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        port TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL, upstream TEXT COLLATE "C",
        src TEXT COLLATE "C" NOT NULL, dst TEXT COLLATE "C" NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT, si SMALLINT,
        color SMALLINT NOT NULL, batch BIGINT NOT NULL, first_ns BIGINT NOT NULL,
        last_ns BIGINT NOT NULL, expected BIGINT, observed BIGINT NOT NULL,
        lost BIGINT NOT NULL, late BIGINT NOT NULL, uncertain BIGINT NOT NULL,
        scope TEXT COLLATE "C" NOT NULL, tail BOOLEAN NOT NULL, drops TEXT
    ) PARTITION BY RANGE (first_ns);
    CREATE INDEX loss_flow ON loss (src, dst, sport, dport, proto, first_ns);
    CREATE TABLE other (
        agent TEXT COLLATE "C" NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        kind TEXT COLLATE "C" NOT NULL, time_ns BIGINT NOT NULL, json TEXT COLLATE "C" NOT NULL
    ) PARTITION BY RANGE (time_ns);
    CREATE INDEX other_kind_time ON other (kind, time_ns);
    CREATE TABLE flows (
        time_ns BIGINT NOT NULL, agent TEXT COLLATE "C" NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        port TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL, direction TEXT COLLATE "C",
        src TEXT COLLATE "C" NOT NULL, dst TEXT COLLATE "C" NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, packets BIGINT NOT NULL, bytes BIGINT NOT NULL,
        exact BOOLEAN NOT NULL, error_bound BIGINT NOT NULL
    ) PARTITION BY RANGE (time_ns);
    CREATE INDEX flows_time ON flows (time_ns);
    CREATE TABLE flow_hours (
        hour BIGINT NOT NULL,
        src TEXT COLLATE "C" NOT NULL, dst TEXT COLLATE "C" NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT NOT NULL, si SMALLINT NOT NULL,
        agent TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL, upstream TEXT COLLATE "C" NOT NULL, scope TEXT COLLATE "C" NOT NULL,
        batches BIGINT NOT NULL, lossy_batches BIGINT NOT NULL, expected NUMERIC NOT NULL,
        lost NUMERIC NOT NULL, uncertain NUMERIC NOT NULL,
        first_ns BIGINT NOT NULL, last_ns BIGINT NOT NULL,
        PRIMARY KEY (hour, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
    );
    CREATE TABLE flow_state (
        exporter TEXT COLLATE "C" NOT NULL, domain BIGINT NOT NULL, kind TEXT COLLATE "C" NOT NULL, id BIGINT NOT NULL,
        options BIGINT NOT NULL DEFAULT 0, value BYTEA NOT NULL, seen_ns BIGINT NOT NULL,
        PRIMARY KEY (exporter, domain, kind, id)
    );"#,
    // 2: the console's overview reads every flow's loss records in a window.
    r#"CREATE INDEX loss_time ON loss (first_ns);"#,
    // 3: sums per flow and day, and per segment and hour (`crate::rollup`), from the hourly
    // sums already stored; writers of them wait (and those under way finish first), so none is
    // left out.
    r#"LOCK TABLE flow_hours IN SHARE MODE;
    CREATE TABLE flow_days (
        day BIGINT NOT NULL,
        src TEXT COLLATE "C" NOT NULL, dst TEXT COLLATE "C" NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT NOT NULL, si SMALLINT NOT NULL,
        agent TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL, upstream TEXT COLLATE "C" NOT NULL, scope TEXT COLLATE "C" NOT NULL,
        batches BIGINT NOT NULL, lossy_batches BIGINT NOT NULL, expected NUMERIC NOT NULL,
        lost NUMERIC NOT NULL, uncertain NUMERIC NOT NULL,
        first_ns BIGINT NOT NULL, last_ns BIGINT NOT NULL,
        PRIMARY KEY (day, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
    );
    INSERT INTO flow_days
        SELECT hour / 24, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope,
               SUM(batches), SUM(lossy_batches), SUM(expected), SUM(lost), SUM(uncertain),
               MIN(first_ns), MAX(last_ns)
        FROM flow_hours GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12;
    CREATE TABLE segment_hours (
        hour BIGINT NOT NULL, agent TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL,
        upstream TEXT COLLATE "C" NOT NULL, scope TEXT COLLATE "C" NOT NULL, proto SMALLINT NOT NULL,
        batches BIGINT NOT NULL, lossy_batches BIGINT NOT NULL, expected NUMERIC NOT NULL,
        lost NUMERIC NOT NULL, uncertain NUMERIC NOT NULL,
        PRIMARY KEY (hour, agent, point, upstream, scope, proto)
    );
    INSERT INTO segment_hours
        SELECT hour, agent, point, upstream, scope, proto, SUM(batches), SUM(lossy_batches),
               SUM(expected), SUM(lost), SUM(uncertain)
        FROM flow_hours GROUP BY 1, 2, 3, 4, 5, 6;"#,
    // 4: the marking period of batches that are periods of time (`batch` is then its number),
    // and whether the point may have missed some of the batch (records' `incomplete`).
    "ALTER TABLE loss ADD COLUMN period_ns BIGINT,
        ADD COLUMN incomplete BOOLEAN NOT NULL DEFAULT false",
    // 5: segments between agents, settled per flow and second (`crate::settle`), and how far
    // they are settled; the flow's TTL (hop limit) at the point (records' `ttl`).
    r#"CREATE TABLE link_sums (
        slot_ns BIGINT NOT NULL,
        src TEXT COLLATE "C" NOT NULL, dst TEXT COLLATE "C" NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT NOT NULL, si SMALLINT NOT NULL,
        agent TEXT COLLATE "C" NOT NULL, point TEXT COLLATE "C" NOT NULL, upstream TEXT COLLATE "C" NOT NULL,
        periods BIGINT NOT NULL, lossy_periods BIGINT NOT NULL, expected BIGINT NOT NULL,
        lost BIGINT NOT NULL, first_ns BIGINT NOT NULL, last_ns BIGINT NOT NULL,
        PRIMARY KEY (slot_ns, src, dst, sport, dport, proto, spi, si, agent, point, upstream)
    );
    CREATE TABLE settled (name TEXT COLLATE "C" PRIMARY KEY, upto_ns BIGINT NOT NULL);
    ALTER TABLE loss ADD COLUMN ttl SMALLINT;"#,
    // 6: packets a marker left as their sender coloured them, unmeasured (records'
    // `own_colour`).
    "ALTER TABLE loss ADD COLUMN own_colour BIGINT NOT NULL DEFAULT 0",
];

/// The tables partitioned by day, in the order a batch writes them (loss, flows, other):
/// creating or dropping a partition locks its parent table, and taking those locks in the
/// writers' order keeps a collector's DDL and another's batch from deadlocking.
const PARTITIONED: [&str; 3] = ["loss", "flows", "other"];

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> StoreError {
        // A reader's statement_timeout stopped it: the budget, not the database, failed.
        if e.code() == Some(&postgres::error::SqlState::QUERY_CANCELED) {
            return StoreError::OverBudget;
        }
        // The client's own text is the kind ("db error", "error connecting to server"); the
        // cause (the server's message, the refused connection) is in its source chain.
        let mut text = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        StoreError::Postgres(text)
    }
}

/// Whether `e` is "no partition of relation … found for row": a day another collector's
/// retention dropped after this one saw it.
fn missing_partition(e: &postgres::Error) -> bool {
    e.code() == Some(&postgres::error::SqlState::CHECK_VIOLATION)
}

/// One collector's connection to the shared store (a connection answers one request at a
/// time: the writer's is behind the ingest lock, each reader's behind its own).
pub struct PgStore {
    client: RefCell<Client>,
    config: postgres::Config,
    /// What a new connection of this kind runs first (a reader's budget).
    setup: &'static str,
    budget_ms: u128,
    /// Days whose partitions are known to exist.
    days: RefCell<BTreeSet<i64>>,
    /// What the agents' rows still lack (last seen, counts), and when they were last updated.
    agents: (AgentsSeen, std::time::Instant),
}

/// How often a writer brings the agents' rows up to date: each update writes a new version
/// of every agent's row a poll touched (with a fleet, nearly all of them).
const AGENTS_EVERY: Duration = Duration::from_secs(2);

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// `SUM(x)` of stored counts as a BIGINT that never fails: PostgreSQL sums BIGINTs as
/// NUMERIC, exact; held to 2^63 - 1 on the way out.
fn usum(x: &str) -> String {
    format!("LEAST(COALESCE(SUM({x}), 0), 9223372036854775807)::BIGINT")
}

fn flow_of(r: &Row) -> Flow {
    Flow {
        src: r.get(0),
        dst: r.get(1),
        sport: u16::try_from(r.get::<_, i32>(2)).unwrap_or(0),
        dport: u16::try_from(r.get::<_, i32>(3)).unwrap_or(0),
        proto: u8::try_from(r.get::<_, i16>(4)).unwrap_or(0),
        spi: None,
        si: None,
    }
}

/// A record's own time, the one it is partitioned and expired by; records without one (flow
/// loss, cost, capture reports) take the time they were first stored.
fn time_of(r: &Record, now: u64) -> u64 {
    match r {
        Record::Loss(l) => l.first_ns,
        Record::Summary(x) => x.interval_end_ns,
        Record::Health(h) => h.interval_end_ns,
        Record::Event(e) => e.time_ns,
        Record::Flow(f) => f.window_end_ns,
        Record::FlowLoss(_) | Record::Cost(_) | Record::Capture(_) => now,
    }
}

impl PgStore {
    /// Connects to `url` (`postgresql://user@host:port/db`; a Unix socket's directory
    /// percent-encoded as the host), with `password` if given apart, and applies the
    /// migrations the database lacks.
    pub fn connect(url: &str, password: Option<&str>) -> Result<PgStore, StoreError> {
        let mut config: postgres::Config =
            url.parse().map_err(|e| StoreError::Postgres(format!("the URL: {e}")))?;
        if let Some(p) = password {
            config.password(p);
        }
        config.application_name("telemark-collector");
        config.connect_timeout(Duration::from_secs(10));
        // The server's notices ("relation … already exists, skipping" from the idempotent
        // DDL every collector runs) are expected: debug, not the log's info.
        config.notice_callback(|n| tracing::debug!("postgresql: {}", n.message()));
        let client = RefCell::new(config.connect(NoTls)?);
        let agents = (AgentsSeen::default(), std::time::Instant::now());
        let mut s =
            PgStore { client, config, setup: "", budget_ms: 0, days: RefCell::default(), agents };
        s.migrate()?;
        Ok(s)
    }

    /// Applies every migration not yet applied, each once across collectors.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let mut tx = self.client.get_mut().transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS telemark_migrations (
                version INTEGER PRIMARY KEY, applied_ns BIGINT NOT NULL)",
        )?;
        let done: i32 =
            tx.query_one("SELECT COALESCE(MAX(version), 0) FROM telemark_migrations", &[])?.get(0);
        if done as usize > MIGRATIONS.len() {
            return Err(StoreError::Postgres(format!(
                "the database's schema is version {done}, newer than this collector's {}: \
                 upgrade the collector",
                MIGRATIONS.len()
            )));
        }
        for (n, sql) in MIGRATIONS.iter().enumerate().skip(done as usize) {
            tx.batch_execute(sql)?;
            let version = n as i32 + 1;
            tx.execute(
                "INSERT INTO telemark_migrations (version, applied_ns) VALUES ($1, $2)",
                &[&version, &i(crate::now_ns())],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Makes sure the partitions of `days` exist (in a transaction of their own, under the
    /// schema lock: collectors create each once).
    fn ensure_days(&mut self, days: impl Iterator<Item = i64>) -> Result<(), postgres::Error> {
        let new: BTreeSet<i64> = days.filter(|d| !self.days.get_mut().contains(d)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut tx = self.client.get_mut().transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
        for d in &new {
            for table in PARTITIONED {
                // Day numbers are i64 from our own arithmetic: safe to format into DDL.
                tx.batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table}_d{d} PARTITION OF {table}
                     FOR VALUES FROM ({}) TO ({})",
                    d * DAY_NS,
                    (d + 1) * DAY_NS
                ))?;
            }
        }
        tx.commit()?;
        self.days.get_mut().extend(new);
        Ok(())
    }

    /// Registers `agent` (or updates it on a new run).
    pub fn register(
        &mut self,
        agent: &str,
        version: &str,
        boot: u64,
        now: u64,
    ) -> Result<(), StoreError> {
        self.reconnect_if_closed()?;
        self.client.get_mut().execute(
            "INSERT INTO agents (agent, version, boot, first_seen_ns, last_seen_ns)
             VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT (agent) DO UPDATE SET version = $2, boot = $3, last_seen_ns = $4",
            &[&agent, &version, &i(boot), &i(now)],
        )?;
        Ok(())
    }

    /// Stores `records`, each numbered in `agent`'s run `boot`, once across every collector
    /// of the database; returns which were new.
    pub fn store(
        &mut self,
        agent: &str,
        boot: u64,
        records: &[(u64, &Record)],
        version: &str,
        export_dropped: Option<u64>,
        now: u64,
    ) -> Result<Stored, StoreError> {
        let run = Run { agent, boot, records: records.to_vec(), version, export_dropped };
        Ok(self.store_runs(std::slice::from_ref(&run), now)?.pop().unwrap_or_default())
    }

    /// Stores several runs' records in one transaction (a Kafka poll holds many agents'):
    /// what one commit costs is paid once, not once per agent. Each run's outcome, in order.
    pub fn store_runs(&mut self, runs: &[Run<'_>], now: u64) -> Result<Vec<Stored>, StoreError> {
        self.reconnect_if_closed()?;
        match self.store_runs_once(runs, now) {
            // A day another collector's retention dropped since this one saw it: made again.
            Err(e) if missing_partition(&e) => {
                self.days.get_mut().clear();
                Ok(self.store_runs_once(runs, now)?)
            }
            r => Ok(r?),
        }
    }

    fn store_runs_once(
        &mut self,
        runs: &[Run<'_>],
        now: u64,
    ) -> Result<Vec<Stored>, postgres::Error> {
        // Days before the transaction: partitions are made in one of their own.
        let days = runs.iter().flat_map(|r| &r.records);
        self.ensure_days(days.map(|(_, r)| i(time_of(r, now)).div_euclid(DAY_NS)))?;
        let mut tx = self.client.get_mut().transaction()?;
        let (out, seen) = store_all(&mut tx, runs, now)?;
        tx.commit()?;
        // The agents' rows after the commit, at most every AGENTS_EVERY: in the transaction,
        // every collector's poll (which holds records of nearly every agent: records are
        // keyed by flow) would hold every agent's row until it commits, and the collectors
        // of a group would store one after another. An agent's last-seen time and counts
        // are then up to that late (a collector stopped meanwhile leaves them short; its
        // records are stored).
        self.agents.0.merge(seen);
        if self.agents.1.elapsed() >= AGENTS_EVERY {
            if let Err(e) = self.agents.0.update(self.client.get_mut(), now) {
                tracing::warn!("postgresql: the agents' last-seen times and counts: {e}");
            }
            self.agents = (AgentsSeen::default(), std::time::Instant::now());
        }
        Ok(out)
    }

    /// Rows in `table` (for tests and the sizing report).
    pub fn rows(&mut self, table: &str) -> Result<u64, StoreError> {
        const TABLES: [&str; 8] = [
            "loss",
            "other",
            "flows",
            "seen",
            "flow_hours",
            "flow_days",
            "segment_hours",
            "agents",
        ];
        if !TABLES.contains(&table) {
            return Err(StoreError::Postgres(format!("no table {table}")));
        }
        let n: i64 =
            self.client.get_mut().query_one(&format!("SELECT COUNT(*) FROM {table}"), &[])?.get(0);
        Ok(n as u64)
    }
}

/// One agent run's records for [`PgStore::store_runs`].
pub struct Run<'a> {
    /// The agent (or exporter).
    pub agent: &'a str,
    /// Its run.
    pub boot: u64,
    /// Its records, each with its sequence number.
    pub records: Vec<(u64, &'a Record)>,
    /// What registers it if it was not (`kafka`, `exporter`, …).
    pub version: &'a str,
    /// The export drops its last request reported (agents over HTTP only).
    pub export_dropped: Option<u64>,
}

/// Stores the runs' new records inside `tx`, in a fixed number of statements whatever the
/// number of runs: the keys go into `seen` first, and only the records whose keys were new
/// are stored (each record once, whoever stores it). Keys and hourly sums are taken in key
/// order, so two collectors storing overlapping batches cannot deadlock. The agents' rows
/// are brought up to date after the commit ([`AgentsSeen::update`]).
fn store_all(
    tx: &mut Transaction<'_>,
    runs: &[Run<'_>],
    now: u64,
) -> Result<(Vec<Stored>, AgentsSeen), postgres::Error> {
    // Every record as (run, its index in the run), in (agent, boot, seq) order.
    let mut order: Vec<(usize, usize)> = runs
        .iter()
        .enumerate()
        .flat_map(|(r, run)| (0..run.records.len()).map(move |n| (r, n)))
        .collect();
    order.sort_by(|&(ra, na), &(rb, nb)| {
        let (a, b) = (&runs[ra], &runs[rb]);
        (a.agent, a.boot, a.records[na].0).cmp(&(b.agent, b.boot, b.records[nb].0))
    });
    // The agents, once each (their newest run, the first version named).
    let mut agents: std::collections::BTreeMap<&str, (&str, u64)> = Default::default();
    for run in runs {
        let e = agents.entry(run.agent).or_insert((run.version, run.boot));
        e.1 = e.1.max(run.boot);
    }
    let names: Vec<&str> = agents.keys().copied().collect();
    let versions: Vec<&str> = agents.values().map(|v| v.0).collect();
    let boots: Vec<i64> = agents.values().map(|v| i(v.1)).collect();
    // Agents not registered yet; the others' rows are not touched (nor locked) here.
    tx.execute(
        "INSERT INTO agents (agent, version, boot, first_seen_ns, last_seen_ns)
         SELECT a, v, b, $4, $4 FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[]) AS u(a, v, b)
         ON CONFLICT (agent) DO NOTHING",
        &[&names, &versions, &boots, &i(now)],
    )?;
    // One statement for every key: the new ones come back.
    let key = |&(r, n): &(usize, usize)| (runs[r].agent, i(runs[r].boot), i(runs[r].records[n].0));
    let k_agent: Vec<&str> = order.iter().map(|o| key(o).0).collect();
    let k_boot: Vec<i64> = order.iter().map(|o| key(o).1).collect();
    let k_seq: Vec<i64> = order.iter().map(|o| key(o).2).collect();
    let k_time: Vec<i64> =
        order.iter().map(|&(r, n)| i(time_of(runs[r].records[n].1, now))).collect();
    let taken = tx.query(
        "INSERT INTO seen (agent, boot, seq, time_ns)
         SELECT a, b, s, t FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[])
            AS u(a, b, s, t) ORDER BY a COLLATE \"C\", b, s
         ON CONFLICT DO NOTHING RETURNING agent, boot, seq",
        &[&k_agent, &k_boot, &k_seq, &k_time],
    )?;
    let mut taken: BTreeSet<(String, i64, i64)> =
        taken.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
    let mut out: Vec<Stored> = runs
        .iter()
        .map(|run| Stored { new: vec![false; run.records.len()], ..Stored::default() })
        .collect();
    let mut fresh = Vec::new();
    for o in &order {
        let (agent, boot, seq) = key(o);
        // A key twice in one poll is stored once: the first is the new one.
        if taken.remove(&(agent.to_string(), boot, seq)) {
            let (r, n) = *o;
            out[r].new[n] = true;
            out[r].accepted += 1;
            fresh.push((agent, boot, runs[r].records[n].0, runs[r].records[n].1));
        }
    }
    insert(tx, &fresh, now)?;
    // What each agent's records and last reported export drops come to.
    let mut touched = AgentsSeen::default();
    for (run, st) in runs.iter().zip(&mut out) {
        st.duplicates = run.records.len() as u64 - st.accepted;
        let c = touched.0.entry(run.agent.to_string()).or_insert((0, 0, None));
        c.0 = c.0.max(i(run.boot));
        c.1 += i(st.accepted);
        c.2 = run.export_dropped.map(i).or(c.2);
    }
    Ok((out, touched))
}

impl Drop for PgStore {
    fn drop(&mut self) {
        let now = crate::now_ns();
        if let Err(e) = self.agents.0.update(self.client.get_mut(), now) {
            tracing::debug!("postgresql: the agents' rows at exit: {e}");
        }
    }
}

/// Per agent of a store: its newest run, the records stored now, the export drops it last
/// reported.
#[derive(Default)]
struct AgentsSeen(std::collections::BTreeMap<String, (i64, i64, Option<i64>)>);

impl AgentsSeen {
    /// Adds a later store's.
    fn merge(&mut self, later: AgentsSeen) {
        for (agent, (boot, added, dropped)) in later.0 {
            let c = self.0.entry(agent).or_insert((0, 0, None));
            c.0 = c.0.max(boot);
            c.1 += added;
            c.2 = dropped.or(c.2);
        }
    }

    /// Brings the agents' rows up to date, in agent order, in a short transaction.
    fn update(&self, c: &mut Client, now: u64) -> Result<(), postgres::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = self.0.keys().map(String::as_str).collect();
        let boots: Vec<i64> = self.0.values().map(|v| v.0).collect();
        let added: Vec<i64> = self.0.values().map(|v| v.1).collect();
        let dropped: Vec<Option<i64>> = self.0.values().map(|v| v.2).collect();
        // Rows locked in agent order first: two collectors updating overlapping agents
        // cannot deadlock, whatever plan the update takes.
        let mut tx = c.transaction()?;
        tx.execute(
            "SELECT 1 FROM agents WHERE agent = ANY($1) ORDER BY agent COLLATE \"C\" FOR UPDATE",
            &[&names],
        )?;
        tx.execute(
            "UPDATE agents SET boot = GREATEST(agents.boot, u.b),
                last_seen_ns = GREATEST(agents.last_seen_ns, $5),
                records = agents.records + u.n,
                export_dropped = COALESCE(u.d, agents.export_dropped)
             FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[]) AS u(a, b, n, d)
             WHERE agents.agent = u.a",
            &[&names, &boots, &added, &dropped, &i(now)],
        )?;
        tx.commit()
    }
}

/// Inserts records already known to be new, in a few statements whatever their number (each
/// column as an array, `unnest`ed: one round trip per table): loss batches and their hourly
/// sums, flow records in columns, and every record but loss whole, as JSON.
fn insert(
    tx: &mut Transaction<'_>,
    records: &[(&str, i64, u64, &Record)],
    now: u64,
) -> Result<(), postgres::Error> {
    let mut loss = LossColumns::default();
    let mut sums = crate::rollup::Rollup::default();
    let mut other = OtherColumns::default();
    let mut flows = FlowColumns::default();
    for &(agent, boot, seq, r) in records {
        let seq = i(seq);
        let kind = match r {
            Record::Loss(l) => {
                loss.push(agent, boot, seq, l);
                sums.add(agent, l);
                continue;
            }
            Record::Summary(_) => "summary",
            Record::FlowLoss(_) => "flow_loss",
            Record::Cost(_) => "cost",
            Record::Capture(_) => "capture",
            Record::Health(_) => "health",
            Record::Event(_) => "event",
            Record::Flow(f) => {
                flows.push(agent, boot, seq, f);
                "flow"
            }
        };
        other.agent.push(agent);
        other.boot.push(boot);
        other.seq.push(seq);
        other.kind.push(kind);
        other.time.push(i(time_of(r, now)));
        other.json.push(serde_json::to_string(r).unwrap_or_default());
    }
    if !loss.seq.is_empty() {
        let l = &loss;
        tx.execute(
            "INSERT INTO loss (agent, boot, seq, port, point, upstream, src, dst, sport, dport,
                proto, spi, si, color, batch, first_ns, last_ns, expected, observed, lost, late,
                uncertain, scope, tail, drops, period_ns, incomplete, ttl, own_colour)
             SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::TEXT[],
                $5::TEXT[], $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::INTEGER[], $10::INTEGER[],
                $11::SMALLINT[], $12::BIGINT[], $13::SMALLINT[], $14::SMALLINT[], $15::BIGINT[],
                $16::BIGINT[], $17::BIGINT[], $18::BIGINT[], $19::BIGINT[], $20::BIGINT[],
                $21::BIGINT[], $22::BIGINT[], $23::TEXT[], $24::BOOLEAN[], $25::TEXT[],
                $26::BIGINT[], $27::BOOLEAN[], $28::SMALLINT[], $29::BIGINT[])",
            &[
                &l.agent,
                &l.boot,
                &l.seq,
                &l.port,
                &l.point,
                &l.upstream,
                &l.src,
                &l.dst,
                &l.sport,
                &l.dport,
                &l.proto,
                &l.spi,
                &l.si,
                &l.color,
                &l.batch,
                &l.first_ns,
                &l.last_ns,
                &l.expected,
                &l.observed,
                &l.lost,
                &l.late,
                &l.uncertain,
                &l.scope,
                &l.tail,
                &l.drops,
                &l.period_ns,
                &l.incomplete,
                &l.ttl,
                &l.own_colour,
            ],
        )?;
    }
    if !sums.is_empty() {
        add_sums(tx, &sums)?;
    }
    if !flows.seq.is_empty() {
        let f = &flows;
        tx.execute(
            "INSERT INTO flows (time_ns, agent, boot, seq, port, point, direction, src, dst,
                sport, dport, proto, packets, bytes, exact, error_bound)
             SELECT t, agent, boot, seq, port, point, direction, src, dst, sport, dport, proto,
                packets, bytes, exact, error_bound
             FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[],
                $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::INTEGER[], $11::INTEGER[],
                $12::SMALLINT[], $13::BIGINT[], $14::BIGINT[], $15::BOOLEAN[], $16::BIGINT[])
                AS u(agent, boot, t, seq, port, point, direction, src, dst, sport, dport, proto,
                     packets, bytes, exact, error_bound)",
            &[
                &f.agent,
                &f.boot,
                &f.time,
                &f.seq,
                &f.port,
                &f.point,
                &f.direction,
                &f.src,
                &f.dst,
                &f.sport,
                &f.dport,
                &f.proto,
                &f.packets,
                &f.bytes,
                &f.exact,
                &f.error_bound,
            ],
        )?;
    }
    if !other.seq.is_empty() {
        let o = &other;
        tx.execute(
            "INSERT INTO other (agent, boot, seq, kind, time_ns, json)
             SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::TEXT[],
                $5::BIGINT[], $6::TEXT[])",
            &[&o.agent, &o.boot, &o.seq, &o.kind, &o.time, &o.json],
        )?;
    }
    Ok(())
}

/// A batch's records other than loss and flows, column by column.
#[derive(Default)]
struct OtherColumns<'a> {
    agent: Vec<&'a str>,
    boot: Vec<i64>,
    seq: Vec<i64>,
    kind: Vec<&'static str>,
    time: Vec<i64>,
    json: Vec<String>,
}

/// A batch's loss records, column by column.
#[derive(Default)]
struct LossColumns<'a> {
    agent: Vec<&'a str>,
    boot: Vec<i64>,
    seq: Vec<i64>,
    port: Vec<String>,
    point: Vec<String>,
    upstream: Vec<Option<String>>,
    src: Vec<String>,
    dst: Vec<String>,
    sport: Vec<i32>,
    dport: Vec<i32>,
    proto: Vec<i16>,
    spi: Vec<Option<i64>>,
    si: Vec<Option<i16>>,
    color: Vec<i16>,
    batch: Vec<i64>,
    first_ns: Vec<i64>,
    last_ns: Vec<i64>,
    expected: Vec<Option<i64>>,
    observed: Vec<i64>,
    lost: Vec<i64>,
    late: Vec<i64>,
    uncertain: Vec<i64>,
    scope: Vec<&'static str>,
    tail: Vec<bool>,
    drops: Vec<Option<String>>,
    period_ns: Vec<Option<i64>>,
    incomplete: Vec<bool>,
    ttl: Vec<Option<i16>>,
    own_colour: Vec<i64>,
}

impl<'a> LossColumns<'a> {
    fn push(
        &mut self,
        agent: &'a str,
        boot: i64,
        seq: i64,
        l: &telemark_core::records::LossRecord,
    ) {
        let f = &l.flow;
        self.agent.push(agent);
        self.boot.push(boot);
        self.seq.push(seq);
        self.port.push(l.port.clone());
        self.point.push(l.point.clone());
        self.upstream.push(l.upstream.clone());
        self.src.push(f.src.clone());
        self.dst.push(f.dst.clone());
        self.sport.push(i32::from(f.sport));
        self.dport.push(i32::from(f.dport));
        self.proto.push(i16::from(f.proto));
        self.spi.push(f.spi.map(i64::from));
        self.si.push(f.si.map(i16::from));
        self.color.push(i16::from(l.color));
        self.batch.push(i(l.batch));
        self.first_ns.push(i(l.first_ns));
        self.last_ns.push(i(l.last_ns));
        self.expected.push(l.expected.map(i));
        self.observed.push(i(l.observed));
        self.lost.push(i(l.lost));
        self.late.push(i(l.late));
        self.uncertain.push(i(l.uncertain));
        self.scope.push(l.scope.as_str());
        self.tail.push(l.tail);
        self.drops.push(crate::store::drops_json(&l.drops));
        self.period_ns.push(l.period_ns.map(i));
        self.incomplete.push(l.incomplete);
        self.ttl.push(l.ttl.map(i16::from));
        self.own_colour.push(i(l.own_colour));
    }
}

/// Adds one transaction's sums (`crate::rollup`) to their tables: one statement per table,
/// each row once, in key order (two collectors take the rows' locks in the same order). Sums
/// are exact (NUMERIC), sent as decimal text.
fn add_sums(tx: &mut Transaction<'_>, sums: &crate::rollup::Rollup) -> Result<(), postgres::Error> {
    const ADD: &str = "batches = t.batches + excluded.batches,
        lossy_batches = t.lossy_batches + excluded.lossy_batches,
        expected = t.expected + excluded.expected, lost = t.lost + excluded.lost,
        uncertain = t.uncertain + excluded.uncertain";
    for (table, period, rows) in
        [("flow_hours", "hour", &sums.flow_hours), ("flow_days", "day", &sums.flow_days)]
    {
        let mut c = SumColumns::default();
        for (k, v) in rows {
            c.push(v);
            c.agent.push(&k.agent);
            c.period.push(k.period);
            c.src.push(&k.src);
            c.dst.push(&k.dst);
            c.sport.push(k.sport);
            c.dport.push(k.dport);
            c.proto.push(k.proto);
            c.spi.push(k.spi);
            c.si.push(k.si);
            c.point.push(&k.point);
            c.upstream.push(&k.upstream);
            c.scope.push(k.scope);
        }
        tx.execute(
            &format!(
                "INSERT INTO {table} AS t ({period}, src, dst, sport, dport, proto, spi, si,
                    agent, point, upstream, scope, batches, lossy_batches, expected, lost,
                    uncertain, first_ns, last_ns)
                 SELECT p, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope,
                    batches, lossy, expected::NUMERIC, lost::NUMERIC, uncertain::NUMERIC,
                    first_ns, last_ns
                 FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::INTEGER[],
                    $6::INTEGER[], $7::SMALLINT[], $8::BIGINT[], $9::SMALLINT[], $10::TEXT[],
                    $11::TEXT[], $12::TEXT[], $13::BIGINT[], $14::BIGINT[], $15::TEXT[],
                    $16::TEXT[], $17::TEXT[], $18::BIGINT[], $19::BIGINT[])
                    AS u(agent, p, src, dst, sport, dport, proto, spi, si, point, upstream,
                         scope, batches, lossy, expected, lost, uncertain, first_ns, last_ns)
                 ON CONFLICT ({period}, src, dst, sport, dport, proto, spi, si, agent, point,
                    upstream, scope)
                 DO UPDATE SET {ADD}, first_ns = LEAST(t.first_ns, excluded.first_ns),
                    last_ns = GREATEST(t.last_ns, excluded.last_ns)"
            ),
            &[
                &c.agent,
                &c.period,
                &c.src,
                &c.dst,
                &c.sport,
                &c.dport,
                &c.proto,
                &c.spi,
                &c.si,
                &c.point,
                &c.upstream,
                &c.scope,
                &c.batches,
                &c.lossy,
                &c.expected,
                &c.lost,
                &c.uncertain,
                &c.first_ns,
                &c.last_ns,
            ],
        )?;
    }
    let mut c = SumColumns::default();
    for (k, v) in &sums.segment_hours {
        c.push(v);
        c.agent.push(&k.agent);
        c.period.push(k.hour);
        c.point.push(&k.point);
        c.upstream.push(&k.upstream);
        c.scope.push(k.scope);
        c.proto.push(k.proto);
    }
    tx.execute(
        &format!(
            "INSERT INTO segment_hours AS t (hour, agent, point, upstream, scope, proto, batches,
                lossy_batches, expected, lost, uncertain)
             SELECT hour, agent, point, upstream, scope, proto, batches, lossy,
                expected::NUMERIC, lost::NUMERIC, uncertain::NUMERIC
             FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[], $5::TEXT[],
                $6::SMALLINT[], $7::BIGINT[], $8::BIGINT[], $9::TEXT[], $10::TEXT[], $11::TEXT[])
                AS u(agent, hour, point, upstream, scope, proto, batches, lossy, expected, lost,
                     uncertain)
             ON CONFLICT (hour, agent, point, upstream, scope, proto) DO UPDATE SET {ADD}"
        ),
        &[
            &c.agent,
            &c.period,
            &c.point,
            &c.upstream,
            &c.scope,
            &c.proto,
            &c.batches,
            &c.lossy,
            &c.expected,
            &c.lost,
            &c.uncertain,
        ],
    )?;
    Ok(())
}

/// Rows of sums, column by column (the key columns a table has; sums as decimal text).
#[derive(Default)]
struct SumColumns<'a> {
    agent: Vec<&'a str>,
    period: Vec<i64>,
    src: Vec<&'a str>,
    dst: Vec<&'a str>,
    sport: Vec<i32>,
    dport: Vec<i32>,
    proto: Vec<i16>,
    spi: Vec<i64>,
    si: Vec<i16>,
    point: Vec<&'a str>,
    upstream: Vec<&'a str>,
    scope: Vec<&'static str>,
    batches: Vec<i64>,
    lossy: Vec<i64>,
    expected: Vec<String>,
    lost: Vec<String>,
    uncertain: Vec<String>,
    first_ns: Vec<i64>,
    last_ns: Vec<i64>,
}

impl SumColumns<'_> {
    fn push(&mut self, v: &crate::rollup::Sums) {
        self.batches.push(v.batches);
        self.lossy.push(v.lossy_batches);
        self.expected.push(v.expected.to_string());
        self.lost.push(v.lost.to_string());
        self.uncertain.push(v.uncertain.to_string());
        self.first_ns.push(v.first_ns);
        self.last_ns.push(v.last_ns);
    }
}

/// A batch's flow records, column by column.
#[derive(Default)]
struct FlowColumns<'a> {
    agent: Vec<&'a str>,
    boot: Vec<i64>,
    time: Vec<i64>,
    seq: Vec<i64>,
    port: Vec<String>,
    point: Vec<String>,
    direction: Vec<Option<&'static str>>,
    src: Vec<String>,
    dst: Vec<String>,
    sport: Vec<i32>,
    dport: Vec<i32>,
    proto: Vec<i16>,
    packets: Vec<i64>,
    bytes: Vec<i64>,
    exact: Vec<bool>,
    error_bound: Vec<i64>,
}

impl<'a> FlowColumns<'a> {
    fn push(&mut self, agent: &'a str, boot: i64, seq: i64, f: &FlowRecord) {
        self.agent.push(agent);
        self.boot.push(boot);
        self.time.push(i(f.window_end_ns));
        self.seq.push(seq);
        self.port.push(f.port.clone());
        self.point.push(f.point.clone());
        self.direction.push(f.exported.direction.map(Direction::name));
        self.src.push(f.flow.src.clone());
        self.dst.push(f.flow.dst.clone());
        self.sport.push(i32::from(f.flow.sport));
        self.dport.push(i32::from(f.flow.dport));
        self.proto.push(i16::from(f.flow.proto));
        self.packets.push(i(f.packets));
        self.bytes.push(i(f.bytes));
        self.exact.push(f.exact);
        self.error_bound.push(i(f.error_bound));
    }
}

/// The API's questions, asked of the shared database: the same answers as the embedded
/// store's ([`crate::store::Sqlite`]), from the same rules ([`crate::store::points_of`],
/// [`crate::store::flows_of`], …) over rows read here.
impl PgStore {
    fn query(&self, sql: &str, args: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, StoreError> {
        self.reconnect_if_closed()?;
        Ok(self.client.borrow_mut().query(sql, args)?)
    }

    /// A connection the server closed (a restart, a failover) is made again, with what this
    /// kind of connection runs first; the partitions it knew are asked again.
    fn reconnect_if_closed(&self) -> Result<(), StoreError> {
        let mut c = self.client.borrow_mut();
        if !c.is_closed() {
            return Ok(());
        }
        let mut fresh = self.config.connect(NoTls)?;
        if !self.setup.is_empty() {
            fresh.batch_execute(&self.setup.replace("{budget}", &self.budget_ms.to_string()))?;
        }
        *c = fresh;
        self.days.borrow_mut().clear();
        tracing::info!("postgresql: connected again");
        Ok(())
    }

    /// `n` connections of their own for queries, each statement stopped after `budget`
    /// (PostgreSQL's `statement_timeout`).
    pub fn readers(&self, n: usize, budget: Duration) -> Result<Readers, StoreError> {
        let mut conns = Vec::new();
        let ms = budget.as_millis().clamp(1, i32::MAX as u128);
        for _ in 0..n.max(1) {
            let mut c = self.config.connect(NoTls)?;
            c.batch_execute(&READER_SETUP.replace("{budget}", &ms.to_string()))?;
            conns.push(Mutex::new(Store::Postgres(PgStore {
                client: RefCell::new(c),
                config: self.config.clone(),
                setup: READER_SETUP,
                budget_ms: ms,
                days: RefCell::default(),
                agents: (AgentsSeen::default(), std::time::Instant::now()),
            })));
        }
        Ok(Readers::of(conns, budget))
    }

    /// Nothing to check: the database is a server's.
    pub fn check_file(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Whether the server answers.
    pub fn ready(&self) -> Result<(), StoreError> {
        self.query("SELECT 1", &[]).map(drop)
    }

    /// Publishing keeps its outbox in the collector's own SQLite file, which a shared store
    /// has not: refused.
    pub fn publish(&mut self, _max: u64) -> Result<Arc<Publishing>, StoreError> {
        Err(StoreError::Postgres(
            "[publish] needs the embedded SQLite store (its outbox is in the same transaction \
             as the records): publish from the collectors agents send to, or have agents \
             publish to Kafka themselves"
                .into(),
        ))
    }

    /// The run `agent` registered last and when it was last heard from.
    pub fn registered(&self, agent: &str) -> Result<Option<(u64, u64)>, StoreError> {
        let rows =
            self.query("SELECT boot, last_seen_ns FROM agents WHERE agent = $1", &[&agent])?;
        Ok(rows.first().map(|r| (u(r.get(0)), u(r.get(1)))))
    }

    /// Records numbered from `seq` of `agent`'s run `boot`.
    pub fn ingest(
        &mut self,
        agent: &str,
        boot: u64,
        seq: u64,
        records: &[Record],
        export_dropped: u64,
        now: u64,
    ) -> Result<Stored, StoreError> {
        let numbered: Vec<(u64, &Record)> =
            records.iter().enumerate().map(|(n, r)| (seq.saturating_add(n as u64), r)).collect();
        self.store(agent, boot, &numbered, "unknown", Some(export_dropped), now)
    }

    /// Records read from Kafka.
    pub fn ingest_numbered(
        &mut self,
        agent: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        let numbered: Vec<(u64, &Record)> = records.iter().map(|(s, r)| (*s, r)).collect();
        self.store(agent, boot, &numbered, "kafka", None, now)
    }

    /// Several agents' runs of records read from Kafka (one poll), in one transaction.
    pub fn ingest_numbered_runs(
        &mut self,
        runs: &[crate::store::NumberedRun<'_>],
        now: u64,
    ) -> Result<Vec<Stored>, StoreError> {
        let runs: Vec<Run<'_>> = runs
            .iter()
            .map(|(agent, boot, records)| Run {
                agent,
                boot: *boot,
                records: records.iter().map(|(s, r)| (*s, r)).collect(),
                version: "kafka",
                export_dropped: None,
            })
            .collect();
        self.store_runs(&runs, now)
    }

    /// Flows decoded from an exporter's datagrams (the counts rule: `validate::counts`).
    pub fn ingest_flows(
        &mut self,
        exporter: &str,
        boot: u64,
        records: &[(u64, Record)],
        now: u64,
    ) -> Result<Stored, StoreError> {
        let (fit, refused): (Vec<_>, Vec<_>) =
            records.iter().partition(|(_, r)| crate::validate::counts(r).is_ok());
        let numbered: Vec<(u64, &Record)> = fit.into_iter().map(|(s, r)| (*s, r)).collect();
        let mut st = self.store(exporter, boot, &numbered, "exporter", None, now)?;
        st.refused = refused.len() as u64;
        Ok(st)
    }

    /// Keeps what exporters' templates and options data taught the decoders.
    pub fn remember_flow_state(&mut self, changes: &[Remembered]) -> Result<(), StoreError> {
        self.reconnect_if_closed()?;
        let now = i(crate::now_ns());
        let mut tx = self.client.get_mut().transaction()?;
        let upsert = "INSERT INTO flow_state (exporter, domain, kind, id, options, value, seen_ns)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (exporter, domain, kind, id) DO UPDATE SET options = $5, value = $6,
                seen_ns = $7";
        for c in changes {
            match c {
                Remembered::Template(key, r) => {
                    let Some((ip, domain)) = crate::store::flow_state_key(key) else { continue };
                    match r {
                        TemplateRecord::Define(t) => tx.execute(
                            upsert,
                            &[
                                &ip,
                                &domain,
                                &"template",
                                &i64::from(t.id),
                                &i64::from(t.options),
                                &t.to_bytes(),
                                &now,
                            ],
                        )?,
                        TemplateRecord::Withdraw(id) => tx.execute(
                            "DELETE FROM flow_state WHERE exporter = $1 AND domain = $2
                             AND kind = 'template' AND id = $3",
                            &[&ip, &domain, &i64::from(*id)],
                        )?,
                        TemplateRecord::WithdrawAll { options } => tx.execute(
                            "DELETE FROM flow_state WHERE exporter = $1 AND domain = $2
                             AND kind = 'template' AND options = $3",
                            &[&ip, &domain, &i64::from(*options)],
                        )?,
                    };
                }
                Remembered::Sampler(key, sampler, rate) => {
                    let Some((ip, domain)) = crate::store::flow_state_key(key) else { continue };
                    let id = sampler.map_or(-1, |s| s as i64);
                    let value = i64::from(*rate).to_be_bytes().to_vec();
                    tx.execute(upsert, &[&ip, &domain, &"sampler", &id, &0i64, &value, &now])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// What [`PgStore::remember_flow_state`] kept, newest first, at most `limit` rows.
    pub fn flow_state(&self, limit: usize) -> Result<Vec<Remembered>, StoreError> {
        let rows = self.query(
            "SELECT exporter, domain, kind, id, value FROM flow_state
             ORDER BY seen_ns DESC LIMIT $1",
            &[&i64::try_from(limit).unwrap_or(i64::MAX)],
        )?;
        let mut out = Vec::new();
        for r in rows {
            let (session, domain, kind, id, value): (String, i64, String, i64, Vec<u8>) =
                (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
            let Some(key) = crate::store::flow_state_domain(&session, domain) else { continue };
            match kind.as_str() {
                "template" => {
                    if let Some(t) = Template::from_bytes(&value) {
                        out.push(Remembered::Template(key, TemplateRecord::Define(t)));
                    }
                }
                "sampler" => {
                    let Ok(b) = <[u8; 8]>::try_from(value.as_slice()) else { continue };
                    let rate = u32::try_from(i64::from_be_bytes(b)).unwrap_or(u32::MAX).max(1);
                    out.push(Remembered::Sampler(key, (id != -1).then_some(id as u64), rate));
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Deletes flow state not written since `before_ns`, and the oldest past `max_bytes`.
    pub fn prune_flow_state(&mut self, before_ns: u64, max_bytes: u64) -> Result<u64, StoreError> {
        self.reconnect_if_closed()?;
        let c = self.client.get_mut();
        let mut n = c.execute(
            "DELETE FROM flow_state WHERE seen_ns < $1 OR domain < 4294967296",
            &[&i(before_ns)],
        )?;
        n += c.execute(
            "DELETE FROM flow_state WHERE (exporter, domain, kind, id) IN (
                SELECT exporter, domain, kind, id FROM (
                    SELECT exporter, domain, kind, id, SUM(length(value)) OVER (
                        ORDER BY seen_ns DESC, exporter, domain, kind, id
                        ROWS UNBOUNDED PRECEDING) AS total
                    FROM flow_state) t
                WHERE total > $1)",
            &[&i(max_bytes)],
        )?;
        Ok(n)
    }

    /// Drops the daily partitions wholly before `before_ns` (retention), and the keys and
    /// hourly sums of those days; returns how many records went.
    pub fn expire(&mut self, before_ns: u64) -> Result<u64, StoreError> {
        self.reconnect_if_closed()?;
        let before = i(before_ns);
        let mut gone = 0u64;
        let mut tx = self.client.get_mut().transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&SCHEMA_LOCK])?;
        for table in PARTITIONED {
            let parts = tx.query(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                 WHERE i.inhparent = $1::TEXT::regclass",
                &[&table],
            )?;
            for p in parts {
                let name: String = p.get(0);
                let Some(day) = name
                    .strip_prefix(table)
                    .and_then(|r| r.strip_prefix("_d"))
                    .and_then(|d| d.parse::<i64>().ok())
                else {
                    continue;
                };
                if (day + 1).saturating_mul(DAY_NS) <= before {
                    if table != "flows" {
                        let n: i64 =
                            tx.query_one(&format!("SELECT COUNT(*) FROM {name}"), &[])?.get(0);
                        gone += u(n);
                    }
                    tx.batch_execute(&format!("DROP TABLE {name}"))?;
                    self.days.get_mut().remove(&day);
                }
            }
        }
        // Keys and hourly sums go with their day's partition, not before: a record of a day
        // still kept, redelivered, must find its key.
        let cut = before.div_euclid(DAY_NS) * DAY_NS;
        tx.execute("DELETE FROM seen WHERE time_ns < $1", &[&cut])?;
        tx.execute("DELETE FROM flow_hours WHERE hour < $1", &[&(cut / HOUR_NS)])?;
        tx.execute("DELETE FROM segment_hours WHERE hour < $1", &[&(cut / HOUR_NS)])?;
        tx.execute("DELETE FROM flow_days WHERE day < $1", &[&(cut / DAY_NS)])?;
        tx.execute("DELETE FROM link_sums WHERE slot_ns < $1", &[&cut])?;
        tx.commit()?;
        Ok(gone)
    }

    /// Settles the segments between agents due by `now_ns` ([`crate::settle`]). Collectors sharing the database may settle the same span: a slot already
    /// stored adds nothing.
    pub fn settle(&mut self, now_ns: u64) -> Result<crate::settle::Pass, StoreError> {
        use crate::settle::{crossing_flows, read_window, span, Pass};
        let settled = self.query("SELECT upto_ns FROM settled WHERE name = 'links'", &[])?;
        let settled = settled.first().map(|r| u(r.get(0)));
        let Some(((from, to), behind)) = span(settled, now_ns) else {
            return Ok(Pass::default());
        };
        let rows = self.query(&crossing_flows("$1", "$2"), &[&i(from), &i(to)])?;
        let mut slots = Vec::new();
        for r in &rows {
            let flow = Flow {
                spi: r.get::<_, Option<i64>>(5).and_then(|v| u32::try_from(v).ok()),
                si: r.get::<_, Option<i16>>(6).and_then(|v| u8::try_from(v).ok()),
                ..flow_of(r)
            };
            let (from_ns, to_ns) = read_window(from, to, u(r.get(7)));
            let w = Window { from_ns, to_ns };
            slots.extend(crate::settle::slots(&flow, &self.points_in(&flow, w)?, from, to));
        }
        self.reconnect_if_closed()?;
        let mut tx = self.client.get_mut().transaction()?;
        let mut sums = crate::rollup::Rollup::default();
        let mut stored = 0;
        let insert = tx.prepare(
            "INSERT INTO link_sums (slot_ns, src, dst, sport, dport, proto, spi, si, agent, point,
                upstream, periods, lossy_periods, expected, lost, first_ns, last_ns)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
             ON CONFLICT DO NOTHING",
        )?;
        for l in &slots {
            let f = &l.flow;
            let added = tx.execute(
                &insert,
                &[
                    &i(l.slot_ns),
                    &f.src,
                    &f.dst,
                    &i32::from(f.sport),
                    &i32::from(f.dport),
                    &i16::from(f.proto),
                    &f.spi.map_or(-1, i64::from),
                    &f.si.map_or(-1, i16::from),
                    &l.agent,
                    &l.point,
                    &l.upstream,
                    &i(l.periods),
                    &i(l.lossy_periods),
                    &i(l.expected),
                    &i(l.lost),
                    &i(l.first_ns),
                    &i(l.last_ns),
                ],
            )?;
            if added == 1 {
                sums.add_link(l);
                stored += 1;
            }
        }
        add_sums(&mut tx, &sums)?;
        tx.execute(
            "INSERT INTO settled (name, upto_ns) VALUES ('links', $1)
             ON CONFLICT (name) DO UPDATE SET upto_ns = GREATEST(settled.upto_ns, excluded.upto_ns)",
            &[&i(to)],
        )?;
        tx.commit()?;
        Ok(Pass { slots: stored, behind })
    }

    /// The registered agents.
    pub fn agents(&self) -> Result<Vec<Agent>, StoreError> {
        let rows = self.query(
            "SELECT agent, version, boot, first_seen_ns, last_seen_ns, records, export_dropped
             FROM agents ORDER BY agent",
            &[],
        )?;
        Ok(rows
            .iter()
            .map(|r| Agent {
                agent: r.get(0),
                version: r.get(1),
                boot: u(r.get(2)),
                first_seen_ns: u(r.get(3)),
                last_seen_ns: u(r.get(4)),
                records: u(r.get(5)),
                export_dropped: u(r.get(6)),
            })
            .collect())
    }

    /// Flows with batches in `w`, most lost first ([`crate::store::flows_of`]).
    pub fn flows(
        &self,
        w: Window,
        lossy_only: bool,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<FlowSummary>, StoreError> {
        // Whole days from the daily sums, the hours around them from the hourly ones (as
        // [`crate::store::Sqlite::flows`]).
        const COLUMNS: &str = "src, dst, sport, dport, proto, spi, si, agent, point, upstream,
            scope, lossy_batches, lost, uncertain, first_ns, last_ns, expected";
        let sql = format!(
            "SELECT src, dst, sport, dport, proto, NULLIF(spi, -1), NULLIF(si, -1), agent, point,
                    NULLIF(upstream, ''), scope, SUM(lossy_batches)::BIGINT, {}, {},
                    MIN(first_ns), MAX(last_ns), {}
             FROM (SELECT {COLUMNS} FROM flow_days WHERE day >= $1 AND day <= $2
                   UNION ALL SELECT {COLUMNS} FROM flow_hours WHERE hour >= $3 AND hour <= $4
                   UNION ALL SELECT {COLUMNS} FROM flow_hours WHERE hour >= $5 AND hour <= $6)
                  AS sums
             GROUP BY src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope
             HAVING NOT $7 OR MAX(lost) > 0 OR MAX(uncertain) > 0
             ORDER BY src, dst, sport, dport, proto, spi, si",
            usum("lost"),
            usum("uncertain"),
            usum("expected")
        );
        let s = crate::rollup::split_hours(
            i(w.from_ns) / HOUR_NS,
            i(w.to_ns.saturating_sub(1)) / HOUR_NS,
        );
        let (d, b, a) = (s.days, s.before, s.after);
        let rows = self.query(&sql, &[&d.0, &d.1, &b.0, &b.1, &a.0, &a.1, &lossy_only])?;
        let rows = rows
            .iter()
            .map(|r| {
                let mut flow = flow_of(r);
                flow.spi = r.get::<_, Option<i64>>(5).and_then(|v| u32::try_from(v).ok());
                flow.si = r.get::<_, Option<i16>>(6).and_then(|v| u8::try_from(v).ok());
                let p = PointRecords {
                    agent: r.get(7),
                    point: r.get(8),
                    upstream: r.get(9),
                    scope: crate::store::scope_of(&r.get::<_, String>(10)),
                    lossy_batches: u(r.get(11)),
                    lost: u(r.get(12)),
                    uncertain: u(r.get(13)),
                    expected: u(r.get(16)),
                    ..PointRecords::default()
                };
                (flow, p, u(r.get(14)), u(r.get(15)))
            })
            .collect();
        crate::store::flows_of(rows, lossy_only, offset, limit, |f| self.points_in(f, w))
    }

    /// `flow`'s loss per agent and point in buckets of `bucket_ns`, in `w`.
    pub fn series(
        &self,
        flow: &Flow,
        w: Window,
        bucket_ns: u64,
    ) -> Result<Vec<SeriesPoint>, StoreError> {
        let sql = format!(
            "SELECT agent, point, (first_ns / $10) * $10 AS t, COUNT(*), {}, {}, {}, MAX(scope), {}
             FROM loss WHERE {FLOW_IN} GROUP BY agent, point, t ORDER BY t, agent, point",
            usum("COALESCE(expected, 0)"),
            usum("lost"),
            usum("late"),
            usum("uncertain")
        );
        let bucket = i(bucket_ns.max(1));
        let a = FlowArgs::of(flow, w);
        let rows = self.query(&sql, &a.with(&bucket))?;
        Ok(rows
            .iter()
            .map(|r| SeriesPoint {
                agent: r.get(0),
                point: r.get(1),
                t_ns: u(r.get(2)),
                batches: u(r.get(3)),
                expected: u(r.get(4)),
                lost: u(r.get(5)),
                late: u(r.get(6)),
                scope: crate::store::scope_of(&r.get::<_, String>(7)),
                uncertain: u(r.get(8)),
            })
            .collect())
    }

    /// Loss records of every flow summed per segment and time bucket (as
    /// [`crate::store::Sqlite::overview`]).
    pub fn overview(
        &self,
        q: &crate::overview::OverviewQuery,
    ) -> Result<Vec<crate::overview::OverviewRow>, StoreError> {
        use crate::overview::{OverviewRow, OverviewSource, Sums};
        let filter = "($4::TEXT IS NULL OR agent = $4) AND ($5::SMALLINT IS NULL OR proto = $5)";
        let sql = match q.source() {
            OverviewSource::Batches => format!(
                "SELECT agent, point, upstream, scope, (first_ns / $1) * $1 AS t, COUNT(*),
                        COUNT(*) FILTER (WHERE lost > 0), {}, {}, {}
                 FROM loss WHERE first_ns >= $2 AND first_ns < $3 AND {filter}
                 GROUP BY agent, point, upstream, scope, t
                 UNION ALL
                 SELECT agent, point, upstream, 'link', (slot_ns / $1) * $1 AS t, {}, {}, {},
                        {}, 0
                 FROM link_sums WHERE slot_ns >= $2 AND slot_ns < $3 AND {filter}
                 GROUP BY agent, point, upstream, t",
                usum("COALESCE(expected, 0)"),
                usum("lost"),
                usum("uncertain"),
                usum("periods"),
                usum("lossy_periods"),
                usum("expected"),
                usum("lost"),
            ),
            OverviewSource::HourlySums => format!(
                "SELECT agent, point, NULLIF(upstream, ''), scope,
                        ((hour * {HOUR_NS}) / $1) * $1 AS t, {}, {}, {}, {}, {}
                 FROM segment_hours WHERE hour >= $2 AND hour <= $3 AND {filter}
                 GROUP BY agent, point, upstream, scope, t",
                usum("batches"),
                usum("lossy_batches"),
                usum("expected"),
                usum("lost"),
                usum("uncertain")
            ),
        };
        let (from, to) = match q.source() {
            OverviewSource::Batches => (i(q.window.from_ns), i(q.window.to_ns)),
            OverviewSource::HourlySums => {
                let (a, b) = q.hours();
                (i(a), i(b))
            }
        };
        let bucket = i(q.bucket_ns.max(1));
        let proto = q.proto.map(i16::from);
        let rows = self.query(&sql, &[&bucket, &from, &to, &q.agent, &proto])?;
        Ok(rows
            .iter()
            .map(|r| OverviewRow {
                agent: r.get(0),
                point: r.get(1),
                upstream: r.get(2),
                scope: crate::overview::SegmentScope::of(&r.get::<_, String>(3)),
                t_ns: u(r.get(4)),
                sums: Sums {
                    batches: u(r.get(5)),
                    lossy_batches: u(r.get(6)),
                    expected: u(r.get(7)),
                    lost: u(r.get(8)),
                    uncertain: u(r.get(9)),
                },
            })
            .collect())
    }

    /// `flow`'s loss records in `w`, per point ([`crate::store::points_of`]).
    pub fn points_in(&self, flow: &Flow, w: Window) -> Result<Vec<PointRecords>, StoreError> {
        let sql = format!(
            "SELECT agent, point, port, upstream, scope, color, first_ns, last_ns, observed,
                    late, COALESCE(expected, 0), lost, uncertain, tail, drops, boot, batch,
                    period_ns, incomplete, ttl, own_colour
             FROM loss WHERE {FLOW_IN} ORDER BY agent, point, first_ns, seq"
        );
        let a = FlowArgs::of(flow, w);
        let rows = self.query(&sql, &a.args())?;
        let rows =
            rows.iter()
                .map(|r| LossRow {
                    agent: r.get(0),
                    point: r.get(1),
                    port: r.get(2),
                    upstream: r.get(3),
                    scope: r.get(4),
                    batch: Batch {
                        color: u8::try_from(r.get::<_, i16>(5)).unwrap_or(0),
                        first_ns: u(r.get(6)),
                        last_ns: u(r.get(7)),
                        observed: u(r.get(8)),
                        late: u(r.get(9)),
                        boot: u(r.get(15)),
                        period: r.get::<_, Option<i64>>(17).map(u).filter(|t| *t > 0).map(
                            |length_ns| crate::link::Period { length_ns, number: u(r.get(16)) },
                        ),
                        incomplete: r.get(18),
                    },
                    expected: u(r.get(10)),
                    lost: u(r.get(11)),
                    uncertain: u(r.get(12)),
                    tail: r.get(13),
                    drops: r.get(14),
                    ttl: r.get::<_, Option<i16>>(19).and_then(|t| u8::try_from(t).ok()),
                    own_colour: u(r.get(20)),
                })
                .collect();
        Ok(crate::store::points_of(rows))
    }

    /// Each agent's health since `since_ns` ([`crate::store::health_of`]).
    pub fn health(&self, since_ns: u64) -> Result<Vec<HealthRecord>, StoreError> {
        let rows = self.query(
            "SELECT json FROM other WHERE kind = 'health' AND time_ns >= $1
             ORDER BY agent, time_ns, seq",
            &[&i(since_ns)],
        )?;
        Ok(crate::store::health_of(rows.iter().map(|r| r.get(0)).collect()))
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
        let src = flow.map(|f| f.src.as_str());
        let dst = flow.map(|f| f.dst.as_str());
        let ports = flow.map(|f| (i64::from(f.sport), i64::from(f.dport), i64::from(f.proto)));
        let rows = self.query(
            "SELECT json FROM other WHERE kind = 'event' AND time_ns >= $1 AND time_ns < $2
               AND ($3::TEXT IS NULL OR json::jsonb->>'detector' = $3::TEXT)
               AND ($4::TEXT IS NULL OR agent = $4::TEXT)
               AND ($5::TEXT IS NULL OR (json::jsonb->'flow'->>'src' = $5::TEXT
                    AND json::jsonb->'flow'->>'dst' = $6::TEXT
                    AND (json::jsonb->'flow'->>'sport')::BIGINT = $7::BIGINT
                    AND (json::jsonb->'flow'->>'dport')::BIGINT = $8::BIGINT
                    AND (json::jsonb->'flow'->>'proto')::BIGINT = $9::BIGINT))
             ORDER BY time_ns DESC, agent, seq LIMIT $10",
            &[
                &i(w.from_ns),
                &i(w.to_ns),
                &detector,
                &agent,
                &src,
                &dst,
                &ports.map(|p| p.0),
                &ports.map(|p| p.1),
                &ports.map(|p| p.2),
                &i(limit),
            ],
        )?;
        Ok(crate::store::events_of(rows.iter().map(|r| r.get(0)).collect()))
    }

    /// Whether any `flow` record in `w` was observed at egress.
    fn egress_in(&self, w: Window) -> Result<bool, StoreError> {
        let rows = self.query(
            "SELECT EXISTS (SELECT 1 FROM flows
               WHERE direction = 'egress' AND time_ns >= $1 AND time_ns < $2)",
            &[&i(w.from_ns), &i(w.to_ns)],
        )?;
        Ok(rows.first().is_none_or(|r| r.get(0)))
    }

    /// The `limit` flows with the most bytes or packets in `w`.
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
        let sql = format!(
            "{}
             SELECT src, dst, sport, dport, proto, {} AS packets, {} AS bytes,
                    SUM(records)::BIGINT, bool_and(exact), COALESCE(SUM(var), 0)::FLOAT8
             FROM kept GROUP BY 1, 2, 3, 4, 5 ORDER BY {order} LIMIT $6",
            counted_once(
                self.egress_in(w)?,
                "time_ns >= $1 AND time_ns < $2
                 AND ($3::TEXT IS NULL OR agent = $3::TEXT)
                 AND ($4::TEXT IS NULL OR port = $4::TEXT)
                 AND ($5::TEXT IS NULL OR point = $5::TEXT)"
            ),
            usum("packets"),
            usum("bytes")
        );
        let rows = self.query(
            &sql,
            &[
                &i(w.from_ns),
                &i(w.to_ns),
                &filter.exporter,
                &filter.interface,
                &filter.point,
                &i(limit),
            ],
        )?;
        Ok(rows
            .iter()
            .map(|r| TopTalker {
                flow: flow_of(r),
                packets: u(r.get(5)),
                bytes: u(r.get(6)),
                records: u(r.get(7)),
                exact: r.get::<_, Option<bool>>(8).unwrap_or(false),
                error_bound: r.get::<_, f64>(9).sqrt().round() as u64,
            })
            .collect())
    }

    /// The `flow` records that match `filter` in `w`, oldest first, a page after `after`.
    pub fn flow_records(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
        after: Option<&RecordCursor>,
        limit: u64,
    ) -> Result<Vec<(FlowRecord, RecordCursor)>, StoreError> {
        let sql = format!(
            "SELECT (SELECT json FROM other o
                     WHERE o.agent = f.agent AND o.boot = f.boot AND o.seq = f.seq
                       AND o.time_ns = f.time_ns AND o.kind = 'flow'),
                    time_ns, agent, boot, seq
             FROM flows f WHERE {RECORDS_MATCH}
               AND ($12::BIGINT IS NULL
                    OR (time_ns, agent, boot, seq) > ($12::BIGINT, $13::TEXT, $14::BIGINT, $15::BIGINT))
             ORDER BY time_ns, agent, boot, seq LIMIT $16"
        );
        let at = after.map(|c| (c.time_ns, c.agent.as_str(), c.boot, c.seq));
        let (t, a, bt, sq) = (at.map(|c| c.0), at.map(|c| c.1), at.map(|c| c.2), at.map(|c| c.3));
        let f = RecordArgs::of(filter, w);
        let mut args = f.args();
        let limit = i(limit);
        args.extend_from_slice(&[&t, &a, &bt, &sq, &limit]);
        let rows = self.query(&sql, &args)?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let json: Option<String> = r.get(0);
                let c = RecordCursor {
                    time_ns: r.get(1),
                    agent: r.get(2),
                    boot: r.get(3),
                    seq: r.get(4),
                };
                match serde_json::from_str::<Record>(json.as_deref()?) {
                    Ok(Record::Flow(f)) => Some((f, c)),
                    _ => None,
                }
            })
            .collect())
    }

    /// What the `flow` records that match `filter` in `w` add up to.
    pub fn flow_totals(
        &self,
        w: Window,
        filter: &RecordFilter<'_>,
    ) -> Result<FlowTotals, StoreError> {
        let sql = format!(
            "{}
             SELECT (SELECT COALESCE(SUM(records), 0)::BIGINT FROM per),
                    COALESCE(SUM(records), 0)::BIGINT, {}, {}
             FROM kept",
            counted_once(self.egress_in(w)?, RECORDS_MATCH),
            usum("packets"),
            usum("bytes")
        );
        let f = RecordArgs::of(filter, w);
        let rows = self.query(&sql, &f.args())?;
        Ok(rows
            .first()
            .map(|r| FlowTotals {
                records: u(r.get(0)),
                counted: u(r.get(1)),
                packets: u(r.get(2)),
                bytes: u(r.get(3)),
            })
            .unwrap_or_default())
    }

    /// Frames `agent`'s own receive rings dropped since `since_ns`, from its health records.
    pub fn ring_drops(&self, agent: &str, since_ns: u64) -> Result<u64, StoreError> {
        let rows = self.query(
            &format!(
                "SELECT {} FROM other WHERE agent = $1 AND kind = 'health' AND time_ns >= $2",
                usum("(json::jsonb->>'rx_ring_drops')::NUMERIC")
            ),
            &[&agent, &i(since_ns)],
        )?;
        Ok(rows.first().map_or(0, |r| u(r.get(0))))
    }

    /// Records stored: (loss batches, other records), as PostgreSQL's statistics estimate
    /// them (counting every row of a fleet's tables at each scrape would take seconds).
    pub fn counts(&self) -> Result<(u64, u64), StoreError> {
        let rows = self.query(
            "SELECT p.relname, COALESCE(SUM(GREATEST(c.reltuples, 0)), 0)::BIGINT
             FROM pg_class p JOIN pg_inherits i ON i.inhparent = p.oid
             JOIN pg_class c ON c.oid = i.inhrelid
             WHERE p.relname IN ('loss', 'other') GROUP BY p.relname",
            &[],
        )?;
        let get =
            |t: &str| rows.iter().find(|r| r.get::<_, String>(0) == t).map_or(0, |r| u(r.get(1)));
        Ok((get("loss"), get("other")))
    }
}

/// What a reader connection runs first: each statement stopped after the query budget
/// (`{budget}` ms), and no writes.
const READER_SETUP: &str =
    "SET statement_timeout = {budget}; SET default_transaction_read_only = on";

/// One flow's loss records in a window: parameters $1..$9 ([`FlowArgs`]).
const FLOW_IN: &str = "src = $1 AND dst = $2 AND sport = $3 AND dport = $4 AND proto = $5
    AND spi IS NOT DISTINCT FROM $6 AND si IS NOT DISTINCT FROM $7
    AND first_ns >= $8 AND first_ns < $9";

/// The values of [`FLOW_IN`]'s parameters, typed as the columns are.
struct FlowArgs {
    src: String,
    dst: String,
    sport: i32,
    dport: i32,
    proto: i16,
    spi: Option<i64>,
    si: Option<i16>,
    from: i64,
    to: i64,
}

impl FlowArgs {
    fn of(f: &Flow, w: Window) -> FlowArgs {
        FlowArgs {
            src: f.src.clone(),
            dst: f.dst.clone(),
            sport: i32::from(f.sport),
            dport: i32::from(f.dport),
            proto: i16::from(f.proto),
            spi: f.spi.map(i64::from),
            si: f.si.map(i16::from),
            from: i(w.from_ns),
            to: i(w.to_ns),
        }
    }

    fn args(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.src,
            &self.dst,
            &self.sport,
            &self.dport,
            &self.proto,
            &self.spi,
            &self.si,
            &self.from,
            &self.to,
        ]
    }

    fn with<'a>(&'a self, extra: &'a (dyn ToSql + Sync)) -> Vec<&'a (dyn ToSql + Sync)> {
        let mut a = self.args();
        a.push(extra);
        a
    }
}

/// `flow` records matching a [`RecordFilter`] in a window: parameters $1..$11.
const RECORDS_MATCH: &str = "time_ns >= $1 AND time_ns < $2
    AND ($3::TEXT IS NULL OR agent = $3::TEXT)
    AND ($4::TEXT IS NULL OR port = $4::TEXT)
    AND ($5::TEXT IS NULL OR point = $5::TEXT)
    AND ($6::TEXT IS NULL OR src = $6::TEXT)
    AND ($7::TEXT IS NULL OR dst = $7::TEXT)
    AND ($8::BIGINT IS NULL OR sport = $8::BIGINT)
    AND ($9::BIGINT IS NULL OR dport = $9::BIGINT)
    AND ($10::BIGINT IS NULL OR proto = $10::BIGINT)
    AND ($11::TEXT IS NULL OR COALESCE(direction, 'unknown') = $11::TEXT)";

/// The values of [`RECORDS_MATCH`]'s parameters.
struct RecordArgs<'a> {
    from: i64,
    to: i64,
    f: &'a RecordFilter<'a>,
}

impl<'a> RecordArgs<'a> {
    fn of(f: &'a RecordFilter<'a>, w: Window) -> RecordArgs<'a> {
        RecordArgs { from: i(w.from_ns), to: i(w.to_ns), f }
    }

    fn args(&self) -> Vec<&(dyn ToSql + Sync)> {
        let f = self.f;
        vec![
            &self.from,
            &self.to,
            &f.exporter,
            &f.interface,
            &f.point,
            &f.src,
            &f.dst,
            &f.sport,
            &f.dport,
            &f.proto,
            &f.direction,
        ]
    }
}

/// The `flow` rows matching `cond`, as `per` and `kept` (the rule of
/// [`crate::store`]'s `counted_once`: a flow seen at an interface's egress is counted there
/// only), in PostgreSQL's words.
fn counted_once(egress: bool, cond: &str) -> String {
    if !egress {
        return format!(
            "WITH per AS (
               SELECT src, dst, sport, dport, proto, packets, bytes, 1 AS records, exact,
                      error_bound::FLOAT8 * error_bound AS var
               FROM flows WHERE {cond}),
             kept AS (SELECT * FROM per)"
        );
    }
    format!(
        "WITH per AS (
           SELECT agent, port, src, dst, sport, dport, proto,
                  direction IS NOT DISTINCT FROM 'egress' AS egress,
                  SUM(packets) AS packets, SUM(bytes) AS bytes, COUNT(*) AS records,
                  bool_and(exact) AS exact, SUM(error_bound::FLOAT8 * error_bound) AS var
           FROM flows WHERE {cond}
           GROUP BY 1, 2, 3, 4, 5, 6, 7, 8),
         kept AS (
           SELECT * FROM (
             SELECT *, bool_and(egress) OVER (PARTITION BY agent, port, src, dst, sport, dport,
                    proto) AS only_egress
             FROM per) t
           WHERE egress = only_egress)"
    )
}
