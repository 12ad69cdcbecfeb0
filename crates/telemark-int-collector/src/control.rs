//! `telemark int-collector`'s control API (docs/int.md, "Control API"): the detector rules in
//! force, and their replacement at run time in every worker, as the agent's `PUT /api/v1/int`
//! replaces a sink's. The rules are checked here once, for the config file's `[[detect]]` and
//! for the API's body alike; each worker's new detector table is built here, off its receive
//! loop, and taken by the worker between two batches.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use telemark_core::int::{DetectRule, DetectSection, Detectors};

/// The most detector rules: a flow remembers its rule as a 16-bit index.
const MAX_RULES: usize = 1 << 16;

/// How long a `PUT` waits for every worker to take its new table (a worker looks ten times a
/// second, between two batches).
const APPLY_WAIT: Duration = Duration::from_secs(2);

/// The detector rules as written: the config file's `[[detect]]` list, the body of `PUT
/// /api/v1/detectors` and the answer of `GET` (`{"detect": [...]}`, as in the agent's body).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DetectList {
    /// Tried in order; a flow's first match decides its detector.
    #[serde(default)]
    pub(crate) detect: Vec<DetectSection>,
}

/// Rules checked, with the text they came from (to show them back).
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    /// As written.
    pub(crate) text: DetectList,
    /// As the detectors run them; events are turned into records with these.
    pub(crate) rules: Arc<Vec<DetectRule>>,
}

impl DetectList {
    /// Checks every rule, naming the first bad one.
    pub(crate) fn validate(self) -> Result<Rules, String> {
        if self.detect.len() > MAX_RULES {
            return Err(format!("{} [[detect]] rules: at most {MAX_RULES}", self.detect.len()));
        }
        let mut rules = Vec::with_capacity(self.detect.len());
        for (n, d) in self.detect.iter().enumerate() {
            rules.push(d.rule().map_err(|e| format!("[[detect]] rule {}: {e}", n + 1))?);
        }
        Ok(Rules { text: self, rules: Arc::new(rules) })
    }
}

/// A worker's next rules, with the detector table built for them.
pub(crate) type NewTable = (Arc<Vec<DetectRule>>, Detectors);

/// Why a change was refused (the label of `telemark_int_detector_changes_refused_total`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Refused {
    /// No control token, or a wrong one.
    Unauthenticated,
    /// A body that is not JSON of the right shape, or a rule that does not check.
    Invalid,
}

impl Refused {
    /// Every reason, in label order.
    pub(crate) const ALL: [Refused; 2] = [Refused::Unauthenticated, Refused::Invalid];

    /// The label value.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refused::Unauthenticated => "unauthenticated",
            Refused::Invalid => "invalid",
        }
    }
}

/// The rules in force and the tables the workers are to take next, under one lock so that
/// the two never disagree.
struct State {
    in_force: DetectList,
    rule_count: usize,
    pending: Vec<Option<NewTable>>,
}

/// The detector rules of a running int-collector, shared by its workers and its listener.
pub(crate) struct Control {
    /// Flows each worker's table holds.
    flows: usize,
    state: Mutex<State>,
    /// One change at a time, from its check to its last worker.
    change: Mutex<()>,
    changes: AtomicU64,
    refused: [AtomicU64; Refused::ALL.len()],
}

impl Control {
    /// `rules` in force in `workers` workers whose tables hold `flows` flows each.
    pub(crate) fn new(rules: &Rules, workers: usize, flows: usize) -> Control {
        Control {
            flows,
            state: Mutex::new(State {
                in_force: rules.text.clone(),
                rule_count: rules.rules.len(),
                pending: (0..workers).map(|_| None).collect(),
            }),
            change: Mutex::new(()),
            changes: AtomicU64::default(),
            refused: Default::default(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The rules in force, as written.
    pub(crate) fn in_force(&self) -> DetectList {
        self.state().in_force.clone()
    }

    /// How many rules are in force.
    pub(crate) fn rule_count(&self) -> usize {
        self.state().rule_count
    }

    /// Changes applied so far.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Relaxed)
    }

    /// Changes refused so far for `why`.
    pub(crate) fn refused(&self, why: Refused) -> u64 {
        self.refused[why as usize].load(Ordering::Relaxed)
    }

    /// Counts a refused change.
    pub(crate) fn refuse(&self, why: Refused) {
        self.refused[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Worker `w`'s new rules and table, if a change left them; never waits (a change may
    /// hold the lock a moment).
    pub(crate) fn take(&self, w: usize) -> Option<NewTable> {
        self.state.try_lock().ok()?.pending.get_mut(w)?.take()
    }

    /// A `PUT` body: checked as the config file's rules are, then put in force in every
    /// worker. The rules now in force, or why nothing changed (counted).
    pub(crate) fn put(&self, body: &[u8]) -> Result<DetectList, String> {
        let checked = serde_json::from_slice::<DetectList>(body)
            .map_err(|e| format!("body: {e}"))
            .and_then(DetectList::validate);
        match checked {
            Ok(rules) => {
                let text = rules.text.clone();
                if self.replace(rules) {
                    tracing::info!("detector rules replaced through the control API");
                }
                Ok(text)
            }
            Err(e) => {
                self.refuse(Refused::Invalid);
                Err(e)
            }
        }
    }

    /// Puts `rules` in force: builds each worker's table here, hands it over and waits (up
    /// to [`APPLY_WAIT`]) until every worker has taken its own. Rules equal to those in force
    /// are not applied again (flows keep their state); whether these were applied.
    fn replace(&self, rules: Rules) -> bool {
        let _one = self.change.lock().unwrap_or_else(|p| p.into_inner());
        let workers = {
            let s = self.state();
            if s.in_force == rules.text {
                return false;
            }
            s.pending.len()
        };
        // A table may be megabytes: built without the lock the workers look at.
        let tables: Vec<NewTable> = (0..workers)
            .map(|_| (rules.rules.clone(), Detectors::new(rules.rules.to_vec(), self.flows)))
            .collect();
        {
            let mut s = self.state();
            s.in_force = rules.text;
            s.rule_count = rules.rules.len();
            s.pending = tables.into_iter().map(Some).collect();
        }
        self.changes.fetch_add(1, Ordering::Relaxed);
        let until = Instant::now() + APPLY_WAIT;
        while self.state().pending.iter().any(Option::is_some) {
            if Instant::now() >= until {
                tracing::warn!("a worker has not taken the new detector rules yet");
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(json: &str) -> Result<Rules, String> {
        serde_json::from_str::<DetectList>(json).map_err(|e| e.to_string())?.validate()
    }

    #[test]
    fn bodies_are_checked_as_the_file_is() {
        let ok = list(
            r#"{"detect": [{"flows": "dport=7001", "detector": "per_hop",
                            "metric": "hop_latency", "threshold": "5us"}]}"#,
        )
        .unwrap();
        assert_eq!(ok.rules.len(), 1);
        assert_eq!(ok.rules[0].detector.threshold(), Some(5_000));
        for (body, want) in [
            (
                r#"{"detect": [{"detector": "per_hop", "metric": "hop_latncy", "threshold": "1"}]}"#,
                "hop_latncy",
            ),
            (r#"{"detect": [{"detector": "per_hop", "metric": "hop_latency"}]}"#, "threshold"),
            (r#"{"detect": [{"detector": "noop"}, {"detector": "sometimes"}]}"#, "rule 2"),
            (r#"{"rule": []}"#, "unknown field"),
            (r#"{"detect": [{"detector": "noop", "colour": 1}]}"#, "unknown field"),
        ] {
            let e = list(body).err().unwrap_or_default();
            assert!(e.contains(want), "{body}: {e:?}");
        }
    }

    #[test]
    fn every_worker_takes_its_own_table_and_equal_rules_are_not_applied_again() {
        let first = list(r#"{"detect": [{"detector": "noop"}]}"#).unwrap();
        let c = Arc::new(Control::new(&first, 2, 64));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let c = c.clone();
                std::thread::spawn(move || loop {
                    if let Some((rules, table)) = c.take(w) {
                        assert_eq!(*rules, *table.rules());
                        return rules.len();
                    }
                    std::thread::sleep(Duration::from_millis(1));
                })
            })
            .collect();
        let body =
            br#"{"detect": [{"detector": "noop"}, {"detector": "noop", "flows": "dport=1"}]}"#;
        assert!(c.put(body).is_ok());
        // The answer came once both had taken theirs.
        assert!(c.state().pending.iter().all(Option::is_none));
        for w in workers {
            assert_eq!(w.join().unwrap(), 2);
        }
        assert_eq!((c.changes(), c.rule_count()), (1, 2));
        assert!(c.put(body).is_ok());
        assert_eq!(c.changes(), 1, "the same rules again change nothing");
        assert!(c.state().pending.iter().all(Option::is_none));
        assert!(c.put(b"{").is_err());
        assert_eq!((c.refused(Refused::Invalid), c.rule_count()), (1, 2));
    }
}
