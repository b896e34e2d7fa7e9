//! A sample's segments name the call whose tokens each holds, the same in
//! the live view and in one rebuilt from the store. A drift's details name
//! the call of the segment it falls in, so a wrong name reaches the store.

use serde_json::{json, Value};
use tito::config::TrajectoryConfig;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::store::SegmentKind;
use tito::trajectory::{testing, ChatInput, SegRange, Trajectories};

fn input(messages: &[Value]) -> ChatInput<'_> {
    ChatInput {
        messages,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    }
}

/// Prepares and records one call on `messages` that replies `reply`.
async fn call(traj: &Trajectories, messages: &[Value], reply: &str) {
    let prepared = traj
        .prepare_chat("t", input(messages))
        .await
        .expect("prepare");
    let ctx = testing::context(
        "t",
        json!({ "messages": messages }),
        Some(messages.to_vec()),
    );
    let sampled = [
        chatml_renderer().encode(reply).expect("encode"),
        vec![IM_END],
    ]
    .concat();
    let outcome = testing::stopped(sampled, json!({"role": "assistant", "content": reply}));
    traj.commit(&ctx, &prepared, vec![outcome], None)
        .await
        .expect("commit");
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test]
async fn a_later_samples_prompt_segment_names_its_root_call_live_and_rebuilt() {
    let traj = Trajectories::new(
        tito::store::open("memory://").expect("store"),
        chatml_renderer(),
        TrajectoryConfig::default(),
    );
    // Call 0 starts sample 0; an edited first message starts sample 1 at
    // call 1, which the third request continues.
    call(&traj, &[user("first question")], "first answer").await;
    call(&traj, &[user("edited question")], "second answer").await;
    let next = [
        user("edited question"),
        json!({"role": "assistant", "content": "second answer"}),
        user("and then?"),
    ];
    let live = traj.prepare_chat("t", input(&next)).await.expect("live");
    traj.forget("t");
    let rebuilt = traj.prepare_chat("t", input(&next)).await.expect("rebuilt");

    let kinds: Vec<(SegmentKind, u32)> = live.segments.iter().map(|s| (s.kind, s.call)).collect();
    assert_eq!(
        kinds,
        [
            (SegmentKind::Prompt, 1),
            (SegmentKind::Sampled, 1),
            (SegmentKind::Observation, 1)
        ],
        "live segments: {:?}",
        live.segments
    );
    let rebuilt: &[SegRange] = &rebuilt.segments;
    assert_eq!(live.segments.as_slice(), rebuilt);
}
