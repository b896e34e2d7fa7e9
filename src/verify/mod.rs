//! The teacher-forced replay check: each recorded sample's full sequence
//! (prompt ids, then response ids) is sent back to a backend as a prompt
//! with prompt logprobs ([`crate::backend::Backend::prompt_logprobs`]), and the logprob the
//! backend computes for every sampled token, given exactly the recorded
//! prefix, is compared with the logprob recorded when it was sampled.
//!
//! The gap is what an RL trainer sees between its rollout engine and its
//! own recomputation: batch effects, prefill-vs-decode kernels, quantization,
//! a different weight version, a wrong template. Per sample the check
//! reports max and mean |Δ| (nats), the positions above a threshold and the
//! share of sampled tokens that are not the replay's argmax, overall and per
//! weight version that sampled the tokens (the recorded logprobs are never
//! recomputed: each token is held against the backend serving now), stores that with
//! the trajectory ([`SpanStore::set_replays`](crate::store::SpanStore)) and
//! observes every |Δ| in `tito_replay_logprob_abs_diff`.
//!
//! Owns: building the sequences, picking the backend, the comparison
//! ([`compare`]) and the sampled background mode ([`background`]). Must not:
//! speak a backend's wire format (the `backend` module does) or HTTP.
//!
//! Which backend: the one named (request `backend`, `[verify] backend`,
//! `tito verify --backend`), else where the router sends a call of that
//! trajectory: its pinned backend while the pin lasts, so a sample is
//! replayed where it was generated.
//!
//! Which weights: each policy's own ([`Scope`]). A trajectory whose calls
//! were served by several policies (models, LoRA adapters) is checked once
//! per policy, on its model's backends with its adapter, comparing only the
//! tokens that policy sampled; each result names the policy.

pub mod background;
pub mod compare;
pub mod output;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use crate::backend::{BackendError, DynBackend, ScoreRequest};
use crate::router::{RouteError, Router};
use crate::store::{DynStore, Policy, Sample, StoreError, Trajectory, VersionReplay};

pub use compare::{by_version, compare, has_comparable, sequence, Comparison, Tally};
pub use output::{sample_json, Summary};

/// The |Δ| (nats) above which a position is listed, unless configured.
pub use crate::config::DEFAULT_VERIFY_THRESHOLD as DEFAULT_THRESHOLD;

/// Samples of one trajectory replayed at once.
const SAMPLE_CONCURRENCY: usize = 4;

/// How one check runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Nats; positions with a larger |Δ| are listed.
    pub threshold: f64,
    /// Replay on the backend of this name instead of the router's choice.
    pub backend: Option<String>,
    /// Longest sequence sent (the context window); a longer sample fails
    /// the check before any backend call.
    pub max_len: Option<usize>,
}

impl Options {
    /// `[verify]`'s threshold and backend, with `max_len` as the window.
    pub fn from_config(cfg: &crate::config::VerifyConfig, max_len: Option<usize>) -> Options {
        Options {
            threshold: cfg.threshold,
            backend: (!cfg.backend.is_empty()).then(|| cfg.backend.clone()),
            max_len,
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold: DEFAULT_THRESHOLD,
            backend: None,
            max_len: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Route(#[from] RouteError),
    #[error("no backend named `{0}`")]
    UnknownBackend(String),
    #[error(
        "sample {sample} of trajectory `{trajectory}` has {len} tokens, more than the \
         context window of {max} tokens: it cannot be replayed"
    )]
    TooLong {
        trajectory: String,
        sample: u32,
        len: usize,
        max: usize,
    },
    #[error(
        "trajectory `{0}` has images: the replay check sends token ids alone, and without \
         its images a replay would score another prompt"
    )]
    Images(String),
    #[error("replay task failed: {0}")]
    Task(String),
    #[error(
        "trajectory `{trajectory}` has calls of model `{model}`, which this gateway does not \
         serve: their samples cannot be replayed on their weights"
    )]
    NotServed { trajectory: String, model: String },
}

/// What one check of a trajectory found, per sample in sample order.
#[derive(Debug, Clone)]
pub struct Report {
    pub trajectory_id: String,
    /// `None` when no sample had anything to compare (no backend was asked).
    pub backend: Option<String>,
    pub samples: Vec<Comparison>,
    /// Over every sample: the numbers per weight version
    /// ([`SampleReplay::by_version`](crate::store::SampleReplay)).
    pub by_version: Vec<VersionReplay>,
}

/// Sequence number → label of every version span of `traj`'s calls.
fn version_labels(traj: &Trajectory) -> BTreeMap<u64, String> {
    let spans = traj.calls.iter().flat_map(|c| &c.versions);
    spans
        .filter_map(|s| Some((s.seq?, s.version.clone()?)))
        .collect()
}

/// The served models a check replays samples on.
pub struct Scope<'a> {
    /// Each model's name and router. Each policy (a model, or one of its
    /// LoRA adapters) is replayed on its model's router, the adapter
    /// applied, and only its own sampled tokens are compared.
    pub served: Vec<(&'a str, &'a Router)>,
    /// The first of `served` is the gateway's first model: it also checks
    /// calls recorded without a policy.
    pub primary: bool,
    /// `served` is every model of the gateway: a policy of a model it does
    /// not serve is an error (else it is left to that model's check).
    pub whole: bool,
}

impl<'a> Scope<'a> {
    /// One model alone, the gateway's only one.
    pub fn single(model: &'a str, router: &'a Router) -> Self {
        Scope {
            served: vec![(model, router)],
            primary: true,
            whole: true,
        }
    }
}

/// Loads trajectory `id` and checks it ([`verify_loaded`]).
pub async fn verify_trajectory(
    scope: &Scope<'_>,
    store: &DynStore,
    id: &str,
    opts: &Options,
) -> Result<Report, VerifyError> {
    let traj = store
        .get_trajectory(id)
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    verify_loaded(scope, store, traj, opts).await
}

/// The samples of one policy, to replay on `served[model]` with `adapter`.
struct Group {
    model: usize,
    adapter: Option<Arc<str>>,
    samples: Vec<Sample>,
}

/// The policies of `traj`'s calls in `scope`, each with its samples as it
/// sees them ([`crate::store::samples_for`]); calls recorded without a
/// policy form one group of the primary model, as the samples are.
fn groups(
    scope_models: &[String],
    primary: bool,
    whole: bool,
    traj: &Trajectory,
) -> Result<Vec<Group>, VerifyError> {
    if traj.calls.iter().all(|c| c.model.is_none()) {
        if !primary {
            return Ok(Vec::new());
        }
        let samples = crate::store::samples(traj)?;
        return Ok(vec![Group {
            model: 0,
            adapter: None,
            samples,
        }]);
    }
    let mut policies: Vec<Policy> = Vec::new();
    for c in &traj.calls {
        let Some(model) = &c.model else { continue };
        let p = Policy {
            model: Some(model.clone()),
            adapter: c.adapter.clone(),
        };
        if !policies.contains(&p) {
            policies.push(p);
        }
    }
    let mut out = Vec::new();
    for p in policies {
        let name = p.model.as_deref().unwrap_or_default();
        let Some(model) = scope_models.iter().position(|m| m == name) else {
            if whole {
                return Err(VerifyError::NotServed {
                    trajectory: traj.meta.id.clone(),
                    model: name.to_string(),
                });
            }
            continue;
        };
        let samples = crate::store::samples_for(traj, &p)?;
        out.push(Group {
            model,
            adapter: p.adapter.as_deref().map(Arc::from),
            samples,
        });
    }
    Ok(out)
}

/// Replays every sample of `traj` as each of its policies in `scope` sees
/// it, stores the results with the trajectory (replacing earlier checks of
/// the same samples and policies) and returns them.
pub async fn verify_loaded(
    scope: &Scope<'_>,
    store: &DynStore,
    traj: Trajectory,
    opts: &Options,
) -> Result<Report, VerifyError> {
    let id = traj.meta.id.clone();
    if traj.calls.iter().any(|c| !c.images.is_empty()) {
        return Err(VerifyError::Images(id));
    }
    // Where the trajectory was generated last (where it was pinned).
    let home = traj.calls.last().map(|c| c.backend.clone());
    let labels = Arc::new(version_labels(&traj));
    let names: Vec<String> = scope.served.iter().map(|(m, _)| m.to_string()).collect();
    let (primary, whole) = (scope.primary, scope.whole);
    // Sample reconstruction copies every id of the trajectory: off the runtime.
    let groups = tokio::task::spawn_blocking(move || groups(&names, primary, whole, &traj))
        .await
        .map_err(|e| VerifyError::Task(e.to_string()))??;
    for g in &groups {
        check_lengths(&id, &g.samples, opts.max_len)?;
    }
    // A backend named serves one model: that model's policies replay on
    // it, the others where their router sends.
    let named = opts.backend.as_deref();
    let has = |r: &Router, n: &str| r.slots().iter().any(|s| &*s.name == n);
    if let Some(n) = named {
        if !scope.served.iter().any(|(_, r)| has(r, n)) {
            return Err(VerifyError::UnknownBackend(n.to_string()));
        }
    }
    let mut comparisons = Vec::new();
    let mut backend_name = None;
    for g in groups {
        let Some((_, router)) = scope.served.get(g.model) else {
            continue;
        };
        let first = g.samples.iter().find(|s| has_comparable(s));
        let (backend, route) = match first {
            None => (None, None),
            Some(s) => {
                let named = named.filter(|n| has(router, n));
                let (b, r) = choose(router, named, home.as_deref(), &sequence(s)).await?;
                (Some(b), r)
            }
        };
        if let Some(b) = &backend {
            backend_name.get_or_insert_with(|| b.name().to_string());
        }
        let result = replay_samples(
            backend,
            &id,
            g.samples,
            opts.threshold,
            labels.clone(),
            g.adapter,
        )
        .await;
        if let Some(r) = &route {
            match &result {
                Ok(_) => router.report_success(r.id),
                Err(e) => router.report_error(r.id, e),
            }
        }
        drop(route);
        comparisons.extend(result?);
    }
    store
        .set_replays(&id, comparisons.iter().map(|c| c.replay.clone()).collect())
        .await?;
    let mut totals: BTreeMap<Option<u64>, Tally> = BTreeMap::new();
    for c in &comparisons {
        crate::metrics::replay_sample(&c.replay.backend, &c.abs_diffs);
        for (seq, t) in &c.tallies {
            totals.entry(*seq).or_default().merge(t);
        }
    }
    Ok(Report {
        trajectory_id: id,
        backend: backend_name,
        samples: comparisons,
        by_version: by_version(&totals, &labels),
    })
}

/// Every sample with something to compare fits in `max_len` tokens.
fn check_lengths(id: &str, samples: &[Sample], max_len: Option<usize>) -> Result<(), VerifyError> {
    let Some(max) = max_len else {
        return Ok(());
    };
    for s in samples.iter().filter(|s| has_comparable(s)) {
        let len = s.prompt_ids.len() + s.response_ids.len();
        if len > max {
            return Err(VerifyError::TooLong {
                trajectory: id.to_string(),
                sample: s.sample,
                len,
                max,
            });
        }
    }
    Ok(())
}

/// The backend named `name`, else the one the trajectory was generated on
/// (`home`) when it is usable, else the router's choice; the sticky map is
/// left alone (the returned route counts the replay as in flight).
async fn choose(
    router: &Router,
    name: Option<&str>,
    home: Option<&str>,
    ids: &[u32],
) -> Result<(DynBackend, Option<crate::router::Route>), VerifyError> {
    if let Some(name) = name {
        let slot = router
            .slots()
            .into_iter()
            .find(|s| &*s.name == name)
            .ok_or_else(|| VerifyError::UnknownBackend(name.to_string()))?;
        return Ok((slot.backend.clone(), None));
    }
    let timeout = crate::call::start::ADMISSION_TIMEOUT;
    let route = router.route_replay_admitted(home, ids, timeout).await?;
    Ok((route.backend.clone(), Some(route)))
}

/// Replays `samples` on `backend` (a few at a time) and compares each;
/// samples with nothing to compare are reported without a backend call
/// (so `backend` may be `None` when no sample has anything). `labels`
/// names the versions (sequence number → label).
pub async fn replay_samples(
    backend: Option<DynBackend>,
    trajectory_id: &str,
    samples: Vec<Sample>,
    threshold: f64,
    labels: Arc<BTreeMap<u64, String>>,
    adapter: Option<Arc<str>>,
) -> Result<Vec<Comparison>, BackendError> {
    let tid: Arc<str> = Arc::from(trajectory_id);
    futures::stream::iter(samples)
        .map(|s| {
            let (b, t, l, a) = (
                backend.clone(),
                tid.clone(),
                labels.clone(),
                adapter.clone(),
            );
            replay_one(b, t, s, threshold, l, a)
        })
        .buffered(SAMPLE_CONCURRENCY)
        .try_collect()
        .await
}

async fn replay_one(
    backend: Option<DynBackend>,
    trajectory_id: Arc<str>,
    sample: Sample,
    threshold: f64,
    labels: Arc<BTreeMap<u64, String>>,
    adapter: Option<Arc<str>>,
) -> Result<Comparison, BackendError> {
    let name = backend.as_ref().map_or("", |b| b.name());
    let Some(b) = backend.as_ref().filter(|_| has_comparable(&sample)) else {
        return Ok(compare(
            &sample,
            &[],
            threshold,
            name,
            crate::store::now_ms(),
            &labels,
        ));
    };
    let req = ScoreRequest {
        request_id: format!("verify-{trajectory_id}-{}", sample.sample),
        ids: Arc::new(sequence(&sample)),
        adapter,
    };
    let replayed = b.prompt_logprobs(req).await?;
    Ok(compare(
        &sample,
        &replayed,
        threshold,
        name,
        crate::store::now_ms(),
        &labels,
    ))
}
