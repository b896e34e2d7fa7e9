//! The LoRA adapters the fleet serves, by name: those of `[[model.adapters]]`
//! at start, then as `POST /admin/adapters` loads, replaces and unloads
//! them. A call on an adapter holds its [`AdapterUse`] (a read share of the
//! adapter's gate) from admission to its record; replacing or unloading an
//! adapter takes the gate whole, so it waits for the adapter's calls in
//! flight to finish and new ones wait for it (they then see the new weights,
//! or that the adapter is gone).
//!
//! A change in `abort` mode first marks the adapter aborted
//! ([`Adapters::abort`]): each running call on it sees the mark, stops its
//! generations and gives its share back ([`AdapterUse::release`]), so the
//! gate is taken at once; the call then waits for the change to settle
//! ([`AdapterUse::renew`]) and goes on from what it sampled. Shares asked
//! for while a change is unsettled wait for it too.
//!
//! Owns: adapter names, paths, versions, their gates and abort marks.
//! Must not: speak to backends (the admin endpoint does, through the fleet).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

use crate::config::AdapterConfig;

/// One adapter: where it was loaded from and the label of its weights.
#[derive(Debug)]
pub struct Adapter {
    pub name: Arc<str>,
    state: Mutex<AdapterState>,
    gate: Arc<RwLock<()>>,
    /// Changes in `abort` mode begun on it, and the highest of them that
    /// has settled (succeeded, failed or timed out).
    aborts: AtomicU64,
    settled: AtomicU64,
    /// Woken when `aborts` grows, and when `settled` does.
    aborted: Notify,
    settled_notify: Notify,
}

#[derive(Debug, Clone)]
pub struct AdapterState {
    pub path: String,
    /// The label of its weights (`POST /admin/adapters` `version`); `None`
    /// for an adapter of the config that was not loaded since.
    pub version: Option<String>,
    /// False once unloaded: calls that waited at its gate are refused.
    pub loaded: bool,
}

/// A call's share of an adapter: held until the call is recorded, or
/// given back while a change in `abort` mode runs. Clones are one share.
#[derive(Debug, Clone)]
pub struct AdapterUse {
    pub name: Arc<str>,
    /// The label of the adapter's weights when the call was admitted.
    pub version: Option<String>,
    held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    adapter: Arc<Adapter>,
    /// The adapter's abort count when the share was taken.
    at: u64,
    share: Mutex<Option<OwnedRwLockReadGuard<()>>>,
}

/// The whole gate of an adapter, held by the admin operation changing it.
pub struct AdapterLock {
    pub adapter: Arc<Adapter>,
    _whole: OwnedRwLockWriteGuard<()>,
}

/// A change in `abort` mode, begun: settles when dropped.
pub struct AbortMark {
    adapter: Arc<Adapter>,
    n: u64,
}

#[derive(Debug, Default)]
pub struct Adapters {
    by_name: Mutex<BTreeMap<String, Arc<Adapter>>>,
}

/// Returns once `done` holds, woken by `notify`.
async fn until(notify: &Notify, done: impl Fn() -> bool) {
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        // Registered before the check, so a change in between still wakes
        // this waiter.
        notified.as_mut().enable();
        if done() {
            return;
        }
        notified.await;
    }
}

impl Adapter {
    fn new(name: &str, path: &str, version: Option<String>, loaded: bool) -> Arc<Adapter> {
        Arc::new(Adapter {
            name: Arc::from(name),
            state: Mutex::new(AdapterState {
                path: path.to_string(),
                version,
                loaded,
            }),
            gate: Arc::new(RwLock::new(())),
            aborts: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            aborted: Notify::new(),
            settled_notify: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, AdapterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> AdapterState {
        self.lock().clone()
    }

    /// Waits until every change in `abort` mode up to the `n`-th settled.
    async fn settled_past(&self, n: u64) {
        until(&self.settled_notify, || {
            self.settled.load(Ordering::SeqCst) >= n
        })
        .await;
    }
}

impl AdapterUse {
    /// How many changes in `abort` mode were begun on the adapter so far.
    pub fn aborts(&self) -> u64 {
        self.held.adapter.aborts.load(Ordering::SeqCst)
    }

    /// The abort count when the share was taken: a call that sees
    /// [`AdapterUse::aborts`] move past it was aborted.
    pub fn admitted_at(&self) -> u64 {
        self.held.at
    }

    /// Returns once [`AdapterUse::aborts`] differs from `seen`.
    pub async fn aborted_since(&self, seen: u64) {
        until(&self.held.adapter.aborted, || self.aborts() != seen).await;
    }

    fn share(&self) -> MutexGuard<'_, Option<OwnedRwLockReadGuard<()>>> {
        self.held.share.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the share back, for every clone: the change can take the gate.
    pub fn release(&self) {
        drop(self.share().take());
    }

    /// Takes the share again after [`AdapterUse::release`], once the
    /// changes in `abort` mode up to the `seen`-th settled; a share still
    /// held is kept. False when the adapter is no longer loaded.
    pub async fn renew(&self, seen: u64) -> bool {
        let adapter = &self.held.adapter;
        if self.share().is_none() {
            adapter.settled_past(seen).await;
            let share = adapter.gate.clone().read_owned().await;
            let mut held = self.share();
            if held.is_none() {
                *held = Some(share);
            }
        }
        adapter.lock().loaded
    }
}

impl AdapterLock {
    /// Records what the operation did: the adapter's new path and version,
    /// or that it is no longer loaded.
    pub fn set(&self, path: &str, version: Option<String>, loaded: bool) {
        let mut s = self.adapter.lock();
        s.path = path.to_string();
        s.version = version;
        s.loaded = loaded;
    }
}

impl Drop for AbortMark {
    fn drop(&mut self) {
        self.adapter.settled.fetch_max(self.n, Ordering::SeqCst);
        self.adapter.settled_notify.notify_waiters();
    }
}

impl Adapters {
    pub fn from_config(adapters: &[AdapterConfig]) -> Adapters {
        let by_name = adapters
            .iter()
            .map(|a| (a.name.clone(), Adapter::new(&a.name, &a.path, None, true)))
            .collect();
        Adapters {
            by_name: Mutex::new(by_name),
        }
    }

    fn map(&self) -> MutexGuard<'_, BTreeMap<String, Arc<Adapter>>> {
        self.by_name.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The loaded adapters' names, in order.
    pub fn names(&self) -> Vec<String> {
        self.map()
            .values()
            .filter(|a| a.lock().loaded)
            .map(|a| a.name.to_string())
            .collect()
    }

    /// Whether `name` is a loaded adapter.
    pub fn is_loaded(&self, name: &str) -> bool {
        self.map().get(name).is_some_and(|a| a.lock().loaded)
    }

    /// Every adapter the gateway knows of, loaded or not.
    pub fn all(&self) -> Vec<Arc<Adapter>> {
        self.map().values().cloned().collect()
    }

    /// A share of adapter `name` for one call, waiting while an operation
    /// changes it; `None` when there is no such loaded adapter.
    pub async fn share(&self, name: &str) -> Option<AdapterUse> {
        let adapter = self.map().get(name).cloned()?;
        // Read before waiting: an abort begun after this point aborts the
        // call, one begun before is waited for.
        let at = adapter.aborts.load(Ordering::SeqCst);
        adapter.settled_past(at).await;
        let share = adapter.gate.clone().read_owned().await;
        let s = adapter.state();
        s.loaded.then(|| AdapterUse {
            name: adapter.name.clone(),
            version: s.version,
            held: Arc::new(Held {
                adapter: adapter.clone(),
                at,
                share: Mutex::new(Some(share)),
            }),
        })
    }

    /// Begins a change in `abort` mode on adapter `name`: its running calls
    /// stop and give their shares back; they and new calls wait until the
    /// returned mark is dropped. `None` for an adapter not known yet.
    pub fn abort(&self, name: &str) -> Option<AbortMark> {
        let adapter = self.map().get(name).cloned()?;
        let n = adapter.aborts.fetch_add(1, Ordering::SeqCst) + 1;
        adapter.aborted.notify_waiters();
        Some(AbortMark { adapter, n })
    }

    /// The whole gate of adapter `name` (made, not loaded, when new): waits
    /// until its calls in flight are recorded; new calls wait for the lock.
    pub async fn lock(&self, name: &str, path: &str) -> AdapterLock {
        let adapter = self
            .map()
            .entry(name.to_string())
            .or_insert_with(|| Adapter::new(name, path, None, false))
            .clone();
        let whole = adapter.gate.clone().write_owned().await;
        AdapterLock {
            adapter,
            _whole: whole,
        }
    }

    /// Forgets an adapter that is not loaded (an unload, or a failed first
    /// load), so it is no longer listed.
    pub fn forget_unloaded(&self, name: &str) {
        let mut map = self.map();
        if map.get(name).is_some_and(|a| !a.lock().loaded) {
            map.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config() -> Vec<AdapterConfig> {
        vec![AdapterConfig {
            name: "coder".into(),
            path: "/a".into(),
        }]
    }

    #[tokio::test]
    async fn a_call_holds_its_share_until_it_is_dropped() {
        let adapters = Arc::new(Adapters::from_config(&config()));
        assert_eq!(adapters.names(), ["coder"]);
        assert!(adapters.share("other").await.is_none());
        let share = adapters.share("coder").await.unwrap();
        let locked = Arc::new(tokio::sync::Notify::new());
        let task = {
            let (adapters, locked) = (adapters.clone(), locked.clone());
            tokio::spawn(async move {
                let lock = adapters.lock("coder", "/b").await;
                lock.set("/b", Some("v2".into()), true);
                locked.notify_one();
            })
        };
        // The operation cannot take the gate while the call holds a share.
        tokio::task::yield_now().await;
        assert!(!task.is_finished());
        drop(share);
        locked.notified().await;
        task.await.unwrap();
        let share = adapters.share("coder").await.unwrap();
        assert_eq!(share.version.as_deref(), Some("v2"));
    }

    #[tokio::test]
    async fn an_unloaded_adapter_refuses_shares_and_is_forgotten() {
        let adapters = Adapters::from_config(&config());
        let lock = adapters.lock("coder", "/a").await;
        lock.set("/a", None, false);
        drop(lock);
        assert!(adapters.share("coder").await.is_none());
        adapters.forget_unloaded("coder");
        assert!(adapters.all().is_empty());
        // A new name is made unloaded, and listed once loaded.
        let lock = adapters.lock("new", "/n").await;
        assert!(adapters.names().is_empty());
        lock.set("/n", Some("v1".into()), true);
        drop(lock);
        assert_eq!(adapters.names(), ["new"]);
    }

    #[tokio::test]
    async fn an_abort_takes_the_gate_once_its_calls_give_their_shares_back() {
        let adapters = Arc::new(Adapters::from_config(&config()));
        let call = adapters.share("coder").await.unwrap();
        let seen = call.admitted_at();
        assert!(adapters.abort("unknown").is_none());
        let mark = adapters.abort("coder").unwrap();
        // The running call sees the abort and gives its share back.
        call.aborted_since(seen).await;
        let seen = call.aborts();
        call.release();
        let lock = adapters.lock("coder", "/b").await;
        // Neither the aborted call nor a new one gets a share until the
        // change settles.
        let renewed = {
            let call = call.clone();
            tokio::spawn(async move { call.renew(seen).await })
        };
        let fresh = {
            let adapters = adapters.clone();
            tokio::spawn(async move { adapters.share("coder").await.map(|u| u.version) })
        };
        tokio::task::yield_now().await;
        assert!(!renewed.is_finished() && !fresh.is_finished());
        lock.set("/b", Some("v2".into()), true);
        drop(lock);
        drop(mark);
        assert!(renewed.await.unwrap(), "still loaded");
        assert_eq!(fresh.await.unwrap().flatten().as_deref(), Some("v2"));
        // A renewed share is held: the next change waits for it.
        let next = {
            let adapters = adapters.clone();
            tokio::spawn(async move { drop(adapters.lock("coder", "/c").await) })
        };
        tokio::task::yield_now().await;
        assert!(!next.is_finished());
        drop(call);
        next.await.unwrap();
    }

    #[tokio::test]
    async fn a_call_renewing_after_an_unload_is_told_the_adapter_is_gone() {
        let adapters = Adapters::from_config(&config());
        let call = adapters.share("coder").await.unwrap();
        let mark = adapters.abort("coder").unwrap();
        let seen = call.aborts();
        call.release();
        let lock = adapters.lock("coder", "/a").await;
        lock.set("/a", None, false);
        drop(lock);
        drop(mark);
        assert!(!call.renew(seen).await);
    }
}
