//! The hot view's index: recently used trajectories, least recently used
//! first out, bounded by the bytes their calls take (`[trajectory]
//! hot_bytes`). An evicted trajectory is rebuilt from the store on its next
//! call, so eviction costs time, never history.
//!
//! Sizes are estimates: the token ids, decoded texts, segments and messages
//! each call keeps, counted when the call enters the view. Calls that share
//! a buffer (the choices of one request share their prompt) are counted once
//! each, so the estimate errs high.

use std::sync::Arc;

use lru::LruCache;

use super::messages::json_bytes;
use super::{HotCall, SegRange, TrajState};

pub(super) type Shared = Arc<tokio::sync::Mutex<TrajState>>;

struct Entry {
    state: Shared,
    bytes: u64,
}

pub(super) struct HotMap {
    map: LruCache<String, Entry>,
    budget: u64,
    total: u64,
}

impl HotMap {
    pub(super) fn new(budget: u64) -> Self {
        HotMap {
            map: LruCache::unbounded(),
            budget,
            total: 0,
        }
    }

    /// The trajectory's state, created empty (not loaded) on a miss; marks
    /// it most recently used.
    pub(super) fn get_or_insert(&mut self, tid: &str) -> Shared {
        if let Some(e) = self.map.get(tid) {
            return e.state.clone();
        }
        let state = Shared::default();
        self.map.put(
            tid.to_string(),
            Entry {
                state: state.clone(),
                bytes: 0,
            },
        );
        state
    }

    /// Records what `tid` takes now, then evicts least recently used
    /// trajectories until the view fits. A trajectory whose state someone
    /// holds (a call in flight holds it from prepare to commit) is never
    /// evicted: a second state for it would not know of that call. `tid` is
    /// not evicted either.
    pub(super) fn resize(&mut self, tid: &str, bytes: u64) {
        if let Some(e) = self.map.peek_mut(tid) {
            self.total = self.total - e.bytes + bytes;
            e.bytes = bytes;
        }
        if self.total <= self.budget {
            return;
        }
        let victims: Vec<String> = {
            let mut over = self.total - self.budget;
            let mut v = Vec::new();
            // `iter().rev()` walks from the least recently used.
            for (key, e) in self.map.iter().rev() {
                if over == 0 {
                    break;
                }
                if key == tid || Arc::strong_count(&e.state) > 1 {
                    continue;
                }
                over = over.saturating_sub(e.bytes.max(1));
                v.push(key.clone());
            }
            v
        };
        for key in victims {
            self.remove(&key);
            crate::metrics::hot_evictions(1);
        }
    }

    pub(super) fn remove(&mut self, tid: &str) {
        if let Some(e) = self.map.pop(tid) {
            self.total -= e.bytes;
        }
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn total_bytes(&self) -> u64 {
        self.total
    }
}

/// Estimated heap bytes of one call in the view.
pub(super) fn call_bytes(c: &HotCall) -> u64 {
    const FIXED: usize = 256;
    let ids = (c.prompt_ids.len() + c.sampled_ids.len()) * 4;
    let texts = c.prompt_text.len() + c.sampled_text.len();
    let segs = c.segments.len() * std::mem::size_of::<SegRange>();
    let json = c
        .messages
        .as_ref()
        .map_or(0, |m| m.iter().map(json_bytes).sum())
        + json_bytes(&c.served);
    (FIXED + ids + texts + segs + json) as u64
}
