//! `docs/openapi.yaml`, served at `/openapi.json`, against the real router:
//! every documented path and method is a route (no 404 "no such route", no
//! 405), no documented path answers a method it does not list, every
//! `.route("...")` registered in `src/api/*.rs` (and every nested prefix)
//! is documented with its methods, and each operation's `security` names
//! the role that guards it.
//!
//! Requests that reach a handler carry a malformed JSON body, or name
//! trajectories and backends that do not exist, so nothing is changed: a
//! handler answers 400 or 404 "not found" before it acts.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::Value;
use tito::render::testing::IM_END;

const METHODS: &[&str] = &["get", "post", "put", "patch", "delete"];

const API_KEY: &str = "openapi-api-key";
const TRAINER: &str = "openapi-trainer";
const ADMIN: &str = "openapi-admin-1";

async fn gateway(extra: &str) -> (MockVllm, Gateway) {
    let mock = MockVllm::start(Scripted::ids(vec![72, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], extra)).await;
    (mock, g)
}

async fn document(g: &Gateway) -> Value {
    let r = g
        .client
        .get(g.url("/openapi.json"))
        .send()
        .await
        .expect("gateway reachable");
    assert_eq!(r.status(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(ct.starts_with("application/json"), "{ct}");
    r.json().await.expect("JSON document")
}

/// `(METHOD, path template)` of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    let paths = doc["paths"].as_object().expect("paths");
    let mut out = BTreeSet::new();
    for (path, item) in paths {
        for m in METHODS {
            if item.get(*m).is_some() {
                out.insert((m.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

/// A path template with sample values for its parameters: ids that exist
/// nowhere (so handlers answer 404 "not found" without acting), the served
/// model, a real viewer asset.
fn concrete(template: &str) -> String {
    let samples = [
        ("{tid}", "openapi-t"),
        ("{gid}", "openapi-g"),
        ("{id}", "openapi-none"),
        ("{group}", "openapi-g"),
        ("{model}", "test-model"),
        ("{name}", "app.js"),
        (
            "{sha256}",
            "0000000000000000000000000000000000000000000000000000000000000000",
        ),
    ];
    let mut p = template.to_string();
    for (k, v) in samples {
        p = p.replace(k, v);
    }
    assert!(
        !p.contains('{'),
        "no sample value for a parameter of {template}"
    );
    p
}

/// Sends `method path` with a malformed JSON body (POST / PUT / PATCH):
/// status and body.
async fn send(g: &Gateway, method: &str, path: &str, token: Option<&str>) -> (u16, Value) {
    let m = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = g.client.request(m, g.url(path));
    if matches!(method, "POST" | "PUT" | "PATCH") {
        req = req.header("content-type", "application/json").body("{");
    }
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.expect("gateway reachable");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Whether an answer says the router has no such route (its fallback) or
/// no such method on the path.
fn unrouted(status: u16, body: &Value) -> bool {
    status == 405 || status == 404 && body["error"]["message"] == "no such route"
}

#[tokio::test]
async fn every_documented_operation_is_a_route_and_no_other_method_is() {
    let (_mock, g) = gateway("").await;
    // The detector itself: an unknown path and a wrong method are caught.
    let (s, b) = send(&g, "GET", "/v1/no-such-route", None).await;
    assert!(unrouted(s, &b), "{s} {b}");
    let (s, b) = send(&g, "DELETE", "/v1/chat/completions", None).await;
    assert!(unrouted(s, &b), "{s} {b}");

    let doc = document(&g).await;
    let ops = operations(&doc);
    assert!(ops.len() > 30, "{} operations", ops.len());
    let mut missing = Vec::new();
    let mut undocumented = Vec::new();
    for (method, template) in &ops {
        let path = concrete(template);
        let (s, b) = send(&g, method, &path, None).await;
        if unrouted(s, &b) {
            missing.push(format!("{method} {template} ({path}): {s} {b}"));
        }
        // Methods the document does not list for this path are not routes.
        for other in METHODS {
            let other = other.to_uppercase();
            if ops.contains(&(other.clone(), template.clone())) {
                continue;
            }
            let (s, b) = send(&g, &other, &path, None).await;
            if !unrouted(s, &b) {
                undocumented.push(format!("{other} {template}: {s}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "documented but not routed (or pending but routed): {missing:#?}"
    );
    assert!(
        undocumented.is_empty(),
        "routed but not documented: {undocumented:#?}"
    );
}

/// The matching `)` of the `(` at `open`.
fn close_of(src: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in src[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The first string literal in `s`.
fn literal(s: &str) -> Option<&str> {
    let start = s.find('"')? + 1;
    let len = s[start..].find('"')?;
    Some(&s[start..start + len])
}

/// `(path, methods)` of every `.route("path", method(handler)...)` in `src`.
fn routes_in(src: &str) -> Vec<(String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for (at, _) in src.match_indices(".route(") {
        let open = at + ".route".len();
        let Some(close) = close_of(src, open) else {
            continue;
        };
        let call = &src[open + 1..close];
        let Some(path) = literal(call) else { continue };
        let mut methods = BTreeSet::new();
        for m in METHODS {
            let needle = format!("{m}(");
            for (i, _) in call.match_indices(&needle) {
                let before = call[..i].chars().next_back();
                if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
                    methods.insert(m.to_uppercase());
                }
            }
        }
        out.push((path.to_string(), methods));
    }
    out
}

/// The routes of `src/api/<module>.rs` or `src/api/<module>/mod.rs`.
fn routes_of_module(module: &str) -> Vec<(String, BTreeSet<String>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let file = [
        dir.join(format!("{module}.rs")),
        dir.join(module).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("no source for module `{module}` in {}", dir.display()));
    routes_in(&std::fs::read_to_string(&file).expect("source"))
}

/// The module names of `.merge(module::routes())` in `src`.
fn merged_modules(src: &str) -> Vec<&str> {
    src.match_indices(".merge(")
        .filter_map(|(at, _)| {
            let rest = &src[at + ".merge(".len()..];
            let end = rest.find("::routes())")?;
            let name = &rest[..end];
            name.chars()
                .all(|c| c.is_alphanumeric() || c == '_')
                .then_some(name)
        })
        .collect()
}

/// Routes nested under a prefix: `.nest("prefix", f())` where `fn f` is in
/// the same file, with what `f` merges from other modules.
fn nested_in(src: &str) -> Vec<(String, BTreeSet<String>)> {
    let mut out = Vec::new();
    for (at, _) in src.match_indices(".nest(") {
        let open = at + ".nest".len();
        let Some(close) = close_of(src, open) else {
            continue;
        };
        let call = &src[open + 1..close];
        let Some(prefix) = literal(call) else {
            continue;
        };
        let Some(f) = call
            .rsplit(',')
            .next()
            .map(|f| f.trim().trim_end_matches("()"))
        else {
            continue;
        };
        let def = format!("fn {f}(");
        let body = src
            .find(&def)
            .map(|i| &src[i..])
            .and_then(|rest| rest.find("\n}\n").map(|end| &rest[..end]))
            .unwrap_or_else(|| panic!("nested router `{f}` is not defined beside its .nest"));
        let merged = merged_modules(body).into_iter().flat_map(routes_of_module);
        for (path, methods) in routes_in(body).into_iter().chain(merged) {
            out.push((format!("{prefix}{path}"), methods));
        }
    }
    out
}

#[tokio::test]
async fn every_route_in_the_source_is_documented_with_its_methods() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut registered: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = 0;
    // Every source file under src/api, its subdirectories included.
    let mut sources = Vec::new();
    let mut dirs = vec![dir.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src/api") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                sources.push(path);
            }
        }
    }
    for path in sources {
        files += 1;
        let src = std::fs::read_to_string(&path).expect("source");
        for (p, methods) in routes_in(&src).into_iter().chain(nested_in(&src)) {
            registered.entry(p).or_default().extend(methods);
        }
    }
    assert!(files >= 10, "{files} files in {}", dir.display());
    // The scan finds what it must (else it would vouch for nothing).
    for known in [
        "/v1/chat/completions",
        "/t/{tid}/v1/models",
        "/metrics",
        "/openapi.json",
        "/v1/responses/{id}/input_items",
        "/g/{gid}/t/{tid}/v1/messages",
    ] {
        assert!(
            registered.contains_key(known),
            "scan missed {known}: {registered:?}"
        );
    }
    assert!(registered["/admin/backends"].len() == 2, "{registered:?}");

    let (_mock, g) = gateway("").await;
    let documented = operations(&document(&g).await);
    let mut missing = Vec::new();
    for (path, methods) in &registered {
        assert!(!methods.is_empty(), "no method found for {path}");
        for m in methods {
            if !documented.contains(&(m.clone(), path.clone())) {
                missing.push(format!("{m} {path}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "registered but not in docs/openapi.yaml: {missing:?}"
    );
}

#[tokio::test]
async fn each_operations_security_names_the_role_that_guards_it() {
    let (_mock, g) = gateway(&format!(
        "[auth]\napi_keys = [\"{API_KEY}\"]\ntrainer_tokens = [\"{TRAINER}\"]\n\
         admin_tokens = [\"{ADMIN}\"]\n"
    ))
    .await;
    let doc = document(&g).await;
    let token_of = |scheme: &str| match scheme {
        "apiKey" => API_KEY,
        "trainerToken" => TRAINER,
        "adminToken" => ADMIN,
        other => panic!("unknown security scheme {other}"),
    };
    let mut wrong = Vec::new();
    for (method, template) in operations(&doc) {
        let op = &doc["paths"][&template][method.to_lowercase()];
        let security = op["security"]
            .as_array()
            .expect("every operation says its security");
        let path = concrete(&template);
        let (open_status, _) = send(&g, &method, &path, None).await;
        match security.as_slice() {
            [] => {
                if open_status == 401 {
                    wrong.push(format!("{method} {template}: public in the document, 401"));
                }
            }
            [req] => {
                let scheme = req
                    .as_object()
                    .and_then(|o| o.keys().next())
                    .expect("scheme");
                if open_status != 401 {
                    wrong.push(format!(
                        "{method} {template}: {open_status} without a token"
                    ));
                }
                let (s, _) = send(&g, &method, &path, Some(token_of(scheme))).await;
                if s == 401 {
                    wrong.push(format!("{method} {template}: 401 with a {scheme}"));
                }
                // No other role's token opens it (an admin token is also a
                // trainer token).
                for other in ["apiKey", "trainerToken", "adminToken"] {
                    let also = scheme == "trainerToken" && other == "adminToken";
                    if other == scheme || also {
                        continue;
                    }
                    let (s, _) = send(&g, &method, &path, Some(token_of(other))).await;
                    if s != 401 {
                        wrong.push(format!("{method} {template}: {s} with a {other}"));
                    }
                }
            }
            more => wrong.push(format!("{method} {template}: {} alternatives", more.len())),
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
