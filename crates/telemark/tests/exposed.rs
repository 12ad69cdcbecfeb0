//! The collector as an exposed service must survive what any client on the network can do:
//! hold sockets open without sending, send a body one byte at a time, send headers that never
//! end, and use up its file descriptors. The collector runs as its own process; the tests check
//! that real requests are still answered, promptly, while that goes on, and that it recovers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `telemark collector` with `extra` flags on a free loopback port; with `max_files`, its
/// open-file limit (soft and hard) is set to that.
fn start(dir: &std::path::Path, extra: &[&str], max_files: Option<u64>) -> (Proc, SocketAddr) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_telemark"));
    cmd.args(["collector", "--listen", "127.0.0.1:0", "--retention", "0"])
        .arg("--db")
        .arg(dir.join("c.db"))
        .args(extra)
        .stderr(Stdio::piped());
    if let Some(n) = max_files {
        // SAFETY: setrlimit in the child between fork and exec is async-signal-safe.
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit { rlim_cur: n, rlim_max: n };
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("collector starts");
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Proc(child), addr)
}

/// A GET on a new connection: its status and how long the answer took.
fn timed_get(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let t = Instant::now();
    let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(20)).build();
    let status = match http.get(&format!("http://{addr}{path}")).call() {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("GET {path}: {e}"),
    };
    (status, t.elapsed())
}

fn metric(addr: SocketAddr, line_prefix: &str) -> u64 {
    let m = ureq::get(&format!("http://{addr}/metrics")).call().unwrap().into_string().unwrap();
    m.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The status code of the answer to `bytes` sent raw on a new connection (0: closed unanswered).
fn raw_status(addr: SocketAddr, bytes: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = s.write_all(bytes);
    let mut head = [0u8; 12];
    match s.read_exact(&mut head) {
        Ok(()) => String::from_utf8_lossy(&head[9..12]).parse().unwrap_or(0),
        Err(_) => 0,
    }
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p) as usize]
}

/// 1,000 idle sockets, 4 that send a body one byte at a time and 4 that never finish their
/// headers, all at once (each would have frozen a tiny_http worker for 30 s): real requests
/// are still answered at once, and the server closes the slow ones at its timeouts.
#[test]
fn slow_and_idle_sockets_do_not_hold_real_requests() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, addr) = start(dir.path(), &["--head-timeout", "3s", "--body-timeout", "4s"], None);
    let idle: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let slow: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let head = if i < 4 {
                    "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
                } else {
                    "GET /api/v1/agents HTTP/1.1\r\nHost: x\r\nX-Slow: "
                };
                s.write_all(head.as_bytes()).unwrap();
                let t = Instant::now();
                // One byte every 100 ms until the server gives up on the socket.
                while t.elapsed() < Duration::from_secs(20) {
                    std::thread::sleep(Duration::from_millis(100));
                    if s.write_all(b"a").is_err() {
                        break;
                    }
                }
                let mut rest = Vec::new();
                s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
                let _ = s.read_to_end(&mut rest);
                (
                    t.elapsed(),
                    String::from_utf8_lossy(&rest).lines().next().unwrap_or("").to_string(),
                )
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut took = Vec::new();
    for _ in 0..50 {
        let (status, t) = timed_get(addr, "/api/v1/agents");
        assert_eq!(status, 200);
        took.push(t);
        std::thread::sleep(Duration::from_millis(20));
    }
    let (median, worst) = (percentile(&mut took, 0.5), percentile(&mut took, 1.0));
    eprintln!(
        "with 1,000 idle and 8 slow sockets open: 50 requests, median {:.2} ms, worst {:.2} ms",
        median.as_secs_f64() * 1e3,
        worst.as_secs_f64() * 1e3
    );
    // Not held behind any timeout (the shortest is 3 s).
    assert!(worst < Duration::from_secs(1), "a request waited {worst:?}");
    for h in slow {
        let (lasted, answer) = h.join().unwrap();
        assert!(lasted < Duration::from_secs(10), "a slow socket was kept {lasted:?}");
        // A body that never completes is answered 408; a head that never ends is just closed.
        assert!(answer.is_empty() || answer.contains("408"), "{answer:?}");
    }
    // The idle ones were closed at the head timeout.
    let mut closed = 0;
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 64];
        closed += usize::from(matches!(s.read(&mut b), Ok(0) | Err(_)));
    }
    assert_eq!(closed, 1000, "idle sockets closed by the server");
    assert!(metric(addr, "telemark_collector_http_refused_total{reason=\"body_timeout\"}") >= 4);
}

/// Headers and URLs beyond the limits are refused with the status that says so.
#[test]
fn oversize_heads_and_urls_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, addr) = start(dir.path(), &[], None);
    let big_header = format!(
        "GET /api/v1/agents HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    assert_eq!(raw_status(addr, big_header.as_bytes()), 431);
    let long_url =
        format!("GET /api/v1/flows?x={} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(8 << 10));
    assert_eq!(raw_status(addr, long_url.as_bytes()), 414);
    let (status, _) = timed_get(addr, "/api/v1/agents");
    assert_eq!(status, 200);
    assert_eq!(metric(addr, "telemark_collector_http_refused_total{reason=\"url_too_long\"}"), 1);
}

/// With its file descriptors used up by clients, the collector keeps running (the accept
/// failures are counted, not fatal) and answers again as soon as they are released.
#[test]
fn file_descriptor_exhaustion_is_survived() {
    let dir = tempfile::tempdir().unwrap();
    let (mut c, addr) = start(dir.path(), &[], Some(64));
    let hogs: Vec<TcpStream> = (0..200).filter_map(|_| TcpStream::connect(addr).ok()).collect();
    assert!(hogs.len() >= 100, "connections open: {}", hogs.len());
    std::thread::sleep(Duration::from_millis(500));
    drop(hogs);
    // The sockets the server holds close as it reads their EOF; it answers again.
    let t = Instant::now();
    let status = loop {
        let http = ureq::AgentBuilder::new().timeout(Duration::from_secs(2)).build();
        match http.get(&format!("http://{addr}/api/v1/agents")).call() {
            Ok(r) => break r.status(),
            Err(e) if t.elapsed() > Duration::from_secs(20) => panic!("never answered again: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    assert_eq!(status, 200);
    assert!(c.0.try_wait().unwrap().is_none(), "the collector is still running");
    assert!(metric(addr, "telemark_collector_http_refused_total{reason=\"accept\"}") > 0);
}
