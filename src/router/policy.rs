//! The routing-policy trait: given the eligible backends and their loads,
//! pick one for a trajectory's first call. Sticky pinning, health and
//! exclusion are applied by the router before a policy is asked.
//!
//! Owns: the trait, the candidate type and the config → policy mapping.
//! Must not: touch backends, counters or the sticky map.

use super::{least_requests, prefix_affinity, round_robin, BackendId};
use crate::config::{PolicyKind, RouterConfig};

/// One eligible backend as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub id: BackendId,
    /// Requests currently running on this backend.
    pub in_flight: usize,
}

pub trait RoutingPolicy: Send + Sync + 'static {
    /// The config name (`least_requests`, ...).
    fn name(&self) -> &'static str;
    /// Index into `candidates` (never empty, ordered by id) of the backend
    /// that should serve a new trajectory whose prompt is `prompt_ids`.
    fn pick(&self, candidates: &[Candidate], prompt_ids: &[u32]) -> usize;
}

/// The policy named by `router.policy`.
pub fn from_config(cfg: &RouterConfig) -> Box<dyn RoutingPolicy> {
    match cfg.policy {
        PolicyKind::LeastRequests => Box::new(least_requests::LeastRequests::default()),
        PolicyKind::RoundRobin => Box::new(round_robin::RoundRobin::default()),
        PolicyKind::PrefixAffinity => Box::new(prefix_affinity::PrefixAffinity::new(
            cfg.affinity_prefix_tokens,
            cfg.affinity_margin,
        )),
    }
}
