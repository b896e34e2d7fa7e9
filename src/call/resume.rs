//! Continuing a choice that a weight update interrupted (`abort` mode), or
//! a change of its LoRA adapter in `abort` mode (the gateway then stops the
//! generation itself and the continuation waits for the change).
//!
//! The backend stopped the generation after some tokens; the choice keeps
//! them with their logprobs (from the old weights) and goes on with a new
//! request: the original prompt ids followed by every id sampled so far,
//! asking for what is left of `max_tokens`. It is routed like any call of
//! its trajectory (the sticky pin, or another backend when it moved) and
//! waits for admission, which the update holds until its commit, so it runs
//! on the new weights. The client sees one answer; the record is one call
//! whose [`VersionSpan`]s mark the seam.
//!
//! A choice an update in `keep` mode paused in place needs no new
//! request: its stream goes on, and the server's own report on its last
//! chunk ([`reported`]) says where the new weights began.
//!
//! A choice under an output constraint (`response_format`) cannot continue:
//! the backend's grammar would start again at the seam. A non-streamed one
//! starts over on the new weights (its client has seen nothing); a streamed
//! one fails, like any generation cut after its first token.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::StreamMap;

use super::assemble::ChoiceAssembly;
use super::start::{start_sequence, Started};
use super::CallPlan;
use crate::backend::{GenStream, GenerateRequest, ServerSpan};
use crate::error::ApiError;
use crate::router::adapters::AdapterUse;
use crate::router::Router;
use crate::store::VersionSpan;

/// A continuation being routed: which choice, and its start.
pub(super) type Resume = Pin<Box<dyn Future<Output = (u32, Result<Started, ApiError>)> + Send>>;

/// How an interrupted choice goes on.
pub(super) enum Continue {
    /// Prompt + the ids sampled so far.
    Extend,
    /// From its prompt again, the partial answer dropped (constrained,
    /// nothing streamed).
    Restart,
}

/// How `choice` (of `plan`) goes on after an interruption, or the error
/// that ends the call.
pub(super) fn how(plan: &CallPlan, streamed: bool) -> Result<Continue, ApiError> {
    match (&plan.params.structured, streamed) {
        (None, _) => Ok(Continue::Extend),
        (Some(_), false) => Ok(Continue::Restart),
        (Some(_), true) => Err(ApiError::overloaded(
            "an update in abort mode (of the weights or of the call's adapter) interrupted \
             this streamed call; a call under an output constraint (response_format) cannot \
             continue across it: retry the call",
        )),
    }
}

/// The continuation request of choice `i` of `plan`, which holds `choice`'s
/// sampled ids, as the `round`-th continuation of request `request_id`.
pub(super) fn request(
    request_id: &str,
    pi: usize,
    i: u32,
    round: u32,
    plan: &CallPlan,
    choice: &ChoiceAssembly,
) -> GenerateRequest {
    let sampled = &choice.result.ids;
    let mut params = plan.params.clone();
    if let Some(seed) = params.seed {
        params.seed = Some(seed.wrapping_add(i64::from(i)));
    }
    // The assembly ends the choice at `max_tokens` sampled in all, so at
    // least one is left here.
    params.max_tokens = params
        .max_tokens
        .saturating_sub(u32::try_from(sampled.len()).unwrap_or(u32::MAX))
        .max(1);
    let mut prompt = Vec::with_capacity(plan.prepared.prompt_ids.len() + sampled.len());
    prompt.extend_from_slice(&plan.prepared.prompt_ids);
    prompt.extend_from_slice(sampled);
    GenerateRequest {
        request_id: format!("{request_id}-{pi}-{i}-r{round}"),
        prompt_ids: Arc::new(prompt),
        params,
        images: plan.ctx.images.clone(),
        adapter: plan.ctx.adapter.as_ref().map(|a| a.name.clone()),
    }
}

/// Routes and starts `req` for the trajectory, waiting for admission. A
/// call on an adapter first takes its share again when an abort of the
/// adapter made it give the share back (`adapter`: the share and the aborts
/// answered), and fails when the abort unloaded it.
pub(super) fn start(
    router: Arc<Router>,
    trajectory_id: String,
    index: u32,
    req: GenerateRequest,
    adapter: Option<(AdapterUse, u64)>,
) -> Resume {
    Box::pin(async move {
        if let Some((a, seen)) = adapter {
            if !a.renew(seen).await {
                let e = ApiError::not_found(format!(
                    "the adapter `{}` was unloaded while this call ran; nothing was recorded",
                    a.name
                ))
                .with_param("model")
                .with_code("model_not_found");
                return (index, Err(e));
            }
        }
        (index, start_sequence(&router, &trajectory_id, req).await)
    })
}

/// Notes on the choice where its tokens now come from: a new span when the
/// weights differ from the last span's.
pub(super) fn seam(choice: &mut ChoiceAssembly, started: &Started) {
    let r = &mut choice.result;
    let start = u32::try_from(r.ids.len()).unwrap_or(u32::MAX);
    let same = r
        .versions
        .last()
        .is_some_and(|v| v.version == started.weight_version && v.seq == started.weight_seq);
    if !same {
        r.versions.push(VersionSpan {
            start,
            version: started.weight_version.clone(),
            seq: started.weight_seq,
        });
    }
    if r.backend != started.backend {
        if r.moved_from.is_none() {
            r.moved_from = Some(std::mem::take(&mut r.backend));
        }
        r.backend = started.backend.clone();
    }
}

/// A stream's own report of which weights sampled its tokens (a call an
/// update in `keep` mode paused in place): from the stream's first token
/// on, its runs replace the one span noted when it started. The first run
/// is the weights it started on; later ones are named by the labels tito
/// gave the server, numbered as the fleet numbered them.
pub(super) fn reported(choice: &mut ChoiceAssembly, spans: &[ServerSpan], router: &Router) {
    let r = &mut choice.result;
    // This stream's tokens start where its own span (the last) does.
    let Some(mut last) = r.versions.last().cloned() else {
        return;
    };
    let offset = last.start;
    for s in spans.iter().skip(1) {
        let start = offset.saturating_add(s.start);
        if Some(s.version.as_str()) == last.version.as_deref() || start <= last.start {
            continue;
        }
        let span = VersionSpan {
            start,
            version: Some(s.version.clone()),
            seq: router.seq_of(&s.version),
        };
        r.versions.push(span.clone());
        last = span;
    }
}

/// The span list of a choice that (re)starts from its prompt on `started`.
pub(super) fn first_span(started: &Started) -> Vec<VersionSpan> {
    vec![VersionSpan {
        start: 0,
        version: started.weight_version.clone(),
        seq: started.weight_seq,
    }]
}

/// Returns once a change in `abort` mode begins on the call's adapter after
/// the `seen`-th; never for a call on no adapter.
pub(super) async fn adapter_aborted(adapter: Option<&AdapterUse>, seen: u64) {
    match adapter {
        Some(a) => a.aborted_since(seen).await,
        None => std::future::pending().await,
    }
}

impl super::Pump {
    /// A change of the call's adapter in `abort` mode began: stops every
    /// generation on it and gives the share back, so the change goes on;
    /// each unfinished choice continues once the change settles.
    pub(super) fn adapter_cut(
        &mut self,
        streams: &mut StreamMap<u32, GenStream>,
        resumes: &mut futures::stream::FuturesUnordered<Resume>,
    ) -> Result<(), ApiError> {
        streams.clear();
        resumes.clear();
        if let Some(a) = &self.adapter {
            self.adapter_seen = a.aborts();
            a.release();
        }
        let open: Vec<u32> = (0..self.choices.len())
            .filter(|&i| self.choices.get(i).is_some_and(|c| !c.done()))
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        for index in open {
            crate::metrics::call_interrupted("adapter_abort");
            resumes.push(self.resume(index)?);
        }
        Ok(())
    }
}
