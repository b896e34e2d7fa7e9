//! Per-token policy versions in the export: `response_versions` (the
//! sequence number of the weights that sampled each response token, null on
//! observation tokens and where unknown), `min_version` / `max_version`, the
//! verl layout's padded `rollout_versions`, the per_call layout, truncation,
//! and the `min_version_seq` / `max_staleness` filters in the export
//! function and on `GET /v1/export` (400 naming a bad value).

mod store_support;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use serde_json::{json, Value};
use store_support::{call, ids};
use tito::api::trajectories::StoreState;
use tito::export::{export, ExportOptions, ExportStats, Format, Layout};
use tito::store::{MemoryStore, SpanStore, TrajectoryFilter, VersionSpan};
use tower::ServiceExt;

fn span(start: u32, version: &str, seq: u64) -> VersionSpan {
    VersionSpan {
        start,
        version: Some(version.into()),
        seq: Some(seq),
    }
}

/// Three finished trajectories, versions `v1`..`v3` registered (newest 3):
/// `seam`: call 0 samples 3 ids on v1; call 1 (4 observation ids before it)
/// samples 8, the first 5 on v1 and the rest, after an update, on v2.
/// `fresh`: one call on v2. `old`: one call of unknown version.
async fn store() -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    for label in ["v1", "v2", "v3"] {
        store.register_version(label).await.expect("register");
    }
    let mut c0 = call("seam", 0, 0, None, ids(1, 3), ids(10, 3));
    c0.versions = vec![span(0, "v1", 1)];
    let mut c1 = call("seam", 1, 0, Some(0), ids(20, 4), ids(30, 8));
    c1.versions = vec![span(0, "v1", 1), span(5, "v2", 2)];
    let mut fresh = call("fresh", 0, 0, None, ids(1, 2), ids(40, 2));
    fresh.versions = vec![span(0, "v2", 2)];
    let old = call("old", 0, 0, None, ids(1, 2), ids(50, 2));
    for c in [c0, c1, fresh, old] {
        store.append_call(c).await.expect("append");
    }
    for id in ["seam", "fresh", "old"] {
        store.finish(id).await.expect("finish");
    }
    store
}

/// `seam`'s sample: v1 on call 0's 3 ids, null on the 4 observation ids,
/// v1 on 5 of call 1's ids and v2 on its last 3.
fn seam_versions() -> Vec<Value> {
    let (v1, v2, obs) = (json!(1), json!(2), Value::Null);
    let mut out = vec![v1.clone(); 3];
    out.extend(vec![obs; 4]);
    out.extend(vec![v1; 5]);
    out.extend(vec![v2; 3]);
    out
}

fn run(store: &MemoryStore, opts: &ExportOptions) -> (Vec<u8>, ExportStats) {
    let mut out = Vec::new();
    let it = store.scan(&TrajectoryFilter::default()).expect("scan");
    let stats = export(it, store, opts, &mut out, &mut |_| {}).expect("export");
    (out, stats)
}

fn jsonl_rows(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .expect("utf8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a row"))
        .collect()
}

fn field_json(f: &Field) -> Value {
    match f {
        Field::Null => Value::Null,
        Field::Bool(b) => json!(b),
        Field::Int(i) => json!(i),
        Field::Long(i) => json!(i),
        Field::Float(x) => json!(f64::from(*x)),
        Field::Double(x) => json!(x),
        Field::Str(s) => json!(s),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(field_json).collect()),
        other => panic!("unexpected parquet field {other:?}"),
    }
}

fn parquet_rows(bytes: Vec<u8>) -> Vec<Value> {
    let reader = SerializedFileReader::new(bytes::Bytes::from(bytes)).expect("parquet opens");
    reader
        .get_row_iter(None)
        .expect("rows")
        .map(|row| {
            let row = row.expect("row");
            Value::Object(
                row.get_column_iter()
                    .map(|(name, f)| (name.clone(), field_json(f)))
                    .collect(),
            )
        })
        .collect()
}

/// The rows of an export in JSONL and in Parquet, which must agree on the
/// version columns.
fn both(store: &MemoryStore, layout: Layout, tweak: impl Fn(&mut ExportOptions)) -> Vec<Value> {
    let mut jl = ExportOptions::new(Format::Jsonl, layout);
    tweak(&mut jl);
    let mut pq = jl.clone();
    pq.format = Format::Parquet;
    let (jbytes, jstats) = run(store, &jl);
    let (pbytes, pstats) = run(store, &pq);
    assert_eq!(jstats, pstats);
    let (jrows, prows) = (jsonl_rows(&jbytes), parquet_rows(pbytes));
    assert_eq!(jrows.len(), prows.len());
    let cols = [
        "response_versions",
        "rollout_versions",
        "min_version",
        "max_version",
    ];
    for (j, p) in jrows.iter().zip(&prows) {
        for c in cols {
            assert_eq!(j.get(c), p.get(c), "{c}: JSONL and Parquet differ");
        }
    }
    jrows
}

fn by_id<'a>(rows: &'a [Value], id: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["trajectory_id"] == id)
        .unwrap_or_else(|| panic!("no row of `{id}`"))
}

#[tokio::test]
async fn each_response_token_carries_the_version_that_sampled_it() {
    let store = store().await;
    let rows = both(&store, Layout::Trajectory, |_| {});
    let seam = by_id(&rows, "seam");
    assert_eq!(seam["response_versions"], json!(seam_versions()));
    assert_eq!(
        seam["response_versions"].as_array().map(Vec::len),
        seam["response_ids"].as_array().map(Vec::len)
    );
    assert_eq!(
        (&seam["min_version"], &seam["max_version"]),
        (&json!(1), &json!(2))
    );
    let fresh = by_id(&rows, "fresh");
    assert_eq!(fresh["response_versions"], json!([2, 2]));
    assert_eq!(
        (&fresh["min_version"], &fresh["max_version"]),
        (&json!(2), &json!(2))
    );
    let old = by_id(&rows, "old");
    assert_eq!(old["response_versions"], json!([null, null]));
    assert_eq!(
        (&old["min_version"], &old["max_version"]),
        (&Value::Null, &Value::Null)
    );
    // The columns beside them are unchanged.
    assert_eq!(seam["weight_versions"], json!(["step-0", "step-1"]));
}

#[tokio::test]
async fn per_call_rows_carry_their_own_calls_versions() {
    let store = store().await;
    let rows = both(&store, Layout::PerCall, |_| {});
    let seam: Vec<&Value> = rows
        .iter()
        .filter(|r| r["trajectory_id"] == "seam")
        .collect();
    assert_eq!(seam.len(), 2);
    assert_eq!(seam[0]["response_versions"], json!([1, 1, 1]));
    assert_eq!(
        (&seam[0]["min_version"], &seam[0]["max_version"]),
        (&json!(1), &json!(1))
    );
    assert_eq!(
        seam[1]["response_versions"],
        json!([1, 1, 1, 1, 1, 2, 2, 2])
    );
    assert_eq!(
        (&seam[1]["min_version"], &seam[1]["max_version"]),
        (&json!(1), &json!(2))
    );
}

#[tokio::test]
async fn a_cut_response_keeps_versions_aligned_and_bounds_them_by_what_it_keeps() {
    let store = store().await;
    // 15 response tokens cut to 10: the v2 tail goes.
    let rows = both(&store, Layout::Trajectory, |o| o.response_length = Some(10));
    let seam = by_id(&rows, "seam");
    assert_eq!(seam["truncated"], true);
    assert_eq!(seam["response_versions"], json!(seam_versions()[..10]));
    assert_eq!(
        (&seam["min_version"], &seam["max_version"]),
        (&json!(1), &json!(1))
    );
}

#[tokio::test]
async fn verl_rollout_versions_are_padded_with_minus_one() {
    let store = store().await;
    let rows = both(&store, Layout::Verl, |o| {
        o.prompt_length = Some(4);
        o.response_length = Some(18);
    });
    let seam = by_id(&rows, "seam");
    let mut want: Vec<i64> = seam_versions()
        .iter()
        .map(|v| v.as_i64().unwrap_or(-1))
        .collect();
    want.resize(18, -1);
    assert_eq!(seam["rollout_versions"], json!(want));
    assert_eq!(
        (&seam["min_version"], &seam["max_version"]),
        (&json!(1), &json!(2))
    );
    assert!(
        seam.get("response_versions").is_none(),
        "verl has rollout_versions"
    );
    let old = by_id(&rows, "old");
    assert_eq!(old["rollout_versions"], json!(vec![-1; 18]));
}

#[tokio::test]
async fn version_filters_leave_rows_out_and_count_them() {
    let store = store().await;
    let kept = |tweak: &dyn Fn(&mut ExportOptions)| {
        let mut opts = ExportOptions::new(Format::Jsonl, Layout::Trajectory);
        tweak(&mut opts);
        let (bytes, stats) = run(&store, &opts);
        let ids: Vec<String> = jsonl_rows(&bytes)
            .iter()
            .map(|r| r["trajectory_id"].as_str().unwrap_or_default().to_string())
            .collect();
        (ids, stats.skipped_version, stats.rows)
    };
    // No filter: every row, a row without versions too.
    assert_eq!(
        kept(&|_| {}),
        (vec!["seam".into(), "fresh".into(), "old".into()], 0, 3)
    );
    // min_version >= 2: `seam` started on v1, `old` has no version.
    assert_eq!(
        kept(&|o| o.versions.min_version_seq = Some(2)),
        (vec!["fresh".into()], 2, 1)
    );
    assert_eq!(
        kept(&|o| o.versions.min_version_seq = Some(0)),
        (vec!["seam".into(), "fresh".into()], 1, 2)
    );
    // Newest 3: at most 1 behind keeps min_version 2; at most 2 behind, 1.
    let stale = |n: u64| {
        move |o: &mut ExportOptions| {
            o.versions.max_staleness = Some(n);
            o.versions.newest = Some(3);
        }
    };
    assert_eq!(kept(&stale(1)), (vec!["fresh".into()], 2, 1));
    assert_eq!(kept(&stale(2)), (vec!["seam".into(), "fresh".into()], 1, 2));
    assert_eq!(kept(&stale(0)), (vec![], 3, 0));
    // The filter reads the tokens a cut keeps: `seam` cut before its v2
    // tail is still v1.
    assert_eq!(
        kept(&|o| {
            o.versions.min_version_seq = Some(1);
            o.response_length = Some(2);
        }),
        (vec!["seam".into(), "fresh".into()], 1, 2)
    );
}

fn app(store: Arc<MemoryStore>) -> axum::Router {
    let state = StoreState {
        pixel_values: Err("text-only".into()),
        store,
        decode: None,
        on_finish: None,
        pad_id: 0,
    };
    tito::api::export::routes()
        .merge(tito::api::trajectories::routes())
        .with_state(state)
}

async fn get(app: &axum::Router, uri: &str) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("body");
    (status, bytes.to_vec())
}

#[tokio::test]
async fn the_http_export_filters_by_version_and_names_a_bad_value() {
    let app = app(store().await);
    let ids = |bytes: &[u8]| -> Vec<String> {
        jsonl_rows(bytes)
            .iter()
            .map(|r| r["trajectory_id"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let (s, body) = get(&app, "/v1/export?min_version_seq=2").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ids(&body), ["fresh"]);
    // The newest registered version is 3 (registered, no call on it).
    let (s, body) = get(&app, "/v1/export?max_staleness=2").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ids(&body), ["seam", "fresh"]);
    let (s, body) = get(&app, "/v1/export?max_staleness=1&min_version_seq=1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ids(&body), ["fresh"]);
    let (s, body) = get(
        &app,
        "/v1/export?layout=verl&prompt_length=4&response_length=16",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        jsonl_rows(&body)[0]["rollout_versions"]
            .as_array()
            .map(Vec::len),
        Some(16)
    );
    for (param, value) in [
        ("min_version_seq", "abc"),
        ("min_version_seq", "-1"),
        ("max_staleness", "1.5"),
        ("max_staleness", ""),
    ] {
        let (s, body) = get(&app, &format!("/v1/export?{param}={value}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{param}={value}");
        let v: Value = serde_json::from_slice(&body).expect("error body");
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(param)),
            "{v}"
        );
    }
}

/// Status and headers of a request, with its body.
async fn get_full(app: &axum::Router, uri: &str) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let req = Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("response");
    let (status, headers) = (resp.status(), resp.headers().clone());
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("body");
    (status, headers, bytes.to_vec())
}

#[tokio::test]
async fn one_trajectory_is_exported_by_id_under_the_schema_version_header() {
    let store = store().await;
    // An active trajectory is exported too: `trajectory=` names it exactly.
    store
        .append_call(call("live", 0, 0, None, ids(1, 2), ids(60, 2)))
        .await
        .expect("append");
    let app = app(store);
    for id in ["seam", "live"] {
        let (s, headers, body) = get_full(&app, &format!("/v1/export?trajectory={id}")).await;
        assert_eq!(s, StatusCode::OK, "{id}");
        assert_eq!(
            headers
                .get("x-export-schema-version")
                .and_then(|v| v.to_str().ok()),
            Some(tito::export::EXPORT_SCHEMA_VERSION)
        );
        let rows = jsonl_rows(&body);
        assert!(!rows.is_empty(), "{id}");
        assert!(
            rows.iter().all(|r| r["trajectory_id"] == id),
            "{id}: {rows:?}"
        );
    }
    let (s, headers, _) = get_full(&app, "/v1/export?status=finished").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        headers
            .get("x-export-schema-version")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (s, _, body) = get_full(&app, "/v1/export?trajectory=nosuch").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let v: Value = serde_json::from_slice(&body).expect("error body");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("nosuch")),
        "{v}"
    );
    for other in ["consumer=ppo", "group=g", "status=finished", "limit=3"] {
        let (s, _, body) = get_full(&app, &format!("/v1/export?trajectory=seam&{other}")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{other}");
        let v: Value = serde_json::from_slice(&body).expect("error body");
        assert_eq!(v["error"]["param"], "trajectory", "{v}");
        let name = other.split('=').next().unwrap_or_default();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(name)),
            "{v}"
        );
    }
}

#[tokio::test]
async fn registered_versions_are_listed_by_sequence_number() {
    let app = app(store().await);
    let (s, body) = get(&app, "/v1/versions").await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["object"], "list");
    let listed: Vec<(u64, String)> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| {
            assert!(d["registered_at"].as_i64().is_some_and(|t| t > 0), "{d}");
            (
                d["seq"].as_u64().expect("seq"),
                d["version"].as_str().expect("version").to_string(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [(1, "v1".into()), (2, "v2".into()), (3, "v3".into())]
    );
}
