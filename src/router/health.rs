//! Backend health: a per-backend circuit breaker fed by passive results
//! (calls that failed or succeeded) and active probes (`Backend::health`
//! every `health_interval_ms` from a background task).
//!
//! Circuit: `closed` (serving) → `open` after `failure_threshold` consecutive
//! failures (taken out of routing) → `half_open` after a successful probe
//! (serving again, on probation) → `closed` after one more success (probe or
//! call); any failure while `half_open` opens it again.
//!
//! Owns: the state machine and the probe loop. Must not: pick backends or
//! touch the sticky map.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::Serialize;

use super::Router;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug)]
struct Inner {
    state: CircuitState,
    consecutive_failures: u32,
    last_error: Option<String>,
}

/// One backend's circuit breaker.
#[derive(Debug)]
pub struct Health {
    threshold: u32,
    inner: Mutex<Inner>,
    /// Times this circuit opened.
    opened: AtomicU64,
}

/// A state change, returned so the caller can log it.
pub type Transition = Option<(CircuitState, CircuitState)>;

impl Health {
    pub fn new(failure_threshold: u32) -> Self {
        Health {
            threshold: failure_threshold.max(1),
            inner: Mutex::new(Inner {
                state: CircuitState::Closed,
                consecutive_failures: 0,
                last_error: None,
            }),
            opened: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> CircuitState {
        self.lock().state
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.lock().consecutive_failures
    }

    pub fn last_error(&self) -> Option<String> {
        self.lock().last_error.clone()
    }

    /// How many times the circuit has opened.
    pub fn times_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// A call on this backend succeeded (its stream ended with a finish), or a
    /// probe did.
    pub fn on_success(&self) -> Transition {
        let mut g = self.lock();
        g.consecutive_failures = 0;
        match g.state {
            // Calls routed before the circuit opened may still finish; only
            // probes bring an open backend back.
            CircuitState::Open | CircuitState::Closed => None,
            CircuitState::HalfOpen => {
                g.state = CircuitState::Closed;
                Some((CircuitState::HalfOpen, CircuitState::Closed))
            }
        }
    }

    /// A call on this backend failed (before or after its first token), or a
    /// probe did.
    pub fn on_failure(&self, error: Option<&str>) -> Transition {
        let mut g = self.lock();
        g.consecutive_failures = g.consecutive_failures.saturating_add(1);
        if let Some(e) = error {
            g.last_error = Some(e.to_string());
        }
        let from = g.state;
        let open = match from {
            CircuitState::Closed => g.consecutive_failures >= self.threshold,
            CircuitState::HalfOpen => true,
            CircuitState::Open => false,
        };
        if open {
            g.state = CircuitState::Open;
            self.opened.fetch_add(1, Ordering::Relaxed);
            Some((from, CircuitState::Open))
        } else {
            None
        }
    }

    /// An active probe succeeded. It does not reset the failure count of a
    /// closed circuit: a backend whose `/health` answers while its calls fail
    /// must still open.
    pub fn on_probe_ok(&self) -> Transition {
        let mut g = self.lock();
        let from = g.state;
        let to = match from {
            CircuitState::Closed => return None,
            CircuitState::Open => CircuitState::HalfOpen,
            CircuitState::HalfOpen => CircuitState::Closed,
        };
        g.state = to;
        g.consecutive_failures = 0;
        g.last_error = None;
        Some((from, to))
    }
}

/// The background probe task; dropping it (or the router) stops the loop.
pub struct HealthTask {
    handle: Option<tokio::task::JoinHandle<()>>,
}

impl HealthTask {
    /// Stops the loop and waits until it has stopped.
    pub async fn stop(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.abort();
            let _ = handle.await;
        }
    }
}

impl Drop for HealthTask {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

impl Router {
    /// Starts probing every backend every `health_interval_ms`. The task
    /// holds only a weak reference: it ends when the router is dropped, or
    /// when the returned guard is dropped or stopped.
    pub fn start_health_checks(self: &Arc<Self>) -> HealthTask {
        let weak: Weak<Router> = Arc::downgrade(self);
        let interval = self.health_interval();
        let handle = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is immediate: skip it
            loop {
                tick.tick().await;
                let Some(router) = weak.upgrade() else { break };
                router.probe_once().await;
            }
        });
        HealthTask {
            handle: Some(handle),
        }
    }

    /// Probes every backend once, concurrently, and applies the results.
    /// Backends put to sleep through `broadcast_admin` are not probed.
    /// Returns how many probes succeeded.
    pub async fn probe_once(&self) -> usize {
        let slots = self.slots();
        let timeout = self.probe_timeout();
        let probes = slots
            .iter()
            .filter(|s| !s.is_sleeping())
            .map(|slot| async move {
                let result = match tokio::time::timeout(timeout, slot.backend.health()).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("health probe timed out after {timeout:?}")),
                };
                let transition = match &result {
                    Ok(()) => slot.health.on_probe_ok(),
                    Err(e) => slot.health.on_failure(Some(e)),
                };
                log_transition(
                    &slot.name,
                    transition,
                    result.as_ref().err().map(String::as_str),
                );
                result.is_ok()
            });
        futures::future::join_all(probes)
            .await
            .into_iter()
            .filter(|ok| *ok)
            .count()
    }

    fn probe_timeout(&self) -> Duration {
        self.health_interval().max(Duration::from_millis(500))
    }
}

pub(crate) fn log_transition(backend: &str, t: Transition, error: Option<&str>) {
    if let Some((from, to)) = t {
        if to == CircuitState::Open {
            tracing::warn!(
                backend,
                from = from.as_str(),
                to = to.as_str(),
                error,
                "backend circuit opened"
            );
        } else {
            tracing::info!(
                backend,
                from = from.as_str(),
                to = to.as_str(),
                "backend circuit changed"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_recovers_through_half_open() {
        let h = Health::new(3);
        assert_eq!(h.on_failure(Some("x")), None);
        assert_eq!(h.on_failure(None), None);
        assert_eq!(
            h.on_probe_ok(),
            None,
            "a probe does not reset call failures"
        );
        assert_eq!(
            h.on_failure(None),
            Some((CircuitState::Closed, CircuitState::Open))
        );
        assert_eq!(h.times_opened(), 1);
        assert_eq!(h.on_success(), None, "open stays open on a late success");
        assert_eq!(h.state(), CircuitState::Open);
        assert_eq!(
            h.on_probe_ok(),
            Some((CircuitState::Open, CircuitState::HalfOpen))
        );
        assert_eq!(
            h.on_probe_ok(),
            Some((CircuitState::HalfOpen, CircuitState::Closed))
        );
        assert_eq!(h.consecutive_failures(), 0);
        assert_eq!(h.last_error(), None);
    }

    #[test]
    fn half_open_reopens_on_one_failure_and_closes_on_a_call_success() {
        let h = Health::new(2);
        h.on_failure(None);
        h.on_failure(None);
        h.on_probe_ok();
        assert_eq!(h.state(), CircuitState::HalfOpen);
        assert_eq!(
            h.on_failure(Some("boom")),
            Some((CircuitState::HalfOpen, CircuitState::Open))
        );
        assert_eq!(h.last_error().as_deref(), Some("boom"));
        h.on_probe_ok();
        assert_eq!(
            h.on_success(),
            Some((CircuitState::HalfOpen, CircuitState::Closed))
        );
    }

    #[test]
    fn success_resets_the_failure_count() {
        let h = Health::new(2);
        h.on_failure(None);
        h.on_success();
        assert_eq!(h.on_failure(None), None);
        assert_eq!(h.state(), CircuitState::Closed);
    }
}
