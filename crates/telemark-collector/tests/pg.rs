//! The shared store on a real PostgreSQL 15 server (Debian's `postgresql`), started by the
//! test as the `postgres` user on its own port and socket directory, and read back with
//! `psql`, not through Telemark. Needs root (to run the server as `postgres`).

use std::path::{Path, PathBuf};
use std::process::Command;
use telemark_collector::pg::PgStore;
use telemark_core::records::{Flow, LossRecord, Record, Scope};

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A throw-away server; stopped when dropped.
struct Server {
    dir: tempfile::TempDir,
    port: u16,
}

impl Server {
    fn start() -> Server {
        assert!(
            Path::new(BIN).join("initdb").exists(),
            "PostgreSQL 15 is missing: apt-get install postgresql (bash .ci/run does)"
        );
        let dir = tempfile::Builder::new().prefix("tm-pg").tempdir().unwrap();
        let d = dir.path();
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let run = |args: &[&str]| {
            let out =
                Command::new("runuser").args(["-u", "postgres", "--"]).args(args).output().unwrap();
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let data = d.join("data");
        run(&[
            &format!("{BIN}/initdb"),
            "-D",
            data.to_str().unwrap(),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
        ]);
        let opts = format!("-k {} -p {port} -c listen_addresses=''", d.display());
        run(&[
            &format!("{BIN}/pg_ctl"),
            "-D",
            data.to_str().unwrap(),
            "-l",
            d.join("log").to_str().unwrap(),
            "-w",
            "-o",
            &opts,
            "start",
        ]);
        let s = Server { dir, port };
        s.psql("postgres", "CREATE DATABASE telemark");
        s
    }

    /// The connection string collectors use.
    fn url(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=telemark",
            self.dir.path().display(),
            self.port
        )
    }

    /// `sql`'s output by psql (unaligned, tuples only).
    fn psql(&self, db: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", self.dir.path().to_str().unwrap(), "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .unwrap();
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let data: PathBuf = self.dir.path().join("data");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", &format!("{BIN}/pg_ctl"), "-D"])
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn loss(agent: &str, sport: u16, b: u64, lost: u64) -> Record {
    Record::Loss(LossRecord {
        agent: agent.into(),
        port: "p".into(),
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
        // Over three days, so that records land in three partitions.
        first_ns: 1_790_000_000_000_000_000 + b * 60_000_000_000,
        last_ns: 1_790_000_000_000_000_000 + b * 60_000_000_000 + 1,
        expected: Some(100),
        observed: 100 - lost,
        lost,
        late: 0,
        uncertain: 0,
        scope: Scope::Segment,
        tail: false,
        drops: Vec::new(),
    })
}

/// Two collectors store the same records at once, in different orders and chunks, each
/// chunk twice: psql finds every record once, the per-flow loss sums equal the truth, and
/// each record was counted new by exactly one of them. A third collector connecting finds
/// the schema applied and applies nothing again.
#[test]
fn two_collectors_store_each_record_once() {
    let server = Server::start();
    let agents = ["h1", "h2"];
    let mut truth_lost = 0u64;
    let mut records: Vec<(&str, u64, Record)> = Vec::new();
    for agent in agents {
        for b in 0..3000u64 {
            let lost = u64::from(b % 11 == 0) * (b % 5 + 1);
            truth_lost += lost;
            records.push((agent, b, loss(agent, 4000 + (b % 20) as u16, b, lost)));
        }
    }
    let total = records.len() as u64;
    let run = |rev: bool, chunk: usize| {
        let mut s = PgStore::connect(&server.url()).unwrap();
        let mut mine: Vec<&(&str, u64, Record)> = records.iter().collect();
        if rev {
            mine.reverse();
        }
        let mut accepted = 0;
        for c in mine.chunks(chunk) {
            for _ in 0..2 {
                for agent in agents {
                    let batch: Vec<(u64, &Record)> =
                        c.iter().filter(|r| r.0 == agent).map(|r| (r.1, &r.2)).collect();
                    if !batch.is_empty() {
                        accepted += s.store(agent, 1, &batch, "kafka", None, 1).unwrap().accepted;
                    }
                }
            }
        }
        accepted
    };
    let (a, b) = std::thread::scope(|sc| {
        let a = sc.spawn(|| run(false, 97));
        let b = sc.spawn(|| run(true, 131));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a + b, total, "each record new at exactly one collector ({a} + {b})");
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM loss"), total.to_string());
    assert_eq!(
        server.psql(
            "telemark",
            "SELECT COUNT(*) FROM (SELECT 1 FROM loss GROUP BY agent, boot, seq HAVING COUNT(*) > 1) d"
        ),
        "0"
    );
    assert_eq!(server.psql("telemark", "SELECT SUM(lost) FROM loss"), truth_lost.to_string());
    assert_eq!(
        server.psql("telemark", "SELECT SUM(lost), SUM(batches) FROM flow_hours"),
        format!("{truth_lost}|{total}")
    );
    let parts = server
        .psql("telemark", "SELECT COUNT(*) FROM pg_inherits WHERE inhparent = 'loss'::regclass");
    assert_eq!(parts, "3", "one partition a day");
    let _third = PgStore::connect(&server.url()).unwrap();
    assert_eq!(server.psql("telemark", "SELECT COUNT(*) FROM telemark_migrations"), "1");
}
