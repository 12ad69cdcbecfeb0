//! The collector's shared store: one PostgreSQL database that any number of collectors write
//! and read (docs/scale.md). Work in progress on branch postgres-store: schema, migrations,
//! partitions and the write path first.
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

use crate::store::StoreError;
use postgres::{Client, NoTls, Transaction};
use std::collections::BTreeSet;
use telemark_core::records::{Direction, Record};

/// A day in nanoseconds: the partitions' width.
const DAY_NS: i64 = 86_400_000_000_000;
/// An hour in nanoseconds (`flow_hours`).
const HOUR_NS: i64 = 3_600_000_000_000;
/// Advisory lock key of schema changes and partition creation ("telemark" in ASCII).
const SCHEMA_LOCK: i64 = 0x7465_6c65_6d61_726b;

/// Migrations, in order; each is applied once, in one transaction.
const MIGRATIONS: [&str; 1] = [
    // 1: the first schema.
    "CREATE TABLE agents (
        agent TEXT PRIMARY KEY, version TEXT NOT NULL, boot BIGINT NOT NULL,
        first_seen_ns BIGINT NOT NULL, last_seen_ns BIGINT NOT NULL,
        records BIGINT NOT NULL DEFAULT 0, export_dropped BIGINT NOT NULL DEFAULT 0
    );
    CREATE TABLE seen (
        agent TEXT NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL, time_ns BIGINT NOT NULL,
        PRIMARY KEY (agent, boot, seq)
    );
    CREATE INDEX seen_time ON seen (time_ns);
    CREATE TABLE loss (
        agent TEXT NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        port TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT,
        src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT, si SMALLINT,
        color SMALLINT NOT NULL, batch BIGINT NOT NULL, first_ns BIGINT NOT NULL,
        last_ns BIGINT NOT NULL, expected BIGINT, observed BIGINT NOT NULL,
        lost BIGINT NOT NULL, late BIGINT NOT NULL, uncertain BIGINT NOT NULL,
        scope TEXT NOT NULL, tail BOOLEAN NOT NULL, drops TEXT
    ) PARTITION BY RANGE (first_ns);
    CREATE INDEX loss_flow ON loss (src, dst, sport, dport, proto, first_ns);
    CREATE TABLE other (
        agent TEXT NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        kind TEXT NOT NULL, time_ns BIGINT NOT NULL, json TEXT NOT NULL
    ) PARTITION BY RANGE (time_ns);
    CREATE INDEX other_kind_time ON other (kind, time_ns);
    CREATE TABLE flows (
        time_ns BIGINT NOT NULL, agent TEXT NOT NULL, boot BIGINT NOT NULL, seq BIGINT NOT NULL,
        port TEXT NOT NULL, point TEXT NOT NULL, direction TEXT,
        src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, packets BIGINT NOT NULL, bytes BIGINT NOT NULL,
        exact BOOLEAN NOT NULL, error_bound BIGINT NOT NULL
    ) PARTITION BY RANGE (time_ns);
    CREATE INDEX flows_time ON flows (time_ns);
    CREATE TABLE flow_hours (
        hour BIGINT NOT NULL,
        src TEXT NOT NULL, dst TEXT NOT NULL, sport INTEGER NOT NULL, dport INTEGER NOT NULL,
        proto SMALLINT NOT NULL, spi BIGINT NOT NULL, si SMALLINT NOT NULL,
        agent TEXT NOT NULL, point TEXT NOT NULL, upstream TEXT NOT NULL, scope TEXT NOT NULL,
        batches BIGINT NOT NULL, lossy_batches BIGINT NOT NULL, expected NUMERIC NOT NULL,
        lost NUMERIC NOT NULL, uncertain NUMERIC NOT NULL,
        first_ns BIGINT NOT NULL, last_ns BIGINT NOT NULL,
        PRIMARY KEY (hour, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
    );
    CREATE TABLE flow_state (
        exporter TEXT NOT NULL, domain BIGINT NOT NULL, kind TEXT NOT NULL, id BIGINT NOT NULL,
        options BIGINT NOT NULL DEFAULT 0, value BYTEA NOT NULL, seen_ns BIGINT NOT NULL,
        PRIMARY KEY (exporter, domain, kind, id)
    );",
];

/// The tables partitioned by day, with the column they are partitioned on.
const PARTITIONED: [&str; 3] = ["loss", "other", "flows"];

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl From<postgres::Error> for StoreError {
    fn from(e: postgres::Error) -> StoreError {
        StoreError::Postgres(e.to_string())
    }
}

/// One collector's connection to the shared store.
pub struct PgStore {
    client: Client,
    /// Days whose partitions are known to exist.
    days: BTreeSet<i64>,
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
    /// Connects to `url` (`postgres://user@host/db`, or `host=/run/postgresql dbname=…`) and
    /// applies the migrations it lacks.
    pub fn connect(url: &str) -> Result<PgStore, StoreError> {
        let client = Client::connect(url, NoTls)?;
        let mut s = PgStore { client, days: BTreeSet::new() };
        s.migrate()?;
        Ok(s)
    }

    /// Applies every migration not yet applied, each once across collectors.
    fn migrate(&mut self) -> Result<(), StoreError> {
        let mut tx = self.client.transaction()?;
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
    fn ensure_days(&mut self, days: impl Iterator<Item = i64>) -> Result<(), StoreError> {
        let new: BTreeSet<i64> = days.filter(|d| !self.days.contains(d)).collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut tx = self.client.transaction()?;
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
        self.days.extend(new);
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
        self.client.execute(
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
    ) -> Result<crate::store::Stored, StoreError> {
        let mut st = crate::store::Stored::default();
        // Days before the transaction: partitions are made in one of their own.
        self.ensure_days(records.iter().map(|(_, r)| i(time_of(r, now)).div_euclid(DAY_NS)))?;
        // Key order, so that two collectors storing overlapping batches take their keys in
        // the same order and cannot deadlock.
        let mut order: Vec<usize> = (0..records.len()).collect();
        order.sort_by_key(|&n| records[n].0);
        let mut new = vec![false; records.len()];
        let mut tx = self.client.transaction()?;
        tx.execute(
            "INSERT INTO agents (agent, version, boot, first_seen_ns, last_seen_ns)
             VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT (agent) DO UPDATE SET boot = GREATEST(agents.boot, $3),
                last_seen_ns = GREATEST(agents.last_seen_ns, $4)",
            &[&agent, &version, &i(boot), &i(now)],
        )?;
        let seen = tx.prepare(
            "INSERT INTO seen (agent, boot, seq, time_ns) VALUES ($1, $2, $3, $4)
             ON CONFLICT DO NOTHING",
        )?;
        for &n in &order {
            let (seq, r) = records[n];
            let t = i(time_of(r, now));
            new[n] = tx.execute(&seen, &[&agent, &i(boot), &i(seq), &t])? == 1;
        }
        let fresh: Vec<(u64, &Record)> =
            order.iter().filter(|&&n| new[n]).map(|&n| records[n]).collect();
        insert(&mut tx, agent, boot, &fresh, now)?;
        let accepted = fresh.len() as u64;
        tx.execute(
            "UPDATE agents SET records = records + $2,
                export_dropped = COALESCE($3, export_dropped) WHERE agent = $1",
            &[&agent, &i(accepted), &export_dropped.map(i)],
        )?;
        tx.commit()?;
        st.accepted = accepted;
        st.duplicates = records.len() as u64 - accepted;
        st.new = new;
        Ok(st)
    }

    /// Rows in `table` (for tests and the sizing report).
    pub fn rows(&mut self, table: &str) -> Result<u64, StoreError> {
        if !["loss", "other", "flows", "seen", "flow_hours", "agents"].contains(&table) {
            return Err(StoreError::Postgres(format!("no table {table}")));
        }
        let n: i64 = self.client.query_one(&format!("SELECT COUNT(*) FROM {table}"), &[])?.get(0);
        Ok(n as u64)
    }
}

/// Inserts records already known to be new: loss batches and their hourly sums, flow
/// records in columns, everything else whole as JSON.
fn insert(
    tx: &mut Transaction<'_>,
    agent: &str,
    boot: u64,
    records: &[(u64, &Record)],
    now: u64,
) -> Result<(), StoreError> {
    let loss = tx.prepare(
        "INSERT INTO loss (agent, boot, seq, port, point, upstream, src, dst, sport, dport,
            proto, spi, si, color, batch, first_ns, last_ns, expected, observed, lost, late,
            uncertain, scope, tail, drops)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17,
            $18, $19, $20, $21, $22, $23, $24, $25)",
    )?;
    let other = tx.prepare(
        "INSERT INTO other (agent, boot, seq, kind, time_ns, json) VALUES ($1, $2, $3, $4, $5, $6)",
    )?;
    let flows = tx.prepare(
        "INSERT INTO flows (time_ns, agent, boot, seq, port, point, direction, src, dst, sport,
            dport, proto, packets, bytes, exact, error_bound)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )?;
    let hours = tx.prepare(
        "INSERT INTO flow_hours (hour, src, dst, sport, dport, proto, spi, si, agent, point,
            upstream, scope, batches, lossy_batches, expected, lost, uncertain, first_ns, last_ns)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 1, $13, $14::BIGINT,
            $15::BIGINT, $16::BIGINT, $17, $18)
         ON CONFLICT (hour, src, dst, sport, dport, proto, spi, si, agent, point, upstream, scope)
         DO UPDATE SET batches = flow_hours.batches + 1,
            lossy_batches = flow_hours.lossy_batches + excluded.lossy_batches,
            expected = flow_hours.expected + excluded.expected,
            lost = flow_hours.lost + excluded.lost,
            uncertain = flow_hours.uncertain + excluded.uncertain,
            first_ns = LEAST(flow_hours.first_ns, excluded.first_ns),
            last_ns = GREATEST(flow_hours.last_ns, excluded.last_ns)",
    )?;
    let (boot, agent) = (i(boot), agent);
    for &(seq, r) in records {
        let seq = i(seq);
        let kind = match r {
            Record::Loss(l) => {
                let f = &l.flow;
                let (sport, dport, proto) =
                    (i32::from(f.sport), i32::from(f.dport), i16::from(f.proto));
                let (spi, si) = (f.spi.map(i64::from), f.si.map(i16::from));
                tx.execute(
                    &loss,
                    &[
                        &agent,
                        &boot,
                        &seq,
                        &l.port,
                        &l.point,
                        &l.upstream,
                        &f.src,
                        &f.dst,
                        &sport,
                        &dport,
                        &proto,
                        &spi,
                        &si,
                        &i16::from(l.color),
                        &i(l.batch),
                        &i(l.first_ns),
                        &i(l.last_ns),
                        &l.expected.map(i),
                        &i(l.observed),
                        &i(l.lost),
                        &i(l.late),
                        &i(l.uncertain),
                        &l.scope.as_str(),
                        &l.tail,
                        &crate::store::drops_json(&l.drops),
                    ],
                )?;
                tx.execute(
                    &hours,
                    &[
                        &(i(l.first_ns) / HOUR_NS),
                        &f.src,
                        &f.dst,
                        &sport,
                        &dport,
                        &proto,
                        &spi.unwrap_or(-1),
                        &si.unwrap_or(-1),
                        &agent,
                        &l.point,
                        &l.upstream.as_deref().unwrap_or(""),
                        &l.scope.as_str(),
                        &i64::from(l.lost > 0),
                        &i(l.expected.unwrap_or(0)),
                        &i(l.lost),
                        &i(l.uncertain),
                        &i(l.first_ns),
                        &i(l.last_ns),
                    ],
                )?;
                continue;
            }
            Record::Summary(_) => "summary",
            Record::FlowLoss(_) => "flow_loss",
            Record::Cost(_) => "cost",
            Record::Capture(_) => "capture",
            Record::Health(_) => "health",
            Record::Event(_) => "event",
            Record::Flow(f) => {
                let fl = &f.flow;
                tx.execute(
                    &flows,
                    &[
                        &i(f.window_end_ns),
                        &agent,
                        &boot,
                        &seq,
                        &f.port,
                        &f.point,
                        &f.exported.direction.map(Direction::name),
                        &fl.src,
                        &fl.dst,
                        &i32::from(fl.sport),
                        &i32::from(fl.dport),
                        &i16::from(fl.proto),
                        &i(f.packets),
                        &i(f.bytes),
                        &f.exact,
                        &i(f.error_bound),
                    ],
                )?;
                "flow"
            }
        };
        let json = serde_json::to_string(r).unwrap_or_default();
        tx.execute(&other, &[&agent, &boot, &seq, &kind, &i(time_of(r, now)), &json])?;
    }
    Ok(())
}
