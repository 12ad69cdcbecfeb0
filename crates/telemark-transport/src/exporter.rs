//! The agent's side of the transport: a bounded buffer of records with sequence numbers, sent in
//! batches, removed only when the collector acknowledged them, retried otherwise.
//!
//! Delivery is at least once (a batch whose acknowledgement was lost is sent again) and the
//! collector stores each (agent, boot, seq) once, so a collector restart neither loses nor
//! duplicates a closed record. When the buffer is full, new records are dropped and counted
//! (`dropped`), and the count travels with every request so the collector shows it. Nothing
//! here blocks the fast path: the aggregator thread owns the exporter.

use crate::wire::{Ack, Ingest, Register};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use telemark_core::records::Record;

/// Why a flush did not get everything acknowledged.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The collector could not be reached, or timed out.
    #[error("collector unreachable: {0}")]
    Transport(String),
    /// The collector answered with an error.
    #[error("collector said {status}: {body}")]
    Rejected {
        /// HTTP status.
        status: u16,
        /// Its error message.
        body: String,
    },
}

/// An exporter for one agent.
pub struct Exporter {
    base: String,
    agent: String,
    version: String,
    boot: u64,
    next_seq: u64,
    buf: VecDeque<(u64, Record)>,
    cap: usize,
    batch: usize,
    http: ureq::Agent,
    /// `Bearer <token>`, when the collector wants one.
    authorization: Option<String>,
    registered: bool,
    /// Records dropped because the buffer was full.
    pub dropped: u64,
    /// Records acknowledged.
    pub acked: u64,
    /// Records the collector already had (acknowledged again after a retry).
    pub duplicates: u64,
    /// Failed flushes.
    pub failures: u64,
}

impl Exporter {
    /// An exporter to the collector at `base` (`http://host:port`), holding at most `cap`
    /// records; `boot` identifies this run of the agent (use the start time in ns).
    pub fn new(base: &str, agent: &str, boot: u64, cap: usize) -> Exporter {
        Exporter {
            base: base.trim_end_matches('/').to_string(),
            agent: agent.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            boot,
            next_seq: 0,
            buf: VecDeque::new(),
            cap: cap.max(1),
            batch: 1000,
            http: Self::client().build(),
            authorization: None,
            registered: false,
            dropped: 0,
            acked: 0,
            duplicates: 0,
            failures: 0,
        }
    }

    /// Sends `token` with every request (the collector's token file names it for this agent).
    pub fn with_token(mut self, token: Option<&str>) -> Exporter {
        self.authorization = token.map(|t| format!("Bearer {t}"));
        self
    }

    /// Speaks TLS with `tls` (for an `https://` collector whose certificate a private CA
    /// signed: [`crate::tls::client_config`]); without it, `https://` trusts the public web PKI.
    pub fn with_tls(mut self, tls: Arc<rustls::ClientConfig>) -> Exporter {
        self.http = Self::client().tls_config(tls).build();
        self
    }

    /// Sends to another collector (or with another token or TLS trust) from now on, keeping
    /// the records not yet acknowledged and their sequence numbers: the new collector stores
    /// each once, as a restarted one would.
    pub fn retarget(
        &mut self,
        base: &str,
        token: Option<&str>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) {
        self.base = base.trim_end_matches('/').to_string();
        self.authorization = token.map(|t| format!("Bearer {t}"));
        self.http = match tls {
            Some(t) => Self::client().tls_config(t).build(),
            None => Self::client().build(),
        };
        self.registered = false;
    }

    /// Holds at most `cap` records from now on (records already held stay).
    pub fn set_capacity(&mut self, cap: usize) {
        self.cap = cap.max(1);
    }

    fn client() -> ureq::AgentBuilder {
        ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(1))
            .timeout(Duration::from_secs(5))
    }

    /// Queues a record; false (and counted) when the buffer is full.
    pub fn push(&mut self, r: Record) -> bool {
        if self.buf.len() >= self.cap {
            self.dropped += 1;
            return false;
        }
        self.buf.push_back((self.next_seq, r));
        self.next_seq += 1;
        true
    }

    /// Records waiting for an acknowledgement.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Sends everything buffered, batch by batch; stops at the first failure (the records stay
    /// buffered for the next call).
    pub fn flush(&mut self) -> Result<u64, ExportError> {
        let r = self.flush_inner();
        if r.is_err() {
            self.failures += 1;
        }
        r
    }

    fn flush_inner(&mut self) -> Result<u64, ExportError> {
        let mut sent = 0;
        if !self.registered {
            self.register()?;
        }
        while let Some(&(seq, _)) = self.buf.front() {
            let n = self.buf.len().min(self.batch);
            let body = Ingest {
                agent: self.agent.clone(),
                boot: self.boot,
                seq,
                export_dropped: self.dropped,
                records: self.buf.iter().take(n).map(|(_, r)| r).collect(),
            };
            match self.post::<_, Ack>("/api/v1/ingest", &body) {
                Ok(ack) => {
                    self.duplicates += ack.duplicates;
                    self.acked += n as u64;
                    self.buf.drain(..n);
                    sent += n as u64;
                }
                Err(ExportError::Rejected { status: 409, .. }) => {
                    // The collector lost its registration (a new database): register again.
                    self.registered = false;
                    self.register()?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    fn register(&mut self) -> Result<(), ExportError> {
        let body =
            Register { agent: self.agent.clone(), version: self.version.clone(), boot: self.boot };
        self.post::<_, serde_json::Value>("/api/v1/agents", &body)?;
        self.registered = true;
        Ok(())
    }

    fn post<B: Serialize, A: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<A, ExportError> {
        let mut req = self.http.post(&format!("{}{path}", self.base));
        if let Some(a) = &self.authorization {
            req = req.set("Authorization", a);
        }
        match req.send_json(body) {
            Ok(r) => r.into_json().map_err(|e| ExportError::Transport(e.to_string())),
            Err(ureq::Error::Status(status, r)) => {
                Err(ExportError::Rejected { status, body: r.into_string().unwrap_or_default() })
            }
            Err(e) => Err(ExportError::Transport(e.to_string())),
        }
    }
}
