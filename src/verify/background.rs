//! The sampled mode: with `[verify] fraction > 0`, that share of finished
//! trajectories is checked in the background after
//! `POST /v1/trajectories/{id}/finish`.
//!
//! Which ones is decided by the id alone: a trajectory is checked when the
//! first 8 bytes of SHA-256(id), read as a fraction of 2^64, fall below
//! `fraction`. The choice is the same on every replica and after restarts,
//! and an id finished twice is not checked twice (a trajectory that already
//! carries replay results is skipped). The check runs in its own task, at
//! most [`MAX_RUNNING`] at once (later ones wait their turn); its failure is
//! logged and counted (`tito_replay_check_failures_total{source="background"}`)
//! and never touches the finish response, which has already been sent.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use super::{verify_loaded, Options, Report, Scope, VerifyError};
use crate::router::Router;
use crate::store::DynStore;

/// Background checks running at once.
pub const MAX_RUNNING: usize = 4;

/// Called with a trajectory id once it is finished.
pub type FinishHook = Arc<dyn Fn(&str) + Send + Sync>;

/// True when trajectory `id` falls in the sampled `fraction` (0..=1).
pub fn is_sampled(id: &str, fraction: f64) -> bool {
    if fraction <= 0.0 {
        return false;
    }
    if fraction >= 1.0 {
        return true;
    }
    let digest = Sha256::digest(id.as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    let x = u64::from_be_bytes(head) as f64 / 18_446_744_073_709_551_616.0;
    x < fraction
}

/// The finish hook of one served model of a gateway: `inner`, then the
/// background check that `[verify] fraction` asks for (`inner` alone when
/// it is 0) of the trajectory's calls of that model (`model`, on `router`;
/// `primary`: the gateway's first model, which also checks calls recorded
/// without a policy).
pub fn finish_hook(
    inner: FinishHook,
    cfg: &crate::config::VerifyConfig,
    served: (Arc<str>, Arc<Router>, bool),
    store: DynStore,
    max_len: usize,
) -> FinishHook {
    let opts = Options::from_config(cfg, Some(max_len));
    Background::new(served, store, opts, cfg.fraction).hook(inner)
}

/// The background checker of one gateway.
pub struct Background {
    model: Arc<str>,
    router: Arc<Router>,
    primary: bool,
    store: DynStore,
    opts: Options,
    fraction: f64,
    running: Semaphore,
}

impl Background {
    /// The checker of `served`: a model's name, its router, and whether it
    /// is the gateway's first model.
    pub fn new(
        served: (Arc<str>, Arc<Router>, bool),
        store: DynStore,
        opts: Options,
        fraction: f64,
    ) -> Arc<Self> {
        let (model, router, primary) = served;
        Arc::new(Background {
            model,
            router,
            primary,
            store,
            opts,
            fraction,
            running: Semaphore::new(MAX_RUNNING),
        })
    }

    /// `inner` followed by a background check of the sampled share; `inner`
    /// itself when the fraction is 0.
    pub fn hook(self: &Arc<Self>, inner: FinishHook) -> FinishHook {
        if self.fraction <= 0.0 {
            return inner;
        }
        let this = self.clone();
        Arc::new(move |id: &str| {
            inner(id);
            this.on_finish(id);
        })
    }

    /// Spawns the check of `id` when it is in the sampled share.
    pub fn on_finish(self: &Arc<Self>, id: &str) {
        if !is_sampled(id, self.fraction) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(trajectory = id, "no async runtime: replay check skipped");
            return;
        };
        let this = self.clone();
        let id = id.to_string();
        rt.spawn(async move {
            match this.check(&id).await {
                Ok(Some(report)) => log_report(&report),
                Ok(None) => {}
                Err(e) => {
                    crate::metrics::replay_failure("background");
                    tracing::warn!(trajectory = %id, error = %e, "background replay check failed");
                }
            }
        });
    }

    /// Checks `id` now (waiting for a free slot) unless it is gone or was
    /// checked before; `None` then.
    pub async fn check(&self, id: &str) -> Result<Option<Report>, VerifyError> {
        let Ok(_slot) = self.running.acquire().await else {
            return Ok(None);
        };
        let Some(traj) = self.store.get_trajectory(id).await? else {
            return Ok(None);
        };
        // A trajectory with images cannot be replayed (VerifyError::Images):
        // the sampled share skips it.
        let mine = |m: &Option<String>| match m {
            Some(m) => **m == *self.model,
            None => self.primary,
        };
        if traj.replays.iter().any(|r| mine(&r.model))
            || traj.calls.iter().any(|c| !c.images.is_empty())
        {
            return Ok(None);
        }
        let scope = Scope {
            served: vec![(&*self.model, &*self.router)],
            primary: self.primary,
            whole: false,
        };
        let report = verify_loaded(&scope, &self.store, traj, &self.opts).await?;
        Ok((!report.samples.is_empty()).then_some(report))
    }
}

fn log_report(r: &Report) {
    for s in &r.samples {
        let p = &s.replay;
        tracing::info!(
            trajectory = %r.trajectory_id,
            sample = p.sample,
            backend = %p.backend,
            compared = p.compared,
            max_abs_diff = p.max_abs_diff,
            mean_abs_diff = p.mean_abs_diff,
            above_threshold = s.above_threshold,
            argmax_mismatch_share = p.argmax_mismatch_share,
            "replay check"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_is_deterministic_and_near_the_fraction() {
        let ids: Vec<String> = (0..10_000).map(|i| format!("traj-{i:016x}")).collect();
        let picked = ids.iter().filter(|id| is_sampled(id, 0.1)).count();
        assert!((800..1200).contains(&picked), "{picked} of 10000 at 0.1");
        for id in &ids[..100] {
            assert_eq!(is_sampled(id, 0.1), is_sampled(id, 0.1));
            // A larger fraction keeps every id a smaller one picked.
            assert!(!is_sampled(id, 0.1) || is_sampled(id, 0.5));
        }
        assert!(!ids.iter().any(|id| is_sampled(id, 0.0)));
        assert!(ids.iter().all(|id| is_sampled(id, 1.0)));
    }
}
