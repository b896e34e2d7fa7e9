//! HTTP layer: routes, shared state, server start-up and shutdown.
//!
//! Owns: the OpenAI-compatible surfaces (Chat Completions, Completions,
//! Responses) and Anthropic's Messages, also under `/t/{trajectory_id}`;
//! trajectory id resolution, the context-window check. Must not: render
//! templates or speak backend wire formats itself (see `render`, `backend`).

mod admin;
mod admin_adapters;
mod around;
pub mod auth;
mod chat;
mod completions;
mod count;
pub mod export;
pub mod gateway;
mod image_fetch;
mod images;
mod logprobs;
mod messages;
mod metrics;
mod models;
mod openapi;
pub mod request;
pub mod request_id;
mod responses;
mod run;
mod serve;
mod sse;
mod stream;
pub mod trajectories;
pub mod ui;
mod unsupported;
mod verify;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRef, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde_json::json;

use crate::backend::DynBackend;
use crate::call::{replies, Calls};
use crate::config::Config;
use crate::error::ApiError;
use crate::render::Renderer;
use crate::router::Router;
use crate::store::{DynStore, TrajectoryMetadata};
use crate::trajectory::Trajectories;

pub use gateway::{AdminModel, Gateway, Picked};
pub use serve::{build_backends, serve};
pub use trajectories::StoreState;

/// Context window used when neither the config nor the model files say.
pub const DEFAULT_MAX_MODEL_LEN: u32 = 32768;

/// Shared state, grouped by module: one `Arc`, so the clone each request's
/// handler takes is one reference count, not one per part
/// ([`AppParts`]).
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl std::ops::Deref for AppState {
    type Target = AppParts;
    fn deref(&self) -> &AppParts {
        &self.0
    }
}

/// What [`AppState`] shares.
pub struct AppParts {
    pub config: Arc<Config>,
    pub renderer: Arc<Renderer>,
    pub router: Arc<Router>,
    pub trajectories: Arc<Trajectories>,
    pub calls: Arc<Calls>,
    pub store: StoreState,
    /// Tokens per role.
    pub auth: Arc<auth::Auth>,
    /// Unix seconds when this state was built: the model's `created`.
    pub started: u64,
    /// Fetches `http(s)://` images, when `[model] image_fetch` is on.
    pub(crate) image_fetch: image_fetch::Fetch,
    /// Images checked lately (see [`images::Recent`]).
    pub(crate) recent_images: images::Recent,
    /// The LoRA adapters served, by name.
    pub adapters: Arc<crate::router::adapters::Adapters>,
    /// `[model] name`, shared by every call's record.
    pub model_name: Arc<str>,
    /// The other models served beside this one.
    pub peers: gateway::Peers,
}

impl FromRef<AppState> for StoreState {
    fn from_ref(state: &AppState) -> StoreState {
        state.store.clone()
    }
}

/// What a route's path names: the `{tid}` of `/t/{tid}/v1/...` and the
/// `{gid}` of `/g/{gid}/t/{tid}/v1/...`.
#[derive(Debug, Default)]
pub struct PathIds {
    pub tid: Option<String>,
    pub gid: Option<String>,
}

impl PathIds {
    fn of(params: &axum::extract::RawPathParams) -> PathIds {
        let get = |name: &str| {
            params
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        PathIds {
            tid: get("tid"),
            gid: get("gid"),
        }
    }
}

/// The parsers suit the chat format: Harmony output is read by
/// `openai-harmony` (`gpt_oss`), any other by the text parsers.
fn check_parsers(model: &crate::config::ModelConfig, renderer: &Renderer) -> anyhow::Result<()> {
    const GPT_OSS: &str = "gpt_oss";
    let (tool, reasoning) = (&model.tool_parser, &model.reasoning_parser);
    if renderer.harmony().is_some() {
        if tool != GPT_OSS && tool != "none" {
            anyhow::bail!(
                "model.tool_parser = {tool:?}: the Harmony format's tool calls are read by \
                 openai-harmony: set \"gpt_oss\" (or \"none\")"
            );
        }
        if reasoning != GPT_OSS {
            anyhow::bail!(
                "model.reasoning_parser = {reasoning:?}: the Harmony format's analysis channel \
                 is read by openai-harmony: set \"gpt_oss\""
            );
        }
    } else if let Some((key, value)) = [("tool_parser", tool), ("reasoning_parser", reasoning)]
        .into_iter()
        .find(|(_, v)| *v == GPT_OSS)
    {
        anyhow::bail!(
            "model.{key} = {value:?}: gpt_oss reads the Harmony format; it needs \
             [model] chat_template = \"harmony\""
        );
    }
    Ok(())
}

/// Leads the store's weight version while an update is under way or failed
/// on some backend (versions hold no control character).
pub(crate) const IN_DOUBT: char = '\u{1}';

impl AppState {
    /// State over `backends` (in `[[backends]]` order) and a span store.
    pub fn new(
        config: Config,
        renderer: Arc<Renderer>,
        backends: Vec<DynBackend>,
        store: DynStore,
    ) -> anyhow::Result<AppState> {
        let trajectories = Arc::new(Trajectories::new(
            store.clone(),
            renderer.clone(),
            config.trajectory.clone(),
        ));
        AppState::build(config, renderer, backends, store, trajectories, true)
    }

    /// State of one served model over `trajectories` (shared by the
    /// models that tokenize alike, see [`Gateway`]); `primary`: the
    /// gateway's first model.
    fn build(
        config: Config,
        renderer: Arc<Renderer>,
        backends: Vec<DynBackend>,
        store: DynStore,
        trajectories: Arc<Trajectories>,
        primary: bool,
    ) -> anyhow::Result<AppState> {
        // A backend that knows its context (the in-process engine) bounds
        // the window: a prompt it cannot hold is refused here, naming both
        // numbers, and the room left for output is counted against it.
        let backend_len = backends.iter().filter_map(|b| b.max_model_len()).min();
        check_parsers(&config.model, &renderer)?;
        let router = Router::new(&config.router);
        for (b, cfg) in backends.into_iter().zip(&config.backends) {
            router.add_backend(b, cfg.url.clone())?;
        }
        let (traj, pins) = (trajectories.clone(), router.clone());
        let forget: trajectories::FinishHook = Arc::new(move |id: &str| {
            traj.forget(id);
            pins.unpin(id);
        });
        let pad_id = renderer.pad_token_id().unwrap_or(0);
        let pixel_values = match renderer.vision() {
            None => {
                Err("pixel_values=true needs a vision model ([model] vision is \"none\")".into())
            }
            Some(v) => crate::render::pixel_values::PixelConfig::from_model_dir(
                *v,
                &config.model.tokenizer,
            )
            .map_err(|e| format!("pixel_values=true: {e}")),
        };
        let dec = renderer.clone();
        let decode: trajectories::DecodeFn =
            Arc::new(move |_: Option<&str>, ids: &[u32]| dec.decode(ids, false).ok());
        let max_model_len = match config.model.max_model_len {
            0 => renderer.max_model_len().unwrap_or(DEFAULT_MAX_MODEL_LEN),
            n => n,
        };
        let max_model_len = backend_len.map_or(max_model_len, |b| b.min(max_model_len));
        let on_finish = crate::verify::background::finish_hook(
            forget,
            &config.verify,
            (
                Arc::from(config.model.name.as_str()),
                router.clone(),
                primary,
            ),
            store.clone(),
            max_model_len as usize,
        );
        let calls = Arc::new(Calls::new(
            router.clone(),
            renderer.clone(),
            trajectories.clone(),
            config.trajectory.clone(),
            max_model_len,
            config.model.default_max_tokens,
        ));
        Ok(AppState(Arc::new(AppParts {
            started: unix_now(),
            peers: gateway::Peers::default(),
            model_name: Arc::from(config.model.name.as_str()),
            image_fetch: image_fetch::Fetch::new(&config.model)?,
            recent_images: images::Recent::new(RECENT_IMAGE_BYTES),
            adapters: Arc::new(crate::router::adapters::Adapters::from_config(
                &config.model.adapters,
            )),
            calls,
            auth: Arc::new(auth::Auth::from_config(&config)?),
            config: Arc::new(config),
            renderer,
            router,
            trajectories,
            store: StoreState {
                pixel_values,
                pad_id,
                store,
                decode: Some(decode),
                on_finish: Some(on_finish),
            },
        })))
    }

    /// Takes up what the store remembers of the last run: the fleet's
    /// weight version.
    pub async fn restore(&self) -> anyhow::Result<()> {
        match self.store.store.weight_version().await? {
            Some(v) if v.starts_with(IN_DOUBT) => tracing::warn!(
                update = %v.trim_start_matches(IN_DOUBT),
                "a weight update had not succeeded on every backend when tito stopped: \
                 what each backend serves is unknown, so calls are recorded without a \
                 weight version until an update succeeds everywhere"
            ),
            Some(v) if !v.is_empty() => {
                let seq = self.store.store.register_version(&v).await?;
                tracing::info!(version = %v, seq, "weight version restored from the store");
                self.router.set_weight_version(&v, Some(seq));
            }
            _ => {}
        }
        Ok(())
    }

    /// The context window in tokens.
    pub fn max_model_len(&self) -> u32 {
        self.calls.max_model_len()
    }

    /// OpenAI's `system_fingerprint`: this build and the served weights.
    pub fn system_fingerprint(&self) -> String {
        let weights = self.router.weight_version();
        format!(
            "tito-{}-{}",
            env!("CARGO_PKG_VERSION"),
            weights.as_deref().unwrap_or("initial")
        )
    }

    /// A request starts `prompts × n` sequences: bounded by
    /// `[server] max_sequences_per_request`.
    fn check_sequences(&self, prompts: usize, n: u32) -> Result<(), ApiError> {
        let limit = self.config.server.max_sequences_per_request;
        let asked = prompts.saturating_mul(n as usize);
        if asked > limit as usize {
            return Err(ApiError::invalid(
                "n",
                format!(
                    "this request asks for {asked} sequences ({prompts} prompts × n = {n}); \
                     the limit is {limit} (server.max_sequences_per_request)"
                ),
            ));
        }
        Ok(())
    }
}

pub(crate) use crate::call::unix_now;

pub(crate) fn new_id(prefix: &str) -> String {
    let r: u64 = rand::random();
    format!("{prefix}-{r:016x}")
}

/// A trajectory id the gateway names: `traj-`, the time in milliseconds (12
/// hex digits) and 64 random bits (16 hex digits). Unique without
/// coordination between replicas, and in time order, so the store's index of
/// trajectory ids grows at its end: a random id would land on an index page
/// of its own and add one more dirty page to each commit.
pub(crate) fn new_trajectory_id() -> String {
    // The clock before 1970 would make a negative time: 0 then.
    let ms = crate::store::now_ms().max(0);
    let r: u64 = rand::random();
    format!("traj-{ms:012x}{r:016x}")
}

pub const MAX_TRAJECTORY_ID_LEN: usize = 128;

/// A trajectory or group id as the client named it: path, else header, else
/// body field; checked, or None when it named none.
fn named_id(
    what: &str,
    path: Option<String>,
    (header_name, header): (&str, Option<&HeaderValue>),
    (field, body): (&str, Option<&str>),
) -> Result<Option<String>, ApiError> {
    let header = match header {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| {
                    ApiError::invalid(header_name, format!("{header_name} must be ASCII"))
                })?
                .to_string(),
        ),
        None => None,
    };
    let (source, id) = match (path, header, body) {
        (Some(p), _, _) => ("path", p),
        (None, Some(h), _) => (header_name, h),
        (None, None, Some(b)) => (field, b.to_string()),
        (None, None, None) => return Ok(None),
    };
    check_id(what, source, &id)?;
    Ok(Some(id))
}

/// Ids (trajectories, groups) are path segments: 1 to
/// [`MAX_TRAJECTORY_ID_LEN`] characters from a safe set, not only dots
/// (HTTP clients resolve `.` and `..` away, so such a trajectory could not
/// be shown, rewarded or finished).
pub(crate) fn check_id(what: &str, source: &str, id: &str) -> Result<(), ApiError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "-_.:@".contains(c);
    let dots = id.bytes().all(|b| b == b'.');
    if dots || id.len() > MAX_TRAJECTORY_ID_LEN || !id.chars().all(ok_char) {
        return Err(ApiError::invalid(
            source,
            format!(
                "invalid {what} id {id:?} (from {source}): use 1 to {MAX_TRAJECTORY_ID_LEN} \
                 characters from A-Z a-z 0-9 - _ . : @, not only dots"
            ),
        ));
    }
    Ok(())
}

/// The trajectory id the client named: path prefix, else `X-Trajectory-Id`,
/// else body `trajectory_id`; checked, or None when it named none.
pub fn named_trajectory_id(
    path: Option<String>,
    headers: &HeaderMap,
    body: Option<&str>,
) -> Result<Option<String>, ApiError> {
    named_id(
        "trajectory",
        path,
        ("X-Trajectory-Id", headers.get("x-trajectory-id")),
        ("trajectory_id", body),
    )
}

/// The group and task metadata a call names for its trajectory: group from
/// the `/g/{gid}` path, else `X-Trajectory-Group`, else body
/// `trajectory_group`, else `trajectory_metadata.group`; the rest from body
/// `trajectory_metadata`.
pub fn named_metadata(
    path_gid: Option<String>,
    headers: &HeaderMap,
    group: Option<&str>,
    metadata: Option<&TrajectoryMetadata>,
) -> Result<TrajectoryMetadata, ApiError> {
    let mut tag = metadata.cloned().unwrap_or_default();
    let body = group.or(tag.group.as_deref());
    let field = if group.is_some() {
        "trajectory_group"
    } else {
        "trajectory_metadata.group"
    };
    tag.group = named_id(
        "group",
        path_gid,
        ("X-Trajectory-Group", headers.get("x-trajectory-group")),
        (field, body),
    )?;
    check_extra_info(tag.extra_info.as_ref(), "trajectory_metadata.extra_info")?;
    Ok(tag)
}

/// `extra_info` is a JSON object (verl keeps it as a dict per sample).
pub(crate) fn check_extra_info(v: Option<&serde_json::Value>, param: &str) -> Result<(), ApiError> {
    match v {
        None | Some(serde_json::Value::Object(_)) => Ok(()),
        Some(_) => Err(ApiError::invalid(
            param,
            format!("`{param}` must be a JSON object"),
        )),
    }
}

/// The named trajectory, or a new one. A new id is registered as an empty
/// trajectory so its first call does not look for history in the store.
/// Bytes of the images a gateway keeps checked (`images::Recent`): a few
/// trajectories' screenshots.
const RECENT_IMAGE_BYTES: usize = 256 << 20;

pub fn trajectory_id(state: &AppState, named: Option<String>) -> String {
    named.unwrap_or_else(|| {
        let id = new_trajectory_id();
        state.trajectories.register_new(&id);
        id
    })
}

/// What the retry lookup needs from a request: its `Idempotency-Key`,
/// whether it is an OpenAI SDK retry, its scope and its exact body.
fn retry_request(
    headers: &HeaderMap,
    scope: Option<String>,
    body: &axum::body::Bytes,
) -> Result<replies::Request, ApiError> {
    let text = |name: &str| -> Result<Option<&str>, ApiError> {
        headers
            .get(name)
            .map(|v| {
                v.to_str()
                    .map_err(|_| ApiError::invalid(name, format!("{name} must be ASCII")))
            })
            .transpose()
    };
    let key = text("idempotency-key")?;
    if key.is_some_and(|k| k.is_empty() || k.len() > 256) {
        return Err(ApiError::invalid(
            "Idempotency-Key",
            "Idempotency-Key must be 1 to 256 characters",
        ));
    }
    let retry = text("x-stainless-retry-count")?
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|n| n >= 1);
    Ok(replies::Request {
        scope,
        key: key.map(str::to_string),
        retry,
        body: body.clone(),
    })
}

fn trajectory_header(tid: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(tid) {
        h.insert("x-trajectory-id", v);
    }
    h
}

/// Liveness: the process answers.
async fn health() -> &'static str {
    "ok"
}

/// Readiness: each served model has a backend that can take calls, and the
/// store commits. 503 with the reasons otherwise, so a load balancer stops
/// sending traffic. With several models the body lists each one's counts.
async fn ready(State(gateway): State<Gateway>) -> Response {
    let counts: Vec<(&str, usize, usize)> = gateway
        .models()
        .iter()
        .map(|m| {
            let backends = m.router.snapshot();
            let healthy = backends
                .iter()
                .filter(|b| b.healthy && !b.sleeping && b.weights_error.is_none())
                .count();
            (&*m.model_name, backends.len(), healthy)
        })
        .collect();
    let store = gateway.primary().store.store.writable().await;
    let ok = counts.iter().all(|c| c.2 > 0) && store.is_ok();
    let status = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut body = json!({
        "ready": ok,
        "backends": counts.iter().map(|c| c.1).sum::<usize>(),
        "backends_ready": counts.iter().map(|c| c.2).sum::<usize>(),
        "store": match &store {
            Ok(()) => "writable".to_string(),
            Err(e) => e.to_string(),
        },
    });
    if counts.len() > 1 {
        body["models"] = counts
            .iter()
            .map(|(name, all, healthy)| {
                json!({"model": name, "backends": all, "backends_ready": healthy})
            })
            .collect();
    }
    (status, Json(body)).into_response()
}

async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("method {method} is not allowed on this route"),
    )
    .with_code("method_not_allowed")
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such route")
}

/// Middleware of the OpenAI routes: the API role's check
/// ([`auth::refusal`]), then `[server] max_concurrent_requests`. One layer
/// for both: each `from_fn` layer clones the route's boxed service and boxes
/// a future for every request.
async fn openai_guard(
    State((auth, slots)): State<(Arc<auth::Auth>, Arc<tokio::sync::Semaphore>)>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(refused) = auth::refusal(&auth, auth::Role::Api, req.headers()) {
        return refused;
    }
    limit_concurrency(slots, req, next).await
}

/// `[server] max_concurrent_requests`: a request beyond it is answered 429
/// with `Retry-After` and reaches no backend. A streamed answer holds its
/// slot until its body ends (or the client goes away); an answer whose body
/// is complete frees it at once.
async fn limit_concurrency(
    slots: Arc<tokio::sync::Semaphore>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::body::HttpBody;
    use futures::StreamExt;
    let Ok(slot) = slots.try_acquire_owned() else {
        crate::metrics::rejected_overload();
        let mut resp = ApiError::too_many_requests(
            "the gateway is at its limit of concurrent requests \
             (server.max_concurrent_requests): retry later",
        )
        .into_response();
        resp.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            HeaderValue::from_static("1"),
        );
        return resp;
    };
    let resp = next.run(req).await;
    if resp.body().size_hint().exact().is_some() {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let held = body.into_data_stream().map(move |chunk| {
        let _slot = &slot;
        chunk
    });
    Response::from_parts(parts, axum::body::Body::from_stream(held))
}

fn v1_routes() -> axum::Router<Gateway> {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{model}", get(models::one))
        .merge(responses::routes())
        .merge(messages::routes())
}

/// The app over `models` (an [`AppState`] is a one-model gateway).
pub fn build_app(models: impl Into<Gateway>) -> axum::Router {
    crate::metrics::init();
    let gateway: Gateway = models.into();
    let state = gateway.primary().clone();
    let limit = state.config.server.max_body_bytes;
    let role = |r: auth::Role| {
        axum::middleware::from_fn_with_state((state.auth.clone(), r), auth::require)
    };
    let in_flight = Arc::new(tokio::sync::Semaphore::new(
        state.config.server.max_concurrent_requests as usize,
    ));
    let openai = axum::Router::new()
        .merge(v1_routes())
        .nest("/t/{tid}", v1_routes())
        .nest("/g/{gid}/t/{tid}", v1_routes())
        .route_layer(axum::middleware::from_fn_with_state(
            (state.auth.clone(), in_flight),
            openai_guard,
        ));
    let trainer = trajectories::routes()
        .merge(export::routes())
        .merge(ui::trainer_routes())
        .merge(verify::routes())
        .route_layer(role(auth::Role::Trainer));
    let admin = admin::routes().route_layer(role(auth::Role::Admin));
    let metrics = axum::Router::new()
        .route("/metrics", get(metrics::render))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(Arc::new(
            gateway
                .models()
                .iter()
                .map(|m| m.router.clone())
                .collect::<Vec<_>>(),
        ));
    axum::Router::new()
        .merge(openai)
        .merge(trainer)
        .merge(admin)
        .merge(ui::routes())
        .merge(openapi::routes())
        .route("/health", get(health))
        .route("/ready", get(ready))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(gateway)
        .merge(metrics)
        .layer(axum::middleware::from_fn_with_state(limit, around::around))
        .layer(DefaultBodyLimit::max(limit))
}

#[cfg(test)]
mod tests {
    use crate::store::now_ms;

    #[test]
    fn ids_of_only_dots_are_refused() {
        for bad in ["", ".", "..", "...", "a/b", "a b"] {
            assert!(
                super::check_id("trajectory", "test", bad).is_err(),
                "{bad:?}"
            );
        }
        for good in ["a.b", "..a", "run-1:step.2@x"] {
            assert!(
                super::check_id("trajectory", "test", good).is_ok(),
                "{good:?}"
            );
        }
    }

    /// A gateway-named trajectory id carries the time it was made, first, so
    /// ids sort in time order; it is an id a client may name too.
    #[test]
    fn trajectory_ids_lead_with_their_time() {
        let before = now_ms();
        let id = super::new_trajectory_id();
        let after = now_ms();
        let hex = id.strip_prefix("traj-").expect("traj- prefix");
        assert_eq!(hex.len(), 28, "{id}");
        assert!(hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let ms = i64::from_str_radix(&hex[..12], 16).expect("hex time");
        assert!(before <= ms && ms <= after, "{before} <= {ms} <= {after}");
        assert!(super::check_id("trajectory id", "test", &id).is_ok());
        assert_ne!(id, super::new_trajectory_id());
    }
}
