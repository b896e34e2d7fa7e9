//! The trajectory and export routes through `Router::oneshot` (no socket):
//! listing with cursors, show with segments / decoded text / drift, rewards,
//! finish, 404s and 400s in OpenAI shape, streamed JSONL and Parquet exports.

mod store_support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use serde_json::{json, Value};
use store_support::{branching, without_logprobs};
use tito::api::trajectories::StoreState;
use tito::store::{Drift, MemoryStore, SpanStore};
use tower::ServiceExt;

async fn app() -> Router {
    let store = Arc::new(MemoryStore::new());
    for id in ["a", "b", "c"] {
        let mut calls = branching(id);
        calls[2].drift = Some(Drift {
            position: 9,
            cause: "tool_call_rerender".into(),
            details: json!({"expected": [1], "actual": [2]}),
        });
        for c in calls {
            store.append_call(c).await.expect("append");
        }
    }
    store.finish("b").await.expect("finish");
    let state = StoreState {
        pixel_values: Err("text-only".into()),
        store,
        decode: Some(Arc::new(|_: Option<&str>, ids: &[u32]| {
            Some(ids.iter().map(|i| format!("<{i}>")).collect())
        })),
        on_finish: None,
        pad_id: 0,
    };
    tito::api::trajectories::routes()
        .merge(tito::api::export::routes())
        .with_state(state)
}

async fn send(app: &Router, method: &str, uri: &str, body: Option<Value>) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("body");
    (status, bytes.to_vec())
}

async fn json_of(
    app: &Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (status, bytes) = send(app, method, uri, body).await;
    (status, serde_json::from_slice(&bytes).expect("json body"))
}

fn assert_openai_error(v: &Value, code: Option<&str>) {
    let e = &v["error"];
    assert!(e["message"].is_string(), "{v}");
    assert!(e["type"].is_string(), "{v}");
    if let Some(code) = code {
        assert_eq!(e["code"], code, "{v}");
    }
}

#[tokio::test]
async fn list_paginates_and_filters() {
    let app = app().await;
    let (s, page1) = json_of(&app, "GET", "/v1/trajectories?limit=2", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(page1["object"], "list");
    let ids: Vec<&str> = page1["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|t| t["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(page1["has_more"], true);
    let cursor = page1["next_cursor"].as_str().expect("cursor");
    let (_, page2) = json_of(
        &app,
        "GET",
        &format!("/v1/trajectories?limit=2&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(page2["data"][0]["id"], "c");
    assert_eq!(page2["has_more"], false);
    assert!(page2["next_cursor"].is_null());

    let (_, fin) = json_of(
        &app,
        "GET",
        "/v1/trajectories?status=finished&since=1970-01-01T00:00:00Z",
        None,
    )
    .await;
    assert_eq!(fin["data"].as_array().expect("data").len(), 1);
    assert_eq!(fin["data"][0]["id"], "b");
    assert_eq!(fin["data"][0]["status"], "finished");

    let (s, bad) = json_of(&app, "GET", "/v1/trajectories?status=done", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_openai_error(&bad, None);
    let (s, bad) = json_of(&app, "GET", "/v1/trajectories?limit=x", None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_openai_error(&bad, None);
}

#[tokio::test]
async fn show_has_calls_samples_segments_and_drift() {
    let app = app().await;
    let (s, t) = json_of(&app, "GET", "/v1/trajectories/a", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(t["id"], "a");
    assert_eq!(t["object"], "trajectory");
    assert_eq!(t["calls"].as_array().expect("calls").len(), 6);
    let samples = t["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[1]["calls"], json!([0, 1, 3, 4]));
    let segs = samples[0]["segments"].as_array().expect("segments");
    let kinds: Vec<&str> = segs
        .iter()
        .map(|s| s["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(
        kinds,
        [
            "prompt",
            "sampled",
            "observation",
            "sampled",
            "observation",
            "sampled"
        ]
    );
    assert_eq!(segs[1]["ids"], json!([200, 201, 202]));
    assert_eq!(segs[1]["text"], "<200><201><202>");
    assert_eq!(
        samples[0]["response_mask"],
        json!([1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1])
    );
    assert_eq!(
        t["drift"],
        json!([{"call": 2, "position": 9, "cause": "tool_call_rerender",
                                    "details": {"expected": [1], "actual": [2]}}])
    );

    let (s, e) = json_of(&app, "GET", "/v1/trajectories/nope", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_openai_error(&e, Some("not_found"));
}

#[tokio::test]
async fn reward_and_finish_routes() {
    let app = app().await;
    let (s, m) = json_of(
        &app,
        "POST",
        "/v1/trajectories/a/reward",
        Some(json!({"reward": 1.0})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(m["reward"], 1.0);
    let (s, _) = json_of(
        &app,
        "POST",
        "/v1/trajectories/a/reward",
        Some(json!({"reward": 0.5, "call": 3})),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let (_, t) = json_of(&app, "GET", "/v1/trajectories/a", None).await;
    assert_eq!(t["calls"][3]["reward"], 0.5);
    assert_eq!(t["samples"][0]["reward"], 1.0);

    for (uri, body) in [
        (
            "/v1/trajectories/a/reward",
            json!({"reward": 0.5, "call": 99}),
        ),
        ("/v1/trajectories/nope/reward", json!({"reward": 0.5})),
    ] {
        let (s, e) = json_of(&app, "POST", uri, Some(body)).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{uri}");
        assert_openai_error(&e, Some("not_found"));
    }
    let (s, e) = json_of(
        &app,
        "POST",
        "/v1/trajectories/a/reward",
        Some(json!({"score": 1})),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_openai_error(&e, None);

    let (s, m) = json_of(&app, "POST", "/v1/trajectories/a/finish", None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(m["status"], "finished");
    let (s, e) = json_of(&app, "POST", "/v1/trajectories/nope/finish", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_openai_error(&e, Some("not_found"));
}

#[tokio::test]
async fn export_streams_jsonl_and_parquet() {
    let app = app().await;
    let (s, body) = send(
        &app,
        "GET",
        "/v1/export?format=jsonl&layout=trajectory&status=finished",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let rows: Vec<Value> = std::str::from_utf8(&body)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["trajectory_id"] == "b"));

    let (s, body) = send(
        &app,
        "GET",
        "/v1/export?format=parquet&layout=verl&prompt_length=8&response_length=32",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(&body[..4], b"PAR1");
    assert_eq!(&body[body.len() - 4..], b"PAR1");
    use parquet::file::reader::FileReader;
    let reader = parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(body))
        .expect("parquet");
    assert_eq!(reader.metadata().file_metadata().num_rows(), 9);

    for (uri, param) in [
        ("/v1/export?layout=verl", "prompt_length"),
        ("/v1/export?layout=verl&prompt_length=8", "response_length"),
        ("/v1/export?format=csv", "format"),
        ("/v1/export?layout=nested", "layout"),
        ("/v1/export?since=yesterday", "since"),
        ("/v1/export?prompt_length=-1", "prompt_length"),
        ("/v1/export?prompt_length=0", "prompt_length"),
        ("/v1/export?response_length=200000", "response_length"),
        ("/v1/export?complete_group=true", "complete_group"),
        ("/v1/export?groupsize=8", "groupsize"),
    ] {
        let (s, e) = json_of(&app, "GET", uri, None).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}");
        assert_openai_error(&e, None);
        assert_eq!(e["error"]["param"], param, "{uri}: {e}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(param), "{uri}: the message names it: {e}");
    }
}

/// The HTTP export of a trajectory recorded without any logprob has no number
/// in `response_logprobs`: JSONL nulls, Parquet null elements.
#[tokio::test]
async fn export_writes_missing_logprobs_as_nulls() {
    let store = Arc::new(MemoryStore::new());
    for c in without_logprobs(branching("n")) {
        store.append_call(c).await.expect("append");
    }
    let state = StoreState {
        pixel_values: Err("text-only".into()),
        store,
        decode: None,
        on_finish: None,
        pad_id: 0,
    };
    let app = tito::api::export::routes().with_state(state);
    let verl = "layout=verl&prompt_length=8&response_length=32";
    let (s, body) = send(
        &app,
        "GET",
        &format!("/v1/export?format=jsonl&{verl}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let lines: Vec<Value> = std::str::from_utf8(&body)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("line"))
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let lp = l["rollout_log_probs"].as_array().expect("logprobs");
        assert_eq!(lp.len(), 32);
        assert!(lp.iter().all(Value::is_null), "{lp:?}");
    }

    let (s, body) = send(
        &app,
        "GET",
        &format!("/v1/export?format=parquet&{verl}"),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    use parquet::file::reader::FileReader;
    use parquet::record::Field;
    let reader = parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(body))
        .expect("parquet");
    let mut rows = 0;
    for row in reader.get_row_iter(None).expect("rows") {
        let row = row.expect("row");
        let (_, lp) = row
            .get_column_iter()
            .find(|(name, _)| name.as_str() == "rollout_log_probs")
            .expect("column");
        let Field::ListInternal(lp) = lp else {
            panic!("rollout_log_probs is {lp:?}");
        };
        assert_eq!(lp.len(), 32);
        assert!(lp.elements().iter().all(|f| *f == Field::Null), "{lp:?}");
        rows += 1;
    }
    assert_eq!(rows, 3);
}
