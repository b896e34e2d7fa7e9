//! Interruptions: a weight update in `abort` mode stops the generations in
//! flight on a backend, and the calls that were running there continue on
//! the new weights (`call` resends their prompt plus what was sampled).
//!
//! Each backend counts the interruptions it was sent. A stream remembers
//! the count when it was routed ([`Interruption`]); an abort that ends it
//! after the count moved was the update's, not an operator's or the
//! backend's own, and a request still waiting for its first token when the
//! count moves is withdrawn and routed again once admission resumes.
//!
//! Owns: the per-backend counts. Must not: talk to backends (the admin
//! routes send the pause themselves, after [`Router::interrupt_all`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Router, Slot};

/// One routed stream's view of its backend's interruptions.
#[derive(Clone)]
pub struct Interruption {
    slot: Arc<Slot>,
    at: u64,
    kept_at: u64,
}

impl Interruption {
    pub(crate) fn of(slot: Arc<Slot>) -> Self {
        let at = slot.interrupts.load(Ordering::SeqCst);
        let kept_at = slot.keeps.load(Ordering::SeqCst);
        Interruption { slot, at, kept_at }
    }

    /// An update in `keep` mode paused the backend since the stream was
    /// routed: its tokens may come from two versions.
    pub fn kept(&self) -> bool {
        self.slot.keeps.load(Ordering::SeqCst) != self.kept_at
    }

    /// An interruption was sent to the backend since the stream was routed.
    pub fn happened(&self) -> bool {
        self.slot.interrupts.load(Ordering::SeqCst) != self.at
    }

    /// Returns once [`Interruption::happened`] holds.
    pub async fn wait(&self) {
        loop {
            let notified = self.slot.interrupted.notified();
            tokio::pin!(notified);
            // Registered before the check, so an interruption in between
            // still wakes this waiter.
            notified.as_mut().enable();
            if self.happened() {
                return;
            }
            notified.await;
        }
    }
}

impl Router {
    /// Marks every backend paused in place by an update in `keep` mode.
    pub fn keep_all(&self) {
        for slot in self.slots() {
            slot.keeps.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Marks every backend interrupted, before the admin route tells them
    /// to stop what they generate: each running call sees its abort as the
    /// update's and continues after it.
    pub fn interrupt_all(&self) {
        for slot in self.slots() {
            slot.interrupts.fetch_add(1, Ordering::SeqCst);
            slot.interrupted.notify_waiters();
        }
    }
}
