//! The collector as an exposed service must survive what any client on the network can do:
//! hold sockets open without sending, send a body one byte at a time, send headers that never
//! end, and use up its file descriptors. The collector runs as its own process; the tests check
//! that real requests are still answered, promptly, while that goes on, and that it recovers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The collector's process, and what it wrote to stderr (after its first line).
struct Proc(Child, std::sync::Arc<std::sync::Mutex<String>>);

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
    let mut err = BufReader::new(child.stderr.take().unwrap());
    err.read_line(&mut line).unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let to = log.clone();
    std::thread::spawn(move || {
        for l in err.lines() {
            let Ok(l) = l else { break };
            let mut to = to.lock().unwrap();
            to.push_str(&l);
            to.push('\n');
        }
    });
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (Proc(child, log), addr)
}

impl Proc {
    /// Whether the collector's log has a line containing `what` within 10 s: the log reaches
    /// the test through a reader thread, so a line written before an answer may come after it.
    fn logged(&self, what: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.1.lock().unwrap().contains(what) {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
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
    // (One source may hold 256 connections by default, and bodies must come at 1 KiB/s after
    // 2 s: both lifted here, so that the timeouts are what closes these sockets.)
    let flags = [
        "--head-timeout",
        "3s",
        "--body-timeout",
        "4s",
        "--max-connections-per-source",
        "2000",
        "--min-body-rate",
        "0",
    ];
    let (_c, addr) = start(dir.path(), &flags, None);
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

/// A TCP connection to `to` from source address `from` (a loopback address other than
/// 127.0.0.1 stands for another host), given up after `timeout` as the agent's connect is.
fn connect_from(
    from: std::net::Ipv4Addr,
    to: SocketAddr,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else { panic!("IPv4 only") };
    let sin = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns (closed on every error,
    // else handed to the TcpStream).
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let src = sin(from, 0);
        if libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dst = sin(*to.ip(), to.port());
        if libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len) != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                return Err(e);
            }
            let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
            if libc::poll(&mut p, 1, timeout.as_millis() as i32) != 1 {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"));
            }
            if let Some(e) = s.take_error()? {
                return Err(e);
            }
        }
        s.set_nonblocking(false)?;
        Ok(s)
    }
}

/// One GET sent on `s`: the status and the body.
fn get_on(mut s: TcpStream, path: &str) -> std::io::Result<(u16, String)> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
    let mut all = String::new();
    s.read_to_string(&mut all)?;
    let status = all.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, all.split_once("\r\n\r\n").map_or("", |x| x.1).to_string()))
}

/// The value of the metric line starting with `prefix` in `page`.
fn metric_in(page: &str, prefix: &str) -> u64 {
    page.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Raises this test process's open-file limit to its hard limit (it holds thousands of
/// sockets).
fn raise_files() {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
}

/// The attack that worked before (issue 31, item 6): 4,400 idle connections from one address
/// (the listen backlog was 128, the connection bound 4,096) made 27 of 38 new connections with
/// the agent's 1 s connect timeout fail, and /metrics too. Now one address holds at most 256
/// (the rest are closed at once, counted): 38 connections from another address, each with a
/// 1 s connect timeout, are all answered, /metrics among them.
#[test]
fn idle_connections_from_one_address_do_not_lock_out_others() {
    raise_files();
    let dir = tempfile::tempdir().unwrap();
    let (_c, addr) = start(dir.path(), &[], None);
    let t = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..4400 {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect {}: {e}", idle.len()),
        }
    }
    eprintln!("4,400 idle connections from 127.0.0.1 in {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(500));
    let other = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let (mut ok, mut took) = (0, Vec::new());
    for n in 0..38 {
        let t = Instant::now();
        let path = if n % 2 == 0 { "/metrics" } else { "/api/v1/agents" };
        match connect_from(other, addr, Duration::from_secs(1)).and_then(|s| get_on(s, path)) {
            Ok((200, _)) => ok += 1,
            Ok((s, _)) => eprintln!("{path}: {s}"),
            Err(e) => eprintln!("{path}: {e}"),
        }
        took.push(t.elapsed());
    }
    let worst = percentile(&mut took, 1.0);
    eprintln!("38 connections from 127.0.0.2: {ok} answered, worst {worst:?}");
    assert_eq!(ok, 38);
    let (_, page) =
        get_on(connect_from(other, addr, Duration::from_secs(1)).unwrap(), "/metrics").unwrap();
    let closed =
        metric_in(&page, "telemark_collector_http_refused_total{reason=\"per_source_limit\"}");
    eprintln!("closed at once for 127.0.0.1's limit: {closed}");
    assert_eq!(closed, 4400 - 256);
    // The 256 it holds are open, the others closed by the server.
    let mut open = 0;
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 1];
        open += usize::from(
            matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        );
    }
    assert_eq!(open, 256);
}

/// Near the connection bound, connections idle for a second are closed (counted), so that
/// idle ones from many addresses cannot hold every slot for the whole head timeout.
#[test]
fn idle_connections_are_closed_near_the_connection_bound() {
    raise_files();
    let dir = tempfile::tempdir().unwrap();
    let flags = ["--max-connections", "400", "--head-timeout", "60s"];
    let (_c, addr) = start(dir.path(), &flags, None);
    // 4 addresses x 100: every slot, none over its address's limit.
    let idle: Vec<TcpStream> = (0..400)
        .map(|n| {
            let from = std::net::Ipv4Addr::new(127, 0, 1, 1 + (n % 4) as u8);
            connect_from(from, addr, Duration::from_secs(1)).unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let other = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let (status, page) =
        get_on(connect_from(other, addr, Duration::from_secs(1)).unwrap(), "/metrics").unwrap();
    eprintln!("with every slot held by idle connections: /metrics {status} in {:?}", t.elapsed());
    assert_eq!(status, 200);
    // Answered well before the 60 s head timeout would have freed a slot.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(
        metric_in(&page, "telemark_collector_http_refused_total{reason=\"idle_under_pressure\"}")
            > 0
    );
    drop(idle);
}

/// A tmpfs of `size` mounted on `at` (needs root), unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mounting a tmpfs needs root (this test runs as root in CI)");
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn loss_record(batch: u64) -> telemark_core::records::Record {
    use telemark_core::records::{Flow, LossRecord, Record, Scope};
    let t = telemark_transport::now_ns() - 60_000_000_000 + batch * 10_000_000;
    Record::Loss(LossRecord {
        agent: "sw-b".into(),
        port: "p1".into(),
        point: "egress".into(),
        upstream: Some("ingress".into()),
        scope: Scope::Segment,
        flow: Flow {
            src: "10.0.0.1".into(),
            dst: "10.0.0.7".into(),
            sport: 40000,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        },
        color: (batch % 2) as u8,
        batch,
        period_ns: None,
        first_ns: t,
        last_ns: t + 9_000_000,
        expected: Some(100),
        observed: 99,
        lost: 1,
        late: 0,
        uncertain: 0,
        tail: false,
        incomplete: false,
        drops: Vec::new(),
        ttl: None,
        own_colour: 0,
    })
}

/// Disk full (issue 31, item 8): writes were refused and not acknowledged (right), but
/// /readyz stayed 200, storage_ready 1, and nothing was logged. Now a write that fails for
/// want of space makes the collector unready (503, storage_ready 0, one log line) until a
/// write succeeds again; what was acknowledged is all stored. Needs root (a 2 MiB tmpfs).
#[test]
fn a_full_disk_makes_the_collector_unready_until_writes_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    let _fs = Tmpfs::mount(&mnt, "2m");
    let (c, addr) = start(&mnt, &[], None);
    let status = |path: &str| timed_get(addr, path).0;
    let mut ex =
        telemark_transport::exporter::Exporter::new(&format!("http://{addr}"), "sw-b", 1, 100_000);
    let mut batch = 0;
    let mut push = |ex: &mut telemark_transport::exporter::Exporter, n: u64| {
        for _ in 0..n {
            ex.push(loss_record(batch));
            batch += 1;
        }
    };
    push(&mut ex, 100);
    assert_eq!(ex.flush().unwrap(), 100);
    assert_eq!(status("/readyz"), 200);
    // Fill the file system.
    let filler = mnt.join("filler");
    {
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 << 10];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
    }
    let mut acked = 100;
    let mut failed = false;
    for _ in 0..20 {
        push(&mut ex, 1000);
        match ex.flush() {
            Ok(n) => acked += n,
            Err(e) => {
                eprintln!("with the disk full: {e}");
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "a write failed once the disk was full");
    assert_eq!(status("/readyz"), 503);
    assert_eq!(metric(addr, "telemark_collector_storage_ready "), 0);
    assert_eq!(status("/healthz"), 200);
    assert!(c.logged("not ready until a write succeeds"), "no log line");
    // Space again: the next write succeeds, and with it the collector is ready.
    std::fs::remove_file(&filler).unwrap();
    acked += ex.flush().unwrap();
    assert_eq!(status("/readyz"), 200);
    assert_eq!(metric(addr, "telemark_collector_storage_ready "), 1);
    assert!(c.logged("writes succeed again"), "no log line");
    assert_eq!(acked, batch);
    drop(c);
}

/// The collector's peak resident memory, MB (VmHWM).
fn peak_rss_mb(c: &Proc) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{}/status", c.0.id())).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap()
        / 1024
}

/// Eight concurrent 8 MiB ingest bodies of tiny JSON values took the collector to 660 MB
/// (issue 31, item 8; a reader's token sufficed: the body was parsed before the 403). Now a
/// reader's is refused from its head, and a writer's values are counted before they are
/// parsed (at most 1,000,000 a request, 2,000,000 being parsed at once).
#[test]
fn bodies_of_tiny_values_do_not_blow_up_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (w, r) = ("b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0", "0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, format!("[agents]\nsw-b = \"{w}\"\n[readers]\nops = \"{r}\"\n"))
        .unwrap();
    let (c, addr) = start(dir.path(), &["--auth", tokens.to_str().unwrap()], None);
    let head = b"{\"agent\":\"sw-b\",\"boot\":1,\"seq\":0,\"records\":[";
    let mut body = head.to_vec();
    while body.len() < (8 << 20) - 4 {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]}");
    let body = std::sync::Arc::new(body);
    let before = peak_rss_mb(&c);
    for (who, token) in [("reader", r), ("writer", w)] {
        let answers: Vec<_> = (0..8)
            .map(|_| {
                let body = body.clone();
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    let _ = write!(
                        s,
                        "POST /api/v1/ingest HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \
                         {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(&body);
                    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
                    let mut a = [0u8; 12];
                    s.read_exact(&mut a).map(|()| String::from_utf8_lossy(&a[9..]).to_string())
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let peak = peak_rss_mb(&c);
        eprintln!("8 x 8 MiB of tiny values, {who}'s token: {answers:?}, peak RSS {peak} MB");
        assert!(peak < before + 150, "{who}: peak {peak} MB from {before} MB");
    }
}
