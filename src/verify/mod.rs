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

pub mod background;
pub mod compare;
pub mod output;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use crate::backend::{BackendError, DynBackend, ScoreRequest};
use crate::router::{RouteError, Router};
use crate::store::{DynStore, Sample, StoreError, Trajectory, VersionReplay};

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

/// Loads trajectory `id` and checks it ([`verify_loaded`]).
pub async fn verify_trajectory(
    router: &Router,
    store: &DynStore,
    id: &str,
    opts: &Options,
) -> Result<Report, VerifyError> {
    let traj = store
        .get_trajectory(id)
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?;
    verify_loaded(router, store, traj, opts).await
}

/// Replays every sample of `traj`, stores the results with the trajectory
/// (replacing earlier checks of the same samples) and returns them.
pub async fn verify_loaded(
    router: &Router,
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
    // Sample reconstruction copies every id of the trajectory: off the runtime.
    let samples = tokio::task::spawn_blocking(move || crate::store::samples(&traj))
        .await
        .map_err(|e| VerifyError::Task(e.to_string()))??;
    check_lengths(&id, &samples, opts.max_len)?;
    let first = samples.iter().find(|s| has_comparable(s));
    let (backend, route) = match first {
        None => (None, None),
        Some(s) => {
            let named = opts.backend.as_deref();
            let (b, r) = choose(router, named, home.as_deref(), &sequence(s)).await?;
            (Some(b), r)
        }
    };
    let name = backend.as_ref().map(|b| b.name().to_string());
    let result = replay_samples(backend, &id, samples, opts.threshold, labels.clone()).await;
    if let Some(r) = &route {
        match &result {
            Ok(_) => router.report_success(r.id),
            Err(e) => router.report_error(r.id, e),
        }
    }
    drop(route);
    let comparisons = result?;
    store
        .set_replays(&id, comparisons.iter().map(|c| c.replay.clone()).collect())
        .await?;
    let label = name.as_deref().unwrap_or("none");
    let mut totals: BTreeMap<Option<u64>, Tally> = BTreeMap::new();
    for c in &comparisons {
        crate::metrics::replay_sample(label, &c.abs_diffs);
        for (seq, t) in &c.tallies {
            totals.entry(*seq).or_default().merge(t);
        }
    }
    Ok(Report {
        trajectory_id: id,
        backend: name,
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
) -> Result<Vec<Comparison>, BackendError> {
    let tid: Arc<str> = Arc::from(trajectory_id);
    futures::stream::iter(samples)
        .map(|s| replay_one(backend.clone(), tid.clone(), s, threshold, labels.clone()))
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
