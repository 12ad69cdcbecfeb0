//! The agent's control API (docs/int.md, "Control API"): `GET /api/v1/int` shows the INT
//! rules in force, `PUT /api/v1/int` replaces them (the INT paper's SDN controller). Both need
//! the control token (`[control] token_file`); without one configured the API is off. It is
//! served on the `/metrics` listener, as `telemark int-collector` serves its
//! `/api/v1/detectors`.

use crate::config::IntRulesSection;
use crate::shared::Shared;
use std::sync::Arc;
use telemark_transport::http::{Request, Response};

/// The control API's one path.
pub(crate) const INT: &str = "/api/v1/int";

/// The control API of a running agent: the INT rules in [`Shared`], and who may change them.
pub(crate) struct Control {
    pub(crate) shared: Arc<Shared>,
    /// The token a controller must send; `None`: no control API.
    pub(crate) token: Option<String>,
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
            _ => Err(Response::error(405, "GET or PUT /api/v1/int")),
        }
    }

    /// `GET` or `PUT /api/v1/int`, once [`Control::access`] let it through.
    pub(crate) fn handle(&self, req: &Request<'_>) -> Response {
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
