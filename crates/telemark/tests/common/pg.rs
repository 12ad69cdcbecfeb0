//! A throw-away PostgreSQL 15 server (Debian's `postgresql`) for tests: run as the `postgres`
//! user (so the test needs root) on its own port and a socket directory of its own, with no
//! TCP listener, read back with `psql`. Shared by the tests of the collector's store and the
//! fleet tests (crates/telemark/tests).

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = "/usr/lib/postgresql/15/bin";

/// A throw-away server; stopped when dropped.
pub struct Server {
    dir: tempfile::TempDir,
    port: u16,
}

impl Server {
    /// Initialises and starts one, with an empty database `telemark`.
    pub fn start() -> Server {
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

    /// The URL collectors take (`--db`): the socket directory percent-encoded as the host.
    pub fn url(&self) -> String {
        let host = self.dir.path().display().to_string().replace('/', "%2F");
        format!("postgresql://postgres@{host}:{}/telemark", self.port)
    }

    /// Restarts the server (fast shutdown: clients' connections are closed).
    pub fn restart(&self) {
        let d = self.dir.path();
        let opts = format!("-k {} -p {} -c listen_addresses=''", d.display(), self.port);
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--", &format!("{BIN}/pg_ctl"), "-D"])
            .arg(d.join("data"))
            .args(["-l"])
            .arg(d.join("log"))
            .args(["-m", "fast", "-w", "-o", &opts, "restart"])
            .output()
            .unwrap();
        assert!(out.status.success(), "restart: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// `sql`'s output by psql (unaligned, tuples only).
    pub fn psql(&self, db: &str, sql: &str) -> String {
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
