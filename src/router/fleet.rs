//! Operations on the whole fleet: an admin operation sent to every backend
//! at once, each with its own deadline, and the weight version each backend
//! serves.
//!
//! A backend's weight version is what its calls are tagged with, so a
//! weight update that reached only part of the fleet still tags every call
//! with the weights that produced it. A backend whose update failed or did
//! not answer in time serves weights nobody can name: it takes no calls until
//! a later update succeeds on it (or it is removed).
//!
//! Owns: the per-backend outcome of admin operations and the weight state.
//! Must not: pause or resume admission (the admin routes decide that).

use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use serde::Serialize;

use super::{Router, Slot};
use crate::backend::AdminOp;

/// One backend's weights.
#[derive(Debug, Clone, Default)]
pub(crate) struct Weights {
    /// The version it serves; `None` = the weights it started with.
    pub version: Option<Arc<str>>,
    /// That version's fleet sequence number, once the store gave it one.
    pub seq: Option<u64>,
    /// Set when its last weight update failed: why.
    pub failed: Option<String>,
}

impl Weights {
    pub(crate) fn serving(version: Option<Arc<str>>) -> Self {
        Weights {
            version,
            seq: None,
            failed: None,
        }
    }
}

impl Slot {
    pub(crate) fn weights(&self) -> MutexGuard<'_, Weights> {
        self.weights.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How one backend answered an admin operation.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum AdminOutcome {
    /// It answered with success; its answer's text.
    Done { response: String },
    /// It answered with an error, or could not be reached.
    Failed { error: String },
    /// No answer within the deadline; its state is unknown.
    TimedOut { after_s: f64 },
}

/// One backend's result of a fan-out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdminResult {
    pub backend: String,
    pub ok: bool,
    #[serde(flatten)]
    pub outcome: AdminOutcome,
    /// Its state afterwards, in words (`asleep`, `awake`, `serving weights
    /// v3`, `out of rotation: …`).
    pub state: String,
}

impl Router {
    /// Sends `op` to every backend concurrently, waiting at most `deadline`
    /// for each, and reports each result by backend name in id order.
    ///
    /// Effects on each backend's state: a successful `Sleep` marks it asleep
    /// (not probed, takes no calls) and a successful `WakeUp` awake; an
    /// `UpdateWeights` or `FinishWeightUpdate` that succeeds tags it with
    /// its version, and one that fails or times out takes it out of rotation
    /// until a later update succeeds. A timed-out `Sleep` or `WakeUp`
    /// leaves the flag as it was.
    pub async fn broadcast_admin(&self, op: &AdminOp, deadline: Duration) -> Vec<AdminResult> {
        let version: Option<Arc<str>> = op.new_version().map(Arc::from);
        let slots = self.slots();
        let calls = slots.iter().map(|slot| {
            let version = version.clone();
            async move {
                let outcome = match tokio::time::timeout(deadline, slot.backend.admin(op)).await {
                    Ok(Ok(response)) => AdminOutcome::Done { response },
                    Ok(Err(e)) => AdminOutcome::Failed {
                        error: e.to_string(),
                    },
                    Err(_) => AdminOutcome::TimedOut {
                        after_s: deadline.as_secs_f64(),
                    },
                };
                apply(slot, op, version, &outcome);
                let state = state_of(slot, op, &outcome);
                if !matches!(outcome, AdminOutcome::Done { .. }) {
                    tracing::error!(backend = %slot.name, op = op.name(), ?outcome, %state,
                        "admin operation failed on a backend");
                }
                AdminResult {
                    backend: slot.name.to_string(),
                    ok: matches!(outcome, AdminOutcome::Done { .. }),
                    outcome,
                    state,
                }
            }
        });
        futures::future::join_all(calls).await
    }

    /// The backends asleep now that would lose new weights loaded before
    /// their wake-up ([`Backend::reloads_while_asleep`]).
    ///
    /// [`Backend::reloads_while_asleep`]: crate::backend::Backend::reloads_while_asleep
    pub fn asleep_without_reload(&self) -> Vec<String> {
        self.slots()
            .iter()
            .filter(|s| s.is_sleeping() && !s.backend.reloads_while_asleep())
            .map(|s| s.name.to_string())
            .collect()
    }

    /// The fleet's weight version (`None`: the initial weights).
    pub fn weight_version(&self) -> Option<String> {
        self.lock().weight_version.as_deref().map(str::to_string)
    }

    /// Sets the fleet's weight version and tags every backend that is not
    /// out of rotation with it: for a version restored at start-up, or one
    /// announced without a reload (the trainer updated the weights itself).
    pub fn set_weight_version(&self, version: &str, seq: Option<u64>) {
        let v: Arc<str> = Arc::from(version);
        let mut g = self.lock();
        g.weight_version = Some(v.clone());
        g.weight_seq = seq;
        if let Some(n) = seq {
            g.labels.insert(v.clone(), n);
        }
        for slot in &g.slots {
            let mut w = slot.weights();
            if w.failed.is_none() {
                w.version = Some(v.clone());
                w.seq = seq;
            }
        }
    }

    /// Sets the fleet's version after an update every backend took, and
    /// the sequence number of each backend that serves it.
    pub(crate) fn set_fleet_version(&self, version: &str, seq: Option<u64>) {
        let mut g = self.lock();
        g.weight_version = Some(Arc::from(version));
        g.weight_seq = seq;
        if let Some(n) = seq {
            g.labels.insert(Arc::from(version), n);
        }
        for slot in &g.slots {
            let mut w = slot.weights();
            if w.version.as_deref() == Some(version) {
                w.seq = seq;
            }
        }
    }

    /// The sequence number of version `label`, when the fleet served it.
    pub fn seq_of(&self, label: &str) -> Option<u64> {
        self.lock().labels.get(label).copied()
    }

    /// The fleet version's sequence number, when known.
    pub fn weight_seq(&self) -> Option<u64> {
        self.lock().weight_seq
    }
}

fn apply(slot: &Slot, op: &AdminOp, version: Option<Arc<str>>, outcome: &AdminOutcome) {
    let done = matches!(outcome, AdminOutcome::Done { .. });
    match op {
        AdminOp::KeepCheck => {
            let answer = match outcome {
                AdminOutcome::Done { .. } => Ok(()),
                AdminOutcome::Failed { error } => Err(error.clone()),
                AdminOutcome::TimedOut { after_s } => Err(format!("no answer within {after_s} s")),
            };
            *slot.keep.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
        }
        AdminOp::Sleep { .. } if done => slot.sleeping.store(true, Ordering::Relaxed),
        AdminOp::WakeUp if done => slot.sleeping.store(false, Ordering::Relaxed),
        AdminOp::UpdateWeights { .. } | AdminOp::FinishWeightUpdate { .. } => {
            let mut w = slot.weights();
            match outcome {
                AdminOutcome::Done { .. } => {
                    // Its number comes with the fleet's, once registered.
                    if w.version != version {
                        w.seq = None;
                    }
                    w.version = version;
                    w.failed = None;
                }
                AdminOutcome::Failed { error } => {
                    w.failed = Some(format!("weight update failed: {error}"));
                }
                AdminOutcome::TimedOut { after_s } => {
                    w.failed = Some(format!("weight update did not answer within {after_s} s"));
                }
            }
        }
        _ => {}
    }
}

fn state_of(slot: &Slot, op: &AdminOp, outcome: &AdminOutcome) -> String {
    let w = slot.weights();
    if let Some(why) = &w.failed {
        return format!("out of rotation ({why})");
    }
    match op {
        AdminOp::Sleep { .. } | AdminOp::WakeUp => {
            if let AdminOutcome::TimedOut { .. } = outcome {
                let flag = if slot.is_sleeping() {
                    "asleep"
                } else {
                    "awake"
                };
                format!("unknown: no answer (still routed as {flag})")
            } else if slot.is_sleeping() {
                "asleep".into()
            } else {
                "awake".into()
            }
        }
        _ => match &w.version {
            Some(v) => format!("serving weights {v}"),
            None => "serving its initial weights".into(),
        },
    }
}
