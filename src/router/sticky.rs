//! The sticky map: trajectory id → the backend serving it, as a bounded LRU
//! (`lru::LruCache`: O(1) lookup, insert, touch and eviction), plus
//! per-backend entry counts and hit / miss / eviction counters.
//!
//! Owns: which backend a trajectory is pinned to. Must not: decide where a
//! new trajectory goes (policies do) or know about health.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

use super::BackendId;

/// Where a trajectory is pinned. The name is kept so a move away from a
/// backend that was removed can still say where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub id: BackendId,
    pub name: Arc<str>,
}

/// Bounded LRU of trajectory pins. Not thread-safe by itself: the router
/// keeps it under its lock.
pub struct StickyMap {
    /// One entry per pinned trajectory, most recently used first; never more
    /// than the capacity (a full insert evicts the least recently used).
    nodes: LruCache<Arc<str>, Pin>,
    per_backend: HashMap<BackendId, usize>,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl StickyMap {
    /// `capacity` is clamped to at least 1.
    pub fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        StickyMap {
            // Grows with use, like the map it holds; not allocated up front.
            nodes: LruCache::sparse(capacity),
            per_backend: HashMap::new(),
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Looks a trajectory up, marks it most recently used, and counts a hit
    /// or a miss.
    pub fn lookup(&mut self, key: &str) -> Option<Pin> {
        match self.nodes.get(key) {
            Some(pin) => {
                self.hits += 1;
                Some(pin.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Looks a trajectory up without touching recency or counters.
    pub fn peek(&self, key: &str) -> Option<&Pin> {
        self.nodes.peek(key)
    }

    /// Pins `key` to `pin` (most recently used). Returns the entry evicted to
    /// make room, if any.
    pub fn insert(&mut self, key: &str, pin: Pin) -> Option<(Arc<str>, Pin)> {
        if let Some(slot) = self.nodes.get_mut(key) {
            let old = std::mem::replace(slot, pin.clone());
            self.count(old.id, -1);
            self.count(pin.id, 1);
            return None;
        }
        self.count(pin.id, 1);
        // `key` is not in the map, so what `push` hands back is the evicted
        // least recently used entry.
        let evicted = self.nodes.push(Arc::from(key), pin);
        if let Some((_, old)) = &evicted {
            self.count(old.id, -1);
            self.evictions += 1;
        }
        evicted
    }

    /// Unpins `key` (a finished trajectory).
    pub fn remove(&mut self, key: &str) -> Option<Pin> {
        let pin = self.nodes.pop(key)?;
        self.count(pin.id, -1);
        Some(pin)
    }

    /// Entries pinned to `id`.
    pub fn count_for(&self, id: BackendId) -> usize {
        self.per_backend.get(&id).copied().unwrap_or(0)
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn count(&mut self, id: BackendId, delta: isize) {
        let n = self.per_backend.entry(id).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.per_backend.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(id: u64) -> Pin {
        Pin {
            id: BackendId(id),
            name: Arc::from(format!("b{id}")),
        }
    }

    #[test]
    fn evicts_least_recently_used_and_counts() {
        let mut m = StickyMap::new(2);
        assert!(m.insert("a", pin(0)).is_none());
        assert!(m.insert("b", pin(1)).is_none());
        assert_eq!(m.lookup("a"), Some(pin(0))); // a is now most recent
        let ev = m.insert("c", pin(1));
        assert_eq!(ev, Some((Arc::from("b"), pin(1))));
        assert_eq!(m.lookup("b"), None);
        assert_eq!((m.hits(), m.misses(), m.evictions()), (1, 1, 1));
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m.count_for(BackendId(0)), m.count_for(BackendId(1))),
            (1, 1)
        );
    }

    #[test]
    fn reinsert_moves_pin_without_eviction() {
        let mut m = StickyMap::new(2);
        m.insert("a", pin(0));
        m.insert("b", pin(0));
        assert!(m.insert("a", pin(1)).is_none());
        assert_eq!(m.peek("a"), Some(&pin(1)));
        assert_eq!(
            (m.count_for(BackendId(0)), m.count_for(BackendId(1))),
            (1, 1)
        );
        // "b" is now least recent.
        let ev = m.insert("c", pin(2));
        assert_eq!(ev.map(|e| e.0), Some(Arc::from("b")));
        assert_eq!(m.count_for(BackendId(0)), 0);
    }

    #[test]
    fn many_inserts_stay_bounded_and_consistent() {
        let mut m = StickyMap::new(100);
        for i in 0..10_000u64 {
            m.insert(&format!("t{i}"), pin(i % 3));
            if i % 7 == 0 {
                m.lookup(&format!("t{}", i / 2));
            }
        }
        assert_eq!(m.len(), 100);
        assert_eq!(m.evictions(), 9_900);
        let total: usize = (0..3).map(|b| m.count_for(BackendId(b))).sum();
        assert_eq!(total, 100);
        // Late lookups (of t{i/2}) all miss, so the newest 100 keys survive.
        assert!((9_900..10_000).all(|i| m.peek(&format!("t{i}")).is_some()));
        assert!(m.peek("t9899").is_none());
        // The cache never holds more entries than the capacity.
        assert_eq!(m.nodes.len(), 100);
    }

    #[test]
    fn a_removed_pin_frees_room_and_keeps_the_order() {
        let mut m = StickyMap::new(3);
        m.insert("a", pin(0));
        m.insert("b", pin(1));
        m.insert("c", pin(1));
        assert_eq!(m.remove("b"), Some(pin(1)));
        assert_eq!(m.remove("b"), None);
        assert_eq!((m.len(), m.count_for(BackendId(1))), (2, 1));
        // Room again: the next insert evicts nothing.
        assert!(m.insert("d", pin(2)).is_none());
        assert_eq!(m.nodes.len(), 3);
        // "a" is still the least recently used.
        assert_eq!(m.insert("e", pin(2)).map(|e| e.0), Some(Arc::from("a")));
        assert_eq!(m.lookup("c"), Some(pin(1)));
    }
}
