//! The request id of every HTTP call: the client's `X-Request-Id` when it is
//! 1 to [`MAX_LEN`] visible ASCII characters (`!` to `~`: no spaces or
//! control characters), else a new `req-` + 16 hex digits. It is echoed as
//! `X-Request-Id` on every answer (errors and streams included) and is the
//! `request_id` field of a `request` span around the call, so every log line
//! written while serving it (also from the tasks it starts) carries it.
//!
//! Owns: the header and the span. Must not: change the answer otherwise.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// Lower-case, as `http` stores header names.
pub const HEADER: &str = "x-request-id";

/// The longest client id kept.
pub const MAX_LEN: usize = 128;

/// The id of the call being served, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The client's id when it is acceptable.
fn accept(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    let ok = !bytes.is_empty() && bytes.len() <= MAX_LEN && bytes.iter().all(u8::is_ascii_graphic);
    // Checked bytes are ASCII, so this never fails.
    ok.then(|| value.to_str().ok()).flatten()
}

/// Middleware: names the call, serves it inside its span, echoes the id.
pub async fn layer(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(accept)
        .map_or_else(|| super::new_id("req"), str::to_string);
    // At ERROR level so that the span, and the id on every line inside it,
    // exists whatever level RUST_LOG lets through.
    let span = tracing::error_span!("request", request_id = %id,
        method = %req.method(), path = %req.uri().path());
    req.extensions_mut().insert(RequestId(id.clone()));
    let started = std::time::Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::debug!(
            status = resp.status().as_u16(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "request answered"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(HEADER, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_checked() {
        let ok = |s: &str| accept(&HeaderValue::from_str(s).expect("header value")).is_some();
        assert!(ok("abc-123_x.y:z@w/~!"));
        assert!(ok(&"a".repeat(MAX_LEN)));
        assert!(!ok(&"a".repeat(MAX_LEN + 1)));
        assert!(!ok(""));
        assert!(!ok("has space"));
        assert!(!ok("tab\tinside"));
        let utf8 = HeaderValue::from_bytes("grüße".as_bytes()).expect("opaque bytes");
        assert!(accept(&utf8).is_none());
    }
}
