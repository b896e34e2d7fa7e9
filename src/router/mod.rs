//! The router: which backend serves a call. Backends can be added and
//! removed at runtime (ids stay stable); a trajectory's calls stick to the
//! backend of its first call (bounded LRU, [`sticky`]); new trajectories are
//! placed by a [`policy::RoutingPolicy`]; a circuit breaker per backend
//! ([`health`]) takes failing backends out and probes them back in; sleep and
//! weight reloads pause admission and drain in-flight calls ([`admission`]);
//! admin operations reach every backend with a deadline, and each backend
//! knows its weight version ([`fleet`]).
//!
//! Owns: backend membership, pins, loads, health state and router counters.
//! Must not: speak HTTP to clients, generate tokens, or retry by itself: the
//! call layer runs the retry loop (`call::start`: route → generate → on a
//! failure before the first token, `report_error` and route again with the
//! failed id excluded), and reports how each stream ended ([`Route`]).

pub mod adapters;
pub mod admission;
pub mod fleet;
pub mod health;
pub mod interrupt;
pub mod least_requests;
pub mod policy;
pub mod prefix_affinity;
pub mod retry;
pub mod round_robin;
pub mod sticky;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{BackendError, DynBackend};
use crate::config::RouterConfig;
use crate::error::ApiError;
pub use admission::{InFlight, Pause};
pub use fleet::{AdminOutcome, AdminResult};
pub use health::{CircuitState, HealthTask};
pub use interrupt::Interruption;
pub use policy::{Candidate, RoutingPolicy};
pub use retry::Backoff;
use sticky::{Pin, StickyMap};

/// A backend's id inside this router: assigned on add, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BackendId(pub u64);

impl std::fmt::Display for BackendId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("no inference backends are configured: add one with POST /admin/backends")]
    NoBackends,
    #[error(
        "no healthy backend available ({open} with an open circuit, {sleeping} asleep, \
         {weights_failed} whose weight update failed, {excluded} already failed this call)"
    )]
    NoHealthyBackend {
        open: usize,
        sleeping: usize,
        weights_failed: usize,
        excluded: usize,
    },
    #[error("admission is paused (backends are asleep or reloading weights)")]
    Paused,
    #[error("waited {0:?} for admission; backends are still paused")]
    AdmissionTimeout(Duration),
    #[error("waited {waited:?} for in-flight calls to finish; {in_flight} still running")]
    DrainTimeout { waited: Duration, in_flight: usize },
    #[error("no backend with id {0}")]
    UnknownBackend(BackendId),
    #[error("a backend named `{0}` already exists")]
    DuplicateName(String),
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> Self {
        match e {
            RouteError::UnknownBackend(_) => ApiError::not_found(e.to_string()),
            RouteError::DuplicateName(_) => ApiError::bad_request(e.to_string()),
            _ => ApiError::overloaded(e.to_string()),
        }
    }
}

/// One backend as the router holds it.
pub(crate) struct Slot {
    pub(crate) id: BackendId,
    pub(crate) name: Arc<str>,
    pub(crate) url: String,
    pub(crate) backend: DynBackend,
    pub(crate) health: health::Health,
    pub(crate) in_flight: AtomicUsize,
    sleeping: AtomicBool,
    weights: Mutex<fleet::Weights>,
    /// Interruptions sent to it ([`interrupt`]).
    interrupts: AtomicU64,
    interrupted: tokio::sync::Notify,
    /// Updates in `keep` mode it was paused for.
    keeps: AtomicU64,
    /// What it answered when last asked whether it can keep generations
    /// in place (`Err`: why not); `None` until asked.
    keep: Mutex<Option<Result<(), String>>>,
}

impl Slot {
    pub(crate) fn is_sleeping(&self) -> bool {
        self.sleeping.load(Ordering::Relaxed)
    }

    /// Asleep, or its weights are unknown: takes no calls.
    fn is_out(&self) -> bool {
        self.is_sleeping() || self.weights().failed.is_some()
    }
}

/// Where one call goes. Holding it counts the call as in flight on that
/// backend (for load balancing and draining); drop it when the call ends,
/// i.e. after the last streamed token, not after the first.
pub struct Route {
    pub backend: DynBackend,
    pub id: BackendId,
    pub name: Arc<str>,
    /// True when the trajectory was already pinned here (a sticky hit).
    pub sticky: bool,
    /// Set when the trajectory was pinned elsewhere and had to move (that
    /// backend failed this call, has an open circuit, or was removed). The
    /// pin now points here.
    pub moved_from: Option<String>,
    /// The weights the backend serves (tagged on the call's record).
    pub weight_version: Option<Arc<str>>,
    /// That version's fleet sequence number, when known.
    pub weight_seq: Option<u64>,
    _guard: InFlight,
}

impl Route {
    /// The call on this route ended with its finish: see
    /// [`Router::report_success`].
    pub fn succeeded(&self) {
        succeeded(self._guard.slot());
    }

    /// The interruptions of this route's backend from now on.
    pub fn interruption(&self) -> Interruption {
        Interruption::of(self._guard.slot_arc())
    }

    /// The call on this route failed (before or after its first token):
    /// see [`Router::report_error`].
    pub fn failed(&self, error: &BackendError) {
        if let BackendError::Protocol { backend, .. } = error {
            crate::metrics::backend_protocol_error(backend);
        }
        failed(self._guard.slot(), error);
    }
}

fn succeeded(slot: &Slot) {
    health::log_transition(&slot.name, slot.health.on_success(), None);
}

fn failed(slot: &Slot, error: &BackendError) {
    if error.counts_against_health() {
        let msg = error.to_string();
        health::log_transition(&slot.name, slot.health.on_failure(Some(&msg)), Some(&msg));
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("sticky", &self.sticky)
            .field("moved_from", &self.moved_from)
            .finish()
    }
}

/// One backend's state, as served by `GET /admin/backends`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendStatus {
    pub id: BackendId,
    pub name: String,
    pub kind: String,
    pub url: String,
    /// True when the circuit is closed.
    pub healthy: bool,
    pub circuit: CircuitState,
    pub consecutive_failures: u32,
    pub in_flight: usize,
    /// Trajectories pinned to this backend.
    pub sticky: usize,
    pub sleeping: bool,
    pub last_error: Option<String>,
    /// The weight version this backend serves (null: the initial weights).
    pub weight_version: Option<String>,
    /// Why its last weight update failed; it takes no calls until one works.
    pub weights_error: Option<String>,
    /// The weight-update modes it runs as asked: `wait`, `abort`, and
    /// `keep` once it said it can (see `keep`).
    pub update_modes: Vec<&'static str>,
    /// Its answer when an update last asked for `keep`: `null` before
    /// any did, else `"keep"` or why it runs as `abort`.
    pub keep: Option<String>,
}

/// Router-wide counters (monotonic), for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RouterCounters {
    /// Lookups of a trajectory that had a pin (including pins that moved).
    pub sticky_hits: u64,
    /// Lookups of a trajectory without a pin (its first call, or evicted).
    pub sticky_misses: u64,
    pub sticky_evictions: u64,
    /// `route` calls with a non-empty `exclude` list (re-routes after failure).
    pub retries: u64,
    /// Pinned trajectories that moved to another backend.
    pub moves: u64,
}

struct Inner {
    /// Ordered by id.
    slots: Vec<Arc<Slot>>,
    next_id: u64,
    sticky: StickyMap,
    /// The [`Pause`] reasons that hold, one bit each.
    paused: u8,
    /// The fleet's weight version: what every backend took last.
    weight_version: Option<Arc<str>>,
    /// Its sequence number in the store, when known.
    weight_seq: Option<u64>,
    /// A begun two-step update: its mode, and when admission paused.
    update_begun: Option<admission::BegunUpdate>,
    /// The sequence number of each version label the fleet served.
    labels: std::collections::HashMap<Arc<str>, u64>,
}

/// How [`Router::place`] picks a backend.
#[derive(Clone, Copy)]
enum Placement<'a> {
    /// A trajectory's call: its pinned backend, or a new pin.
    Sticky(&'a str),
    /// A replay check: the named backend when usable; no pin.
    Replay(Option<&'a str>),
}

pub struct Router {
    policy: Box<dyn RoutingPolicy>,
    health_interval: Duration,
    failure_threshold: u32,
    max_attempts: u32,
    backoff: Backoff,
    first_token_timeout: Duration,
    inner: Mutex<Inner>,
    load: Arc<admission::Load>,
    admission: tokio::sync::watch::Sender<bool>,
    /// Held by the admin operation in progress (see
    /// [`Router::admin_operation`]).
    admin: Arc<tokio::sync::Mutex<()>>,
    retries: AtomicU64,
    moves: AtomicU64,
}

impl Router {
    /// An empty router with the policy named in `cfg`.
    pub fn new(cfg: &RouterConfig) -> Arc<Router> {
        Router::with_policy(cfg, policy::from_config(cfg))
    }

    pub fn with_policy(cfg: &RouterConfig, policy: Box<dyn RoutingPolicy>) -> Arc<Router> {
        Arc::new(Router {
            policy,
            health_interval: Duration::from_millis(cfg.health_interval_ms.max(1)),
            failure_threshold: cfg.failure_threshold.max(1),
            max_attempts: cfg.max_attempts.max(1),
            backoff: Backoff {
                initial: Duration::from_millis(cfg.retry_backoff_ms),
                max: Duration::from_millis(cfg.retry_backoff_max_ms),
            },
            first_token_timeout: Duration::from_millis(cfg.first_token_timeout_ms),
            inner: Mutex::new(Inner {
                slots: Vec::new(),
                next_id: 0,
                sticky: StickyMap::new(cfg.sticky_capacity),
                paused: 0,
                weight_version: None,
                weight_seq: None,
                update_begun: None,
                labels: std::collections::HashMap::new(),
            }),
            load: Arc::default(),
            admission: tokio::sync::watch::Sender::new(false),
            admin: Arc::new(tokio::sync::Mutex::new(())),
            retries: AtomicU64::new(0),
            moves: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// `router.max_attempts`: how many backends one call may try.
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The waits between a call's attempts.
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// `router.first_token_timeout_ms`: how long one attempt may take to
    /// its first token.
    pub fn first_token_timeout(&self) -> Duration {
        self.first_token_timeout
    }

    pub(crate) fn health_interval(&self) -> Duration {
        self.health_interval
    }

    /// Adds a backend (circuit closed). Names must be unique.
    pub fn add_backend(
        &self,
        backend: DynBackend,
        url: impl Into<String>,
    ) -> Result<BackendId, RouteError> {
        let mut g = self.lock();
        let name: Arc<str> = Arc::from(backend.name());
        if g.slots.iter().any(|s| s.name == name) {
            return Err(RouteError::DuplicateName(name.to_string()));
        }
        let id = BackendId(g.next_id);
        g.next_id += 1;
        let version = g.weight_version.clone();
        let seq = g.weight_seq;
        g.slots.push(Arc::new(Slot {
            id,
            name: name.clone(),
            url: crate::config::redact_url(&url.into()),
            backend,
            health: health::Health::new(self.failure_threshold),
            in_flight: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            // A backend joining the fleet is taken to serve its weights.
            weights: Mutex::new(fleet::Weights {
                seq,
                ..fleet::Weights::serving(version)
            }),
            interrupts: AtomicU64::new(0),
            interrupted: tokio::sync::Notify::new(),
            keeps: AtomicU64::new(0),
            keep: Mutex::new(None),
        }));
        drop(g);
        tracing::info!(backend = %name, id = id.0, "backend added");
        Ok(id)
    }

    /// Removes a backend. Calls already running on it finish normally;
    /// trajectories pinned to it move on their next call.
    pub fn remove_backend(&self, id: BackendId) -> Result<BackendStatus, RouteError> {
        let mut g = self.lock();
        let pos = g
            .slots
            .iter()
            .position(|s| s.id == id)
            .ok_or(RouteError::UnknownBackend(id))?;
        let slot = g.slots.remove(pos);
        let status = status_of(&slot, g.sticky.count_for(id));
        drop(g);
        tracing::info!(backend = %slot.name, id = id.0, "backend removed");
        Ok(status)
    }

    /// The id of the backend with this name.
    pub fn backend_id(&self, name: &str) -> Option<BackendId> {
        self.lock()
            .slots
            .iter()
            .find(|s| &*s.name == name)
            .map(|s| s.id)
    }

    pub(crate) fn slots(&self) -> Vec<Arc<Slot>> {
        self.lock().slots.clone()
    }

    fn slot(&self, id: BackendId) -> Option<Arc<Slot>> {
        self.lock().slots.iter().find(|s| s.id == id).cloned()
    }

    /// Picks the backend for one call of `trajectory_id` and counts the call
    /// as in flight there until the returned [`Route`] is dropped.
    ///
    /// A pinned trajectory stays on its backend unless that backend is in
    /// `exclude`, has an open circuit, is asleep (its wake-up failed), or was
    /// removed; then it moves (the route says from where) and the pin
    /// follows. New trajectories go where the policy says, among awake
    /// backends with a closed circuit (half-open ones only when no closed one
    /// is left). `exclude` lists backends that already
    /// failed this call; a non-empty list counts as a retry.
    pub fn route(
        &self,
        trajectory_id: &str,
        prompt_ids: &[u32],
        exclude: &[BackendId],
    ) -> Result<Route, RouteError> {
        self.place(Placement::Sticky(trajectory_id), prompt_ids, exclude)
    }

    /// A route for a replay check: on the backend named `prefer` (where the
    /// trajectory was generated) when it is usable, else where the policy
    /// says; the sticky map is neither read nor changed (the trajectory is
    /// finished). Counted in flight like any call.
    pub fn route_replay(
        &self,
        prefer: Option<&str>,
        prompt_ids: &[u32],
    ) -> Result<Route, RouteError> {
        self.place(Placement::Replay(prefer), prompt_ids, &[])
    }

    fn place(
        &self,
        placement: Placement<'_>,
        prompt_ids: &[u32],
        exclude: &[BackendId],
    ) -> Result<Route, RouteError> {
        let mut g = self.lock();
        if g.paused != 0 {
            return Err(RouteError::Paused);
        }
        if g.slots.is_empty() {
            return Err(RouteError::NoBackends);
        }
        if !exclude.is_empty() {
            self.retries.fetch_add(1, Ordering::Relaxed);
        }
        let usable = |g: &Inner, ok: &dyn Fn(&Slot) -> bool| {
            g.slots
                .iter()
                .find(|s| {
                    ok(s)
                        && !exclude.contains(&s.id)
                        && !s.is_out()
                        && s.health.state() != CircuitState::Open
                })
                .cloned()
        };
        let mut moved_from = None;
        match placement {
            Placement::Sticky(tid) => {
                if let Some(pin) = g.sticky.lookup(tid) {
                    if let Some(slot) = usable(&g, &|s| s.id == pin.id) {
                        return Ok(self.make_route(slot, true, None));
                    }
                    moved_from = Some(pin.name.to_string());
                }
            }
            Placement::Replay(Some(name)) => {
                if let Some(slot) = usable(&g, &|s| &*s.name == name) {
                    return Ok(self.make_route(slot, true, None));
                }
            }
            Placement::Replay(None) => {}
        }
        let states: Vec<CircuitState> = g.slots.iter().map(|s| s.health.state()).collect();
        let eligible = |want: CircuitState| -> Vec<Arc<Slot>> {
            g.slots
                .iter()
                .zip(&states)
                .filter(|(s, st)| **st == want && !exclude.contains(&s.id) && !s.is_out())
                .map(|(s, _)| s.clone())
                .collect()
        };
        let mut pool = eligible(CircuitState::Closed);
        if pool.is_empty() {
            pool = eligible(CircuitState::HalfOpen);
        }
        if pool.is_empty() {
            let open = states.iter().filter(|s| **s == CircuitState::Open).count();
            let sleeping = g.slots.iter().filter(|s| s.is_sleeping()).count();
            let weights_failed = g
                .slots
                .iter()
                .filter(|s| s.weights().failed.is_some())
                .count();
            let excluded = g.slots.iter().filter(|s| exclude.contains(&s.id)).count();
            return Err(RouteError::NoHealthyBackend {
                open,
                sleeping,
                weights_failed,
                excluded,
            });
        }
        let candidates: Vec<Candidate> = pool
            .iter()
            .map(|s| Candidate {
                id: s.id,
                in_flight: s.in_flight.load(Ordering::Relaxed),
            })
            .collect();
        let pick = self
            .policy
            .pick(&candidates, prompt_ids)
            .min(pool.len() - 1);
        let slot = pool.swap_remove(pick);
        let Placement::Sticky(trajectory_id) = placement else {
            return Ok(self.make_route(slot, false, None));
        };
        let pin = Pin {
            id: slot.id,
            name: slot.name.clone(),
        };
        let evicted = g.sticky.insert(trajectory_id, pin);
        // Count the call before unlocking so that concurrent picks see it.
        let route = self.make_route(slot, false, moved_from);
        drop(g);
        if let Some(from) = &route.moved_from {
            self.moves.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(trajectory_id, from = %from, to = %route.name, "trajectory moved to another backend");
        } else {
            tracing::debug!(trajectory_id, backend = %route.name, "trajectory pinned");
        }
        if let Some((key, pin)) = evicted {
            tracing::debug!(trajectory_id = %key, backend = %pin.name, "sticky pin evicted");
        }
        Ok(route)
    }

    /// Forgets where a finished trajectory was pinned.
    pub fn unpin(&self, trajectory_id: &str) {
        self.lock().sticky.remove(trajectory_id);
    }

    /// Forgets a pin the failed attempt of a call made (on `id`), so the
    /// retry places the trajectory afresh: it never ran there, which is no
    /// move. A pin another call has changed since is kept.
    pub fn unpin_from(&self, trajectory_id: &str, id: BackendId) {
        let mut g = self.lock();
        if g.sticky.peek(trajectory_id).is_some_and(|p| p.id == id) {
            g.sticky.remove(trajectory_id);
        }
    }

    fn make_route(&self, slot: Arc<Slot>, sticky: bool, moved_from: Option<String>) -> Route {
        let (weight_version, weight_seq) = {
            let w = slot.weights();
            (w.version.clone(), w.seq)
        };
        Route {
            backend: slot.backend.clone(),
            id: slot.id,
            name: slot.name.clone(),
            sticky,
            moved_from,
            weight_version,
            weight_seq,
            _guard: InFlight::new(slot, self.load.clone()),
        }
    }

    /// A call on `id` ended well: resets its failure count (and closes a
    /// half-open circuit).
    pub fn report_success(&self, id: BackendId) {
        if let Some(slot) = self.slot(id) {
            succeeded(&slot);
        }
    }

    /// The call on `id` failed before its first token for a reason that is
    /// the backend's (unreachable, timeout, 5xx, protocol, overloaded).
    pub fn report_failure(&self, id: BackendId) {
        if let Some(slot) = self.slot(id) {
            health::log_transition(&slot.name, slot.health.on_failure(None), None);
        }
    }

    /// Like `report_failure`, keeping the message, for errors that say the
    /// backend is unwell ([`BackendError::counts_against_health`]); an answer
    /// that could not be decoded is only counted
    /// (`tito_backend_protocol_errors_total`).
    pub fn report_error(&self, id: BackendId, error: &BackendError) {
        if let BackendError::Protocol { backend, .. } = error {
            crate::metrics::backend_protocol_error(backend);
        }
        if let Some(slot) = self.slot(id) {
            failed(&slot, error);
        }
    }

    /// Every backend's state, in id order.
    pub fn snapshot(&self) -> Vec<BackendStatus> {
        let g = self.lock();
        g.slots
            .iter()
            .map(|s| status_of(s, g.sticky.count_for(s.id)))
            .collect()
    }

    pub fn counters(&self) -> RouterCounters {
        let g = self.lock();
        RouterCounters {
            sticky_hits: g.sticky.hits(),
            sticky_misses: g.sticky.misses(),
            sticky_evictions: g.sticky.evictions(),
            retries: self.retries.load(Ordering::Relaxed),
            moves: self.moves.load(Ordering::Relaxed),
        }
    }

    pub fn sticky_hits(&self) -> u64 {
        self.lock().sticky.hits()
    }

    pub fn sticky_misses(&self) -> u64 {
        self.lock().sticky.misses()
    }

    pub fn sticky_evictions(&self) -> u64 {
        self.lock().sticky.evictions()
    }

    /// Trajectories currently pinned.
    pub fn sticky_len(&self) -> usize {
        self.lock().sticky.len()
    }

    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    /// The backend a trajectory is pinned to, if any (no counters touched).
    pub fn pinned(&self, trajectory_id: &str) -> Option<BackendId> {
        self.lock().sticky.peek(trajectory_id).map(|p| p.id)
    }
}

fn status_of(s: &Slot, sticky: usize) -> BackendStatus {
    let circuit = s.health.state();
    let keep = s.keep.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let weights = s.weights().clone();
    BackendStatus {
        id: s.id,
        name: s.name.to_string(),
        kind: s.backend.kind().to_string(),
        url: s.url.clone(),
        healthy: circuit == CircuitState::Closed,
        circuit,
        consecutive_failures: s.health.consecutive_failures(),
        in_flight: s.in_flight.load(Ordering::Relaxed),
        sticky,
        sleeping: s.is_sleeping(),
        last_error: s.health.last_error(),
        weight_version: weights.version.as_deref().map(str::to_string),
        weights_error: weights.failed,
        update_modes: match keep {
            Some(Ok(())) => vec!["wait", "abort", "keep"],
            _ => vec!["wait", "abort"],
        },
        keep: keep.map(|k| match k {
            Ok(()) => "keep".to_string(),
            Err(why) => format!("runs as abort: {why}"),
        }),
    }
}
