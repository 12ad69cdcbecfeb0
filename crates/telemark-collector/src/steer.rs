//! Steering the agents from one place (docs/console.md, "Steering"): the collector relays an
//! operator's changes of an agent's watch rules and INT rules to that agent's control API
//! (`GET`/`PUT /api/v1/watch`, `/api/v1/int`, with the agent's control token), and can make
//! agents watch the N heaviest flows it sees: the loss paper's active selection of the flows to
//! measure (its future work), here across hosts.
//!
//! Which agents, where and with which token comes from a file (`--control`):
//!
//! ```toml
//! [agents.sw-b]
//! url = "http://127.0.0.1:9901"      # the agent's [metrics] listener
//! token_file = "/etc/telemark/sw-b.control"
//! ```
//!
//! Every change is logged with who made it (the operator's token name), the agent, what and
//! the agent's answer, and the last [`KEPT`] changes are kept for the console.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Changes kept for the console.
pub const KEPT: usize = 200;

/// Longest an agent may take to answer (the whole exchange).
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest answer read from an agent.
const MAX_ANSWER: u64 = 64 << 10;

/// Largest rules relayed: what an agent's control listener takes (its body limit, 64 KiB).
pub const MAX_RULES: usize = 64 << 10;

/// Relays to agents at once: each holds a request thread of the collector for up to
/// [`AGENT_TIMEOUT`], so a hung agent may hold at most this many; more are refused (503).
const RELAYS: usize = 2;

/// Of those, what reads of rules may hold (anyone's, operators' too: the page reads every
/// agent's rules on each draw): a change always finds a place, whatever is being read.
const READ_RELAYS: usize = 1;

/// What a relay does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Relay {
    /// Reads an agent's rules.
    Read,
    /// Changes them.
    Change,
}

/// Most bytes of the rules sent, and of an agent's answer, kept and logged with a change.
const KEPT_TEXT: usize = 2048;

/// The rules an agent's control API holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleSet {
    /// The flows its loss monitor watches.
    Watch,
    /// Its INT roles and detectors.
    Int,
}

impl RuleSet {
    fn path(self) -> &'static str {
        match self {
            RuleSet::Watch => "/api/v1/watch",
            RuleSet::Int => "/api/v1/int",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlFile {
    agents: BTreeMap<String, AgentEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentEntry {
    url: String,
    token_file: std::path::PathBuf,
}

/// One agent's control API.
struct AgentControl {
    url: String,
    token: String,
}

/// A change made through the collector.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    /// When (ns since the epoch).
    pub time_ns: u64,
    /// Who: the operator's token name.
    pub who: String,
    /// The agent.
    pub agent: String,
    /// Which rules.
    pub rules: RuleSet,
    /// The rules sent (their first [`KEPT_TEXT`] bytes as JSON text).
    pub sent: String,
    /// `ok`, or the agent's error.
    pub result: String,
}

/// Why a relay failed.
#[derive(Debug, thiserror::Error)]
pub enum SteerError {
    /// No such agent in the control file.
    #[error("agent {0:?} is not in the control file (--control)")]
    UnknownAgent(String),
    /// As many relays as allowed are waiting on agents already.
    #[error("{RELAYS} changes are waiting on agents already; retry")]
    Busy,
    /// The agent refused the change (its answer said why).
    #[error("agent {agent} said {status}: {body}")]
    Refused {
        /// Agent.
        agent: String,
        /// Its HTTP status.
        status: u16,
        /// Its answer.
        body: String,
    },
    /// The agent could not be reached.
    #[error("agent {agent} at {url}: {msg}")]
    Unreachable {
        /// Agent.
        agent: String,
        /// Where.
        url: String,
        /// What happened.
        msg: String,
    },
}

/// The agents the collector steers.
pub struct Steering {
    agents: BTreeMap<String, AgentControl>,
    http: ureq::Agent,
    changes: Mutex<VecDeque<Change>>,
    /// Relays under way: all of them (at most [`RELAYS`]), and reads (at most
    /// [`READ_RELAYS`]).
    relaying: Mutex<(usize, usize)>,
}

/// A relay's place among [`RELAYS`], given back on drop.
struct Relaying<'a>(&'a Mutex<(usize, usize)>, Relay);

impl Drop for Relaying<'_> {
    fn drop(&mut self) {
        let mut n = self.0.lock().unwrap_or_else(|p| p.into_inner());
        n.0 -= 1;
        n.1 -= usize::from(self.1 == Relay::Read);
    }
}

/// `s` cut to at most `n` bytes, on a character boundary.
fn cut(s: &str, n: usize) -> String {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    if end < s.len() {
        format!("{}…", &s[..end])
    } else {
        s.to_string()
    }
}

impl Steering {
    /// Reads the control file: each agent's control URL and the file holding its token.
    pub fn load(path: &Path) -> Result<Steering, String> {
        let err = |m: String| format!("control file {}: {m}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        let f: ControlFile = toml::from_str(&text).map_err(|e| err(e.message().to_string()))?;
        let mut agents = BTreeMap::new();
        for (name, e) in f.agents {
            if !telemark_core::records::valid_agent_name(&name) {
                return Err(err(format!(
                    "{name:?}: names are 1-64 of letters, digits and - _ . :"
                )));
            }
            let url = e.url.trim_end_matches('/').to_string();
            let host_is_loopback = url
                .strip_prefix("http://")
                .and_then(|r| r.split('/').next())
                .and_then(|hp| hp.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])))
                .is_some_and(|h| {
                    h == "localhost" || h.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
                });
            // The agent's control listener is loopback-only (docs/agent.md): its token never
            // crosses a network in clear.
            if !host_is_loopback {
                return Err(err(format!(
                    "{name}: url {url:?} is not http:// on a loopback address (an agent serves its \
                     control API on loopback only; run the collector on its host, or forward the \
                     port, e.g. ssh -L)"
                )));
            }
            let token = std::fs::read_to_string(&e.token_file)
                .map_err(|x| err(format!("{name}: token_file {}: {x}", e.token_file.display())))?
                .trim()
                .to_string();
            if token.is_empty() {
                return Err(err(format!("{name}: token_file {} is empty", e.token_file.display())));
            }
            agents.insert(name, AgentControl { url, token });
        }
        Ok(Steering {
            agents,
            http: ureq::AgentBuilder::new().timeout(AGENT_TIMEOUT).redirects(0).build(),
            changes: Mutex::new(VecDeque::new()),
            relaying: Mutex::new((0, 0)),
        })
    }

    /// The agents, by name.
    pub fn agents(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// Agent `agent`'s rules of `set`, as it answers them.
    pub fn get(&self, agent: &str, set: RuleSet) -> Result<Value, SteerError> {
        self.call(agent, "GET", set, None, Relay::Read)
    }

    /// Whether `agent` is steered here.
    pub fn knows(&self, agent: &str) -> bool {
        self.agents.contains_key(agent)
    }

    /// Replaces agent `agent`'s rules of `set` with `rules`, for `who`; logged and kept (a
    /// change for an agent not in the control file is neither).
    pub fn put(
        &self,
        who: &str,
        agent: &str,
        set: RuleSet,
        rules: &Value,
        now: u64,
    ) -> Result<Value, SteerError> {
        if !self.knows(agent) {
            return Err(SteerError::UnknownAgent(agent.into()));
        }
        let r = self.call(agent, "PUT", set, Some(rules), Relay::Change);
        let result = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => cut(&e.to_string(), KEPT_TEXT),
        };
        let sent = cut(&rules.to_string(), KEPT_TEXT);
        tracing::info!(who, agent, rules = ?set, result = %result.escape_debug(), sent = %sent.escape_debug(), "control: rules changed");
        let mut c = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        if c.len() == KEPT {
            c.pop_front();
        }
        c.push_back(Change {
            time_ns: now,
            who: who.to_string(),
            agent: agent.to_string(),
            rules: set,
            sent,
            result,
        });
        r
    }

    /// The changes kept, newest first.
    pub fn changes(&self) -> Vec<Change> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner()).iter().rev().cloned().collect()
    }

    fn call(
        &self,
        agent: &str,
        method: &str,
        set: RuleSet,
        body: Option<&Value>,
        what: Relay,
    ) -> Result<Value, SteerError> {
        let a = self.agents.get(agent).ok_or_else(|| SteerError::UnknownAgent(agent.into()))?;
        let _relaying = {
            let mut n = self.relaying.lock().unwrap_or_else(|p| p.into_inner());
            let read = what == Relay::Read;
            if n.0 >= RELAYS || (read && n.1 >= READ_RELAYS) {
                return Err(SteerError::Busy);
            }
            n.0 += 1;
            n.1 += usize::from(read);
            Relaying(&self.relaying, what)
        };
        let url = format!("{}{}", a.url, set.path());
        let req =
            self.http.request(method, &url).set("Authorization", &format!("Bearer {}", a.token));
        let r = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let unreachable =
            |msg: String| SteerError::Unreachable { agent: agent.into(), url: a.url.clone(), msg };
        let read = |r: ureq::Response| -> Result<String, SteerError> {
            use std::io::Read;
            let mut s = String::new();
            r.into_reader()
                .take(MAX_ANSWER)
                .read_to_string(&mut s)
                .map_err(|e| unreachable(e.to_string()))?;
            Ok(s)
        };
        match r {
            Ok(r) => {
                let text = read(r)?;
                serde_json::from_str(&text).map_err(|e| unreachable(format!("its answer: {e}")))
            }
            Err(ureq::Error::Status(status, r)) => {
                let text = read(r).unwrap_or_default();
                let body = serde_json::from_str::<Value>(&text)
                    .ok()
                    .and_then(|v| v["error"].as_str().map(str::to_string))
                    .unwrap_or(text);
                Err(SteerError::Refused { agent: agent.into(), status, body })
            }
            Err(e) => Err(unreachable(e.to_string())),
        }
    }
}

/// Exact watch rules for `flows` (each its five-tuple).
pub fn watch_rules_for(flows: &[telemark_core::records::Flow]) -> Value {
    let host = |a: &str| if a.contains(':') { format!("{a}/128") } else { format!("{a}/32") };
    Value::Array(
        flows
            .iter()
            .map(|f| {
                serde_json::json!({
                    "src": host(&f.src), "dst": host(&f.dst), "proto": f.proto.to_string(),
                    "sport": f.sport, "dport": f.dport,
                })
            })
            .collect(),
    )
}

impl std::fmt::Debug for Steering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names and URLs only: a token never reaches a log.
        let agents: Vec<(&String, &String)> =
            self.agents.iter().map(|(n, a)| (n, &a.url)).collect();
        f.debug_struct("Steering").field("agents", &agents).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_file_names_loopback_agents_and_their_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("t");
        std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
        let file = dir.path().join("control.toml");
        let write = |url: &str| {
            std::fs::write(
                &file,
                format!("[agents.sw-b]\nurl = \"{url}\"\ntoken_file = {:?}\n", token.display()),
            )
            .unwrap();
        };
        write("http://127.0.0.1:9901/");
        let s = Steering::load(&file).unwrap();
        assert_eq!(s.agents().collect::<Vec<_>>(), ["sw-b"]);
        for (url, says) in [
            ("http://10.0.0.5:9901", "loopback"),
            ("https://127.0.0.1:9901", "loopback"),
            ("http://[::1]:9901", ""),
        ] {
            write(url);
            match Steering::load(&file) {
                Ok(_) => assert!(says.is_empty(), "{url} taken"),
                Err(e) => assert!(!says.is_empty() && e.contains(says), "{url}: {e}"),
            }
        }
        // Nobody listens there: the relay says which agent and where.
        write("http://127.0.0.1:1");
        let s = Steering::load(&file).unwrap();
        let e = s.put("alice", "sw-b", RuleSet::Watch, &serde_json::json!([]), 1).unwrap_err();
        assert!(e.to_string().contains("sw-b at http://127.0.0.1:1"), "{e}");
        let unknown = s.get("sw-x", RuleSet::Int);
        assert!(matches!(unknown, Err(SteerError::UnknownAgent(_))));
        let e = s.put("alice", "sw-x", RuleSet::Watch, &serde_json::json!([]), 1).unwrap_err();
        assert!(matches!(e, SteerError::UnknownAgent(_)));
        // The failed change is kept, the unknown agent's is not; what is kept is bounded.
        let c = s.changes();
        assert_eq!((c.len(), c[0].who.as_str(), c[0].rules), (1, "alice", RuleSet::Watch));
        let big = serde_json::json!([{ "src": "x".repeat(10_000) }]);
        let _ = s.put("alice", "sw-b", RuleSet::Watch, &big, 2);
        assert!(s.changes()[0].sent.len() <= KEPT_TEXT + 3);
        // The relays' budget is given back.
        assert_eq!(*s.relaying.lock().unwrap(), (0, 0));
    }

    /// An agent that never answers holds a relay's place until the timeout: reads hold at
    /// most one, so an operator's change still goes out.
    #[test]
    fn reads_never_take_the_last_relay_from_a_change() {
        let hung = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (file, token) = (dir.path().join("control.toml"), dir.path().join("token"));
        std::fs::write(&token, "c".repeat(32)).unwrap();
        let url = format!("http://{}", hung.local_addr().unwrap());
        let text = format!("[agents.sw-b]\nurl = {url:?}\ntoken_file = {token:?}\n");
        std::fs::write(&file, text).unwrap();
        let s = Steering::load(&file).unwrap();
        std::thread::scope(|sc| {
            let first = sc.spawn(|| s.get("sw-b", RuleSet::Watch));
            while s.relaying.lock().unwrap().1 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            let second = s.get("sw-b", RuleSet::Watch);
            assert!(matches!(second, Err(SteerError::Busy)), "{second:?}");
            // The operator's change is relayed (and times out on the hung agent: not Busy).
            let change = s.put("alice", "sw-b", RuleSet::Watch, &serde_json::json!([]), 1);
            assert!(matches!(change, Err(SteerError::Unreachable { .. })), "{change:?}");
            assert!(matches!(first.join().unwrap(), Err(SteerError::Unreachable { .. })));
        });
        assert_eq!(*s.relaying.lock().unwrap(), (0, 0));
    }

    #[test]
    fn watch_rules_for_flows_are_their_five_tuples() {
        let f = telemark_core::records::Flow {
            src: "10.0.0.1".into(),
            dst: "2001:db8::7".into(),
            sport: 40000,
            dport: 5201,
            proto: 17,
            spi: None,
            si: None,
        };
        assert_eq!(
            watch_rules_for(&[f]),
            serde_json::json!([{"src": "10.0.0.1/32", "dst": "2001:db8::7/128", "proto": "17",
                                "sport": 40000, "dport": 5201}])
        );
    }
}
