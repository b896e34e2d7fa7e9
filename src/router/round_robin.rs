//! `round_robin`: new trajectories go to the eligible backends in turn,
//! regardless of load.
//!
//! Owns: one rotating counter. Must not: look at loads or prompts.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::policy::{Candidate, RoutingPolicy};

#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn pick(&self, candidates: &[Candidate], _prompt_ids: &[u32]) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % candidates.len().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::BackendId;

    #[test]
    fn rotates_over_candidates() {
        let p = RoundRobin::default();
        let c: Vec<Candidate> = (0..3)
            .map(|i| Candidate {
                id: BackendId(i),
                in_flight: 100 * i as usize,
            })
            .collect();
        let picks: Vec<usize> = (0..6).map(|_| p.pick(&c, &[])).collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }
}
