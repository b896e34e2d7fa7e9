//! The hot view under a byte budget (`[trajectory] hot_bytes`): over 10,000
//! trajectories of 8,192 prompt tokens its estimated size never passes the
//! budget by more than the trajectory being recorded, least recently used
//! trajectories go first, finished ones leave nothing behind, an evicted
//! trajectory continues exactly (rebuilt from the store), and one whose call
//! is in flight is not evicted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};
use tito::config::TrajectoryConfig;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::render::Renderer;
use tito::store::{
    Ack, Acked, CallRecord, DynStore, Lease, ListQuery, Page, SampleReplay, SpanStore, StoreError,
    Trajectory, TrajectoryFilter, TrajectoryIter, TrajectoryMeta, TrajectoryMetadata,
};
use tito::trajectory::{testing, CallContext, ChatInput, ChoiceOutcome, Trajectories};

const TRAJECTORIES: usize = 10_000;
const PROMPT_TOKENS: usize = 8_192;
const BUDGET: u64 = 32 << 20;

/// Keeps the calls of trajectories named `keep-*` and counts the others'
/// bytes without keeping them: the test is about the gateway's memory, not
/// the store's.
struct KeepSome {
    inner: DynStore,
    dropped: AtomicU64,
    reads: AtomicU64,
    /// The next append of a kept trajectory fails (a commit error).
    fail_next: AtomicBool,
}

#[async_trait]
impl SpanStore for KeepSome {
    async fn append_call(&self, call: CallRecord) -> Result<(), StoreError> {
        if call.trajectory_id.starts_with("keep-") {
            if self.fail_next.swap(false, Ordering::Relaxed) {
                return Err(StoreError::Commit("disk full".into()));
            }
            return self.inner.append_call(call).await;
        }
        self.dropped.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    async fn put_images(&self, images: &[tito::store::StoredImage]) -> Result<(), StoreError> {
        self.inner.put_images(images).await
    }
    async fn image(&self, sha256: &str) -> Result<Option<tito::store::StoredImage>, StoreError> {
        self.inner.image(sha256).await
    }
    async fn set_reward(
        &self,
        id: &str,
        call: Option<u32>,
        reward: f64,
        extra: Option<Value>,
    ) -> Result<TrajectoryMeta, StoreError> {
        self.inner.set_reward(id, call, reward, extra).await
    }
    async fn set_metadata(
        &self,
        id: &str,
        update: &TrajectoryMetadata,
    ) -> Result<TrajectoryMeta, StoreError> {
        self.inner.set_metadata(id, update).await
    }
    async fn set_replays(&self, id: &str, replays: Vec<SampleReplay>) -> Result<(), StoreError> {
        self.inner.set_replays(id, replays).await
    }
    async fn set_weight_version(&self, version: &str) -> Result<(), StoreError> {
        self.inner.set_weight_version(version).await
    }
    async fn weight_version(&self) -> Result<Option<String>, StoreError> {
        self.inner.weight_version().await
    }
    async fn register_version(&self, label: &str) -> Result<u64, StoreError> {
        self.inner.register_version(label).await
    }
    async fn versions(&self) -> Result<Vec<tito::store::VersionRecord>, StoreError> {
        self.inner.versions().await
    }
    async fn group(&self, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError> {
        self.inner.group(group).await
    }
    async fn lease(
        &self,
        consumer: &str,
        filter: &TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Lease, StoreError> {
        self.inner.lease(consumer, filter, limit, lease_ms).await
    }
    async fn ack(&self, consumer: &str, cursor: &str) -> Result<Acked, StoreError> {
        self.inner.ack(consumer, cursor).await
    }
    async fn finish(&self, id: &str) -> Result<TrajectoryMeta, StoreError> {
        self.inner.finish(id).await
    }
    async fn get_meta(&self, id: &str) -> Result<Option<TrajectoryMeta>, StoreError> {
        self.inner.get_meta(id).await
    }
    async fn get_trajectory(&self, id: &str) -> Result<Option<Trajectory>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.inner.get_trajectory(id).await
    }
    async fn latest_calls(&self, id: &str, n: usize) -> Result<Vec<CallRecord>, StoreError> {
        self.inner.latest_calls(id, n).await
    }
    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError> {
        self.inner.list_trajectories(query).await
    }
    async fn find_response(
        &self,
        response_id: &str,
    ) -> Result<Option<tito::store::ResponseRef>, StoreError> {
        self.inner.find_response(response_id).await
    }
    async fn forget_response(&self, response_id: &str) -> Result<bool, StoreError> {
        self.inner.forget_response(response_id).await
    }
    fn count(&self, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
        self.inner.count(filter)
    }
    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError> {
        self.inner.scan(filter)
    }
    fn scan_ids(&self, ids: Vec<String>) -> Result<TrajectoryIter, StoreError> {
        self.inner.scan_ids(ids)
    }
    async fn begin_run(&self, ack: Ack) -> Result<u64, StoreError> {
        self.inner.begin_run(ack).await
    }
}

fn ctx(tid: &str, messages: Option<Vec<Value>>) -> CallContext {
    testing::context(tid, json!({"messages": messages}), messages)
}

fn outcome(sampled: Vec<u32>, content: &str) -> ChoiceOutcome {
    testing::stopped(sampled, json!({"role": "assistant", "content": content}))
}

#[tokio::test]
async fn the_hot_view_stays_within_its_byte_budget_and_evicted_trajectories_continue_exactly() {
    let renderer = chatml_renderer();
    let store = keep_some();
    let traj = Trajectories::new(
        store.clone(),
        renderer.clone(),
        TrajectoryConfig {
            hot_bytes: BUDGET,
            ..Default::default()
        },
    );

    // The trajectory that will be evicted, then continued.
    let first = vec![json!({"role": "user", "content": "What is 2+2?"})];
    let input = ChatInput {
        messages: &first,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    };
    let p0 = traj.prepare_chat("keep-0", input).await.expect("prepare");
    let reply = "It is 4.";
    let sampled0 = [renderer.encode(reply).expect("enc"), vec![IM_END]].concat();
    traj.commit(
        &ctx("keep-0", Some(first.clone())),
        &p0,
        vec![outcome(sampled0.clone(), reply)],
        None,
    )
    .await
    .expect("commit");
    // A prepared call holds its trajectory in the view until it is dropped
    // (see the next test): keep only its prompt.
    let p0_prompt = p0.prompt_ids.clone();
    drop(p0);

    // 10,000 trajectories of 8,192 distinct prompt tokens each.
    let mut largest_one = 0u64;
    let mut peak = 0u64;
    for i in 0..TRAJECTORIES {
        let ids: Vec<u32> = (0..PROMPT_TOKENS)
            .map(|j| u32::from(b'a') + ((i * 31 + j * 7) % 26) as u32)
            .collect();
        let tid = format!("t-{i}");
        let before = traj.hot_usage().1;
        record_root(&traj, &tid, ids).await;
        let (_, after) = traj.hot_usage();
        largest_one = largest_one.max(after.saturating_sub(before));
        peak = peak.max(after);
        // Finished trajectories leave the view entirely.
        if i % 10 == 9 {
            traj.forget(&tid);
        }
    }
    let (len, bytes) = traj.hot_usage();
    assert!(largest_one > 0);
    assert!(
        peak <= BUDGET + largest_one,
        "peak {peak} over budget {BUDGET} + one trajectory {largest_one}"
    );
    assert!(bytes <= BUDGET, "{bytes}");
    // Evictions happened: far fewer trajectories than were recorded.
    assert!(
        (len as u64) < BUDGET / largest_one.max(1) + 2,
        "{len} trajectories in the view"
    );
    assert_eq!(store.dropped.load(Ordering::Relaxed), TRAJECTORIES as u64);

    // keep-0 was evicted long ago: its next turn is rebuilt from the store
    // and continues exactly (earlier prompt + sampled ids verbatim).
    let reads_before = store.reads.load(Ordering::Relaxed);
    let mut next = first.clone();
    next.push(json!({"role": "assistant", "content": reply}));
    next.push(json!({"role": "user", "content": "And 3+3?"}));
    let input = ChatInput {
        messages: &next,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    };
    let p1 = traj.prepare_chat("keep-0", input).await.expect("prepare");
    assert!(
        store.reads.load(Ordering::Relaxed) > reads_before,
        "reloaded"
    );
    let exact: Vec<u32> = [p0_prompt.as_slice(), &sampled0].concat();
    assert_eq!(&p1.prompt_ids[..exact.len()], exact.as_slice());
    assert!(p1.drift.is_none(), "{:?}", p1.drift);
    let parent = p1.parent.as_ref().expect("continues call 0");
    assert_eq!(parent.call_index, 0);
}

fn keep_some() -> Arc<KeepSome> {
    Arc::new(KeepSome {
        inner: tito::store::open("memory://").expect("store"),
        dropped: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        fail_next: AtomicBool::new(false),
    })
}

fn chat_input(messages: &[Value]) -> ChatInput<'_> {
    ChatInput {
        messages,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    }
}

/// Records a call of `tid` on `ids` that samples one token.
async fn record_root(traj: &Trajectories, tid: &str, ids: Vec<u32>) {
    let p = traj.prepare_root(tid, ids).await.expect("prepare");
    traj.commit(
        &ctx(tid, None),
        &p,
        vec![outcome(vec![b'x'.into(), IM_END], "x")],
        None,
    )
    .await
    .expect("commit");
}

/// Records the first turn of `tid` and returns the messages of its second.
/// `(call_index, parent_call, sample_index)` of every stored call of `tid`.
async fn stored_calls(store: &KeepSome, tid: &str) -> Vec<(u32, Option<u32>, u32)> {
    let stored = store
        .inner
        .get_trajectory(tid)
        .await
        .expect("get")
        .expect("stored");
    stored
        .calls
        .iter()
        .map(|c| (c.call_index, c.parent_call, c.sample_index))
        .collect()
}

async fn first_turn(traj: &Trajectories, renderer: &Renderer, tid: &str) -> Vec<Value> {
    let first = vec![json!({"role": "user", "content": "What is 2+2?"})];
    let p0 = traj
        .prepare_chat(tid, chat_input(&first))
        .await
        .expect("prepare");
    let reply = "It is 4.";
    let sampled0 = [renderer.encode(reply).expect("enc"), vec![IM_END]].concat();
    traj.commit(
        &ctx(tid, Some(first.clone())),
        &p0,
        vec![outcome(sampled0, reply)],
        None,
    )
    .await
    .expect("commit");
    let mut next = first;
    next.push(json!({"role": "assistant", "content": reply}));
    next.push(json!({"role": "user", "content": "And 3+3?"}));
    next
}

/// A call holds its trajectory in the view from prepare to commit: other
/// trajectories filling the view meanwhile evict others, never it, and the
/// call is recorded as the continuation it was prepared as.
#[tokio::test]
async fn a_trajectory_is_not_evicted_while_its_call_generates() {
    let renderer = chatml_renderer();
    let store = keep_some();
    let traj = Trajectories::new(
        store.clone(),
        renderer.clone(),
        TrajectoryConfig {
            hot_bytes: 64 << 10,
            ..Default::default()
        },
    );
    let next = first_turn(&traj, &renderer, "keep-a").await;
    let p1 = traj
        .prepare_chat("keep-a", chat_input(&next))
        .await
        .expect("prepare");
    assert_eq!(p1.parent.as_ref().map(|p| p.call_index), Some(0));

    // While "keep-a" generates, 50 trajectories of 4,096 tokens pass the budget
    // many times over.
    for i in 0..50u32 {
        let tid = format!("t-{i}");
        let ids: Vec<u32> = (0..4096).map(|j| u32::from(b'a') + (i + j) % 26).collect();
        record_root(&traj, &tid, ids).await;
    }
    let (len, bytes) = traj.hot_usage();
    assert!(
        len < 50 && bytes <= 64 << 10,
        "{len} trajectories, {bytes} bytes: nothing evicted"
    );

    let reads = store.reads.load(Ordering::Relaxed);
    let indices = traj
        .commit(
            &ctx("keep-a", Some(next)),
            &p1,
            vec![outcome(vec![b'y'.into(), IM_END], "y")],
            None,
        )
        .await
        .expect("the held trajectory's call is recorded");
    assert_eq!(indices, vec![1]);
    assert_eq!(
        store.reads.load(Ordering::Relaxed),
        reads,
        "recorded against the held view, not reloaded from the store"
    );
    let parents: Vec<_> = stored_calls(&store, "keep-a")
        .await
        .iter()
        .map(|(call, parent, _)| (*call, *parent))
        .collect();
    assert_eq!(parents, vec![(0, None), (1, Some(0))]);
}

/// A continuation whose append fails (a commit error, answered 500) leaves
/// the trajectory as it was: the client's retry continues the same sample,
/// it does not start a second one repeating the first's prefix.
#[tokio::test]
async fn a_failed_append_leaves_the_parent_to_the_retry() {
    let renderer = chatml_renderer();
    let store = keep_some();
    let traj = Trajectories::new(store.clone(), renderer.clone(), TrajectoryConfig::default());
    let next = first_turn(&traj, &renderer, "keep-r").await;

    store.fail_next.store(true, Ordering::Relaxed);
    let p1 = traj
        .prepare_chat("keep-r", chat_input(&next))
        .await
        .expect("prepare");
    let failed = traj
        .commit(
            &ctx("keep-r", Some(next.clone())),
            &p1,
            vec![outcome(vec![b'6'.into(), IM_END], "6")],
            None,
        )
        .await;
    assert!(failed.is_err());
    drop(p1);

    let retry = traj
        .prepare_chat("keep-r", chat_input(&next))
        .await
        .expect("prepare");
    traj.commit(
        &ctx("keep-r", Some(next)),
        &retry,
        vec![outcome(vec![b'6'.into(), IM_END], "6")],
        None,
    )
    .await
    .expect("commit");
    let calls = stored_calls(&store, "keep-r").await;
    assert_eq!(calls, vec![(0, None, 0), (1, Some(0), 0)], "one sample");
}
