//! The hot view's index: recently used trajectories, least recently used
//! first out, bounded by the bytes their calls take (`[trajectory]
//! hot_bytes`). An evicted trajectory is rebuilt from the store on its next
//! call, so eviction costs time, never history.
//!
//! Sizes are estimates of the heap held: the token ids, decoded texts,
//! segments and messages each call keeps (counted when the call enters the
//! view, JSON as serde_json allocates it; a continuation keeps what it adds
//! to its parent's, see `kept.rs`), and each trajectory's state and entry
//! here. `tests/trajectory_hot_bytes.rs` checks them against a
//! counting allocator. Calls that share a buffer (the choices of one request
//! share their prompt) are counted once each, so the estimate errs high.

use std::mem::size_of;
use std::sync::Arc;

use lru::LruCache;
use serde_json::Value as Json;

use super::messages::json_heap_bytes;
use super::{HotCall, SegRange, Served, TrajState};

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

/// A prompt's ids as the view keeps them (past their call, in its
/// [`HotCall`]): without the spare capacity they were built with.
pub(super) fn kept_ids(mut ids: Vec<u32>) -> Arc<Vec<u32>> {
    ids.shrink_to_fit();
    Arc::new(ids)
}

/// As [`kept_ids`], for a kept text (a render's output has room to grow, a
/// decode reserves 4 bytes an id).
pub(super) fn kept_text(mut text: String) -> Arc<String> {
    text.shrink_to_fit();
    Arc::new(text)
}

/// An `Arc`'s allocation besides its value: the two counts.
const ARC: usize = 2 * size_of::<usize>();

/// Estimated heap bytes of one call in the view: the call itself, what it
/// keeps of its ids, texts and segments (each in an `Arc` of its own), of its
/// messages and the message it served, and its slots in the trajectory's
/// lists.
pub(super) fn call_bytes(c: &HotCall) -> u64 {
    let vec = |bytes: usize| ARC + size_of::<Vec<u8>>() + bytes;
    let kept = c.kept();
    let ids = vec(kept.ids.capacity() * size_of::<u32>())
        + vec(c.sampled_ids.capacity() * size_of::<u32>());
    let texts = vec(kept.text.get().capacity()) + vec(c.sampled_text.capacity());
    let segs = vec(kept.segments.capacity() * size_of::<SegRange>());
    let messages = kept.messages.as_ref().map(|m| m.get()).map_or(0, |m| {
        vec(m.capacity() * size_of::<Json>()) + m.iter().map(json_heap_bytes).sum::<usize>()
    });
    // The `calls` slot, and the entries of `served` and `continued`
    // (hashbrown tables at up to 7/8 load, grown by doubling: about twice
    // an entry's size, its control byte included).
    let lists =
        size_of::<Arc<HotCall>>() + 2 * (size_of::<(u32, Served)>() + 1 + size_of::<u32>() + 1);
    (ARC + size_of::<HotCall>()
        + ids
        + texts
        + segs
        + messages
        + ARC
        + size_of::<Json>()
        + json_heap_bytes(&c.served)
        + lists) as u64
}

/// Estimated heap bytes of a trajectory in the view: its calls, its state
/// and its metadata, and its entry in this index: the key's text, the LRU's
/// node (the key, the entry and two links) and a slot of its hash table (a
/// key reference and a node pointer; about twice a slot's size, as above).
pub(super) fn trajectory_bytes(tid: &str, st: &TrajState) -> u64 {
    let metadata = &st.metadata;
    let metadata = metadata.group.as_ref().map_or(0, String::capacity)
        + metadata.data_source.as_ref().map_or(0, String::capacity)
        + metadata.extra_info.as_ref().map_or(0, json_heap_bytes);
    let node = size_of::<String>() + size_of::<Entry>() + 2 * size_of::<usize>();
    let slot = 2 * size_of::<usize>() + 1;
    let entry = tid.len() + node + 2 * slot;
    st.bytes + (ARC + size_of::<tokio::sync::Mutex<TrajState>>() + metadata + entry) as u64
}
