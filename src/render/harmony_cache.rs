//! The rendered ids of single Harmony messages, by the message's JSON: the
//! crate renders a conversation message by message, so a later call of a
//! trajectory (whose fresh render repeats every earlier message) tokenizes
//! only the messages it has not rendered before. Bounded by the ids held;
//! the least recently used messages go first.

use std::sync::{Arc, Mutex};

use lru::LruCache;

/// Ids held at most (4 bytes each): 16 MiB.
const MAX_IDS: usize = 4 << 20;

pub(super) struct RenderCache {
    inner: Mutex<Inner>,
}

struct Inner {
    map: LruCache<String, Arc<[u32]>>,
    held: usize,
}

impl RenderCache {
    pub(super) fn new() -> Self {
        RenderCache {
            inner: Mutex::new(Inner {
                map: LruCache::unbounded(),
                held: 0,
            }),
        }
    }

    /// The ids cached for `key`, or `render`'s, then cached.
    pub(super) fn get_or_render<E>(
        &self,
        key: String,
        render: impl FnOnce() -> Result<Vec<u32>, E>,
    ) -> Result<Arc<[u32]>, E> {
        if let Some(ids) = self.lock().map.get(&key) {
            return Ok(ids.clone());
        }
        let ids: Arc<[u32]> = render()?.into();
        if ids.len() <= MAX_IDS / 4 {
            let mut inner = self.lock();
            inner.held += ids.len();
            if let Some(old) = inner.map.put(key, ids.clone()) {
                inner.held -= old.len();
            }
            while inner.held > MAX_IDS {
                match inner.map.pop_lru() {
                    Some((_, gone)) => inner.held -= gone.len(),
                    None => break,
                }
            }
        }
        Ok(ids)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a consistent map.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}
