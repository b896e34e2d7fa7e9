//! One LLM call's life, from a prepared prompt to a recorded answer:
//!
//! 1. **plan** ([`Calls::plan`]): sampling parameters resolved against the
//!    context window and the sample's response budget; the sampled token's
//!    logprob is always asked for, whatever the client asked.
//! 2. **start** ([`Calls::start`]): every choice is routed and started, with
//!    retries on another backend before its first token ([`start`]); errors
//!    here are plain HTTP errors.
//! 3. **run**: the call's pump reads the backends' events, assembles each
//!    choice ([`assemble`]) and forwards deltas to whoever answers the
//!    client. It runs in that reader's task, as the reader waits for events
//!    ([`Running`]). If the reader goes away before the last token, the
//!    backends are cancelled and nothing is recorded.
//! 4. **record**: after the last token the pump commits the call to the
//!    trajectory store itself. A reader dropped before then (a client gone)
//!    hands the pump to a task of its own, so a disconnect at any moment
//!    after the last token still records the call and advances the
//!    trajectory. Then the pump hands the [`Answer`] to the reader and to
//!    [`replies`] (retries and `Idempotency-Key`).
//!
//! Must not: parse HTTP requests or format response bodies and stream chunks
//! (see `api`); the assistant message it records is built in [`served`].

pub mod assemble;
mod record;
pub mod replies;
mod resume;
pub mod served;
pub mod start;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::StreamMap;

pub use assemble::{ChoiceEvent, ChoiceResult};
pub use served::{Output, ParseSetup};
pub use start::{start_sequence, Started};

use crate::backend::{
    BackendError, FinishReason, GenEvent, GenStream, GenerateRequest, SamplingParams,
};
use crate::config::{OnBudgetExhausted, OnStale, TrajectoryConfig};
use crate::error::ApiError;
use crate::render::Renderer;
use crate::router::Router;
use crate::trajectory::{CallContext, Prepared, Trajectories};
use assemble::ChoiceAssembly;

/// Runs calls: shared by every endpoint.
pub struct Calls {
    router: Arc<Router>,
    renderer: Arc<Renderer>,
    trajectories: Arc<Trajectories>,
    replies: Arc<replies::Replies>,
    config: TrajectoryConfig,
    max_model_len: u32,
    default_max_tokens: u32,
    /// The pumps of running calls, so shutdown can wait for their records.
    pumps: tokio_util::task::TaskTracker,
}

/// One prompt's call: what to generate, and what to record it against.
pub struct CallPlan {
    pub ctx: CallContext,
    pub prepared: Prepared,
    /// What the backend is asked (logprobs always on).
    pub params: SamplingParams,
    pub n: u32,
    pub skip_special_tokens: bool,
    pub output: Output,
    /// The sample's response budget is spent (or it is too stale): answer
    /// without a backend call.
    pub spent: bool,
    /// The sample is more than `max_staleness` versions behind.
    pub stale: bool,
}

/// What the client asked, before it becomes a [`CallPlan`].
pub struct PlanRequest {
    pub ctx: CallContext,
    pub prepared: Prepared,
    pub params: SamplingParams,
    pub max_tokens: Option<u32>,
    pub n: u32,
    pub skip_special_tokens: bool,
    pub output: Output,
}

/// A finished, recorded call: what is answered, and answered again to
/// retries.
#[derive(Debug)]
pub struct Answer {
    pub request_id: String,
    pub created: u64,
    pub trajectory_id: String,
    /// One prompt per plan (completions may have several).
    pub prompts: Vec<Arc<Vec<u32>>>,
    pub n: u32,
    /// By global index: prompt index × n + choice.
    pub choices: Vec<ChoiceResult>,
    /// Waiting on the backends: from the moment they are asked (routing
    /// and retries before the first token included) to the last token.
    pub generated_in: Duration,
}

impl Answer {
    pub fn completion_tokens(&self) -> usize {
        self.choices.iter().map(|c| c.ids.len()).sum()
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(|p| p.len()).sum()
    }

    /// Memory held (estimated), for the retry cache's bound: texts, ids,
    /// logprobs with their alternatives, the served message and the prompts.
    pub fn approx_bytes(&self) -> usize {
        use std::mem::size_of;
        let choices: usize = self
            .choices
            .iter()
            .map(|c| {
                let logprobs: usize = c
                    .logprobs
                    .iter()
                    .map(|l| {
                        size_of::<crate::backend::TokenLogprob>()
                            + l.top.len() * size_of::<(u32, f32)>()
                    })
                    .sum();
                256 + c.text.len()
                    + c.ids.len() * size_of::<u32>()
                    + logprobs
                    + crate::trajectory::messages::json_heap_bytes(&c.served)
            })
            .sum();
        let prompts: usize = self
            .prompts
            .iter()
            .map(|p| 64 + p.len() * size_of::<u32>())
            .sum();
        choices + prompts
    }
}

/// What the reader of a running call receives.
#[derive(Debug)]
pub enum CallEvent {
    Delta(ChoiceEvent),
    /// Every choice finished and the call is recorded (or it failed).
    Done(Result<Arc<Answer>, ApiError>),
}

/// A started call. Dropping it before the last token cancels the backends;
/// dropping it after, the call is still recorded.
pub struct Running {
    rx: mpsc::Receiver<CallEvent>,
    /// The call's pump, run in the reader's own task as the reader waits for
    /// events (no task of its own and no hand-off between two tasks per
    /// call). `None` once it has ended. A reader dropped before it ends hands
    /// it to a task of its own: see `Drop`. A reader busy elsewhere (a
    /// streaming client slow to take its chunks, at most
    /// `[server] sse_send_timeout_s` per chunk) holds the pump meanwhile.
    pump: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    pub request_id: String,
    pub prompts: Vec<Arc<Vec<u32>>>,
    pub n: u32,
}

impl Running {
    pub async fn next(&mut self) -> Option<CallEvent> {
        use std::task::Poll;
        use tokio::sync::mpsc::error::TryRecvError;
        let taken = |rx: &mut mpsc::Receiver<CallEvent>| match rx.try_recv() {
            Ok(ev) => Some(Some(ev)),
            Err(TryRecvError::Disconnected) => Some(None),
            Err(TryRecvError::Empty) => None,
        };
        std::future::poll_fn(|cx| {
            // While the pump runs in this task, what it sends is taken
            // without registering this task's waker on the channel: a
            // send would otherwise wake the task that is running it. The
            // pump's own wakers (backend sockets, the store's
            // acknowledgement, the channel's free capacity) wake this task.
            if let Some(pump) = self.pump.as_mut() {
                if let Some(ev) = taken(&mut self.rx) {
                    return Poll::Ready(ev);
                }
                if pump.as_mut().poll(cx).is_pending() {
                    return taken(&mut self.rx).map_or(Poll::Pending, Poll::Ready);
                }
                self.pump = None;
            }
            self.rx.poll_recv(cx)
        })
        .await
    }

    /// Waits for the recorded answer (the non-streaming path).
    pub async fn finish(mut self) -> Result<Arc<Answer>, ApiError> {
        while let Some(ev) = self.next().await {
            if let CallEvent::Done(result) = ev {
                return result;
            }
        }
        Err(ApiError::internal("the call ended without an answer"))
    }
}

impl Drop for Running {
    /// The reader left (a client disconnect) while the pump runs: the pump
    /// goes on in a task of its own, which sees the reader gone. Before the
    /// last token it stops and cancels the backends; after it, it records
    /// the call. It stays counted among the running calls either way.
    fn drop(&mut self) {
        if let Some(pump) = self.pump.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(pump)),
                // Only when the runtime itself is gone.
                Err(_) => tracing::warn!(
                    request_id = %self.request_id,
                    "a running call was dropped outside the runtime; it is not recorded"
                ),
            }
        }
    }
}

impl Calls {
    pub fn new(
        router: Arc<Router>,
        renderer: Arc<Renderer>,
        trajectories: Arc<Trajectories>,
        config: TrajectoryConfig,
        max_model_len: u32,
        default_max_tokens: u32,
    ) -> Calls {
        Calls {
            replies: replies::Replies::new(Duration::from_secs(config.retry_window_s)),
            router,
            renderer,
            trajectories,
            config,
            max_model_len,
            default_max_tokens,
            pumps: tokio_util::task::TaskTracker::new(),
        }
    }

    /// Calls running (generating or being recorded).
    pub fn running(&self) -> usize {
        self.pumps.len()
    }

    /// Waits up to `timeout` for every running call to end (recorded, or
    /// dropped by its reader); new calls can still start meanwhile. True
    /// when none is left.
    pub async fn wait_idle(&self, timeout: Duration) -> bool {
        self.pumps.close();
        let idle = tokio::time::timeout(timeout, self.pumps.wait())
            .await
            .is_ok();
        self.pumps.reopen();
        idle
    }

    pub fn max_model_len(&self) -> u32 {
        self.max_model_len
    }

    /// Looks a request up among recorded answers (see [`replies`]); a key
    /// reused with another body is a 409.
    pub async fn claim(&self, req: replies::Request) -> Result<replies::Claim, ApiError> {
        self.replies.claim(req).await.map_err(|replies::KeyReused| {
            ApiError::conflict(
                "this Idempotency-Key was used with a different request body; \
                 use a new key for a new request",
            )
            .with_code("idempotency_key_reused")
        })
    }

    /// Resolves `max_tokens` against the context window and the sample's
    /// response budget, adds EOS ids, and always asks for logprobs.
    pub fn plan(&self, req: PlanRequest) -> Result<CallPlan, ApiError> {
        let PlanRequest {
            ctx,
            prepared,
            mut params,
            max_tokens,
            n,
            skip_special_tokens,
            output,
        } = req;
        let stale = self.stale(&prepared)?;
        let spent = prepared.truncated || stale;
        if prepared.truncated && self.config.on_budget_exhausted == OnBudgetExhausted::Error {
            return Err(ApiError::bad_request(format!(
                "this trajectory's sample already holds {} response tokens, its budget is {} \
                 (trajectory.response_length); start a new trajectory",
                prepared.response_used, self.config.response_length
            ))
            .with_code("response_budget_exhausted"));
        }
        // What the backend is asked: the client's `max_tokens` (or the
        // default, within the window), capped by what is left of the
        // sample's response budget. The window is checked against that, so
        // an agent with a fixed `max_tokens` near its budget's end is capped,
        // not refused. A spent sample makes no backend call: nothing to check.
        let cap = |m: u32| match prepared.budget_left(self.config.response_length) {
            Some(left) => m.min(left.max(1)),
            None => m,
        };
        let prompt_len = prepared.prompt_ids.len();
        let window = self.max_model_len as usize;
        if prompt_len >= window && !spent {
            return Err(ApiError::bad_request(format!(
                "the prompt is {prompt_len} tokens long but this model's context window is {window} tokens"
            ))
            .with_code("context_length_exceeded"));
        }
        let room = window.saturating_sub(prompt_len);
        params.max_tokens = match max_tokens.map(cap) {
            Some(m) if m as usize > room && !spent => {
                return Err(ApiError::bad_request(format!(
                    "this model's context window is {window} tokens, but {} were requested \
                     ({prompt_len} in the prompt, {m} for the completion)",
                    prompt_len + m as usize
                ))
                .with_code("context_length_exceeded"))
            }
            Some(m) => m,
            None => cap(self.default_max_tokens.min(room as u32)),
        };
        if !params.ignore_eos {
            for id in self.renderer.eos_token_ids() {
                if !params.stop_token_ids.contains(id) {
                    params.stop_token_ids.push(*id);
                }
            }
        }
        // The sampled token's logprob is recorded on every call; the client's
        // own request only decides what its response carries.
        params.logprobs = Some(params.logprobs.unwrap_or(0));
        Ok(CallPlan {
            ctx,
            prepared,
            params,
            n,
            skip_special_tokens,
            output,
            spent,
            stale,
        })
    }

    /// Whether the sample this call continues started more than
    /// `[trajectory] max_staleness` versions before the fleet's current
    /// one; with `on_stale = "error"` that is a 409 naming both.
    fn stale(&self, prepared: &Prepared) -> Result<bool, ApiError> {
        let bound = self.config.max_staleness;
        let (Some(first), Some(now)) = (prepared.first_version(), self.router.weight_seq()) else {
            return Ok(false);
        };
        let Some(seq) = first.seq else {
            return Ok(false);
        };
        let behind = now.saturating_sub(seq);
        if bound == 0 || behind <= bound {
            return Ok(false);
        }
        if self.config.on_stale == OnStale::Error {
            let label = |v: Option<&str>| v.unwrap_or("(initial weights)").to_string();
            return Err(ApiError::conflict(format!(
                "this sample started on weight version {} (#{seq}); the fleet serves {} (#{now}),                  {behind} versions later, more than trajectory.max_staleness = {bound}: start a new trajectory",
                label(first.version.as_deref()),
                label(self.router.weight_version().as_deref()),
            ))
            .with_code("stale_trajectory"));
        }
        Ok(true)
    }

    /// Starts every choice of every plan and returns the running call, whose
    /// pump runs as its reader waits for events (see [`Running`]).
    /// `owner`, when given, is completed with the recorded answer.
    /// `deltas`: the reader streams, so send it each choice's deltas (a
    /// non-streaming reader only gets the answer).
    pub async fn start(
        self: &Arc<Self>,
        request_id: String,
        plans: Vec<CallPlan>,
        owner: Option<replies::Owner>,
        deltas: bool,
    ) -> Result<Running, ApiError> {
        let mut choices = Vec::new();
        let mut starts = Vec::new();
        for (pi, plan) in plans.iter().enumerate() {
            for i in 0..plan.n {
                let index = pi as u32 * plan.n + i;
                if plan.spent {
                    choices.push(ChoiceAssembly::spent(self.renderer.clone(), index));
                    continue;
                }
                let mut params = plan.params.clone();
                if let Some(seed) = params.seed {
                    params.seed = Some(seed.wrapping_add(i64::from(i)));
                }
                let req = GenerateRequest {
                    request_id: format!("{request_id}-{pi}-{i}"),
                    prompt_ids: plan.prepared.prompt_ids.clone(),
                    params,
                    images: plan.ctx.images.clone(),
                    adapter: plan.ctx.adapter.as_ref().map(|a| a.name.clone()),
                };
                let tid = &plan.ctx.trajectory_id;
                starts.push(async move {
                    start_sequence(&self.router, tid, req)
                        .await
                        .map(|s| (index, s))
                });
                choices.push(ChoiceAssembly::new(
                    self.renderer.clone(),
                    &plan.params,
                    plan.skip_special_tokens,
                    index,
                ));
            }
        }
        // Start all choices together; the first failure fails the call.
        let asked = Instant::now();
        let started = futures::future::try_join_all(starts).await?;
        let mut map = StreamMap::new();
        let mut interruptions = Vec::with_capacity(started.len());
        for (index, s) in started {
            if let Some(c) = choices.get_mut(index as usize) {
                c.result.versions = resume::first_span(&s);
                c.result.backend = s.backend;
                c.result.moved_from = s.moved_from;
                c.result.weight_version = s.weight_version;
            }
            interruptions.push((index, s.interruption));
            map.insert(index, s.stream);
        }
        let (tx, rx) = mpsc::channel(64);
        let prompts = plans
            .iter()
            .map(|p| p.prepared.prompt_ids.clone())
            .collect();
        let n = plans.first().map_or(1, |p| p.n);
        // Every plan of a request is on the same policy.
        let adapter = plans.first().and_then(|p| p.ctx.adapter.clone());
        let adapter_seen = adapter.as_ref().map_or(0, |a| a.admitted_at());
        let pump = Pump {
            calls: self.clone(),
            request_id: request_id.clone(),
            plans,
            choices,
            tx,
            owner,
            deltas,
            asked,
            interruptions,
            reported: Vec::new(),
            resumed: 0,
            adapter,
            adapter_seen,
        };
        // In the request's span: its log lines carry the request id.
        let pump = self
            .pumps
            .track_future(tracing::Instrument::in_current_span(pump.run(map)));
        Ok(Running {
            rx,
            pump: Some(Box::pin(pump)),
            request_id,
            prompts,
            n,
        })
    }
}

/// What runs a started call to its recorded end: in its reader's task, or
/// in a task of its own once the reader has left.
struct Pump {
    calls: Arc<Calls>,
    request_id: String,
    plans: Vec<CallPlan>,
    choices: Vec<ChoiceAssembly>,
    tx: mpsc::Sender<CallEvent>,
    owner: Option<replies::Owner>,
    deltas: bool,
    /// When the backends were asked.
    asked: Instant,
    /// Each running choice's view of weight-update interruptions.
    interruptions: Vec<(u32, crate::router::Interruption)>,
    /// Choices whose stream reported its weight versions itself.
    reported: Vec<u32>,
    /// Continuations started so far (numbers their request ids).
    resumed: u32,
    /// The LoRA adapter's share, and the count of adapter aborts this call
    /// has answered (see [`crate::router::adapters`]).
    adapter: Option<crate::router::adapters::AdapterUse>,
    adapter_seen: u64,
}

/// What the pump's wait ended with.
enum Next {
    Event(Option<(u32, Result<GenEvent, BackendError>)>),
    Resumed(Option<(u32, Result<Started, ApiError>)>),
    /// A change of the call's adapter in `abort` mode began.
    AdapterAborted,
}

impl Pump {
    async fn run(mut self, mut streams: StreamMap<u32, GenStream>) {
        let mut resumes = futures::stream::FuturesUnordered::<resume::Resume>::new();
        while !streams.is_empty() || !resumes.is_empty() {
            let next = tokio::select! {
                // A ready backend event goes first: a call whose last event
                // already arrived is recorded even if its reader just left.
                biased;
                ev = streams.next(), if !streams.is_empty() => Next::Event(ev),
                r = resumes.next(), if !resumes.is_empty() => Next::Resumed(r),
                () = resume::adapter_aborted(self.adapter.as_ref(), self.adapter_seen) => {
                    Next::AdapterAborted
                }
                // The reader left before the last token: dropping the
                // streams cancels the backends; nothing is recorded.
                () = self.tx.closed() => return,
            };
            let (index, ev) = match next {
                Next::Event(Some(ev)) => ev,
                Next::Event(None) | Next::Resumed(None) => continue,
                Next::Resumed(Some((index, Ok(started)))) => {
                    self.continue_on(index, started, &mut streams);
                    continue;
                }
                Next::Resumed(Some((_, Err(e)))) => {
                    let _ = self.tx.send(CallEvent::Done(Err(e))).await;
                    return;
                }
                Next::AdapterAborted => {
                    if let Err(e) = self.adapter_cut(&mut streams, &mut resumes) {
                        let _ = self.tx.send(CallEvent::Done(Err(e))).await;
                        return;
                    }
                    continue;
                }
            };
            if let Ok(GenEvent::Versions(spans)) = &ev {
                self.server_versions(index, spans);
                continue;
            }
            if let Ok(GenEvent::PromptDrift(drift)) = ev {
                if let Some(c) = self.choices.get_mut(index as usize) {
                    c.result.prompt_drift.get_or_insert(drift);
                }
                continue;
            }
            let aborted = matches!(
                ev,
                Ok(GenEvent::Done {
                    finish_reason: FinishReason::Abort
                })
            );
            let Some(choice) = self.choices.get_mut(index as usize) else {
                continue;
            };
            if aborted && !choice.done() && self.interrupted(index) {
                // Stopped by a weight update: continue on the new weights.
                streams.remove(&index);
                crate::metrics::call_interrupted("abort");
                match self.resume(index) {
                    Ok(r) => resumes.push(r),
                    Err(e) => {
                        let _ = self.tx.send(CallEvent::Done(Err(e))).await;
                        return;
                    }
                }
                continue;
            }
            let Some(choice) = self.choices.get_mut(index as usize) else {
                continue;
            };
            let ev = ev.and_then(|ev| match ev {
                // Cut by the backend (an operator's abort, or the backend's
                // own): not a sample the model ended, so not recorded; the
                // client's retry generates it again.
                GenEvent::Done {
                    finish_reason: FinishReason::Abort,
                } if !choice.done() => Err(BackendError::Overloaded {
                    backend: choice.result.backend.clone(),
                    message: "aborted the request after its first token; nothing was recorded"
                        .into(),
                }),
                ev => Ok(ev),
            });
            match ev {
                Ok(ev) => {
                    let delta = choice.push(ev, self.deltas);
                    if choice.done() {
                        // A stop string or max_tokens may end a choice before
                        // its backend does: stop that backend now.
                        streams.remove(&index);
                    }
                    if let Some(d) = delta {
                        let _ = self.tx.send(CallEvent::Delta(d)).await;
                    }
                }
                Err(e) => {
                    let _ = self.tx.send(CallEvent::Done(Err(e.into()))).await;
                    return;
                }
            }
        }
        if let Some(c) = self.choices.iter().find(|c| !c.done()) {
            let e = ApiError::from(crate::backend::BackendError::Protocol {
                backend: c.result.backend.clone(),
                message: "stream ended without a finish reason".into(),
            });
            let _ = self.tx.send(CallEvent::Done(Err(e))).await;
            return;
        }
        let generated_in = self.asked.elapsed();
        // A choice an update kept paused in place whose stream did not say
        // where the new weights begin (it ended before its last chunk, or
        // the server does not report versions): which weights sampled which
        // token is unknown, and recorded as such.
        for (index, it) in &self.interruptions {
            if it.kept() && !self.reported.contains(index) {
                if let Some(c) = self.choices.get_mut(*index as usize) {
                    c.result.versions.clear();
                }
            }
        }
        // After the last token: record. A reader that leaves now hands this
        // pump to a task of its own (`Drop for Running`).
        let result = self.record(generated_in).await;
        if let (Ok(answer), Some(owner)) = (&result, self.owner.take()) {
            owner.complete(answer.clone());
        }
        let _ = self.tx.send(CallEvent::Done(result)).await;
    }

    /// Whether a weight update interrupted choice `index`'s backend since
    /// its stream was routed.
    fn interrupted(&self, index: u32) -> bool {
        self.interruptions
            .iter()
            .any(|(i, it)| *i == index && it.happened())
    }

    /// A stream's own report of its versions (see [`resume::reported`]).
    fn server_versions(&mut self, index: u32, spans: &[crate::backend::ServerSpan]) {
        if let Some(choice) = self.choices.get_mut(index as usize) {
            resume::reported(choice, spans, &self.calls.router);
            self.reported.push(index);
        }
    }

    /// The continuation of interrupted choice `index` (see [`resume`]).
    fn resume(&mut self, index: u32) -> Result<resume::Resume, ApiError> {
        let n = self.plans.first().map_or(1, |p| p.n).max(1);
        let pi = (index / n) as usize;
        let i = index % n;
        let (Some(plan), Some(choice)) = (self.plans.get(pi), self.choices.get(index as usize))
        else {
            return Err(ApiError::internal("an interrupted choice has no plan"));
        };
        self.resumed += 1;
        let req = match resume::how(plan, self.deltas)? {
            resume::Continue::Extend => {
                resume::request(&self.request_id, pi, i, self.resumed, plan, choice)
            }
            resume::Continue::Restart => {
                let fresh = ChoiceAssembly::new(
                    self.calls.renderer.clone(),
                    &plan.params,
                    plan.skip_special_tokens,
                    index,
                );
                let req = resume::request(&self.request_id, pi, i, self.resumed, plan, &fresh);
                if let Some(c) = self.choices.get_mut(index as usize) {
                    *c = fresh;
                }
                req
            }
        };
        Ok(resume::start(
            self.calls.router.clone(),
            plan.ctx.trajectory_id.clone(),
            index,
            req,
            self.adapter.clone().map(|a| (a, self.adapter_seen)),
        ))
    }

    /// A continuation started: its stream feeds choice `index` from here.
    fn continue_on(
        &mut self,
        index: u32,
        started: Started,
        streams: &mut StreamMap<u32, GenStream>,
    ) {
        let Some(choice) = self.choices.get_mut(index as usize) else {
            return;
        };
        if choice.result.ids.is_empty() {
            // Started over (or nothing was sampled yet).
            choice.result.versions = resume::first_span(&started);
            choice.result.weight_version = started.weight_version.clone();
            choice.result.backend = started.backend.clone();
        } else {
            resume::seam(choice, &started);
        }
        crate::metrics::call_resumed();
        self.interruptions.retain(|(i, _)| *i != index);
        self.interruptions.push((index, started.interruption));
        streams.insert(index, started.stream);
    }

    async fn record(&mut self, generated_in: Duration) -> Result<Arc<Answer>, ApiError> {
        let calls = &self.calls;
        let mut results: Vec<ChoiceResult> = std::mem::take(&mut self.choices)
            .into_iter()
            .map(|c| c.result)
            .collect();
        // Choices are in global index order: plan pi holds pi*n .. pi*n + n.
        let mut body_at = None;
        for (pi, plan) in self.plans.iter().enumerate() {
            let n = plan.n as usize;
            let Some(mine) = results.get_mut(pi * n..pi * n + n) else {
                continue;
            };
            for r in mine.iter_mut() {
                served::serve(&plan.output, r);
            }
            // Every call of this request shares the body stored first.
            let stored = record::record_plan(calls, plan, mine, body_at).await?;
            body_at = body_at.or(stored);
        }
        Ok(Arc::new(Answer {
            request_id: self.request_id.clone(),
            created: unix_now(),
            trajectory_id: self
                .plans
                .first()
                .map(|p| p.ctx.trajectory_id.clone())
                .unwrap_or_default(),
            prompts: self
                .plans
                .iter()
                .map(|p| p.prepared.prompt_ids.clone())
                .collect(),
            n: self.plans.first().map_or(1, |p| p.n),
            choices: results,
            generated_in,
        }))
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
