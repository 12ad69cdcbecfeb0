//! The agent's control API (docs/int.md, "Control API"; docs/console.md, "Steering"):
//! `GET /api/v1/int` shows the INT rules in force, `PUT /api/v1/int` replaces them (the INT
//! paper's SDN controller); `GET`/`PUT /api/v1/watch` do the same for the flows the loss
//! monitor watches (the loss paper's selection of flows to measure, made from outside: the
//! collector's console steers agents through it). All need the control token
//! (`[control] token_file`); without one configured the API is off. It is served on the
//! `/metrics` listener, as `telemark int-collector` serves its `/api/v1/detectors`.

use crate::config::{watch_rules, IntRulesSection, WatchSection};
use crate::shared::Shared;
use std::sync::Arc;
use telemark_transport::http::{Request, Response};

/// The control API's paths: the INT rules, the watch rules.
pub(crate) const INT: &str = "/api/v1/int";
pub(crate) const WATCH: &str = "/api/v1/watch";

/// The control API of a running agent: the INT rules in [`Shared`], and who may change them.
pub(crate) struct Control {
    pub(crate) shared: Arc<Shared>,
    /// The token a controller must send; `None`: no control API.
    pub(crate) token: Option<String>,
    /// Whether the agent has an INT stage (`[int]`): without one, its INT rules cannot change.
    pub(crate) int: bool,
    /// Whether its datapath takes watch rules (the AF_PACKET switch does; the eBPF datapath
    /// measures every flow at its ports, docs/ebpf.md).
    pub(crate) watch: bool,
}

impl Control {
    /// Whether a request to [`INT`] may be made, from its method and token alone. The
    /// listener asks this before the server reads a body (so a local user without the control
    /// token cannot hold the listener's body budget), and again before [`Control::handle`].
    pub(crate) fn access(&self, method: &str, token: Option<&str>) -> Result<(), Response> {
        let Some(want) = &self.token else {
            return Err(Response::error(
                404,
                "the control API is off: set [control] token_file and [int]",
            ));
        };
        if !token.is_some_and(|t| telemark_transport::http::token_eq(want, t)) {
            return Err(Response::unauthenticated());
        }
        match method {
            "GET" | "PUT" => Ok(()),
            _ => Err(Response::error(405, "GET or PUT /api/v1/int or /api/v1/watch")),
        }
    }

    /// `GET` or `PUT` of [`INT`] or [`WATCH`], once [`Control::access`] let it through.
    pub(crate) fn handle(&self, req: &Request<'_>) -> Response {
        if req.path() == WATCH {
            if !self.watch && req.method == "PUT" {
                return Response::error(
                    409,
                    "this agent's eBPF datapath measures every flow at its ports: it takes no \
                     watch rules",
                );
            }
            return self.watch(req);
        }
        if !self.int {
            return Response::error(409, "this agent has no INT stage: add [int] to its file");
        }
        match req.method {
            "GET" => {
                let rules = self.shared.int_rules();
                Response::json(200, &rules.map(|r| r.text).unwrap_or_default())
            }
            "PUT" => {
                let body: IntRulesSection = match serde_json::from_slice(req.body) {
                    Ok(b) => b,
                    Err(e) => return Response::error(400, format!("body: {e}")),
                };
                match body.validate() {
                    Ok(rules) => {
                        let text = rules.text.clone();
                        self.shared.set_int_rules(rules);
                        tracing::info!("INT rules replaced through the control API");
                        Response::json(200, &text)
                    }
                    Err(e) => Response::error(400, e),
                }
            }
            _ => Response::error(405, "GET or PUT /api/v1/int"),
        }
    }
}

impl Control {
    /// `GET /api/v1/watch`: the rules in force, as a list of `[[watch]]` tables in JSON (empty:
    /// every flow). `PUT`: replaces them (the fast path takes them within 100 ms).
    fn watch(&self, req: &Request<'_>) -> Response {
        let shown = |w: &telemark_core::watch::Watch| -> Vec<WatchSection> {
            w.rules.iter().map(WatchSection::of).collect()
        };
        match req.method {
            "GET" => {
                let w = self.shared.watch.lock().unwrap_or_else(|p| p.into_inner()).clone();
                Response::json(200, &shown(&w))
            }
            "PUT" => {
                let body: Vec<WatchSection> = match serde_json::from_slice(req.body) {
                    Ok(b) => b,
                    Err(e) => {
                        return Response::error(
                            400,
                            format!("body: {e} (a list of rules: [{{\"dst\": \"10.0.3.0/24\"}}])"),
                        )
                    }
                };
                match watch_rules(&body) {
                    Ok(w) => {
                        let changed = self.shared.set_watch(w.clone());
                        tracing::info!(
                            changed,
                            rules = w.rules.len(),
                            "watch rules replaced through the control API"
                        );
                        Response::json(200, &shown(&w))
                    }
                    Err(e) => Response::error(400, e),
                }
            }
            _ => Response::error(405, "GET or PUT /api/v1/watch"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(method: &'a str, body: &'a [u8]) -> Request<'a> {
        Request { method, url: WATCH, token: Some("t"), body }
    }

    /// The watch rules through the control API: shown as written, replaced by valid rules (the
    /// fast path's mailbox gets them), refused with the rule's number and fault otherwise.
    #[test]
    fn watch_rules_are_shown_and_replaced() {
        let shared = Arc::new(Shared::default());
        let c =
            Control { shared: shared.clone(), token: Some("t".into()), int: false, watch: true };
        assert!(c.access("PUT", Some("t")).is_ok() && c.access("PUT", Some("x")).is_err());
        let r = c.handle(&req("GET", b""));
        assert_eq!((r.status, r.body.as_slice()), (200, b"[]".as_slice()));
        let rules = br#"[{"dst":"10.0.3.0/24","proto":"udp"},{"sport":4050}]"#;
        let r = c.handle(&req("PUT", rules));
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let shown: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            shown,
            serde_json::json!([{"dst": "10.0.3.0/24", "proto": "17"}, {"sport": 4050}])
        );
        let taken = shared.new_watch.lock().unwrap().take().expect("the fast path's mailbox");
        assert_eq!(taken.rules.len(), 2);
        // The same rules again change nothing; GET shows them.
        assert_eq!(c.handle(&req("PUT", rules)).status, 200);
        assert!(shared.new_watch.lock().unwrap().is_none());
        let r = c.handle(&req("GET", b""));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(), shown);
        for (body, says) in [
            (&br#"[{"dst":"10.0.3.0/40"}]"#[..], "#1"),
            (br#"[{"sport":1},{}]"#, "#2 is empty"),
            (br#"[{"colour":1}]"#, "unknown field"),
            (br#"{"dst":"10.0.0.0/8"}"#, "a list of rules"),
        ] {
            let r = c.handle(&req("PUT", body));
            let text = String::from_utf8_lossy(&r.body);
            assert!(
                r.status == 400 && text.contains(says),
                "{}: {text}",
                String::from_utf8_lossy(body)
            );
        }
        // Nothing refused reached the fast path.
        assert!(shared.new_watch.lock().unwrap().is_none());
        // No INT stage here: its rules are not there to change.
        let r = Request { method: "PUT", url: INT, token: Some("t"), body: b"{}" };
        assert_eq!(c.handle(&r).status, 409);
        // An eBPF agent takes no watch rules, and says so.
        let ebpf = Control { shared, token: Some("t".into()), int: false, watch: false };
        assert_eq!(ebpf.handle(&req("PUT", rules)).status, 409);
        assert_eq!(ebpf.handle(&req("GET", b"")).status, 200);
    }
}
