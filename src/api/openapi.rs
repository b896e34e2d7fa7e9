//! `GET /openapi.json`: the OpenAPI 3.1 document of this API
//! (`docs/openapi.yaml`), embedded in the binary, converted to JSON once and
//! served to anyone (it describes the routes, it holds no data).
//! `tests/api_openapi.rs` checks it against the routes the app registers.

use std::sync::LazyLock;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;

const YAML: &str = include_str!("../../docs/openapi.yaml");

/// The document as JSON text, or why the embedded YAML did not parse.
static JSON: LazyLock<Result<String, String>> = LazyLock::new(|| {
    let doc = parse(YAML)?;
    serde_json::to_string(&doc).map_err(|e| e.to_string())
});

/// The embedded YAML as a JSON value (anchors and aliases expanded).
fn parse(yaml: &str) -> Result<serde_json::Value, String> {
    serde_yaml_ng::from_str(yaml).map_err(|e| format!("docs/openapi.yaml: {e}"))
}

pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/openapi.json", get(document))
}

async fn document() -> Response {
    match &*JSON {
        Ok(text) => {
            let mut resp = text.clone().into_response();
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Err(e) => ApiError::internal(e.clone()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn doc() -> Value {
        parse(YAML).expect("docs/openapi.yaml parses")
    }

    /// Every `$ref` in `v`, with the JSON pointer where it sits.
    fn refs(v: &Value, at: String, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if k == "$ref" {
                        if let Some(r) = x.as_str() {
                            out.push((at.clone(), r.to_string()));
                        }
                    }
                    refs(x, format!("{at}/{k}"), out);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    refs(x, format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }

    #[test]
    fn embedded_document_is_openapi_3_1_of_this_version() {
        let d = doc();
        let version = d["openapi"].as_str().expect("openapi field");
        assert!(version.starts_with("3.1."), "openapi: {version}");
        assert_eq!(d["info"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(d["paths"].as_object().is_some_and(|p| p.len() > 20));
        assert!(JSON.is_ok(), "{:?}", JSON.as_ref().err());
    }

    #[test]
    fn every_ref_resolves_inside_the_document() {
        let d = doc();
        let mut found = Vec::new();
        refs(&d, String::new(), &mut found);
        assert!(found.len() > 50, "{} refs", found.len());
        for (at, r) in found {
            let pointer = r.strip_prefix('#').unwrap_or("not local");
            assert!(d.pointer(pointer).is_some(), "{at}: {r} does not resolve");
        }
    }

    /// Errors answer OpenAI's error body: every documented 4xx and 5xx is
    /// the `Error` schema, except the admin fan-out reports (502) and
    /// `/ready` (503), which say per backend what failed, and the Messages
    /// routes, whose every error is Anthropic's (`AnthropicError`).
    #[test]
    fn every_error_response_is_the_openai_error_shape() {
        let d = doc();
        let paths = d["paths"].as_object().expect("paths");
        for (path, item) in paths {
            for (method, op) in item.as_object().expect("path item") {
                let responses = op["responses"].as_object().expect("responses");
                for (status, resp) in responses {
                    if !(status.starts_with('4') || status.starts_with('5')) {
                        continue;
                    }
                    let resp = match resp.get("$ref").and_then(Value::as_str) {
                        Some(r) => d.pointer(&r[1..]).expect("resolves"),
                        None => resp,
                    };
                    let schema = &resp["content"]["application/json"]["schema"]["$ref"];
                    let report = path.starts_with("/admin/") && status == "502"
                        || path == "/ready" && status == "503";
                    let anthropic = path.ends_with("/v1/messages")
                        || path.ends_with("/v1/messages/count_tokens");
                    if anthropic {
                        assert_eq!(
                            schema, "#/components/schemas/AnthropicError",
                            "{method} {path} {status}"
                        );
                    } else if !report {
                        assert_eq!(
                            schema, "#/components/schemas/Error",
                            "{method} {path} {status}"
                        );
                    }
                }
            }
        }
    }
}
