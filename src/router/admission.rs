//! Admission control and in-flight accounting, for sleep / wake and weight
//! reloads: pause admission (new calls wait, bounded), drain (wait until no
//! call is in flight), resume. The in-flight guard lives here too: it counts
//! a call on its backend and router-wide, and wakes `drain` at zero.
//!
//! Owns: the paused flag's waiters and the in-flight counts. Must not: talk
//! to backends (the caller forwards sleep / wake with `broadcast_admin`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::{BackendId, Route, RouteError, Router, Slot};

/// Router-wide in-flight count.
#[derive(Default)]
pub(crate) struct Load {
    in_flight: AtomicUsize,
    idle: Notify,
}

/// Counts one call as in flight on its backend until dropped.
pub struct InFlight {
    slot: Arc<Slot>,
    load: Arc<Load>,
}

impl InFlight {
    pub(crate) fn new(slot: Arc<Slot>, load: Arc<Load>) -> Self {
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        load.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight { slot, load }
    }
}

impl InFlight {
    pub(crate) fn slot(&self) -> &Slot {
        &self.slot
    }

    pub(crate) fn slot_arc(&self) -> Arc<Slot> {
        self.slot.clone()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.load.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.load.idle.notify_waiters();
        }
    }
}

/// Why admission is paused. Admission is open when no reason holds, so
/// ending one (a weight update committed) does not reopen it while another
/// holds (the backends are still asleep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// An admin operation drains and fans out (sleep, weights).
    Operation,
    /// The backends were put to sleep; until `wake_up`.
    Asleep,
    /// A two-step weight update was begun; until its commit.
    Updating,
}

impl Pause {
    const ALL: [Pause; 3] = [Pause::Operation, Pause::Asleep, Pause::Updating];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    pub fn name(self) -> &'static str {
        match self {
            Pause::Operation => "admin_operation",
            Pause::Asleep => "asleep",
            Pause::Updating => "weight_update",
        }
    }
}

impl Router {
    /// Pauses admission for `why`: `route` answers `Paused` and
    /// `wait_admitted` waits until no reason holds. Calls already routed
    /// keep running.
    pub fn pause_admission(&self, why: Pause) {
        // Under the router lock, so no `route` call straddles the change:
        // each one either counted its call before (and `drain` waits for
        // it) or sees the pause.
        let mut g = self.lock();
        g.paused |= why.bit();
        self.admission.send_replace(true);
        tracing::info!(reason = why.name(), "router admission paused");
    }

    /// Ends the pause for `why`; admission resumes when no other holds.
    pub fn resume_admission(&self, why: Pause) {
        let mut g = self.lock();
        g.paused &= !why.bit();
        let paused = g.paused != 0;
        self.admission.send_replace(paused);
        if paused {
            tracing::info!(
                reason = why.name(),
                "router admission: one pause ended, another holds"
            );
        } else {
            tracing::info!("router admission resumed");
        }
    }

    /// True while admission is paused (sleep or weight reload).
    pub fn is_paused(&self) -> bool {
        self.lock().paused != 0
    }

    /// The right to run an admin operation (sleep, wake-up, a weight
    /// update's steps), or `None` while another runs: they pause and resume
    /// admission and change what the backends serve, so one at a time.
    pub fn admin_operation(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.admin.clone().try_lock_owned().ok()
    }

    /// Whether `why` holds.
    pub fn is_paused_for(&self, why: Pause) -> bool {
        self.lock().paused & why.bit() != 0
    }

    /// The reasons that hold, by name.
    pub fn paused_for(&self) -> Vec<&'static str> {
        let bits = self.lock().paused;
        Pause::ALL
            .into_iter()
            .filter(|p| bits & p.bit() != 0)
            .map(Pause::name)
            .collect()
    }

    /// Returns at once when admitting; else waits up to `timeout` for
    /// `resume_admission`.
    pub async fn wait_admitted(&self, timeout: Duration) -> Result<(), RouteError> {
        let mut rx = self.admission.subscribe();
        let admitted = tokio::time::timeout(timeout, rx.wait_for(|paused| !*paused))
            .await
            .map(|r| r.is_ok());
        match admitted {
            Ok(true) => Ok(()),
            // Timed out (or, impossibly, the sender in `self` was dropped).
            _ => Err(RouteError::AdmissionTimeout(timeout)),
        }
    }

    /// `route`, waiting (up to `admission_timeout` in all) while admission is
    /// paused. This is what the request path should call.
    pub async fn route_admitted(
        &self,
        trajectory_id: &str,
        prompt_ids: &[u32],
        exclude: &[BackendId],
        admission_timeout: Duration,
    ) -> Result<Route, RouteError> {
        self.admitted(admission_timeout, || {
            self.route(trajectory_id, prompt_ids, exclude)
        })
        .await
    }

    /// [`Router::route_replay`], waiting like [`Router::route_admitted`].
    pub async fn route_replay_admitted(
        &self,
        prefer: Option<&str>,
        prompt_ids: &[u32],
        admission_timeout: Duration,
    ) -> Result<Route, RouteError> {
        self.admitted(admission_timeout, || self.route_replay(prefer, prompt_ids))
            .await
    }

    async fn admitted(
        &self,
        admission_timeout: Duration,
        route: impl Fn() -> Result<Route, RouteError>,
    ) -> Result<Route, RouteError> {
        let deadline = tokio::time::Instant::now() + admission_timeout;
        loop {
            match route() {
                Err(RouteError::Paused) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    self.wait_admitted(left)
                        .await
                        .map_err(|_| RouteError::AdmissionTimeout(admission_timeout))?;
                }
                other => return other,
            }
        }
    }

    /// Notes that a two-step weight update in `mode` was begun, admission
    /// paused since `at`, the store's weight version before it `before`
    /// (put back when the update is called off).
    pub fn update_begun(&self, mode: &'static str, at: std::time::Instant, before: Option<String>) {
        self.lock().update_begun = Some(BegunUpdate { mode, at, before });
    }

    /// The begun update, now ended.
    pub fn update_ended(&self) -> Option<BegunUpdate> {
        self.lock().update_begun.take()
    }

    /// Calls in flight on all backends.
    pub fn in_flight(&self) -> usize {
        self.load.in_flight.load(Ordering::SeqCst)
    }

    /// Waits until no call is in flight, up to `timeout`. Pause admission
    /// first, or new calls may keep it busy.
    pub async fn drain(&self, timeout: Duration) -> Result<(), RouteError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let idle = self.load.idle.notified();
            tokio::pin!(idle);
            // Register before reading the count, so a drop to zero in
            // between still wakes us.
            idle.as_mut().enable();
            let n = self.in_flight();
            if n == 0 {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return Err(RouteError::DrainTimeout {
                    waited: timeout,
                    in_flight: self.in_flight(),
                });
            }
        }
    }
}

/// A two-step weight update between `begin` and `commit` (or its call-off).
#[derive(Debug, Clone)]
pub struct BegunUpdate {
    /// The mode it runs in (`wait`, `abort`, `keep`).
    pub mode: &'static str,
    /// When admission was paused for it.
    pub at: std::time::Instant,
    /// The store's weight version before `begin` marked it in doubt.
    pub before: Option<String>,
}
