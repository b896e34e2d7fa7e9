//! HTTP layer: routes, shared state, server start-up and shutdown.
//!
//! Owns: the OpenAI-compatible surface (also under `/t/{trajectory_id}`),
//! trajectory id resolution, the context-window check. Must not: render
//! templates or speak backend wire formats itself (see `render`, `backend`).

mod admin;
mod chat;
mod completions;
mod detok;
pub mod export;
mod generate;
mod logprobs;
pub mod request;
mod sse;
mod toolcalls;
pub mod trajectories;

use std::future::Future;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde_json::json;

use crate::backend::{DynBackend, FinishReason, SamplingParams};
use crate::config::Config;
use crate::error::ApiError;
use crate::render::Renderer;
use crate::router::{RouteError, Router};
use crate::store::DynStore;
use crate::trajectory::{CallContext, ChoiceOutcome, Prepared, Trajectories, TrajectoryError};

pub use generate::{CallPlan, ChoiceResult};
pub use trajectories::StoreState;

/// Context window used when neither the config nor the model files say.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 32768;

/// Shared state, grouped by module.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub renderer: Arc<Renderer>,
    pub router: Arc<Router>,
    pub ops: Arc<admin::Ops>,
    pub trajectories: Arc<Trajectories>,
    pub store: StoreState,
}

impl FromRef<AppState> for StoreState {
    fn from_ref(state: &AppState) -> StoreState {
        state.store.clone()
    }
}

/// The `{tid}` of a `/t/{tid}/v1/...` route, if the route has one.
fn path_tid(params: &axum::extract::RawPathParams) -> Option<String> {
    params
        .iter()
        .find(|(k, _)| *k == "tid")
        .map(|(_, v)| v.to_string())
}

impl AppState {
    /// State over `backends` (in `[[backends]]` order) and a span store.
    pub fn new(
        config: Config,
        renderer: Arc<Renderer>,
        backends: Vec<DynBackend>,
        store: DynStore,
    ) -> anyhow::Result<AppState> {
        let router = Router::new(&config.router);
        for (b, cfg) in backends.into_iter().zip(&config.backends) {
            router.add_backend(b, cfg.url.clone())?;
        }
        let trajectories = Arc::new(Trajectories::new(
            store.clone(),
            renderer.clone(),
            config.trajectory.clone(),
        ));
        let traj = trajectories.clone();
        let forget: trajectories::FinishHook = Arc::new(move |id: &str| traj.forget(id));
        let dec = renderer.clone();
        let decode: trajectories::DecodeFn =
            Arc::new(move |ids: &[u32]| dec.decode(ids, false).ok());
        Ok(AppState {
            ops: Arc::new(admin::Ops::new(&config.server.admin_token)),
            config: Arc::new(config),
            renderer,
            router,
            trajectories,
            store: StoreState {
                store,
                decode: Some(decode),
                on_finish: Some(forget),
            },
        })
    }

    /// The context window in tokens.
    pub fn max_model_len(&self) -> u32 {
        match self.config.model.max_model_len {
            0 => self
                .renderer
                .max_model_len()
                .unwrap_or(DEFAULT_MAX_MODEL_LEN),
            n => n,
        }
    }

    fn check_model(&self, model: Option<&str>) -> Result<(), ApiError> {
        match model {
            Some(m) if m != self.config.model.name => Err(ApiError::model_not_found(m)),
            _ => Ok(()),
        }
    }

    /// Refuses a call whose sample has no response budget left.
    fn check_budget(&self, prepared: &Prepared) -> Result<(), ApiError> {
        if !prepared.truncated {
            return Ok(());
        }
        let limit = self.config.trajectory.response_length;
        Err(ApiError::bad_request(format!(
            "this trajectory's sample already holds {} response tokens, its budget is {limit} \
             (trajectory.response_length); start a new trajectory",
            prepared.response_used
        ))
        .with_code("response_budget_exhausted"))
    }

    /// Resolves `max_tokens` against the context window and the sample's
    /// response budget, and adds EOS ids.
    fn finalize_params(
        &self,
        params: &mut SamplingParams,
        prepared: &Prepared,
        max_tokens: Option<u32>,
    ) -> Result<(), ApiError> {
        let prompt_len = prepared.prompt_ids.len();
        let window = self.max_model_len() as usize;
        if prompt_len >= window {
            return Err(ApiError::bad_request(format!(
                "the prompt is {prompt_len} tokens long but this model's context window is {window} tokens"
            ))
            .with_code("context_length_exceeded"));
        }
        let room = window - prompt_len;
        params.max_tokens = match max_tokens {
            Some(m) if m as usize > room => {
                return Err(ApiError::bad_request(format!(
                    "this model's context window is {window} tokens, but {} were requested \
                     ({prompt_len} in the prompt, {m} for the completion)",
                    prompt_len + m as usize
                ))
                .with_code("context_length_exceeded"))
            }
            Some(m) => m,
            None => self.config.model.default_max_tokens.min(room as u32),
        };
        if let Some(left) = prepared.budget_left(self.config.trajectory.response_length) {
            params.max_tokens = params.max_tokens.min(left.max(1));
        }
        if !params.ignore_eos {
            for id in self.renderer.eos_token_ids() {
                if !params.stop_token_ids.contains(id) {
                    params.stop_token_ids.push(*id);
                }
            }
        }
        Ok(())
    }

    /// Hands a finished call to the span store; returns once it is durable.
    async fn record_call(
        &self,
        ctx: &CallContext,
        prepared: &Prepared,
        results: &[ChoiceResult],
        served: impl Fn(&ChoiceResult) -> (serde_json::Value, Option<String>),
    ) -> Result<Vec<u32>, ApiError> {
        let outcomes: Vec<ChoiceOutcome> = results
            .iter()
            .map(|r| {
                let (message, parse_outcome) = served(r);
                ChoiceOutcome {
                    sampled_ids: r.ids.clone(),
                    logprobs: r.logprobs.clone(),
                    finish_reason: r.finish,
                    served: message,
                    backend: r.backend.clone(),
                    moved_from: r.moved_from.clone(),
                    parse_outcome,
                }
            })
            .collect();
        let start = std::time::Instant::now();
        let indices = self.trajectories.commit(ctx, prepared, &outcomes).await?;
        crate::metrics::store_commit(start.elapsed());
        let delta = prepared.prompt_ids.len() - prepared.delta_start;
        let kind = if prepared.parent.is_some() {
            "observation"
        } else {
            "prompt"
        };
        crate::metrics::tokens(kind, delta);
        crate::metrics::tokens("sampled", results.iter().map(|r| r.ids.len()).sum());
        if let Some(d) = &prepared.drift {
            crate::metrics::drift(&d.cause);
        }
        Ok(indices)
    }
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

impl From<TrajectoryError> for ApiError {
    fn from(e: TrajectoryError) -> Self {
        match e {
            TrajectoryError::Finished(_) => {
                ApiError::new(StatusCode::CONFLICT, "invalid_request_error", e.to_string())
                    .with_code("conflict")
            }
            TrajectoryError::Render(r) => r.into(),
            TrajectoryError::Store(s) => ApiError::internal(format!("span store: {s}")),
        }
    }
}

pub(crate) fn finish_str(f: Option<FinishReason>) -> &'static str {
    f.map_or("stop", FinishReason::as_str)
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn new_id(prefix: &str) -> String {
    let r: u64 = rand::random();
    format!("{prefix}-{r:016x}")
}

pub const MAX_TRAJECTORY_ID_LEN: usize = 128;

/// Path prefix, else `X-Trajectory-Id`, else body `trajectory_id`, else a
/// new id. A new id is registered as an empty trajectory so its first call
/// does not look for history in the store.
pub fn resolve_trajectory_id(
    state: &AppState,
    path: Option<String>,
    headers: &HeaderMap,
    body: Option<&str>,
) -> Result<String, ApiError> {
    let header = match headers.get("x-trajectory-id") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| ApiError::invalid("X-Trajectory-Id", "X-Trajectory-Id must be ASCII"))?
                .to_string(),
        ),
        None => None,
    };
    let (source, id) = match (path, header, body) {
        (Some(p), _, _) => ("path", p),
        (None, Some(h), _) => ("X-Trajectory-Id", h),
        (None, None, Some(b)) => ("trajectory_id", b.to_string()),
        (None, None, None) => {
            let id = new_id("traj");
            state.trajectories.register_new(&id);
            return Ok(id);
        }
    };
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:@".contains(c);
    if id.is_empty() || id.len() > MAX_TRAJECTORY_ID_LEN || !id.chars().all(ok_char) {
        return Err(ApiError::invalid(
            source,
            format!(
                "invalid trajectory id {id:?} (from {source}): use 1 to {MAX_TRAJECTORY_ID_LEN} \
                 characters from A-Z a-z 0-9 - _ . : @"
            ),
        ));
    }
    Ok(id)
}

fn trajectory_header(tid: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(tid) {
        h.insert("x-trajectory-id", v);
    }
    h
}

async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model.name,
            "object": "model",
            "created": unix_now(),
            "owned_by": "tito",
            "max_model_len": state.max_model_len(),
        }]
    }))
}

async fn health() -> &'static str {
    "ok"
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// Maps axum's body-size rejection to an OpenAI-shaped 413.
async fn limit_errors(
    State(limit): State<usize>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let resp = next.run(req).await;
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE
        && resp.extensions().get::<ApiError>().is_none()
    {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "request body is larger than the limit of {limit} bytes (server.max_body_bytes)"
            ),
        )
        .with_code("request_too_large")
        .into_response();
    }
    resp
}

fn v1_routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models))
}

pub fn build_app(state: AppState) -> axum::Router {
    crate::metrics::init();
    let limit = state.config.server.max_body_bytes;
    let guarded =
        admin::routes()
            .merge(export::routes())
            .route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                admin::require_token,
            ));
    let metrics = axum::Router::new()
        .route("/metrics", get(crate::metrics::render))
        .with_state(state.router.clone());
    axum::Router::new()
        .merge(v1_routes())
        .nest("/t/{tid}", v1_routes())
        .merge(trajectories::routes())
        .merge(guarded)
        .route("/health", get(health))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(crate::metrics::track))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(limit, limit_errors))
        .with_state(state)
        .merge(metrics)
}

pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let renderer = Renderer::load(&config.model)?;
    let backends = crate::backend::build_backends(&config)?;
    let store = crate::store::open(&config.store.url)?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, model = %config.model.name, "tito listening");
    let state = AppState::new(config, renderer, backends, store)?;
    let health = state.router.start_health_checks();
    axum::serve(listener, build_app(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    health.stop().await;
    Ok(())
}
