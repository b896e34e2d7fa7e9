//! Configuration: `config.toml` parsed strictly into typed sections, then
//! validated once. Everything downstream receives typed values and never
//! re-checks them.
//!
//! Owns: the file format (key names are a user contract, see docs/configuration.md) and
//! validation messages that name the offending key. Must not: open files other
//! than the config itself, or touch the network.

mod backend;
mod model;
mod models;
mod redact;

pub use backend::{BackendConfig, BackendKind, VllmApi};
pub use model::{usable_model_id, AdapterConfig, ModelConfig, VisionName, TOOL_PARSERS};
pub use models::{BackendRef, ModelsForm};

pub use redact::{redact_store_url, redact_url, redacted_token, usable_token, Secret};

use std::path::{Path, PathBuf};

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config: `{key}` = {value}: {reason}")]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
}

/// Why `url = "engine"` cannot start in a build without the engine.
pub const ENGINE_NOT_BUILT: &str = "the bundled engine is not in this build (built with \
     --no-default-features): rebuild with the `engine` cargo feature (on by default), or point \
     this backend at a vLLM / SGLang server or a `tito engine` URL";

fn invalid(key: &str, value: impl std::fmt::Debug, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        value: format!("{value:?}"),
        reason: reason.to_string(),
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub backends: Vec<BackendConfig>,
    /// `[[models]]`: several served models (see [`Config::served`]); empty
    /// in the one-model form. Once loaded, `model` and `backends` are the
    /// first entry's.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    #[serde(default)]
    pub engine: EngineConfig,
    #[serde(default)]
    pub router: RouterConfig,
    #[serde(default)]
    pub store: StoreConfig,
    #[serde(default)]
    pub trajectory: TrajectoryConfig,
    #[serde(default)]
    pub verify: VerifyConfig,
    #[serde(default)]
    pub auth: AuthConfig,
    /// `tito serve --insecure-open`: serve a non-loopback address with a
    /// role left open. Not a file key.
    #[serde(skip)]
    pub insecure_open: bool,
}

/// `[auth]`: Bearer tokens per role; an empty role is open. Each `*_file`
/// names a file of tokens, one per line (blank lines and `#` comments
/// ignored), read at start-up, so secrets can stay out of config.toml.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
    pub api_keys: Vec<String>,
    pub api_keys_file: Option<PathBuf>,
    /// `/v1/trajectories*`, `/v1/groups/*`, `/v1/export*`.
    pub trainer_tokens: Vec<String>,
    pub trainer_tokens_file: Option<PathBuf>,
    /// `/admin/*` (also accepted on the trainer's routes).
    pub admin_tokens: Vec<String>,
    pub admin_tokens_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: String,
    /// Deprecated (use `[auth] admin_tokens`): when non-empty, accepted as an
    /// admin and a trainer token.
    pub admin_token: String,
    pub max_body_bytes: usize,
    /// Most sequences one request may start (prompts × n).
    pub max_sequences_per_request: u32,
    /// OpenAI requests in flight (a stream until its end); beyond, 429.
    pub max_concurrent_requests: u32,
    /// Client connections open at once; beyond, new ones wait in the
    /// kernel's accept backlog until one closes.
    pub max_connections: usize,
    /// On SIGTERM / Ctrl-C: how long calls in flight may take to finish
    /// (and be recorded) before the process exits anyway.
    pub drain_timeout_s: u64,
    /// A streamed response whose client has not taken the next chunk for
    /// this long is ended, and its backend sequence cancelled.
    pub sse_send_timeout_s: u64,
}

/// `[server] max_connections` when unset (also `tito engine`'s cap).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8000".into(),
            admin_token: String::new(),
            max_body_bytes: 16 * 1024 * 1024,
            max_sequences_per_request: 256,
            max_concurrent_requests: 256,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            drain_timeout_s: 30,
            sse_send_timeout_s: 30,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    pub model: PathBuf,
    pub device: Device,
    /// Most sequences decoded together in one batch.
    pub max_batch: u32,
    /// KV-cache size in tokens shared by all running sequences (0 = model's
    /// training context, capped at 8192).
    pub n_ctx: u32,
    /// CPU threads for decode on the CPU, and for a step's sampling on any
    /// device (0 = all cores).
    pub threads: u32,
    /// Requests waiting for a batch slot before new ones get 503.
    pub max_queue: u32,
    /// Most prompt tokens prefilled per engine step (longer prompts are fed
    /// in chunks, so running sequences keep decoding between chunks).
    pub prefill_chunk: u32,
    /// Which quantity the engine reports as a sampled token's logprob, with
    /// vLLM's meanings: `raw_logprobs` is the log-softmax of the model's
    /// logits; `processed_logprobs` is taken after penalties and temperature.
    pub logprobs_mode: LogprobsMode,
    /// Run ggml's reference CPU kernels (one per-row code path whatever the
    /// batch), so that a sequence's tokens and logprobs are bitwise the same
    /// alone or batched (src/engine/kernels.rs). CPU only.
    pub batch_invariant: bool,
    /// Keep finished sequences' KV cells and let a prompt that starts with
    /// their tokens skip that part of its prefill (src/engine/cells.rs).
    pub kv_reuse: bool,
}

/// `[engine] logprobs_mode`, named as vLLM names its `--logprobs-mode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LogprobsMode {
    RawLogprobs,
    ProcessedLogprobs,
}

impl LogprobsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            LogprobsMode::RawLogprobs => "raw_logprobs",
            LogprobsMode::ProcessedLogprobs => "processed_logprobs",
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            model: PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            device: Device::Cpu,
            max_batch: 16,
            n_ctx: 0,
            threads: 0,
            max_queue: 256,
            prefill_chunk: 256,
            logprobs_mode: LogprobsMode::RawLogprobs,
            batch_invariant: true,
            kv_reuse: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    LeastRequests,
    RoundRobin,
    PrefixAffinity,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    pub policy: PolicyKind,
    pub sticky_capacity: usize,
    pub health_interval_ms: u64,
    pub connect_timeout_ms: u64,
    pub first_token_timeout_ms: u64,
    pub idle_stream_timeout_ms: u64,
    /// Attempts for a request that fails before its first token.
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles at each retry up to
    /// `retry_backoff_max_ms`, with jitter (`router::retry`).
    pub retry_backoff_ms: u64,
    pub retry_backoff_max_ms: u64,
    /// Consecutive failures that open a backend's circuit.
    pub failure_threshold: u32,
    /// prefix_affinity: prompt tokens hashed to pick the preferred backend.
    pub affinity_prefix_tokens: usize,
    /// prefix_affinity: extra in-flight requests tolerated on the preferred
    /// backend over the least-loaded one.
    pub affinity_margin: usize,
    /// How long each backend may take to answer an admin operation (sleep,
    /// wake-up, weight update) before it is reported as not answering.
    pub admin_timeout_s: u64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            policy: PolicyKind::LeastRequests,
            sticky_capacity: 100_000,
            health_interval_ms: 2000,
            connect_timeout_ms: 2000,
            first_token_timeout_ms: 600_000,
            idle_stream_timeout_ms: 120_000,
            max_attempts: 3,
            retry_backoff_ms: 50,
            retry_backoff_max_ms: 2000,
            failure_threshold: 3,
            affinity_prefix_tokens: 256,
            affinity_margin: 8,
            admin_timeout_s: 120,
        }
    }
}

/// When a store's `append_call` returns (`[store] ack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ack {
    /// Once the transaction holding the call has committed (the default):
    /// an answered call survives `kill -9`.
    #[default]
    Committed,
    /// Once the call is queued for the writer: the answer does not wait for
    /// the commit. A crash loses what was queued and not yet committed; on the
    /// next start every trajectory that was still active is marked
    /// `incomplete`. Errors of such writes are logged, not returned.
    Queued,
}

/// `[verify] threshold` when unset: the |recorded - replayed| logprob, in
/// nats, above which the replay check lists a position.
pub const DEFAULT_VERIFY_THRESHOLD: f64 = 0.1;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `sqlite://path`, `postgres://user:pass@host:port/db` (shared by
    /// replicas), or `memory://` (tests only: nothing is durable).
    pub url: String,
    /// When a call is answered: after its commit, or once queued for it.
    pub ack: Ack,
    /// SQLite: the write-ahead log's size past which a commit waits for a
    /// checkpoint that copies it whole, so that it starts over.
    pub wal_max_bytes: u64,
}

/// `[store] wal_max_bytes` by default: 64 MiB, some 16,000 pages of 4 KiB.
pub const DEFAULT_WAL_MAX_BYTES: u64 = 64 << 20;

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            url: "sqlite://tito-data/spans.db".into(),
            ack: Ack::Committed,
            wal_max_bytes: DEFAULT_WAL_MAX_BYTES,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HistoryMode {
    Exact,
    Template,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrajectoryConfig {
    pub history: HistoryMode,
    /// Response-token budget per sample (0 = unlimited). Calls are capped to
    /// what is left; a sample that runs out is marked truncated.
    pub response_length: u32,
    /// What a call on a sample whose budget is spent gets.
    pub on_budget_exhausted: OnBudgetExhausted,
    /// How many weight versions a sample's first sampled token may be
    /// behind the fleet's current version before its calls are refused
    /// (0 = no bound).
    pub max_staleness: u64,
    /// What a call on a sample past `max_staleness` gets.
    pub on_stale: OnStale,
    /// How long an OpenAI SDK retry (`x-stainless-retry-count` >= 1) with the
    /// same body as a recorded call, or a repeated `Idempotency-Key`, gets the
    /// recorded answer instead of a new generation.
    pub retry_window_s: u64,
    /// Memory the hot view of recent trajectories may take (estimated from
    /// their token ids and messages); least recently used ones beyond it are
    /// dropped and reloaded from the store on their next call.
    pub hot_bytes: u64,
}

/// `[trajectory] on_budget_exhausted`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBudgetExhausted {
    /// 200 with an empty assistant message and `finish_reason: "length"`,
    /// as an agent loop ends when its response budget is reached.
    Length,
    /// 400 `response_budget_exhausted`.
    Error,
}

/// `[trajectory] on_stale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStale {
    /// 200 with an empty assistant message and `finish_reason: "length"`,
    /// as for a spent budget; recorded with `finish_reason: "stale"`.
    Length,
    /// 409 `stale_trajectory`, naming the versions.
    Error,
}

impl Default for TrajectoryConfig {
    fn default() -> Self {
        Self {
            history: HistoryMode::Exact,
            response_length: 0,
            on_budget_exhausted: OnBudgetExhausted::Length,
            max_staleness: 0,
            on_stale: OnStale::Length,
            retry_window_s: 600,
            hot_bytes: 1 << 30,
        }
    }
}

/// `[verify]`: the teacher-forced replay check of recorded logprobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VerifyConfig {
    /// Share of finished trajectories checked in the background (0 = off).
    pub fraction: f64,
    /// |Δ| in nats above which a position is listed in a check's report.
    pub threshold: f64,
    /// Backend (by name) the checks replay on; empty = where the router
    /// sends the trajectory.
    pub backend: String,
}

impl Default for VerifyConfig {
    fn default() -> Self {
        Self {
            fraction: 0.0,
            threshold: DEFAULT_VERIFY_THRESHOLD,
            backend: String::new(),
        }
    }
}

impl VerifyConfig {
    fn validate(&self, backends: &[BackendConfig]) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.fraction) {
            return Err(invalid(
                "verify.fraction",
                self.fraction,
                "must be a share from 0.0 (off) to 1.0 (every finished trajectory)",
            ));
        }
        if !(self.threshold.is_finite() && self.threshold >= 0.0) {
            return Err(invalid(
                "verify.threshold",
                self.threshold,
                "must be a non-negative number of nats",
            ));
        }
        if !self.backend.is_empty() && !backends.iter().any(|b| b.display_name() == self.backend) {
            return Err(invalid(
                "verify.backend",
                &self.backend,
                "must be empty or the name (else url) of one of the [[backends]]",
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Reads, parses and validates a config file. Relative paths inside it
    /// are resolved against the current directory, as users expect from a CLI.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            path: PathBuf::from("<string>"),
            message: redact::toml_error(text, &e),
        };
        let mut config: Config = toml::from_str(text).map_err(parse_error)?;
        let table: toml::Table = toml::from_str(text).map_err(parse_error)?;
        models::resolve(&mut config, table.contains_key("model"))?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.server.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "server.listen",
                &self.server.listen,
                "expected host:port, e.g. 127.0.0.1:8000",
            ));
        }
        for (key, v) in [
            (
                "server.max_concurrent_requests",
                u64::from(self.server.max_concurrent_requests),
            ),
            (
                "server.max_sequences_per_request",
                u64::from(self.server.max_sequences_per_request),
            ),
            ("server.drain_timeout_s", self.server.drain_timeout_s),
            ("server.sse_send_timeout_s", self.server.sse_send_timeout_s),
            ("router.admin_timeout_s", self.router.admin_timeout_s),
        ] {
            if v == 0 {
                return Err(invalid(key, v, "must be at least 1"));
            }
        }
        for (key, v) in [
            ("trajectory.hot_bytes", self.trajectory.hot_bytes),
            ("store.wal_max_bytes", self.store.wal_max_bytes),
        ] {
            if v < 1 << 20 {
                return Err(invalid(key, v, "must be at least 1048576 (1 MiB)"));
            }
        }
        if self.server.max_body_bytes < 1024 {
            return Err(invalid(
                "server.max_body_bytes",
                self.server.max_body_bytes,
                "must be at least 1024",
            ));
        }
        for (key, tokens) in [
            ("auth.api_keys", &self.auth.api_keys),
            ("auth.trainer_tokens", &self.auth.trainer_tokens),
            ("auth.admin_tokens", &self.auth.admin_tokens),
        ] {
            if let Some(bad) = tokens.iter().find(|t| !usable_token(t)) {
                return Err(invalid(
                    key,
                    redacted_token(bad),
                    "a token is 8 to 4096 printable ASCII characters without spaces",
                ));
            }
        }
        let legacy = &self.server.admin_token;
        if !legacy.is_empty() && !usable_token(legacy) {
            return Err(invalid(
                "server.admin_token",
                redacted_token(legacy),
                "a token is 8 to 4096 printable ASCII characters without spaces",
            ));
        }
        self.validate_models()?;
        self.model.validate()?;
        backend::validate(&self.backends)?;
        let mut names: Vec<String> = self.backends.iter().map(|b| b.display_name()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(invalid(
                "backends",
                &w[0],
                "backend names/urls must be unique",
            ));
        }
        // llama.cpp holds at most 256 sequences, one of them tito's scratch.
        if self.engine.max_batch == 0 || self.engine.max_batch > 255 {
            return Err(invalid(
                "engine.max_batch",
                self.engine.max_batch,
                "must be 1..=255 (llama.cpp's 256 sequences, less one the engine keeps)",
            ));
        }
        if self.engine.max_queue == 0 {
            return Err(invalid(
                "engine.max_queue",
                0,
                "must be at least 1 (0 would refuse every request)",
            ));
        }
        if self.engine.prefill_chunk < 16 || self.engine.prefill_chunk > 8192 {
            return Err(invalid(
                "engine.prefill_chunk",
                self.engine.prefill_chunk,
                "must be 16..=8192",
            ));
        }
        if self.server.max_connections == 0 {
            return Err(invalid(
                "server.max_connections",
                0,
                "must be at least 1 (0 would accept no connection)",
            ));
        }
        if self.router.sticky_capacity == 0 {
            return Err(invalid("router.sticky_capacity", 0, "must be at least 1"));
        }
        if self.router.health_interval_ms < 10 {
            return Err(invalid(
                "router.health_interval_ms",
                self.router.health_interval_ms,
                "must be at least 10",
            ));
        }
        if self.router.max_attempts == 0 {
            return Err(invalid("router.max_attempts", 0, "must be at least 1"));
        }
        if self.router.retry_backoff_ms > self.router.retry_backoff_max_ms {
            return Err(invalid(
                "router.retry_backoff_ms",
                self.router.retry_backoff_ms,
                &format!(
                    "must be at most router.retry_backoff_max_ms ({})",
                    self.router.retry_backoff_max_ms
                ),
            ));
        }
        let postgres = self.store.url.starts_with("postgres://")
            || self.store.url.starts_with("postgresql://");
        if !(self.store.url.starts_with("sqlite://") || self.store.url == "memory://" || postgres) {
            return Err(invalid(
                "store.url",
                redact_store_url(&self.store.url),
                "expected sqlite://PATH, postgres://USER:PASS@HOST:PORT/DB or memory://",
            ));
        }
        if postgres && self.store.ack == Ack::Queued {
            return Err(invalid(
                "store.ack",
                "queued",
                "needs a sqlite:// store: replicas sharing a postgres store cannot tell which \
                 trajectories a crashed replica left behind; use \"committed\"",
            ));
        }
        self.verify.validate(&self.backends)
    }

    /// True when any backend is the in-process engine.
    pub fn uses_engine(&self) -> bool {
        self.backends.iter().any(|b| b.url == "engine")
    }
}

fn is_http_url(s: &str) -> bool {
    (s.starts_with("http://") || s.starts_with("https://")) && s.len() > "http://".len()
}

#[cfg(test)]
mod tests;
