//! Who may do what: bearer tokens from a file (docs/collector.md, "Authentication").
//!
//! ```toml
//! [agents]            # may register and send records as this agent, and nothing else
//! sw-b = "8c1f…"
//! [readers]           # may read the API, the page's data and /metrics
//! grafana = "41d0…"
//! [operators]         # may read, and steer the agents (docs/console.md, "Steering")
//! alice = "77e3…"
//! ```
//!
//! A request names its token in `Authorization: Bearer <token>`. Tokens are compared in
//! constant time. Without a token file the collector serves anyone, and so it listens only on
//! a loopback address then (see [`crate::Collector::start`]).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Shortest token accepted: 128 bits as hex.
pub const MIN_TOKEN_LEN: usize = 32;

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// No token file: every request is trusted (loopback only).
    Anyone,
    /// An agent's token: it may write as that agent.
    Agent(String),
    /// A reader's token: it may read.
    Reader(String),
    /// An operator's token: it may read, and change the agents' rules through the collector.
    Operator(String),
}

impl Identity {
    /// Whether it may write records as agent `agent`.
    pub fn may_write_as(&self, agent: &str) -> bool {
        match self {
            Identity::Anyone => true,
            Identity::Agent(a) => a == agent,
            Identity::Reader(_) | Identity::Operator(_) => false,
        }
    }

    /// Whether it may write records as some agent.
    pub fn may_write(&self) -> bool {
        matches!(self, Identity::Anyone | Identity::Agent(_))
    }

    /// Whether it may read the API and metrics.
    pub fn may_read(&self) -> bool {
        matches!(self, Identity::Anyone | Identity::Reader(_) | Identity::Operator(_))
    }

    /// Whether it may change the agents' rules (the collector relays it to them): an
    /// operator's token only, also on a collector without a token file (everyone trusted there
    /// would include any web page its user opens: a browser sends a cross-site `POST` to
    /// loopback without asking).
    pub fn may_steer(&self) -> bool {
        matches!(self, Identity::Operator(_))
    }

    /// Who, for the log of changes: the token's name (`anyone` without a token file).
    pub fn name(&self) -> &str {
        match self {
            Identity::Anyone => "anyone",
            Identity::Agent(n) | Identity::Reader(n) | Identity::Operator(n) => n,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    agents: BTreeMap<String, String>,
    #[serde(default)]
    readers: BTreeMap<String, String>,
    #[serde(default)]
    operators: BTreeMap<String, String>,
}

/// The tokens.
#[derive(Clone)]
pub struct Auth {
    tokens: Vec<(Vec<u8>, Identity)>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: a token never reaches a log.
        let who: Vec<&Identity> = self.tokens.iter().map(|(_, i)| i).collect();
        f.debug_struct("Auth").field("identities", &who).finish()
    }
}

/// A token file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("token file {path}: {msg}")]
pub struct AuthError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub msg: String,
}

impl Auth {
    /// Reads a token file.
    pub fn load(path: &Path) -> Result<Auth, AuthError> {
        let err = |msg: String| AuthError { path: path.display().to_string(), msg };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Auth::parse(&text).map_err(err)
    }

    /// Parses a token file's text.
    pub fn parse(text: &str) -> Result<Auth, String> {
        let f: TokenFile = toml::from_str(text).map_err(|e| e.message().to_string())?;
        let mut tokens = Vec::new();
        let agents = f.agents.into_iter().map(|(n, t)| (t, Identity::Agent(n)));
        let readers = f.readers.into_iter().map(|(n, t)| (t, Identity::Reader(n)));
        let operators = f.operators.into_iter().map(|(n, t)| (t, Identity::Operator(n)));
        for (token, who) in agents.chain(readers).chain(operators) {
            let (Identity::Agent(name) | Identity::Reader(name) | Identity::Operator(name)) = &who
            else {
                continue;
            };
            if !telemark_core::records::valid_agent_name(name) {
                return Err(format!("{name:?}: names are 1-64 of letters, digits and - _ . :"));
            }
            if token.len() < MIN_TOKEN_LEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "{name}'s token: at least {MIN_TOKEN_LEN} printable characters without \
                     spaces (e.g. `openssl rand -hex 16`)"
                ));
            }
            if tokens.iter().any(|(t, _): &(Vec<u8>, Identity)| t == token.as_bytes()) {
                return Err(format!("{name}'s token is also another's: give each its own"));
            }
            tokens.push((token.into_bytes(), who));
        }
        if tokens.is_empty() {
            return Err("no tokens: give [agents], [readers] or [operators] at least one".into());
        }
        Ok(Auth { tokens })
    }

    /// Who holds `token` (`None`: nobody).
    pub fn identify(&self, token: Option<&str>) -> Option<Identity> {
        let token = token?.as_bytes();
        // Every token is compared, each in constant time, so the time taken says nothing
        // about which one came close.
        let mut found = None;
        for (t, who) in &self.tokens {
            if same(t, token) {
                found = Some(who.clone());
            }
        }
        found
    }
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "0123456789abcdef0123456789abcdef";
    const R: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn tokens_name_who_holds_them() {
        let auth =
            Auth::parse(&format!("[agents]\nsw-b = \"{A}\"\n[readers]\nops = \"{R}\"\n")).unwrap();
        assert_eq!(auth.identify(Some(A)), Some(Identity::Agent("sw-b".into())));
        assert_eq!(auth.identify(Some(R)), Some(Identity::Reader("ops".into())));
        assert_eq!(auth.identify(Some(&A[1..])), None);
        assert_eq!(auth.identify(None), None);
        let b = Identity::Agent("sw-b".into());
        assert!(b.may_write_as("sw-b") && !b.may_write_as("sw-f") && !b.may_read());
        assert!(Identity::Reader("ops".into()).may_read());
        assert!(!Identity::Reader("ops".into()).may_steer() && !b.may_steer());
        // Not even without a token file: a web page the user opens could steer then.
        assert!(!Identity::Anyone.may_steer());
        let op = Auth::parse(&format!("[operators]\nalice = \"{A}\"\n")).unwrap();
        let alice = op.identify(Some(A)).unwrap();
        assert!(alice.may_steer() && alice.may_read() && !alice.may_write());
        assert_eq!(alice.name(), "alice");
        // Nothing of a token in its Debug form.
        assert!(!format!("{auth:?}").contains(A));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        for (text, says) in [
            ("", "no tokens"),
            ("[agents]\nsw = \"short\"\n", "at least 32"),
            (&format!("[agents]\nsw = \"{A}\"\n[readers]\nx = \"{A}\"\n"), "also another's"),
            (&format!("[agents]\n\"a b\" = \"{A}\"\n"), "names are"),
            (&format!("[agent]\nsw = \"{A}\"\n"), "unknown field"),
        ] {
            let e = Auth::parse(text).err().unwrap_or_default();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
