//! `prefix_affinity`: calls whose prompts share their first
//! `affinity_prefix_tokens` ids (e.g. the n samples of one GRPO prompt)
//! prefer the same backend, chosen by rendezvous hashing of that prefix over
//! the eligible backends (removing a backend only moves the prefixes it
//! owned). The preferred backend is used unless its in-flight count exceeds
//! the least-loaded backend's by more than `affinity_margin`; then the call
//! goes to the least-loaded one.
//!
//! Owns: prefix hashing. Must not: remember prefixes (stateless by design:
//! the same prefix maps to the same backend on every gateway replica).

use super::least_requests::LeastRequests;
use super::policy::{Candidate, RoutingPolicy};

pub struct PrefixAffinity {
    prefix_tokens: usize,
    margin: usize,
    fallback: LeastRequests,
}

impl PrefixAffinity {
    pub fn new(prefix_tokens: usize, margin: usize) -> Self {
        PrefixAffinity {
            prefix_tokens: prefix_tokens.max(1),
            margin,
            fallback: LeastRequests::default(),
        }
    }

    /// Index of the candidate that owns this prompt's prefix.
    pub fn preferred(&self, candidates: &[Candidate], prompt_ids: &[u32]) -> usize {
        let n = prompt_ids.len().min(self.prefix_tokens);
        let key = prefix_hash(&prompt_ids[..n]);
        candidates
            .iter()
            .enumerate()
            .max_by_key(|(_, c)| mix(key ^ mix(c.id.0.wrapping_add(0x9e37_79b9_7f4a_7c15))))
            .map_or(0, |(i, _)| i)
    }
}

impl RoutingPolicy for PrefixAffinity {
    fn name(&self) -> &'static str {
        "prefix_affinity"
    }

    fn pick(&self, candidates: &[Candidate], prompt_ids: &[u32]) -> usize {
        let preferred = self.preferred(candidates, prompt_ids);
        let min = candidates.iter().map(|c| c.in_flight).min().unwrap_or(0);
        let load = candidates.get(preferred).map_or(0, |c| c.in_flight);
        if load <= min.saturating_add(self.margin) {
            preferred
        } else {
            self.fallback.least_loaded(candidates)
        }
    }
}

/// FNV-1a over whole ids (one step per id, not per byte), then mixed:
/// stable across runs, builds and machines (std's hasher promises none of
/// that).
fn prefix_hash(ids: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &id in ids {
        h ^= u64::from(id);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// splitmix64 finalizer: spreads nearby inputs over the whole range.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
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

    fn prompt(seed: u32) -> Vec<u32> {
        (0..300).map(|i| i * 7 + seed).collect()
    }

    #[test]
    fn same_prefix_same_backend_different_tail_too() {
        let p = PrefixAffinity::new(256, 8);
        let c = cands(&[0, 0, 0]);
        let a = prompt(1);
        let mut b = a.clone();
        b[280] = 99_999; // differs only after the hashed prefix
        assert_eq!(p.pick(&c, &a), p.pick(&c, &b));
    }

    #[test]
    fn prefixes_spread_over_backends() {
        let p = PrefixAffinity::new(256, 8);
        let c = cands(&[0, 0, 0]);
        let mut counts = [0usize; 3];
        for s in 0..300 {
            counts[p.pick(&c, &prompt(s))] += 1;
        }
        assert!(counts.iter().all(|&n| n > 60), "{counts:?}");
    }

    #[test]
    fn margin_bounds_the_imbalance() {
        let p = PrefixAffinity::new(256, 2);
        let a = prompt(5);
        let home = p.preferred(&cands(&[0, 0, 0]), &a);
        let mut loads = [0usize; 3];
        loads[home] = 2; // within the margin: stays home
        assert_eq!(p.pick(&cands(&loads), &a), home);
        loads[home] = 3; // over it: least loaded elsewhere
        assert_ne!(p.pick(&cands(&loads), &a), home);
    }

    #[test]
    fn removing_another_backend_keeps_the_owner() {
        let p = PrefixAffinity::new(256, 8);
        let all = cands(&[0, 0, 0, 0]);
        for s in 0..50 {
            let a = prompt(s);
            let owner = all[p.preferred(&all, &a)].id;
            let rest: Vec<Candidate> = all
                .iter()
                .copied()
                .filter(|c| c.id == owner || c.id.0 != (owner.0 + 1) % 4)
                .collect();
            assert_eq!(rest[p.preferred(&rest, &a)].id, owner);
        }
    }
}
