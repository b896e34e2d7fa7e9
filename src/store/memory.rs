//! In-memory [`SpanStore`] for unit tests and `memory://`. Same semantics as
//! the SQLite store (validation, errors, ordering, cursors), nothing durable.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;

use super::types::{clamp_limit, now_ms, parse_cursor};
use super::{
    missing_image, new_cursor, validate_call, validate_images, Acked, CallRecord, Lease, ListQuery,
    Page, ResponseRef, SampleReplay, SpanStore, StoreError, StoredImage, Trajectory,
    TrajectoryFilter, TrajectoryIter, TrajectoryMeta, TrajectoryMetadata, TrajectoryStatus,
    VersionRecord,
};

#[derive(Default)]
struct Inner {
    /// Creation-order key -> trajectory (calls sorted by index).
    by_seq: BTreeMap<u64, Trajectory>,
    seq_of: HashMap<String, u64>,
    next_seq: u64,
    /// (consumer, seq) -> (cursor, expires_at).
    leases: HashMap<(String, u64), (String, i64)>,
    /// (consumer, seq) acknowledged.
    acks: HashSet<(String, u64)>,
    /// (consumer, cursor) acknowledged.
    acked_cursors: HashSet<(String, String)>,
    weight_version: Option<String>,
    /// Every response id ever recorded: the call holding it, `None` once
    /// forgotten (the id stays taken).
    responses: HashMap<String, Option<(String, u32)>>,
    /// Registered weight versions, ascending by seq (1, 2, ...).
    versions: Vec<VersionRecord>,
    /// Stored images by key; the bytes are shared, never copied.
    images: HashMap<String, StoredImage>,
}

#[derive(Clone, Default)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (each update
        // is applied in one step), so recover from poisoning.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn new_meta(id: &str, now: i64) -> TrajectoryMeta {
    TrajectoryMeta {
        id: id.to_string(),
        status: TrajectoryStatus::Active,
        created_at: now,
        updated_at: now,
        reward: None,
        num_calls: 0,
        num_tokens: 0,
        drift_count: 0,
        next_call_index: 0,
        next_sample_index: 0,
        incomplete: false,
        metadata: TrajectoryMetadata::default(),
        reward_extra: None,
    }
}

impl Inner {
    fn get_mut(&mut self, id: &str) -> Result<&mut Trajectory, StoreError> {
        let seq = *self
            .seq_of
            .get(id)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
        self.by_seq
            .get_mut(&seq)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    fn get(&self, id: &str) -> Option<&Trajectory> {
        self.seq_of.get(id).and_then(|s| self.by_seq.get(s))
    }

    /// The trajectory `id`, created (with no calls) when absent.
    fn get_or_create(&mut self, id: &str, now: i64) -> Result<&mut Trajectory, StoreError> {
        let seq = match self.seq_of.get(id) {
            Some(s) => *s,
            None => {
                self.next_seq += 1;
                let seq = self.next_seq;
                self.seq_of.insert(id.to_string(), seq);
                let meta = new_meta(id, now);
                self.by_seq.insert(
                    seq,
                    Trajectory {
                        meta,
                        calls: Vec::new(),
                        replays: Vec::new(),
                    },
                );
                seq
            }
        };
        self.by_seq
            .get_mut(&seq)
            .ok_or_else(|| StoreError::NotFound(id.to_string()))
    }

    /// Every member of the group finished, and at least `size` of them.
    fn group_complete(&self, group: &str, size: Option<u32>) -> bool {
        let mut n = 0u32;
        for t in self.by_seq.values() {
            if t.meta.metadata.group.as_deref() == Some(group) {
                if t.meta.status != TrajectoryStatus::Finished {
                    return false;
                }
                n += 1;
            }
        }
        n > 0 && size.is_none_or(|s| n >= s)
    }

    fn matches(&self, meta: &TrajectoryMeta, filter: &TrajectoryFilter) -> bool {
        let group = meta.metadata.group.as_deref();
        filter.status.is_none_or(|s| meta.status == s)
            && filter.since.is_none_or(|t| meta.updated_at >= t)
            && filter.group.as_deref().is_none_or(|g| group == Some(g))
            && (!filter.complete_groups
                || group.is_some_and(|g| self.group_complete(g, filter.group_size)))
    }
}

#[async_trait]
impl SpanStore for MemoryStore {
    async fn append_call(&self, mut call: CallRecord) -> Result<(), StoreError> {
        validate_call(&call)?;
        // As SQLite stores a missing logprob as NaN and reads NaN back as
        // `None`: a NaN logprob is no logprob.
        for x in &mut call.logprobs {
            if x.is_some_and(f32::is_nan) {
                *x = None;
            }
        }
        // As a durable store keeps what it wrote, this one keeps copies of
        // the request and the served message, not the caller's shared
        // values (the hot view holds the served message it was given, and
        // what it holds must not depend on which store is configured).
        call.request = Arc::new(serde_json::Value::clone(&call.request));
        call.response = Arc::new(serde_json::Value::clone(&call.response));
        let now = now_ms();
        let mut inner = self.lock();
        // First after the structural checks, as the durable stores check.
        if let Some(sha) = call
            .image_keys()
            .into_iter()
            .find(|k| !inner.images.contains_key(*k))
        {
            return Err(missing_image(&call, sha));
        }
        let exists = inner.seq_of.contains_key(&call.trajectory_id);
        if call.parent_call.is_some() && !exists {
            return Err(missing_parent(&call));
        }
        // Refused after every other check, as the durable stores refuse it
        // (they record the id once the call's row is in), and before a new
        // trajectory is made for it.
        let taken = call
            .response_id
            .clone()
            .filter(|id| inner.responses.contains_key(id));
        if let (Some(id), false) = (&taken, exists) {
            return Err(StoreError::ResponseIdTaken(id.clone()));
        }
        let response = call
            .response_id
            .clone()
            .map(|id| (id, (call.trajectory_id.clone(), call.call_index)));
        let traj = inner.get_or_create(&call.trajectory_id, now)?;
        if traj.meta.status == TrajectoryStatus::Finished {
            return Err(StoreError::Finished(call.trajectory_id.clone()));
        }
        if let Some(p) = call.parent_call {
            if traj.call(p).is_none() {
                return Err(missing_parent(&call));
            }
        }
        let pos = match traj
            .calls
            .binary_search_by_key(&call.call_index, |c| c.call_index)
        {
            Ok(_) => {
                return Err(StoreError::Duplicate {
                    trajectory: call.trajectory_id.clone(),
                    call: call.call_index,
                })
            }
            Err(pos) => pos,
        };
        if let Some(id) = taken {
            return Err(StoreError::ResponseIdTaken(id));
        }
        let m = &mut traj.meta;
        m.updated_at = m.updated_at.max(now);
        m.num_calls += 1;
        m.num_tokens += (call.prompt_delta_ids.len() + call.sampled_ids.len()) as u64;
        m.drift_count += u32::from(call.drift.is_some());
        m.next_call_index = m.next_call_index.max(call.call_index + 1);
        m.next_sample_index = m.next_sample_index.max(call.sample_index + 1);
        traj.calls.insert(pos, call);
        if let Some((id, at)) = response {
            inner.responses.insert(id, Some(at));
        }
        Ok(())
    }

    async fn put_images(&self, images: &[StoredImage]) -> Result<(), StoreError> {
        validate_images(images)?;
        let mut inner = self.lock();
        for image in images {
            inner
                .images
                .entry(image.sha256.clone())
                .or_insert_with(|| image.clone());
        }
        Ok(())
    }

    async fn image(&self, sha256: &str) -> Result<Option<StoredImage>, StoreError> {
        Ok(self.lock().images.get(sha256).cloned())
    }

    async fn set_reward(
        &self,
        trajectory_id: &str,
        call: Option<u32>,
        reward: f64,
        extra: Option<serde_json::Value>,
    ) -> Result<TrajectoryMeta, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let traj = inner.get_mut(trajectory_id)?;
        match call {
            None => traj.meta.reward = Some(reward),
            Some(idx) => {
                let pos = traj
                    .calls
                    .binary_search_by_key(&idx, |c| c.call_index)
                    .map_err(|_| StoreError::CallNotFound {
                        trajectory: trajectory_id.to_string(),
                        call: idx,
                    })?;
                if let Some(c) = traj.calls.get_mut(pos) {
                    c.reward = Some(reward);
                }
            }
        }
        if extra.is_some() {
            traj.meta.reward_extra = extra;
        }
        traj.meta.updated_at = traj.meta.updated_at.max(now);
        Ok(traj.meta.clone())
    }

    async fn finish(&self, trajectory_id: &str) -> Result<TrajectoryMeta, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let traj = inner.get_mut(trajectory_id)?;
        if traj.meta.status != TrajectoryStatus::Finished {
            traj.meta.status = TrajectoryStatus::Finished;
            traj.meta.updated_at = traj.meta.updated_at.max(now);
        }
        Ok(traj.meta.clone())
    }

    async fn set_metadata(
        &self,
        trajectory_id: &str,
        update: &TrajectoryMetadata,
    ) -> Result<TrajectoryMeta, StoreError> {
        let now = now_ms();
        let mut inner = self.lock();
        let traj = inner.get_or_create(trajectory_id, now)?;
        traj.meta.metadata = traj.meta.metadata.merged(trajectory_id, update)?;
        traj.meta.updated_at = traj.meta.updated_at.max(now);
        Ok(traj.meta.clone())
    }

    async fn set_replays(
        &self,
        trajectory_id: &str,
        replays: Vec<SampleReplay>,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock();
        let traj = inner.get_mut(trajectory_id)?;
        for r in replays {
            traj.replays.retain(|old| !old.same_check(&r));
            traj.replays.push(r);
        }
        traj.replays.sort_by_key(|r| r.sample);
        Ok(())
    }

    async fn set_weight_version(&self, version: &str) -> Result<(), StoreError> {
        self.lock().weight_version = Some(version.to_string());
        Ok(())
    }

    async fn weight_version(&self) -> Result<Option<String>, StoreError> {
        Ok(self.lock().weight_version.clone())
    }

    async fn register_version(&self, label: &str) -> Result<u64, StoreError> {
        let mut inner = self.lock();
        if let Some(v) = inner.versions.iter().find(|v| v.label == label) {
            return Ok(v.seq);
        }
        let seq = inner.versions.last().map_or(1, |v| v.seq + 1);
        inner.versions.push(VersionRecord {
            seq,
            label: label.to_string(),
            registered_at: now_ms(),
        });
        Ok(seq)
    }

    async fn versions(&self) -> Result<Vec<VersionRecord>, StoreError> {
        Ok(self.lock().versions.clone())
    }

    async fn group(&self, group: &str) -> Result<Vec<TrajectoryMeta>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .by_seq
            .values()
            .filter(|t| t.meta.metadata.group.as_deref() == Some(group))
            .map(|t| t.meta.clone())
            .collect())
    }

    async fn lease(
        &self,
        consumer: &str,
        filter: &TrajectoryFilter,
        limit: usize,
        lease_ms: i64,
    ) -> Result<Lease, StoreError> {
        let now = now_ms();
        let expires_at = now.saturating_add(lease_ms);
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut filter = filter.clone();
        filter.status = Some(TrajectoryStatus::Finished);
        let mut eligible = Vec::new();
        for (seq, t) in &inner.by_seq {
            let key = (consumer.to_string(), *seq);
            let leased = inner.leases.get(&key).is_some_and(|(_, exp)| *exp > now);
            if !inner.acks.contains(&key) && !leased && inner.matches(&t.meta, &filter) {
                let key = (*seq, t.meta.updated_at);
                eligible.push((key, t.meta.id.clone(), t.meta.metadata.group.clone()));
            }
        }
        let picked = super::types::lease_page(eligible, limit, filter.complete_groups);
        if picked.is_empty() {
            return Ok(Lease::empty(expires_at));
        }
        // An expired lease whose trajectories are leased again is released
        // whole: its cursor becomes unknown, so its worker's ack is refused.
        let released: std::collections::HashSet<String> = picked
            .iter()
            .filter_map(|((seq, _), _)| inner.leases.get(&(consumer.to_string(), *seq)))
            .map(|(cursor, _)| cursor.clone())
            .collect();
        if !released.is_empty() {
            inner
                .leases
                .retain(|(c, _), (cursor, _)| c != consumer || !released.contains(cursor));
        }
        let cursor = new_cursor();
        for ((seq, _), _) in &picked {
            inner
                .leases
                .insert((consumer.to_string(), *seq), (cursor.clone(), expires_at));
        }
        Ok(Lease::of(cursor, picked, expires_at))
    }

    async fn ack(&self, consumer: &str, cursor: &str) -> Result<Acked, StoreError> {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let done = (consumer.to_string(), cursor.to_string());
        if inner.acked_cursors.contains(&done) {
            return Ok(Acked {
                trajectories: 0,
                already: true,
            });
        }
        let keys: Vec<(String, u64)> = inner
            .leases
            .iter()
            .filter(|((c, _), (cur, _))| c == consumer && cur == cursor)
            .map(|(k, _)| k.clone())
            .collect();
        if keys.is_empty() {
            return Err(StoreError::CursorNotFound(cursor.to_string()));
        }
        for k in &keys {
            inner.leases.remove(k);
            inner.acks.insert(k.clone());
        }
        inner.acked_cursors.insert(done);
        Ok(Acked {
            trajectories: keys.len() as u64,
            already: false,
        })
    }

    async fn get_meta(&self, trajectory_id: &str) -> Result<Option<TrajectoryMeta>, StoreError> {
        Ok(self.lock().get(trajectory_id).map(|t| t.meta.clone()))
    }

    async fn get_trajectory(&self, trajectory_id: &str) -> Result<Option<Trajectory>, StoreError> {
        Ok(self.lock().get(trajectory_id).cloned())
    }

    async fn latest_calls(
        &self,
        trajectory_id: &str,
        n: usize,
    ) -> Result<Vec<CallRecord>, StoreError> {
        let inner = self.lock();
        let traj = inner
            .get(trajectory_id)
            .ok_or_else(|| StoreError::NotFound(trajectory_id.to_string()))?;
        let start = traj.calls.len().saturating_sub(n);
        Ok(traj
            .calls
            .get(start..)
            .map(<[_]>::to_vec)
            .unwrap_or_default())
    }

    async fn list_trajectories(&self, query: &ListQuery) -> Result<Page, StoreError> {
        let after = parse_cursor(query.cursor.as_deref())?;
        let limit = clamp_limit(query.limit);
        let inner = self.lock();
        let mut items = Vec::new();
        let mut last_seq = None;
        let mut more = false;
        for (seq, t) in inner.by_seq.range(after + 1..) {
            if !inner.matches(&t.meta, &query.filter) {
                continue;
            }
            if items.len() == limit {
                more = true;
                break;
            }
            items.push(t.meta.clone());
            last_seq = Some(*seq);
        }
        Ok(Page {
            items,
            next_cursor: if more {
                last_seq.map(|s| s.to_string())
            } else {
                None
            },
        })
    }

    async fn find_response(&self, response_id: &str) -> Result<Option<ResponseRef>, StoreError> {
        let inner = self.lock();
        Ok(inner
            .responses
            .get(response_id)
            .and_then(Option::as_ref)
            .map(|(trajectory_id, call_index)| ResponseRef {
                trajectory_id: trajectory_id.clone(),
                call_index: *call_index,
            }))
    }

    async fn forget_response(&self, response_id: &str) -> Result<bool, StoreError> {
        let mut inner = self.lock();
        let Some(slot) = inner.responses.get_mut(response_id) else {
            return Ok(false);
        };
        // The call keeps its id (a continuation of it is rebuilt by it);
        // only the lookup goes.
        Ok(slot.take().is_some())
    }

    fn count(&self, filter: &TrajectoryFilter) -> Result<u64, StoreError> {
        let inner = self.lock();
        Ok(inner
            .by_seq
            .values()
            .filter(|t| inner.matches(&t.meta, filter))
            .count() as u64)
    }

    fn scan(&self, filter: &TrajectoryFilter) -> Result<TrajectoryIter, StoreError> {
        let store = self.clone();
        let filter = filter.clone();
        let mut after = 0u64;
        Ok(Box::new(std::iter::from_fn(move || {
            let inner = store.lock();
            let (seq, t) = inner
                .by_seq
                .range(after + 1..)
                .find(|(_, t)| inner.matches(&t.meta, &filter))?;
            after = *seq;
            Some(Ok(without_bodies(t)))
        })))
    }

    fn scan_ids(&self, ids: Vec<String>) -> Result<TrajectoryIter, StoreError> {
        let store = self.clone();
        let mut ids = ids.into_iter();
        Ok(Box::new(std::iter::from_fn(move || loop {
            let id = ids.next()?;
            if let Some(t) = store.lock().get(&id) {
                return Some(Ok(without_bodies(t)));
            }
        })))
    }
}

/// A trajectory as the scans give it out: calls without their bodies, as
/// the durable stores read them ([`crate::store::Bodies::Skip`]).
fn without_bodies(t: &Trajectory) -> Trajectory {
    Trajectory {
        meta: t.meta.clone(),
        calls: t.calls.iter().map(CallRecord::without_bodies).collect(),
        replays: t.replays.clone(),
    }
}

fn missing_parent(call: &CallRecord) -> StoreError {
    StoreError::Invalid(format!(
        "call {} of `{}`: parent {:?} is not stored",
        call.call_index, call.trajectory_id, call.parent_call
    ))
}
