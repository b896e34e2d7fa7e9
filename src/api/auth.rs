//! Who may call what: three roles, each a set of Bearer tokens (`[auth]`).
//! `api` guards the OpenAI routes, `trainer` the trajectory, group and export
//! routes, `admin` the `/admin/*` routes; an admin token is also a trainer
//! token. A role with no token is open (as vLLM without `--api-key`), and
//! [`check_exposure`] refuses to serve a non-loopback address with the
//! trainer or admin role open.
//!
//! Tokens are kept as SHA-256 digests and compared in constant time: the
//! presented token is hashed once and compared with every configured digest
//! without an early exit, so neither the position of the first differing
//! byte nor a token's length shows in the timing.

use crate::config::usable_token;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Api,
    Trainer,
    Admin,
}

impl Role {
    fn key(self) -> &'static str {
        match self {
            Role::Api => "auth.api_keys",
            Role::Trainer => "auth.trainer_tokens",
            Role::Admin => "auth.admin_tokens",
        }
    }
}

type Token = [u8; 32];

/// The token digests of each role.
#[derive(Debug, Default)]
pub struct Auth {
    api: Vec<Token>,
    trainer: Vec<Token>,
    admin: Vec<Token>,
}

fn digest(token: &str) -> Token {
    Sha256::digest(token.as_bytes()).into()
}

/// Tokens of a `*_file`: one per line, blank lines and `#` comments ignored.
fn read_tokens(key: &str, path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("{key}_file = {}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if !usable_token(t) {
            anyhow::bail!(
                "{key}_file = {} line {}: a token is 8 to 4096 printable ASCII characters \
                 without spaces",
                path.display(),
                n + 1
            );
        }
        out.push(t.to_string());
    }
    if out.is_empty() {
        // Setting the file asks for the role to be guarded: an empty one
        // (a secret not mounted yet) must not leave it open.
        anyhow::bail!(
            "{key}_file = {} holds no token (only blank lines and comments): \
             the role would be open",
            path.display()
        );
    }
    Ok(out)
}

impl Auth {
    /// The roles of `[auth]` (files read now) plus the deprecated
    /// `[server] admin_token`, which counts as an admin token.
    pub fn from_config(config: &Config) -> anyhow::Result<Auth> {
        let a = &config.auth;
        let role = |key: &str, inline: &[String], file: &Option<std::path::PathBuf>| {
            let mut tokens: Vec<String> = inline.to_vec();
            if let Some(path) = file {
                tokens.extend(read_tokens(key, path)?);
            }
            anyhow::Ok(tokens.iter().map(|t| digest(t)).collect::<Vec<_>>())
        };
        let mut auth = Auth {
            api: role(Role::Api.key(), &a.api_keys, &a.api_keys_file)?,
            trainer: role(
                Role::Trainer.key(),
                &a.trainer_tokens,
                &a.trainer_tokens_file,
            )?,
            admin: role(Role::Admin.key(), &a.admin_tokens, &a.admin_tokens_file)?,
        };
        // Checked at load like the `[auth]` lists.
        if !config.server.admin_token.is_empty() {
            auth.admin.push(digest(&config.server.admin_token));
        }
        Ok(auth)
    }

    /// Whether the role takes no token.
    pub fn is_open(&self, role: Role) -> bool {
        match role {
            Role::Api => self.api.is_empty(),
            Role::Trainer => self.trainer.is_empty() && self.admin.is_empty(),
            Role::Admin => self.admin.is_empty(),
        }
    }

    /// Whether `headers` carry a token of `role` (always, when it is open).
    pub fn allows(&self, role: Role, headers: &axum::http::HeaderMap) -> bool {
        if self.is_open(role) {
            return true;
        }
        // The scheme is case-insensitive (RFC 9110 § 11.1). The API role's
        // token may also come as `x-api-key`, as Anthropic's clients send it.
        let bearer = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .and_then(|(scheme, t)| scheme.eq_ignore_ascii_case("bearer").then_some(t));
        let api_key = || {
            (role == Role::Api)
                .then(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
                .flatten()
        };
        let Some(given) = bearer.or_else(api_key) else {
            return false;
        };
        let given = digest(given.trim());
        let tokens: &[&[Token]] = match role {
            Role::Api => &[&self.api],
            Role::Trainer => &[&self.trainer, &self.admin],
            Role::Admin => &[&self.admin],
        };
        let mut found = false;
        for t in tokens.iter().flat_map(|ts| ts.iter()) {
            found |= constant_time_eq(t, &given);
        }
        found
    }
}

/// Compares two digests without an early exit.
fn constant_time_eq(a: &Token, b: &Token) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

/// Refuses to serve a non-loopback address while the trainer or admin role
/// is open (anyone reaching the port could read every conversation or point
/// the gateway at a backend of their own), unless `--insecure-open`.
pub fn check_exposure(config: &Config, auth: &Auth) -> anyhow::Result<()> {
    let loopback = config
        .server
        .listen
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    let open: Vec<&str> = [Role::Trainer, Role::Admin]
        .into_iter()
        .filter(|r| auth.is_open(*r))
        .map(Role::key)
        .collect();
    if loopback || open.is_empty() {
        return Ok(());
    }
    if config.insecure_open {
        tracing::warn!(
            listen = %config.server.listen,
            open = ?open,
            "SERVING WITHOUT AUTHENTICATION on a non-loopback address (--insecure-open): \
             anyone who reaches this port can read every recorded conversation, forge \
             rewards and reconfigure backends"
        );
        return Ok(());
    }
    anyhow::bail!(
        "server.listen = {} is not a loopback address and {} {} empty: set tokens for them \
         ([auth] in config.toml, or the *_file variants), or pass --insecure-open to serve \
         without authentication",
        config.server.listen,
        open.join(" and "),
        if open.len() == 1 { "is" } else { "are" }
    )
}

/// The 401 answer: OpenAI's error body and a `WWW-Authenticate` challenge.
fn unauthorized() -> Response {
    let mut resp = ApiError::unauthorized().into_response();
    resp.headers_mut().insert(
        axum::http::header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"tito\""),
    );
    resp
}

/// Whether a browser sent the request from another site's page. Such a
/// page cannot read the answer (tito sends no CORS headers), but a write
/// would still take effect: on a gateway whose roles are open, any page the
/// operator visits could add a backend, put the fleet to sleep, lease the
/// trainer's queue or record made-up calls. Current browsers say where a
/// request comes from in `Sec-Fetch-Site` (`none` when the user typed the
/// address); older ones send `Origin` on anything but a plain GET. Clients
/// that are not browsers send neither.
pub fn cross_site(headers: &axum::http::HeaderMap) -> bool {
    let text = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    if let Some(site) = text("sec-fetch-site") {
        return !matches!(site, "same-origin" | "none");
    }
    match text("origin") {
        None => false,
        Some(origin) => {
            let authority = origin.split_once("://").map_or(origin, |(_, a)| a);
            text("host").is_none_or(|host| !host.eq_ignore_ascii_case(authority))
        }
    }
}

/// Middleware: refuses requests from another site's page (see
/// [`cross_site`]), then lets the request through when it carries a token
/// of the role.
pub async fn require(
    State((auth, role)): State<(Arc<Auth>, Role)>,
    req: Request,
    next: Next,
) -> Response {
    match refusal(&auth, role, req.headers()) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// The answer to a request [`require`] refuses (from another site, or
/// without a token of `role`); `None` lets it through.
pub fn refusal(auth: &Auth, role: Role, headers: &axum::http::HeaderMap) -> Option<Response> {
    if cross_site(headers) {
        return Some(
            ApiError::new(
                axum::http::StatusCode::FORBIDDEN,
                "invalid_request_error",
                "cross-site request refused: a page on another site may not call this gateway",
            )
            .into_response(),
        );
    }
    (!auth.allows(role, headers)).then(unauthorized)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(api: &[&str], trainer: &[&str], admin: &[&str]) -> Auth {
        let d = |ts: &[&str]| ts.iter().map(|t| digest(t)).collect();
        Auth {
            api: d(api),
            trainer: d(trainer),
            admin: d(admin),
        }
    }

    fn bearer(t: &str) -> axum::http::HeaderMap {
        let mut h = axum::http::HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {t}")) {
            h.insert("authorization", v);
        }
        h
    }

    #[test]
    fn roles_take_their_tokens_and_admin_is_also_a_trainer() {
        let a = auth(&["api-key-1"], &["trainer-1"], &["admin-key-1"]);
        assert!(a.allows(Role::Api, &bearer("api-key-1")));
        assert!(!a.allows(Role::Api, &bearer("trainer-1")));
        assert!(a.allows(Role::Trainer, &bearer("trainer-1")));
        assert!(a.allows(Role::Trainer, &bearer("admin-key-1")));
        assert!(!a.allows(Role::Trainer, &bearer("api-key-1")));
        assert!(a.allows(Role::Admin, &bearer("admin-key-1")));
        assert!(!a.allows(Role::Admin, &bearer("trainer-1")));
        assert!(!a.allows(Role::Admin, &bearer("admin-key-")));
        assert!(!a.allows(Role::Admin, &axum::http::HeaderMap::new()));
        let open = auth(&[], &[], &[]);
        assert!([Role::Api, Role::Trainer, Role::Admin]
            .iter()
            .all(|r| open.allows(*r, &axum::http::HeaderMap::new())));
    }

    #[test]
    fn token_files_skip_comments_and_refuse_bad_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("tokens");
        std::fs::write(&p, "# trainers\n\n  token-one  \ntoken-two\n").expect("write");
        assert_eq!(
            read_tokens("auth.trainer_tokens", &p).expect("read"),
            ["token-one", "token-two"]
        );
        std::fs::write(&p, "short\n").expect("write");
        let e = read_tokens("auth.trainer_tokens", &p).expect_err("too short");
        assert!(e.to_string().contains("line 1"), "{e}");
        std::fs::write(&p, "# none yet\n\n").expect("write");
        let e = read_tokens("auth.trainer_tokens", &p).expect_err("empty");
        assert!(e.to_string().contains("holds no token"), "{e}");
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        let a = auth(&["api-key-1"], &[], &[]);
        let mut h = axum::http::HeaderMap::new();
        for v in ["bearer api-key-1", "BEARER api-key-1"] {
            h.insert("authorization", HeaderValue::from_static(v));
            assert!(a.allows(Role::Api, &h), "{v}");
        }
        h.insert("authorization", HeaderValue::from_static("Basic api-key-1"));
        assert!(!a.allows(Role::Api, &h));
    }

    #[test]
    fn the_api_role_takes_its_token_as_x_api_key_too() {
        let a = auth(&["api-key-1"], &["trainer-1"], &["admin-key-1"]);
        let key = |v: &'static str| {
            let mut h = axum::http::HeaderMap::new();
            h.insert("x-api-key", HeaderValue::from_static(v));
            h
        };
        assert!(a.allows(Role::Api, &key("api-key-1")));
        assert!(!a.allows(Role::Api, &key("wrong-key-1")));
        // Only the API role: trainer and admin tokens come as bearers.
        assert!(!a.allows(Role::Trainer, &key("trainer-1")));
        assert!(!a.allows(Role::Admin, &key("admin-key-1")));
    }

    #[test]
    fn requests_from_another_site_s_page_are_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = axum::http::HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        let host = ("host", "127.0.0.1:8000");
        for (h, cross) in [
            (vec![host], false),
            (vec![host, ("sec-fetch-site", "same-origin")], false),
            (vec![host, ("sec-fetch-site", "none")], false),
            (vec![host, ("sec-fetch-site", "cross-site")], true),
            (vec![host, ("sec-fetch-site", "same-site")], true),
            (vec![host, ("origin", "http://127.0.0.1:8000")], false),
            (vec![host, ("origin", "http://evil.example")], true),
            (vec![host, ("origin", "null")], true),
        ] {
            assert_eq!(cross_site(&headers(&h)), cross, "{h:?}");
        }
    }
}
