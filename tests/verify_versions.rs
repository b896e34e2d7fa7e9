//! The replay check per weight version: a trajectory whose sample was
//! sampled partly on `v1` and, after a seam, on `v2` is replayed on a mock
//! vLLM (a scorer that remembers nothing of it: every position gets the
//! mock's unseen logprob, shifted where the test says), and the report
//! gives max / mean |Δ| and the argmax share per version, tokens of unknown
//! version under `seq: null`, per sample and over the trajectory; the
//! stored check keeps them.

mod common;
mod store_support;

use std::sync::Arc;

use common::mock_vllm::{MockVllm, Scripted, UNSEEN_LOGPROB};
use common::{config, start_gateway_on};
use serde_json::{json, Value};
use store_support::call;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::store::{DynStore, MemoryStore, SpanStore, VersionSpan};

fn span(start: u32, version: &str, seq: u64) -> VersionSpan {
    VersionSpan {
        start,
        version: Some(version.into()),
        seq: Some(seq),
    }
}

/// Sample 0: prompt [1, 2, 3]; call 0 samples [10, 11, 12] on v1; after the
/// observation [20, 21], call 1 samples [30..35), its first two on v1 and
/// the last three on v2. Sample 1: a fresh root sampling [40, 41] on
/// weights nobody recorded. Every recorded logprob is the mock's unseen one.
async fn store() -> DynStore {
    let store = Arc::new(MemoryStore::new());
    let recorded = |n: usize| vec![Some(UNSEEN_LOGPROB); n];
    let mut c0 = call("vv", 0, 0, None, vec![1, 2, 3], vec![10, 11, 12]);
    c0.logprobs = recorded(3);
    c0.versions = vec![span(0, "v1", 1)];
    let mut c1 = call("vv", 1, 0, Some(0), vec![20, 21], (30..35).collect());
    c1.logprobs = recorded(5);
    c1.versions = vec![span(0, "v1", 1), span(2, "v2", 2)];
    let mut c2 = call("vv", 2, 1, None, vec![5, 6], vec![40, 41]);
    c2.logprobs = recorded(2);
    for c in [c0, c1, c2] {
        store.append_call(c).await.expect("append");
    }
    store
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

#[tokio::test]
async fn the_mismatch_is_reported_per_version_that_sampled_the_tokens() {
    let mock = MockVllm::start(Scripted::ids(vec![IM_END])).await;
    let store = store().await;
    let g = start_gateway_on(config(&[mock.url()], ""), chatml_renderer(), store.clone()).await;
    // Sequence positions of sample 0: prompt 0..3, call 0 3..6, the
    // observation 6..8, call 1 8..13 (v1 at 8, 9; v2 at 10, 11, 12).
    mock.shift_replay(11, 0.5);
    mock.shift_replay(12, 1.0);
    mock.shift_replay(6, 5.0); // an observation: never compared

    let r = g
        .client
        .post(g.url("/v1/trajectories/vv/verify"))
        .send()
        .await
        .expect("gateway reachable");
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");

    let s0 = &body["samples"][0];
    assert_eq!(s0["compared"], 8);
    assert!(close(&s0["max_abs_diff"], 1.0), "{s0}");
    let v = &s0["by_version"];
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    assert_eq!((&v[0]["seq"], &v[0]["version"]), (&json!(1), &json!("v1")));
    assert_eq!(v[0]["compared"], 5);
    assert!(close(&v[0]["max_abs_diff"], 0.0) && close(&v[0]["mean_abs_diff"], 0.0));
    assert_eq!((&v[1]["seq"], &v[1]["version"]), (&json!(2), &json!("v2")));
    assert_eq!(v[1]["compared"], 3);
    assert!(close(&v[1]["max_abs_diff"], 1.0), "{v}");
    assert!(close(&v[1]["mean_abs_diff"], 0.5), "{v}");
    // The mock ranks an unseen token third: never the argmax.
    assert!(close(&v[0]["argmax_mismatch_share"], 1.0));
    assert!(close(&v[1]["argmax_mismatch_share"], 1.0));

    let s1 = &body["samples"][1];
    assert_eq!(
        s1["by_version"],
        json!([{"seq": null, "version": null, "compared": 2, "max_abs_diff": 0.0,
                "mean_abs_diff": 0.0, "argmax_mismatch_share": 1.0}])
    );

    // Over the trajectory: by version, the unknown last.
    let all = &body["by_version"];
    let seqs: Vec<&Value> = all
        .as_array()
        .expect("list")
        .iter()
        .map(|x| &x["seq"])
        .collect();
    assert_eq!(seqs, [&json!(1), &json!(2), &Value::Null]);
    let compared: Vec<&Value> = all
        .as_array()
        .expect("list")
        .iter()
        .map(|x| &x["compared"])
        .collect();
    assert_eq!(compared, [&json!(5), &json!(3), &json!(2)]);
    assert!(close(&all[1]["mean_abs_diff"], 0.5));

    // Stored with the samples: the trajectory shows the same numbers.
    let t = store
        .get_trajectory("vv")
        .await
        .expect("get")
        .expect("kept");
    let stored = &t.replays[0].by_version;
    assert_eq!(stored.len(), 2);
    assert_eq!((stored[1].seq, stored[1].compared), (Some(2), 3));
    assert_eq!(stored[1].version.as_deref(), Some("v2"));
    assert_eq!(t.replays[1].by_version[0].seq, None);
}
