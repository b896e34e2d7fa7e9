//! `least_requests`: a new trajectory goes to the eligible backend with the
//! fewest in-flight requests; ties are broken round-robin so that an idle
//! fleet still fills evenly.
//!
//! Owns: the tie-break counter. Must not: look at prompts.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::policy::{Candidate, RoutingPolicy};

#[derive(Default)]
pub struct LeastRequests {
    tie_break: AtomicUsize,
}

impl LeastRequests {
    /// Index of a least-loaded candidate (rotating among equals).
    pub fn least_loaded(&self, candidates: &[Candidate]) -> usize {
        let Some(min) = candidates.iter().map(|c| c.in_flight).min() else {
            return 0;
        };
        let ties = candidates.iter().filter(|c| c.in_flight == min).count();
        let nth = self.tie_break.fetch_add(1, Ordering::Relaxed) % ties.max(1);
        candidates
            .iter()
            .enumerate()
            .filter(|(_, c)| c.in_flight == min)
            .nth(nth)
            .map_or(0, |(i, _)| i)
    }
}

impl RoutingPolicy for LeastRequests {
    fn name(&self) -> &'static str {
        "least_requests"
    }

    fn pick(&self, candidates: &[Candidate], _prompt_ids: &[u32]) -> usize {
        self.least_loaded(candidates)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::BackendId;

    fn cands(loads: &[usize]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &l)| Candidate {
                id: BackendId(i as u64),
                in_flight: l,
            })
            .collect()
    }

    #[test]
    fn picks_the_least_loaded() {
        let p = LeastRequests::default();
        assert_eq!(p.pick(&cands(&[3, 1, 2]), &[]), 1);
        assert_eq!(p.pick(&cands(&[0, 5, 5]), &[]), 0);
    }

    #[test]
    fn rotates_among_ties() {
        let p = LeastRequests::default();
        let c = cands(&[1, 4, 1, 1]);
        let picks: Vec<usize> = (0..6).map(|_| p.pick(&c, &[])).collect();
        assert_eq!(picks, vec![0, 2, 3, 0, 2, 3]);
    }
}
