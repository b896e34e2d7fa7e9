//! One LLM call's generation: pick a backend, start the sequence (retrying on
//! another backend while nothing has been generated), and turn backend events
//! into per-choice events carrying text deltas, exact ids and logprobs.
//!
//! Must not: know about chat vs completions response shapes.

use std::sync::Arc;

use futures::{Stream, StreamExt};

use super::detok::TextAssembler;
use super::AppState;
use crate::backend::{
    BackendError, FinishReason, GenEvent, GenStream, GenerateRequest, TokenLogprob,
};
use crate::error::ApiError;
use crate::render::Renderer;

/// What the client asked to be generated, after validation and rendering.
#[derive(Debug, Clone)]
pub struct CallPlan {
    pub request_id: String,
    pub trajectory_id: String,
    pub prompt_ids: Arc<Vec<u32>>,
    pub params: crate::backend::SamplingParams,
    pub n: u32,
    pub skip_special_tokens: bool,
    pub stream: bool,
}

/// A delta of one choice.
#[derive(Debug, Clone, Default)]
pub struct ChoiceEvent {
    pub index: u32,
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// A whole choice, collected.
#[derive(Debug, Clone, Default)]
pub struct ChoiceResult {
    pub index: u32,
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    pub backend: String,
    pub moved_from: Option<String>,
}

/// A started sequence on some backend. Holds the router's in-flight guard
/// until the sequence is dropped.
pub struct Started {
    pub index: u32,
    pub backend: String,
    pub moved_from: Option<String>,
    pub stream: GenStream,
}

/// How long a call waits for admission while backends sleep.
const ADMISSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Starts choice `index` of the plan. A backend that fails before producing
/// its first event is reported to the router and another one is tried, up
/// to `router.max_attempts`; after the first event nothing is retried.
pub async fn start_choice(
    state: &AppState,
    plan: &CallPlan,
    index: u32,
) -> Result<Started, ApiError> {
    let mut params = plan.params.clone();
    if let Some(seed) = params.seed {
        params.seed = Some(seed.wrapping_add(u64::from(index)));
    }
    let req = GenerateRequest {
        request_id: format!("{}-{index}", plan.request_id),
        prompt_ids: plan.prompt_ids.clone(),
        params,
        stream: plan.stream,
    };
    let router = &state.router;
    let t0 = std::time::Instant::now();
    let mut exclude = Vec::new();
    let mut moved_from: Option<String> = None;
    let mut last_err: Option<BackendError> = None;
    for _ in 0..router.max_attempts().max(1) {
        let route = match router
            .route_admitted(
                &plan.trajectory_id,
                &plan.prompt_ids,
                &exclude,
                ADMISSION_TIMEOUT,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => {
                return Err(match last_err {
                    Some(b) if !exclude.is_empty() => b.into(),
                    _ => e.into(),
                })
            }
        };
        if moved_from.is_none() {
            moved_from = route.moved_from.clone();
        }
        if route.moved_from.is_some() || !route.sticky {
            tracing::info!(trajectory = %plan.trajectory_id, backend = %route.name,
                moved_from = route.moved_from.as_deref().unwrap_or(""), "trajectory routed");
        }
        let first = match route.backend.generate(req.clone()).await {
            Ok(mut stream) => match stream.next().await {
                Some(Ok(ev)) => Ok((stream, ev)),
                Some(Err(e)) => Err(e),
                None => Err(BackendError::Protocol {
                    backend: route.name.to_string(),
                    message: "stream ended before any event".into(),
                }),
            },
            Err(e) => Err(e),
        };
        match first {
            Ok((stream, first)) => {
                router.report_success(route.id);
                crate::metrics::time_to_first_token(t0.elapsed());
                let backend = route.name.to_string();
                // The route (and its in-flight guard) lives as long as the stream.
                let stream: GenStream = Box::pin(
                    futures::stream::once(async { Ok(first) })
                        .chain(stream)
                        .map(move |ev| {
                            let _keep = &route;
                            ev
                        }),
                );
                return Ok(Started {
                    index,
                    backend,
                    moved_from,
                    stream,
                });
            }
            Err(e) => {
                router.report_error(route.id, &e);
                if !e.is_retryable() {
                    return Err(e.into());
                }
                tracing::warn!(backend = %route.name, error = %e, "backend failed before the first token; trying another");
                crate::metrics::retry(&route.name);
                exclude.push(route.id);
                last_err = Some(e);
            }
        }
    }
    Err(match last_err {
        Some(e) => e.into(),
        None => ApiError::overloaded("no healthy backend is available"),
    })
}

/// Turns a started sequence into choice events. Stop strings are applied
/// here; when one completes, the backend stream is dropped (cancelled).
pub fn choice_events(
    renderer: Arc<Renderer>,
    started: Started,
    plan: &CallPlan,
) -> impl Stream<Item = Result<ChoiceEvent, ApiError>> + Send + 'static {
    let index = started.index;
    let backend = started.backend.clone();
    let max_tokens = plan.params.max_tokens as usize;
    // Stop-token ids end the sequence; they stay in the ids but not the text.
    let stop_ids = plan.params.stop_token_ids.clone();
    let assembler =
        TextAssembler::new(renderer, plan.skip_special_tokens, plan.params.stop.clone());
    let state = (started.stream, assembler, 0usize, false);
    futures::stream::unfold(state, move |(mut stream, mut asm, mut count, done)| {
        let backend = backend.clone();
        let stop_ids = stop_ids.clone();
        async move {
            if done {
                return None;
            }
            loop {
                let ev = match stream.next().await {
                    None => {
                        let err = ApiError::from(BackendError::Protocol {
                            backend,
                            message: "stream ended without a finish reason".into(),
                        });
                        return Some((Err(err), (stream, asm, count, true)));
                    }
                    Some(Err(e)) => return Some((Err(e.into()), (stream, asm, count, true))),
                    Some(Ok(ev)) => ev,
                };
                match ev {
                    GenEvent::Tokens { ids, logprobs } => {
                        let mut out = ChoiceEvent {
                            index,
                            ..Default::default()
                        };
                        for (i, id) in ids.iter().enumerate() {
                            if !stop_ids.contains(id) {
                                out.text.push_str(&asm.push(*id));
                            }
                            out.ids.push(*id);
                            if let Some(lp) = logprobs.get(i) {
                                out.logprobs.push(lp.clone());
                            }
                            count += 1;
                            if asm.stopped() {
                                out.finish = Some(FinishReason::Stop);
                                break;
                            }
                            if max_tokens > 0 && count >= max_tokens {
                                // A backend that overshoots max_tokens is cut here.
                                out.finish = Some(FinishReason::Length);
                                break;
                            }
                        }
                        if out.finish.is_some() {
                            out.text.push_str(&asm.finish());
                            return Some((Ok(out), (stream, asm, count, true)));
                        }
                        if !out.ids.is_empty() {
                            return Some((Ok(out), (stream, asm, count, false)));
                        }
                    }
                    GenEvent::Done { finish_reason } => {
                        let out = ChoiceEvent {
                            index,
                            text: asm.finish(),
                            finish: Some(finish_reason),
                            ..Default::default()
                        };
                        return Some((Ok(out), (stream, asm, count, true)));
                    }
                }
            }
        }
    })
}

/// Runs every choice of the plan to completion (non-streaming path).
pub async fn run_all(state: &AppState, plan: &CallPlan) -> Result<Vec<ChoiceResult>, ApiError> {
    let futs = (0..plan.n).map(|i| async move {
        let started = start_choice(state, plan, i).await?;
        let backend = started.backend.clone();
        let moved_from = started.moved_from.clone();
        let mut events = Box::pin(choice_events(state.renderer.clone(), started, plan));
        let mut result = ChoiceResult {
            index: i,
            backend,
            moved_from,
            ..Default::default()
        };
        while let Some(ev) = events.next().await {
            let ev = ev?;
            result.text.push_str(&ev.text);
            result.ids.extend(ev.ids);
            result.logprobs.extend(ev.logprobs);
            if ev.finish.is_some() {
                result.finish = ev.finish;
            }
        }
        Ok::<_, ApiError>(result)
    });
    futures::future::try_join_all(futs).await
}
