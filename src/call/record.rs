//! Recording one plan's choices: the outcomes handed to the trajectory's
//! commit, and the token, drift and version metrics of what was recorded.

use std::time::Instant;

use tracing::Instrument;

use super::{CallPlan, Calls, ChoiceResult};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::trajectory::ChoiceOutcome;

/// Commits one plan's choices to its trajectory; returns once durable, with
/// the index of the call holding the request body when this plan stored it.
pub(super) async fn record_plan(
    calls: &Calls,
    plan: &CallPlan,
    results: &[ChoiceResult],
    body_at: Option<u32>,
) -> Result<Option<u32>, ApiError> {
    let outcomes: Vec<ChoiceOutcome> = results
        .iter()
        .map(|r| ChoiceOutcome {
            sampled_ids: r.ids.clone(),
            logprobs: r.logprobs.iter().map(|l| l.logprob).collect(),
            finish_reason: r.finish,
            served: r.served.clone(),
            backend: r.backend.clone(),
            moved_from: r.moved_from.clone(),
            weight_version: r.weight_version.clone(),
            parse_outcome: r.parse_outcome.clone(),
            versions: r.versions.clone(),
            stale: plan.stale,
            prompt_drift: r.prompt_drift.clone(),
        })
        .collect();
    let start = Instant::now();
    let indices = calls
        .trajectories
        .commit(&plan.ctx, &plan.prepared, outcomes, body_at)
        .instrument(tracing::info_span!(target: PHASE, "commit"))
        .await?;
    crate::metrics::store_commit(start.elapsed());
    let prepared = &plan.prepared;
    let delta = prepared.prompt_ids.len() - prepared.delta_start;
    let kind = if prepared.parent.is_some() {
        "observation"
    } else {
        "prompt"
    };
    crate::metrics::tokens(kind, delta);
    let sampled = results.iter().map(|r| r.ids.len()).sum();
    crate::metrics::tokens("sampled", sampled);
    let policy = match &plan.ctx.adapter {
        Some(a) => Some(&*a.name),
        None => plan.ctx.model.as_deref(),
    };
    if let Some(policy) = policy {
        crate::metrics::policy_call(policy, sampled);
    }
    for r in results {
        let ends = r.versions.iter().skip(1).map(|v| v.start as usize);
        let ends = ends.chain(std::iter::once(r.ids.len()));
        for (span, end) in r.versions.iter().zip(ends) {
            let n = end.saturating_sub(span.start as usize);
            crate::metrics::version_tokens(span.version.as_deref(), n);
        }
    }
    for r in results {
        if r.logprobs.iter().any(|l| l.logprob.is_none()) {
            crate::metrics::call_without_logprobs(&r.backend);
        }
    }
    if let Some(d) = &prepared.drift {
        crate::metrics::drift(&d.cause);
    }
    Ok(indices.first().copied().filter(|_| body_at.is_none()))
}
