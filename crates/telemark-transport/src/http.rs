//! A request and its response as plain values: the services' handlers are pure functions from
//! one to the other (and the wall clock), so tests call the same code the server does.

use serde::Serialize;
use serde_json::json;

/// One request, as the server read it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// Path and query.
    pub url: &'a str,
    /// The token of its `Authorization: Bearer` header.
    pub token: Option<&'a str>,
    /// Its body.
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// A `GET` of `url` without a token.
    pub fn get(url: &'a str) -> Self {
        Request { method: "GET", url, token: None, body: b"" }
    }

    /// The path, without the query.
    pub fn path(&self) -> &'a str {
        self.url.split_once('?').map_or(self.url, |(p, _)| p)
    }
}

/// An HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Content type.
    pub content_type: &'static str,
    /// Body.
    pub body: Vec<u8>,
    /// Other headers.
    pub headers: Vec<(&'static str, String)>,
}

impl Response {
    /// `v` as JSON.
    pub fn json<T: Serialize>(status: u16, v: &T) -> Response {
        Response {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(v).unwrap_or_default(),
            headers: Vec::new(),
        }
    }

    /// Plain text (the Prometheus exposition format is one).
    pub fn text(content_type: &'static str, body: String) -> Response {
        Response { status: 200, content_type, body: body.into_bytes(), headers: Vec::new() }
    }

    /// A JSON error `{"error": msg}`.
    pub fn error(status: u16, msg: impl std::fmt::Display) -> Response {
        Response::json(status, &json!({ "error": msg.to_string() }))
    }

    /// 401 with the challenge RFC 6750 asks for.
    pub fn unauthenticated() -> Response {
        let mut r = Response::error(401, "a valid token is needed (Authorization: Bearer)");
        r.headers.push(("WWW-Authenticate", "Bearer realm=\"telemark\"".into()));
        r
    }
}

/// The token of an `Authorization: Bearer <token>` header value (RFC 6750).
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// What a service answers with: a pure function of the request and the wall clock.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request; `now` is ns since the Unix epoch.
    fn handle(&self, req: &Request<'_>, now: u64) -> Response;

    /// The metrics label for `path`: one of a fixed set, so a scan of unknown paths cannot grow
    /// the metrics.
    fn route(&self, path: &str) -> &'static str;

    /// Whether a request may be made at all, from its head alone (method, path without the
    /// query, bearer token): asked before a byte of its body is read, so a client without a
    /// valid token cannot make the server hold (or wait for) its body. `Some(answer)` refuses
    /// it (401, 403, 404, …; the server counts 401 as `unauthenticated`, 403 as `forbidden`);
    /// `None` admits it, and [`Handler::handle`] then sees the whole request. The default
    /// admits everything.
    fn admit(&self, method: &str, path: &str, token: Option<&str>) -> Option<Response> {
        let _ = (method, path, token);
        None
    }
}

/// Whether the host of URL `u` (`http://host[:port][/…]`) is a loopback address or
/// `localhost` (a name that may resolve anywhere else is not).
pub fn loopback_url(u: &str) -> bool {
    let rest = u.split_once("://").map_or(u, |(_, r)| r);
    let auth = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = auth.rsplit_once('@').map_or(auth, |(_, h)| h);
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// The one rule for a bearer token sent to `url` (config key `key`): it crosses the network
/// only inside TLS, unless the operator opted in (`opt_in`, config key `opt_in_key`) on a
/// network they trust; then it is sent, with a warning. Loopback is not the network. `what`
/// names the token, `ca_key` the setting that gives https:// its CA.
pub fn token_in_clear(
    url: &str,
    key: &str,
    what: &str,
    ca_key: &str,
    opt_in_key: &str,
    opt_in: bool,
) -> Result<(), String> {
    if !url.starts_with("http://") || loopback_url(url) {
        return Ok(());
    }
    if !opt_in {
        return Err(format!(
            "{key} {url:?}: {what} would cross the network in clear text; use https:// (with \
             {ca_key}), or set {opt_in_key} = true on a network you trust"
        ));
    }
    tracing::warn!("{key} {url:?}: {what} goes in clear text ({opt_in_key} = true)");
    Ok(())
}

/// Whether a bearer token `got` equals `want`, in time that does not depend on where they
/// differ (so a scraper cannot guess a token byte by byte).
pub fn token_eq(want: &str, got: &str) -> bool {
    want.len() == got.len() && want.bytes().zip(got.bytes()).fold(0u8, |a, (x, y)| a | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_from_the_header() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
    }
}
