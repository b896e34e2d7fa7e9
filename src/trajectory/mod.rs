//! Trajectories: exact multi-turn token history.
//!
//! Owns: deciding which earlier call a new call continues, building its exact
//! prompt (earlier prompt + sampled ids verbatim + the template's rendering of
//! the new messages), drift diagnosis against a fresh render, the per-sample
//! response budget, and handing finished calls to the span store. Keeps a hot
//! in-memory view of active trajectories, rebuilt from the store on a miss
//! (after a restart). Must not: talk to backends or shape HTTP responses.

mod drift;
mod hot;
mod kept;
pub mod messages;
pub mod normalize;
mod prepare;
mod rebuild;
pub mod testing;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use serde_json::Value as Json;

pub use drift::{diagnose, first_difference, SegRange, Served, CAUSES};
pub use kept::HotCall;
use kept::{KeptPrompt, NewCall, WholePrompt};
pub use prepare::{ChatInput, Prepared};

use crate::backend::FinishReason;
use crate::config::{HistoryMode, TrajectoryConfig};
use crate::error::ApiError;
use crate::render::Renderer;
use crate::store::{
    now_ms, CallRecord, DynStore, SegmentKind, StoreError, TrajectoryMeta, TrajectoryMetadata,
    VersionSpan,
};
use crate::surface::{Api, Switches};

#[derive(Debug, thiserror::Error)]
pub enum TrajectoryError {
    #[error("trajectory `{0}` is finished and takes no more calls")]
    Finished(String),
    #[error("{0}")]
    Render(#[from] crate::render::RenderError),
    #[error("span store: {0}")]
    Store(#[from] StoreError),
}

impl From<TrajectoryError> for ApiError {
    fn from(e: TrajectoryError) -> Self {
        match e {
            TrajectoryError::Finished(_) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
                    .with_code("conflict")
            }
            TrajectoryError::Render(r) => r.into(),
            TrajectoryError::Store(s) => s.into(),
        }
    }
}

/// How a view stands against a shared store.
enum Standing {
    Current,
    /// The store holds calls (or a finish) the view has not seen.
    Behind(Box<TrajectoryMeta>),
    /// The store holds fewer calls than the view, or none.
    Diverged,
}

#[derive(Default)]
struct TrajState {
    loaded: bool,
    /// The gateway named this trajectory and it has no call yet: no other
    /// replica can know it, so a shared store need not be asked.
    named_here: bool,
    finished: bool,
    calls: Vec<Arc<HotCall>>,
    next_call: u32,
    next_sample: u32,
    /// Calls that already have a continuation in their own sample.
    continued: HashSet<u32>,
    served: HashMap<u32, Served>,
    /// The group and task metadata as stored.
    metadata: TrajectoryMetadata,
    /// Estimated bytes of `calls` (see [`hot::call_bytes`]).
    bytes: u64,
    /// When the trajectory began (the store's `created_at`, or this
    /// gateway's clock at its first call): the day a Harmony system
    /// message names on every call.
    created_at: Option<i64>,
    /// Images this view put in the store (each is put once per view).
    stored_images: HashSet<String>,
    /// Calls of the trajectory made by a model that tokenizes differently:
    /// in the store, not in this view.
    other_policy_calls: u32,
}

impl TrajState {
    fn push(&mut self, call: Arc<HotCall>) {
        self.bytes += hot::call_bytes(&call);
        self.calls.push(call);
    }
}

/// What the hot view derives from a call's sampled ids.
struct SampledInfo {
    text: String,
    /// The text can be joined to (see [`Renderer::decode_joinable`]).
    joinable: bool,
    served: Served,
}

/// One generated choice of a call, ready to record (and moved into the hot
/// view once recorded).
#[derive(Debug, Clone)]
pub struct ChoiceOutcome {
    pub sampled_ids: Vec<u32>,
    /// The backend's logprob of each sampled id (None where it gave none);
    /// the top alternatives are the client's, not the store's.
    pub logprobs: Vec<Option<f32>>,
    pub finish_reason: Option<FinishReason>,
    /// The message returned to the client (chat) or `{"text": ...}`.
    pub served: Arc<Json>,
    pub backend: String,
    pub moved_from: Option<String>,
    /// The weights of the backend that generated it.
    pub weight_version: Option<String>,
    pub parse_outcome: Option<String>,
    /// The weights that generated each run of `sampled_ids`
    /// ([`CallRecord::versions`]); empty when unknown.
    pub versions: Vec<VersionSpan>,
    /// Answered without a backend because the sample is past
    /// `[trajectory] max_staleness`: recorded with `finish_reason: "stale"`.
    pub stale: bool,
    /// The backend's prompt differed from the recorded one: recorded as the
    /// call's drift, before any the template's rendering showed.
    pub prompt_drift: Option<crate::store::Drift>,
}

/// Everything about a call besides its choices.
#[derive(Debug, Clone)]
pub struct CallContext {
    pub trajectory_id: String,
    pub request: Arc<Json>,
    /// The request's messages, normalized; None for a call no later turn
    /// continues: a /v1/completions call, or a `continue_final_message` one
    /// (its prompt ends inside the final message, not after a served turn).
    pub messages: Option<Arc<Vec<Json>>>,
    pub started_at: i64,
    /// The fleet's weight version when the call started: the tag of a
    /// choice no backend generated (a spent response budget).
    pub weight_version: Option<String>,
    /// Normalization rules applied to the request before rendering
    /// (see [`normalize`]).
    pub normalized: Vec<&'static str>,
    /// The surface the request came through.
    pub api: Api,
    /// The id the call's answer stays retrievable by (a Responses call
    /// with `store` on).
    pub response_id: Option<String>,
    /// Leading messages that come from the request's own instructions (a
    /// Responses call's `instructions`), which a call continuing this one
    /// by `previous_response_id` does not inherit.
    pub instructions: usize,
    /// The images of the prompt, in order; `None` for a text prompt.
    pub images: Option<crate::backend::ImageInputs>,
    /// The served model's name (`[model] name`): the policy the call's
    /// record names, with `adapter`.
    pub model: Option<Arc<str>>,
    /// The LoRA adapter serving the call, held until it is recorded;
    /// `None`: the model itself.
    pub adapter: Option<crate::router::adapters::AdapterUse>,
}

pub struct Trajectories {
    store: DynStore,
    renderer: Arc<Renderer>,
    config: TrajectoryConfig,
    end_of_turn: Vec<(u32, String)>,
    hot: Mutex<hot::HotMap>,
    /// The template switches the other surfaces may set.
    switches: Switches,
    /// Models with other tokenizers or templates write to the same
    /// trajectories ([`Trajectories::with_other_families`]).
    other_families: bool,
}

/// Store reloads one commit may do after finding its call slot taken.
const MAX_RELOADS: u32 = 3;

impl Trajectories {
    pub fn new(store: DynStore, renderer: Arc<Renderer>, config: TrajectoryConfig) -> Self {
        let end_of_turn = end_of_turn_tokens(&renderer);
        let switches = Switches {
            reasoning_effort: renderer.template_reads("reasoning_effort"),
            enable_thinking: renderer.template_reads("enable_thinking"),
        };
        Trajectories {
            store,
            renderer,
            end_of_turn,
            switches,
            hot: Mutex::new(hot::HotMap::new(config.hot_bytes)),
            config,
            other_families: false,
        }
    }

    /// A view beside views of models that tokenize differently: it skips
    /// their calls (they continue only each other) and checks the store
    /// for calls they added before each call, as a replica checks a shared
    /// store.
    pub fn with_other_families(mut self, on: bool) -> Self {
        self.other_families = on;
        self
    }

    /// Whether `rec` was made by a model this view's renderer does not
    /// tokenize for.
    fn other_policy(&self, rec: &CallRecord) -> bool {
        self.other_families
            && (rec.tokenizer_sha256 != self.renderer.tokenizer_sha256()
                || rec.template_sha256 != self.renderer.template_sha256())
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn mode(&self) -> HistoryMode {
        self.config.history
    }

    /// The chat template's switches the Responses and Messages surfaces set
    /// when it reads them.
    pub fn switches(&self) -> Switches {
        self.switches
    }

    /// The conversation a Responses call continuing call `call` of `tid`
    /// (by `previous_response_id`) starts from: that call's messages
    /// without its own instructions, then the message it served. `None`
    /// when the trajectory has no such call or no later turn continues it.
    pub async fn conversation(
        &self,
        tid: &str,
        call: u32,
    ) -> Result<Option<Vec<Json>>, TrajectoryError> {
        let state = self.loaded(tid).await?;
        let st = state.lock().await;
        let Some(c) = st.calls.iter().find(|c| c.call_index == call) else {
            return Ok(None);
        };
        Ok(c.messages()
            .map(|m| crate::surface::responses::continued(&m, c.instructions, &c.served)))
    }

    /// Ids of the end-of-turn tokens (EOS and friends) found in the vocabulary.
    pub fn end_of_turn_ids(&self) -> Vec<u32> {
        self.end_of_turn.iter().map(|(id, _)| *id).collect()
    }

    fn hot(&self) -> std::sync::MutexGuard<'_, hot::HotMap> {
        self.hot.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn state(&self, tid: &str) -> hot::Shared {
        self.hot().get_or_insert(tid)
    }

    /// Records what `tid`'s view takes now; evicts others to fit.
    fn resized(&self, tid: &str, st: &TrajState) {
        let mut hot = self.hot();
        hot.resize(tid, hot::trajectory_bytes(tid, st));
        crate::metrics::hot_bytes(hot.total_bytes());
    }

    /// Trajectories in the hot view and their estimated bytes.
    pub fn hot_usage(&self) -> (usize, u64) {
        let hot = self.hot();
        (hot.len(), hot.total_bytes())
    }

    /// Registers a trajectory the gateway just named: nothing to load.
    pub fn register_new(&self, tid: &str) {
        let state = self.state(tid);
        let lock = state.try_lock();
        if let Ok(mut st) = lock {
            st.loaded = true;
            st.named_here = true;
        }
    }

    /// Records a trajectory's group and task metadata before its call runs;
    /// writes to the store only when `tag` adds something (in practice on a
    /// trajectory's first call). A group other than its own is a conflict,
    /// answered before anything is generated.
    pub async fn tag(&self, tid: &str, tag: &TrajectoryMetadata) -> Result<(), TrajectoryError> {
        if tag.is_empty() {
            return Ok(());
        }
        let state = self.loaded(tid).await?;
        let mut st = state.lock().await;
        let merged = st.metadata.merged(tid, tag)?;
        if merged != st.metadata {
            st.metadata = self.store.set_metadata(tid, tag).await?.metadata;
        }
        Ok(())
    }

    /// Drops a trajectory from the hot view (e.g. when it is finished).
    pub fn forget(&self, tid: &str) {
        let mut hot = self.hot();
        hot.remove(tid);
        crate::metrics::hot_bytes(hot.total_bytes());
    }

    /// Makes sure the hot view of `tid` reflects the store, then returns it.
    async fn loaded(
        &self,
        tid: &str,
    ) -> Result<Arc<tokio::sync::Mutex<TrajState>>, TrajectoryError> {
        let state = self.state(tid);
        {
            let mut st = state.lock().await;
            // Only the first try: a retry after a failed first call asks.
            let unseen = std::mem::take(&mut st.named_here) && st.next_call == 0;
            let shared = self.store.shared() || self.other_families;
            if st.loaded && !unseen && shared && self.refresh(tid, &mut st).await? {
                crate::metrics::hot_stale_reloads(1);
                self.resized(tid, &st);
            }
            if !st.loaded {
                self.reload(tid, &mut st).await?;
                self.resized(tid, &st);
            }
            if st.finished {
                return Err(TrajectoryError::Finished(tid.to_string()));
            }
        }
        Ok(state)
    }

    /// Brings the view of `tid` up to the store when another replica wrote
    /// to it meanwhile: reads the calls it lacks, or reloads it whole when
    /// the store disagrees with it. Whether the view was behind.
    async fn refresh(&self, tid: &str, st: &mut TrajState) -> Result<bool, TrajectoryError> {
        match self.standing(tid, st).await? {
            Standing::Current => return Ok(false),
            Standing::Behind(meta) => self.catch_up(tid, st, &meta).await?,
            Standing::Diverged => self.reload(tid, st).await?,
        }
        Ok(true)
    }

    /// How the view of `tid` stands against a shared store, where another
    /// replica may have served the trajectory meanwhile.
    async fn standing(&self, tid: &str, st: &TrajState) -> Result<Standing, TrajectoryError> {
        let finished = |m: &TrajectoryMeta| m.status == crate::store::TrajectoryStatus::Finished;
        Ok(match self.store.get_meta(tid).await? {
            Some(m) if m.next_call_index == st.next_call && finished(&m) == st.finished => {
                Standing::Current
            }
            Some(m) if m.next_call_index >= st.next_call => Standing::Behind(Box::new(m)),
            Some(_) => Standing::Diverged,
            None if st.next_call == 0 => Standing::Current,
            None => Standing::Diverged,
        })
    }

    /// Replaces the view of `tid` with what the store holds.
    async fn reload(&self, tid: &str, st: &mut TrajState) -> Result<(), TrajectoryError> {
        *st = TrajState::default();
        if let Some(t) = self.store.get_trajectory(tid).await? {
            self.rebuild(st, t)?;
        }
        st.loaded = true;
        Ok(())
    }

    /// Decodes a call's sampled ids once and derives what the hot view keeps:
    /// the text (reused by continuations), what was served (for drift
    /// causes), and where a fresh tokenization of the text would differ.
    fn inspect_sampled(
        &self,
        served: &Json,
        sampled: &[u32],
    ) -> Result<SampledInfo, TrajectoryError> {
        let (text, joinable) = self.renderer.decode_joinable(sampled, false)?;
        let served = Served {
            reasoning: text.contains("<think>")
                || text.contains("</think>")
                || served
                    .get("reasoning_content")
                    .is_some_and(|r| !r.is_null()),
            tool_calls: served
                .get("tool_calls")
                .and_then(Json::as_array)
                .is_some_and(|a| !a.is_empty()),
        };
        Ok(SampledInfo {
            text,
            joinable,
            served,
        })
    }

    /// Stores the images of `ctx`'s prompt the trajectory has not stored yet
    /// (durable before any call names them); returns the calls' references.
    async fn put_images(
        &self,
        ctx: &CallContext,
        st: &mut TrajState,
    ) -> Result<Vec<crate::store::CallImage>, TrajectoryError> {
        let Some(inputs) = &ctx.images else {
            return Ok(Vec::new());
        };
        let new: Vec<crate::store::StoredImage> = inputs
            .images
            .iter()
            .filter(|im| !st.stored_images.contains(&im.sha256))
            .map(|im| crate::store::StoredImage {
                sha256: im.sha256.clone(),
                mime: im.mime.clone(),
                width: im.width,
                height: im.height,
                bytes: im.bytes.clone(),
            })
            .collect();
        if !new.is_empty() {
            self.store.put_images(&new).await?;
            st.stored_images.extend(new.into_iter().map(|im| im.sha256));
        }
        Ok(inputs
            .images
            .iter()
            .zip(inputs.offsets.iter())
            .map(|(im, &offset)| crate::store::CallImage {
                sha256: im.sha256.clone(),
                mime: im.mime.clone(),
                width: im.width,
                height: im.height,
                grid_thw: [im.grid.grid_t, im.grid.grid_h, im.grid.grid_w]
                    .map(|v| u32::try_from(v).unwrap_or(u32::MAX)),
                offset,
                tokens: u32::try_from(im.grid.pad_count).unwrap_or(u32::MAX),
            })
            .collect())
    }

    /// Records a finished call (one record per choice); returns once durable.
    /// The request body is stored once: with the first choice, or not at all
    /// when `request_of` names the call of the same HTTP request that holds
    /// it; every other record points there.
    /// Choice 0 continues the parent's sample unless another call already did
    /// (then it branches into a new sample), further choices always branch.
    ///
    /// When the store already holds a call slot the hot view thought free
    /// (another writer got there first), the view is rebuilt from the store
    /// and the choice is recorded in the next free slot.
    pub async fn commit(
        &self,
        ctx: &CallContext,
        prepared: &Prepared,
        mut choices: Vec<ChoiceOutcome>,
        mut request_of: Option<u32>,
    ) -> Result<Vec<u32>, TrajectoryError> {
        let state = match &prepared.held {
            Some(held) => held.0.clone(),
            None => self.state(&ctx.trajectory_id),
        };
        let mut st = state.lock().await;
        if !st.loaded {
            // Not prepared against the view (or it was evicted before the
            // hold began): the store's history is where this call goes.
            self.reload(&ctx.trajectory_id, &mut st).await?;
        }
        if st.finished {
            return Err(TrajectoryError::Finished(ctx.trajectory_id.clone()));
        }
        // What the view keeps of the prompt, shared by the choices.
        let prompt = KeptPrompt::new(
            prepared.parent.as_deref(),
            WholePrompt {
                messages: ctx.messages.as_ref(),
                ids: &prepared.prompt_ids,
                text: &prepared.prompt_text,
                segments: prepared.segments.as_slice(),
            },
        );
        let images = self.put_images(ctx, &mut st).await?;
        let finished_at = now_ms();
        let mut indices = Vec::with_capacity(choices.len());
        let mut reloads = 0;
        let mut i = 0;
        while let Some(choice) = choices.get(i) {
            let call_index = st.next_call;
            let parent = prepared.parent.as_ref();
            // Marked continued only once this call is stored: a failed
            // append leaves the parent free for the client's retry.
            let continues = parent.filter(|p| i == 0 && !st.continued.contains(&p.call_index));
            let sample_index = continues.map_or(st.next_sample, |p| p.sample_index);
            let budget_hit = self.config.response_length > 0
                && prepared.response_used + choice.sampled_ids.len()
                    >= self.config.response_length as usize
                && choice.finish_reason != Some(FinishReason::Stop);
            let truncated = prepared.truncated || budget_hit || parent.is_some_and(|p| p.truncated);
            let record = CallRecord {
                trajectory_id: ctx.trajectory_id.clone(),
                call_index,
                sample_index,
                parent_call: parent.map(|p| p.call_index),
                backend: choice.backend.clone(),
                started_at: ctx.started_at,
                finished_at,
                prompt_delta_ids: prepared.prompt_ids[prepared.delta_start..].to_vec(),
                sampled_ids: choice.sampled_ids.clone(),
                logprobs: choice
                    .logprobs
                    .iter()
                    .copied()
                    .chain(std::iter::repeat(None))
                    .take(choice.sampled_ids.len())
                    .collect(),
                finish_reason: if choice.stale {
                    "stale".to_string()
                } else {
                    choice
                        .finish_reason
                        .map_or("stop", FinishReason::as_str)
                        .to_string()
                },
                request: match request_of {
                    None => ctx.request.clone(),
                    Some(_) => Arc::new(Json::Null),
                },
                response: choice.served.clone(),
                drift: choice
                    .prompt_drift
                    .clone()
                    .or_else(|| prepared.drift.clone()),
                parse_outcome: choice.parse_outcome.clone(),
                moved_from: choice.moved_from.clone(),
                weight_version: if choice.backend.is_empty() {
                    ctx.weight_version.clone()
                } else {
                    choice.weight_version.clone()
                },
                tokenizer_sha256: self.renderer.tokenizer_sha256().to_string(),
                template_sha256: self.renderer.template_sha256().to_string(),
                reward: None,
                truncated,
                normalized: ctx.normalized.iter().map(|s| s.to_string()).collect(),
                request_of,
                api: Some(ctx.api.as_str().to_string()),
                // One call holds an id: the first choice's.
                response_id: ctx.response_id.clone().filter(|_| indices.is_empty()),
                // No weights generated an answer no backend gave (a spent
                // budget), nor any token of an empty one.
                versions: if choice.backend.is_empty() || choice.sampled_ids.is_empty() {
                    Vec::new()
                } else {
                    choice.versions.clone()
                },
                images: images.clone(),
                model: ctx.model.as_deref().map(str::to_string),
                adapter: ctx
                    .adapter
                    .as_ref()
                    .filter(|_| ctx.model.is_some())
                    .map(|a| a.name.to_string()),
            };
            match self.store.append_call(record).await {
                Ok(()) => {}
                Err(StoreError::Finished(t)) => {
                    st.finished = true;
                    return Err(TrajectoryError::Finished(t));
                }
                Err(StoreError::Duplicate { .. }) if reloads < MAX_RELOADS => {
                    reloads += 1;
                    tracing::warn!(trajectory = %ctx.trajectory_id, call = call_index,
                        "call slot already taken in the store; reading the calls the view lacks");
                    // The slot is taken, so the store is ahead of the view.
                    if !self.refresh(&ctx.trajectory_id, &mut st).await? {
                        self.reload(&ctx.trajectory_id, &mut st).await?;
                    }
                    if st.finished {
                        return Err(TrajectoryError::Finished(ctx.trajectory_id.clone()));
                    }
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
            if let Some(p) = continues {
                st.continued.insert(p.call_index);
            }
            st.next_call += 1;
            request_of = request_of.or(Some(call_index));
            if sample_index == st.next_sample {
                st.next_sample += 1;
            }
            let info = self.inspect_sampled(&choice.served, &choice.sampled_ids)?;
            st.served.insert(call_index, info.served);
            let response_used = prepared.response_used + choice.sampled_ids.len();
            // Recorded: what the view keeps moves out of the outcome.
            let choice = &mut choices[i];
            let call = Arc::new(HotCall::new(NewCall {
                call_index,
                sample_index,
                prompt: prompt.clone(),
                messages_hash: prepared.messages_hash,
                context: prepared.context,
                served: choice.served.clone(),
                sampled_ids: std::mem::take(&mut choice.sampled_ids),
                sampled_text: hot::kept_text(info.text),
                response_used,
                parent: prepared.parent.clone(),
                truncated,
                instructions: ctx.instructions,
                first_span: choice.versions.first().cloned(),
            }));
            st.push(call);
            indices.push(call_index);
            i += 1;
        }
        self.resized(&ctx.trajectory_id, &st);
        Ok(indices)
    }
}

/// The parent's segments, its sampled ids, then `delta` observation ids.
fn extend_segments(parent: &HotCall, delta: usize) -> Vec<SegRange> {
    let mut segs = parent.segments();
    let a = parent.prompt_len();
    let b = a + parent.sampled_ids.len();
    segs.push(SegRange {
        kind: SegmentKind::Sampled,
        call: parent.call_index,
        start: a,
        end: b,
    });
    if delta > 0 {
        segs.push(SegRange {
            kind: SegmentKind::Observation,
            call: parent.call_index,
            start: b,
            end: b + delta,
        });
    }
    segs
}

/// End-of-turn tokens: the tokenizer's EOS ids plus well-known turn
/// terminators present in the vocabulary.
fn end_of_turn_tokens(renderer: &Renderer) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = Vec::new();
    let mut add = |id: u32, text: String| {
        if !out.iter().any(|(i, _)| *i == id) {
            out.push((id, text));
        }
    };
    for id in renderer.eos_token_ids() {
        if let Some(t) = renderer.id_to_token(*id) {
            add(*id, t);
        }
    }
    for t in [
        "<|im_end|>",
        "<|eot_id|>",
        "<|eom_id|>",
        "<end_of_turn>",
        "<｜end▁of▁sentence｜>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "</s>",
    ] {
        if let Some(id) = renderer.token_to_id(t) {
            add(id, t.to_string());
        }
    }
    out
}
