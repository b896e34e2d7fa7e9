//! Sample reconstruction: paths over parent links across samples, response
//! ids / masks / logprobs, rewards, segments, full prompts.

mod store_support;

use store_support::{branching, ids};
use tito::store::{
    full_prompt_ids, segments, SegmentKind, Trajectory, TrajectoryMeta, TrajectoryStatus,
};

fn traj(reward: Option<f64>) -> Trajectory {
    let calls = branching("t");
    Trajectory {
        meta: TrajectoryMeta {
            id: "t".into(),
            status: TrajectoryStatus::Finished,
            created_at: 0,
            updated_at: 0,
            reward,
            num_calls: calls.len() as u32,
            num_tokens: 0,
            drift_count: 0,
            next_call_index: 6,
            next_sample_index: 3,
            incomplete: false,
            metadata: Default::default(),
            reward_extra: None,
        },
        calls,
        replays: Vec::new(),
    }
}

fn lp(n: usize) -> Vec<Option<f32>> {
    (0..n).map(|k| Some(-((k + 1) as f32) / 100.0)).collect()
}

#[test]
fn branching_samples_follow_parent_links() {
    let mut t = traj(Some(1.0));
    t.calls[1].truncated = true;
    t.calls[4].reward = Some(0.5);
    t.calls[4].finish_reason = "length".into();
    let samples = t.samples().expect("samples");
    assert_eq!(samples.len(), 3);

    let s0 = &samples[0];
    assert_eq!(s0.sample, 0);
    assert_eq!(s0.calls, vec![0, 1, 2]);
    assert_eq!(s0.prompt_ids, ids(100, 5));
    assert_eq!(
        s0.response_ids,
        [
            ids(200, 3),
            ids(300, 2),
            ids(400, 4),
            ids(500, 2),
            ids(600, 2)
        ]
        .concat()
    );
    assert_eq!(
        s0.response_mask,
        [vec![1; 3], vec![0; 2], vec![1; 4], vec![0; 2], vec![1; 2]].concat()
    );
    assert_eq!(
        s0.response_logprobs,
        [lp(3), vec![None; 2], lp(4), vec![None; 2], lp(2)].concat()
    );
    assert_eq!(s0.num_turns, 3);
    assert_eq!(s0.reward, Some(1.0));
    assert!(s0.truncated, "call 1 on the path is truncated");
    assert_eq!(s0.weight_version.as_deref(), Some("step-2"));

    // Sample 1 shares calls 0 and 1 with sample 0 and continues from call 1.
    let s1 = &samples[1];
    assert_eq!(s1.calls, vec![0, 1, 3, 4]);
    assert_eq!(s1.prompt_ids, ids(100, 5));
    assert_eq!(
        s1.response_ids,
        [
            ids(200, 3),
            ids(300, 2),
            ids(400, 4),
            ids(700, 3),
            ids(800, 5),
            ids(900, 1),
            ids(1000, 2)
        ]
        .concat()
    );
    assert_eq!(
        s1.response_mask,
        [
            vec![1; 3],
            vec![0; 2],
            vec![1; 4],
            vec![0; 3],
            vec![1; 5],
            vec![0; 1],
            vec![1; 2]
        ]
        .concat()
    );
    assert_eq!(
        s1.reward,
        Some(0.5),
        "per-call reward of the last call wins"
    );
    assert_eq!(s1.finish_reason, "length");
    assert_eq!(s1.num_turns, 4);

    let s2 = &samples[2];
    assert_eq!(s2.calls, vec![5]);
    assert_eq!(s2.prompt_ids, ids(1100, 6));
    assert_eq!(s2.response_ids, ids(1200, 3));
    assert_eq!(s2.response_mask, vec![1; 3]);
    assert!(!s2.truncated);

    for s in &samples {
        assert_eq!(s.response_ids.len(), s.response_mask.len());
        assert_eq!(s.response_ids.len(), s.response_logprobs.len());
        // prompt + response is the last call's full prompt + its sampled ids.
        let last = *s.calls.last().expect("non-empty path");
        let mut seq = full_prompt_ids(&t.calls, last).expect("prompt");
        seq.extend_from_slice(&t.call(last).expect("call").sampled_ids);
        assert_eq!([s.prompt_ids.clone(), s.response_ids.clone()].concat(), seq);
    }
}

#[test]
fn unset_rewards_stay_unset() {
    let samples = traj(None).samples().expect("samples");
    assert!(samples.iter().all(|s| s.reward.is_none()));
}

#[test]
fn segments_label_prompt_sampled_and_observation() {
    let t = traj(None);
    let segs = segments(&t.calls, 2).expect("segments");
    let kinds: Vec<(SegmentKind, u32, usize)> =
        segs.iter().map(|s| (s.kind, s.call, s.ids.len())).collect();
    assert_eq!(
        kinds,
        vec![
            (SegmentKind::Prompt, 0, 5),
            (SegmentKind::Sampled, 0, 3),
            (SegmentKind::Observation, 1, 2),
            (SegmentKind::Sampled, 1, 4),
            (SegmentKind::Observation, 2, 2),
            (SegmentKind::Sampled, 2, 2),
        ]
    );
}

#[test]
fn broken_chains_are_errors_not_panics() {
    let mut t = traj(None);
    t.calls.remove(1);
    assert!(t.samples().is_err());
    assert!(full_prompt_ids(&t.calls, 2).is_err());
    assert!(full_prompt_ids(&t.calls, 42).is_err());
}
