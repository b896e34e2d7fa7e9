//! Sticky pins shared without the router lock: trajectory → backend in a
//! `DashMap` (sharded), with the LRU order and bound in one `LruCache` under
//! its own mutex. Membership of the pin map changes only under that mutex,
//! so it holds exactly the keys of the order and never more than the
//! capacity; lookups read a shard and then take the mutex to mark the entry
//! most recently used.
//!
//! Owns: the same state as [`super::sticky::StickyMap`], thread-safe.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use lru::LruCache;

use super::sticky::Pin;
use super::BackendId;

pub struct SharedPins {
    pins: DashMap<Arc<str>, Pin>,
    order: Mutex<LruCache<Arc<str>, ()>>,
    per_backend: DashMap<BackendId, usize>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
}

impl SharedPins {
    /// `capacity` is clamped to at least 1.
    pub fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        SharedPins {
            pins: DashMap::new(),
            order: Mutex::new(LruCache::sparse(capacity)),
            per_backend: DashMap::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn order(&self) -> MutexGuard<'_, LruCache<Arc<str>, ()>> {
        self.order.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn len(&self) -> usize {
        self.order().len()
    }

    pub fn is_empty(&self) -> bool {
        self.order().is_empty()
    }

    /// Looks a trajectory up, marks it most recently used, and counts a hit
    /// or a miss.
    pub fn lookup(&self, key: &str) -> Option<Pin> {
        let pin = self.pins.get(key).map(|p| p.clone());
        match &pin {
            Some(_) => {
                // False when it was evicted since the read: nothing to mark.
                self.order().promote(key);
                self.hits.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        pin
    }

    /// Looks a trajectory up without touching recency or counters.
    pub fn peek(&self, key: &str) -> Option<Pin> {
        self.pins.get(key).map(|p| p.clone())
    }

    /// Pins `key` to `pin` (most recently used). Returns the entry evicted to
    /// make room, if any.
    pub fn insert(&self, key: &str, pin: Pin) -> Option<(Arc<str>, Pin)> {
        let mut order = self.order();
        if order.promote(key) {
            let old = self
                .pins
                .get_mut(key)
                .map(|mut p| std::mem::replace(&mut *p, pin.clone()));
            if let Some(old) = old {
                self.count(old.id, -1);
                self.count(pin.id, 1);
            }
            return None;
        }
        let key: Arc<str> = Arc::from(key);
        // `key` is not in the order, so what `push` hands back is the evicted
        // least recently used entry.
        let evicted = order.push(key.clone(), ()).and_then(|(old, ())| {
            let (old, pin) = self.pins.remove(&old)?;
            self.count(pin.id, -1);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            Some((old, pin))
        });
        self.count(pin.id, 1);
        self.pins.insert(key, pin);
        evicted
    }

    /// Unpins `key` (a finished trajectory).
    pub fn remove(&self, key: &str) -> Option<Pin> {
        let mut order = self.order();
        order.pop(key)?;
        let (_, pin) = self.pins.remove(key)?;
        self.count(pin.id, -1);
        Some(pin)
    }

    /// Entries pinned to `id`.
    pub fn count_for(&self, id: BackendId) -> usize {
        self.per_backend.get(&id).map_or(0, |n| *n)
    }

    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Called with the order mutex held, so counts never race each other.
    fn count(&self, id: BackendId, delta: isize) {
        let zero = {
            let mut n = self.per_backend.entry(id).or_insert(0);
            *n = n.saturating_add_signed(delta);
            *n == 0
        };
        if zero {
            self.per_backend.remove_if(&id, |_, n| *n == 0);
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
    fn evicts_least_recently_used_and_stays_bounded_across_threads() {
        let m = SharedPins::new(2);
        m.insert("a", pin(0));
        m.insert("b", pin(1));
        assert_eq!(m.lookup("a"), Some(pin(0)));
        assert_eq!(m.insert("c", pin(1)).map(|e| e.0), Some(Arc::from("b")));
        assert_eq!((m.hits(), m.evictions()), (1, 1));

        let m = SharedPins::new(100);
        std::thread::scope(|s| {
            for t in 0..2u64 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..5_000u64 {
                        m.insert(&format!("t{t}-{i}"), pin(i % 3));
                        m.lookup(&format!("t{t}-{}", i / 2));
                    }
                });
            }
        });
        assert_eq!((m.len(), m.pins.len()), (100, 100));
        let total: usize = (0..3).map(|b| m.count_for(BackendId(b))).sum();
        assert_eq!(total, 100);
        assert_eq!(m.evictions(), 9_900);
    }
}
