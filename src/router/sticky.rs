//! The sticky map: trajectory id → the backend serving it, as a bounded LRU
//! with O(1) lookup, insert, touch and eviction, plus per-backend entry
//! counts and hit / miss / eviction counters.
//!
//! Owns: which backend a trajectory is pinned to. Must not: decide where a
//! new trajectory goes (policies do) or know about health.

use std::collections::HashMap;
use std::sync::Arc;

use super::BackendId;

const NIL: usize = usize::MAX;

/// Where a trajectory is pinned. The name is kept so a move away from a
/// backend that was removed can still say where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub id: BackendId,
    pub name: Arc<str>,
}

struct Node {
    key: Arc<str>,
    pin: Pin,
    prev: usize,
    next: usize,
}

/// Bounded LRU of trajectory pins. Not thread-safe by itself: the router
/// keeps it under its lock.
pub struct StickyMap {
    capacity: usize,
    index: HashMap<Arc<str>, usize>,
    nodes: Vec<Node>,
    free: Vec<usize>,
    /// Most recently used.
    head: usize,
    /// Least recently used: evicted first.
    tail: usize,
    per_backend: HashMap<BackendId, usize>,
    hits: u64,
    misses: u64,
    evictions: u64,
}

impl StickyMap {
    /// `capacity` is clamped to at least 1.
    pub fn new(capacity: usize) -> Self {
        StickyMap {
            capacity: capacity.max(1),
            index: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            per_backend: HashMap::new(),
            hits: 0,
            misses: 0,
            evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Looks a trajectory up, marks it most recently used, and counts a hit
    /// or a miss.
    pub fn lookup(&mut self, key: &str) -> Option<Pin> {
        match self.index.get(key).copied() {
            Some(i) => {
                self.hits += 1;
                self.unlink(i);
                self.push_front(i);
                Some(self.nodes[i].pin.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Looks a trajectory up without touching recency or counters.
    pub fn peek(&self, key: &str) -> Option<&Pin> {
        self.index.get(key).map(|&i| &self.nodes[i].pin)
    }

    /// Pins `key` to `pin` (most recently used). Returns the entry evicted to
    /// make room, if any.
    pub fn insert(&mut self, key: &str, pin: Pin) -> Option<(Arc<str>, Pin)> {
        if let Some(&i) = self.index.get(key) {
            let old = std::mem::replace(&mut self.nodes[i].pin, pin.clone());
            self.count(old.id, -1);
            self.count(pin.id, 1);
            self.unlink(i);
            self.push_front(i);
            return None;
        }
        let evicted = if self.index.len() >= self.capacity {
            self.pop_lru()
        } else {
            None
        };
        let key: Arc<str> = Arc::from(key);
        self.count(pin.id, 1);
        let node = Node {
            key: key.clone(),
            pin,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.index.insert(key, i);
        self.push_front(i);
        evicted
    }

    /// Unpins `key` (a finished trajectory). Its slot is reused by the next
    /// insert.
    pub fn remove(&mut self, key: &str) -> Option<Pin> {
        let i = self.index.remove(key)?;
        self.unlink(i);
        self.free.push(i);
        let pin = self.nodes[i].pin.clone();
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

    fn pop_lru(&mut self) -> Option<(Arc<str>, Pin)> {
        let i = self.tail;
        if i == NIL {
            return None;
        }
        self.unlink(i);
        let key = self.nodes[i].key.clone();
        self.index.remove(&key);
        self.free.push(i);
        let pin = self.nodes[i].pin.clone();
        self.count(pin.id, -1);
        self.evictions += 1;
        Some((key, pin))
    }

    fn count(&mut self, id: BackendId, delta: isize) {
        let n = self.per_backend.entry(id).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.per_backend.remove(&id);
        }
    }

    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        if prev == NIL {
            if self.head == i {
                self.head = next;
            }
        } else {
            self.nodes[prev].next = next;
        }
        if next == NIL {
            if self.tail == i {
                self.tail = prev;
            }
        } else {
            self.nodes[next].prev = prev;
        }
        self.nodes[i].prev = NIL;
        self.nodes[i].next = NIL;
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = NIL;
        self.nodes[i].next = self.head;
        if self.head != NIL {
            self.nodes[self.head].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
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
        // Freed slots are reused: storage never grows past the capacity.
        assert_eq!(m.nodes.len(), 100);
    }

    #[test]
    fn a_removed_pin_frees_its_slot_and_keeps_the_order() {
        let mut m = StickyMap::new(3);
        m.insert("a", pin(0));
        m.insert("b", pin(1));
        m.insert("c", pin(1));
        assert_eq!(m.remove("b"), Some(pin(1)));
        assert_eq!(m.remove("b"), None);
        assert_eq!((m.len(), m.count_for(BackendId(1))), (2, 1));
        // Room again without evicting; the new entry reuses b's slot.
        assert!(m.insert("d", pin(2)).is_none());
        assert_eq!(m.nodes.len(), 3);
        // "a" is still the least recently used.
        assert_eq!(m.insert("e", pin(2)).map(|e| e.0), Some(Arc::from("a")));
        assert_eq!(m.lookup("c"), Some(pin(1)));
    }
}
