//! The request id of every HTTP call: the client's `X-Request-Id` when it is
//! 1 to [`MAX_LEN`] visible ASCII characters (`!` to `~`: no spaces or
//! control characters), else a new `req-` + 16 hex digits. It is echoed as
//! `X-Request-Id` on every answer (errors and streams included) and is the
//! `request_id` field of the `request` span around the call (`around`), so
//! every log line written while serving it (also from the tasks it starts)
//! carries it.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;

/// Lower-case, as `http` stores header names.
pub const HEADER: &str = "x-request-id";

/// The longest client id kept.
pub const MAX_LEN: usize = 128;

/// The client's id when it is acceptable.
fn accept(value: &HeaderValue) -> Option<&str> {
    let bytes = value.as_bytes();
    let ok = !bytes.is_empty() && bytes.len() <= MAX_LEN && bytes.iter().all(u8::is_ascii_graphic);
    // Checked bytes are ASCII, so this never fails.
    ok.then(|| value.to_str().ok()).flatten()
}

/// The id of this request: the client's, or a new one.
pub fn of(req: &Request) -> String {
    req.headers()
        .get(HEADER)
        .and_then(accept)
        .map_or_else(|| super::new_id("req"), str::to_string)
}

/// Echoes the id on the answer.
pub fn echo(resp: &mut Response, id: &str) {
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert(HEADER, v);
    }
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
