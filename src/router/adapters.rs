//! The LoRA adapters the fleet serves, by name: those of `[[model.adapters]]`
//! at start, then as `POST /admin/adapters` loads, replaces and unloads
//! them. A call on an adapter holds its [`AdapterUse`] (a read share of the
//! adapter's gate) from admission to its record; replacing or unloading an
//! adapter takes the gate whole, so it waits for the adapter's calls in
//! flight to finish and new ones wait for it (they then see the new weights,
//! or that the adapter is gone).
//!
//! Owns: adapter names, paths, versions and their gates. Must not: speak to
//! backends (the admin endpoint does, through the fleet).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::AdapterConfig;

/// One adapter: where it was loaded from and the label of its weights.
#[derive(Debug)]
pub struct Adapter {
    pub name: Arc<str>,
    state: Mutex<AdapterState>,
    gate: Arc<tokio::sync::RwLock<()>>,
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

/// A call's share of an adapter: held until the call is recorded.
#[derive(Debug, Clone)]
pub struct AdapterUse {
    pub name: Arc<str>,
    pub version: Option<String>,
    _share: Arc<tokio::sync::OwnedRwLockReadGuard<()>>,
}

/// The whole gate of an adapter, held by the admin operation changing it.
pub struct AdapterLock {
    pub adapter: Arc<Adapter>,
    _whole: tokio::sync::OwnedRwLockWriteGuard<()>,
}

#[derive(Debug, Default)]
pub struct Adapters {
    by_name: Mutex<BTreeMap<String, Arc<Adapter>>>,
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
            gate: Arc::new(tokio::sync::RwLock::new(())),
        })
    }

    fn lock(&self) -> MutexGuard<'_, AdapterState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn state(&self) -> AdapterState {
        self.lock().clone()
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
        let share = adapter.gate.clone().read_owned().await;
        let s = adapter.state();
        s.loaded.then(|| AdapterUse {
            name: adapter.name.clone(),
            version: s.version,
            _share: Arc::new(share),
        })
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
}
