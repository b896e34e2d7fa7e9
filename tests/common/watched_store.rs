//! A span store that lets a test await writes made by background tasks it
//! cannot reach (e.g. the sampled replay check): every method goes to the
//! inner store; `set_replays` also wakes `replays_stored`. With
//! `hold_appends` set, each `append_call` waits for `release` before it
//! writes, and says which task waits on it (`held`, `moved`) or that it was
//! dropped unwritten (`abandoned`).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use tito::store::{
    Ack, Acked, CallRecord, DynStore, Lease, ListQuery, Page, SampleReplay, SpanStore, StoreError,
    Trajectory, TrajectoryFilter, TrajectoryIter, TrajectoryMeta, TrajectoryMetadata,
};
use tokio::sync::Notify;

pub struct WatchedStore {
    pub inner: DynStore,
    pub replays_stored: Notify,
    pub hold_appends: AtomicBool,
    /// A held append waits in some task.
    pub held: Notify,
    /// A held append is waited on by another task than the one it began in
    /// (once per append).
    pub moved: Notify,
    /// A held append was dropped before it wrote.
    pub abandoned: Notify,
    /// Lets one held append write.
    pub release: Notify,
    /// An append was written.
    pub appended: Notify,
}

/// Waits for `release`, noting the tasks that poll it and its drop.
struct Held<'a> {
    store: &'a WatchedStore,
    release: Pin<Box<tokio::sync::futures::Notified<'a>>>,
    task: Option<tokio::task::Id>,
    moved: bool,
    done: bool,
}

impl Future for Held<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let now = tokio::task::try_id();
        match self.task {
            None => {
                self.task = now;
                self.store.held.notify_one();
            }
            Some(first) if now != Some(first) && !self.moved => {
                self.moved = true;
                self.store.moved.notify_one();
            }
            Some(_) => {}
        }
        if self.release.as_mut().poll(cx).is_ready() {
            self.done = true;
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.store.abandoned.notify_one();
        }
    }
}

impl WatchedStore {
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(WatchedStore {
            inner,
            replays_stored: Notify::new(),
            hold_appends: AtomicBool::new(false),
            held: Notify::new(),
            moved: Notify::new(),
            abandoned: Notify::new(),
            release: Notify::new(),
            appended: Notify::new(),
        })
    }

    /// Resolves once `id` carries a replay check (stored before or after
    /// the call), and returns the first.
    pub async fn replay_of(&self, id: &str) -> SampleReplay {
        loop {
            let stored = self.replays_stored.notified();
            let t = self.inner.get_trajectory(id).await.expect("read");
            if let Some(r) = t.and_then(|t| t.replays.into_iter().next()) {
                return r;
            }
            stored.await;
        }
    }
}

#[async_trait]
impl SpanStore for WatchedStore {
    async fn append_call(&self, call: CallRecord) -> Result<(), StoreError> {
        if self.hold_appends.load(Ordering::SeqCst) {
            Held {
                store: self,
                release: Box::pin(self.release.notified()),
                task: None,
                moved: false,
                done: false,
            }
            .await;
        }
        let r = self.inner.append_call(call).await;
        self.appended.notify_one();
        r
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
        extra: Option<serde_json::Value>,
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
        let r = self.inner.set_replays(id, replays).await;
        self.replays_stored.notify_waiters();
        r
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

    async fn writable(&self) -> Result<(), StoreError> {
        self.inner.writable().await
    }

    async fn begin_run(&self, ack: Ack) -> Result<u64, StoreError> {
        self.inner.begin_run(ack).await
    }
}
