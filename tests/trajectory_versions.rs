//! A recorded call keeps the version spans of the choice that produced it;
//! an answer no backend generated (a spent response budget) records none.

use serde_json::{json, Value};
use tito::config::TrajectoryConfig;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::store::{DynStore, VersionSpan};
use tito::trajectory::{testing, ChatInput, Trajectories};

fn input(messages: &[Value]) -> ChatInput<'_> {
    ChatInput {
        messages,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    }
}

fn span(start: u32, version: &str, seq: u64) -> VersionSpan {
    VersionSpan {
        start,
        version: Some(version.into()),
        seq: Some(seq),
    }
}

/// Records one call of trajectory `tid` replying "a reply", from backend
/// `backend`, whose choice carries `versions`.
async fn record(traj: &Trajectories, tid: &str, backend: &str, versions: Vec<VersionSpan>) {
    let messages = [json!({"role": "user", "content": "hi"})];
    let prepared = traj
        .prepare_chat(tid, input(&messages))
        .await
        .expect("prepare");
    let ctx = testing::context(
        tid,
        json!({ "messages": messages }),
        Some(messages.to_vec()),
    );
    let sampled = [
        chatml_renderer().encode("a reply").expect("encode"),
        vec![IM_END],
    ]
    .concat();
    assert!(sampled.len() > 2);
    let mut outcome = testing::stopped(sampled, json!({"role": "assistant", "content": "a reply"}));
    outcome.backend = backend.into();
    outcome.versions = versions;
    traj.commit(&ctx, &prepared, vec![outcome], None)
        .await
        .expect("commit");
}

#[tokio::test]
async fn the_store_keeps_a_choices_version_spans_and_none_for_an_unserved_answer() {
    let store: DynStore = tito::store::open("memory://").expect("store");
    let traj = Trajectories::new(
        store.clone(),
        chatml_renderer(),
        TrajectoryConfig::default(),
    );
    let seam = vec![span(0, "v1", 1), span(2, "v2", 2)];
    record(&traj, "served", "b", seam.clone()).await;
    record(&traj, "unserved", "", seam.clone()).await;

    let served = store
        .get_trajectory("served")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(served.calls[0].versions, seam);
    let unserved = store
        .get_trajectory("unserved")
        .await
        .expect("get")
        .expect("kept");
    assert_eq!(unserved.calls[0].versions, []);
}
