//! tito: a token-in, token-out OpenAI-compatible gateway for agentic RL.
//!
//! Layout, lowest module first. A module uses only modules listed before
//! it (`tests/module_order.rs` checks every `crate::` path against this
//! list):
//!
//! 1. [`config`]: `config.toml`, parsed strictly and validated once.
//! 2. [`error`]: the one API error type and its OpenAI JSON / SSE shapes;
//!    each module converts its own errors into it.
//! 3. [`metrics`]: Prometheus series, labelled by matched route, and the
//!    layer that times the request path's phase spans.
//! 4. [`logging`]: the log output of every command (text or JSON lines).
//! 5. [`server`]: the HTTP server (`axum::serve`, a connection cap,
//!    graceful shutdown) of `tito serve` and `tito engine`.
//! 6. [`parse`]: tool-call and reasoning parsers over decoded text, full and
//!    streamed.
//! 7. [`render`]: chat template + tokenizer; prompt token ids are made here,
//!    and sampled ids become text, incrementally (`render::detok`); gpt-oss's
//!    Harmony format through `openai-harmony`, prompt ids and sampled-id
//!    parsing both (`render::harmony`).
//! 8. [`surface`]: the Responses and Messages APIs as chat requests (their
//!    histories translated, also for a trajectory rebuilt from the store)
//!    and their answers built from a recorded call.
//! 9. [`store`]: the durable span store (trait, memory, SQLite, PostgreSQL
//!    shared by gateway replicas) and sample reconstruction from stored calls.
//! 10. [`export`]: training rows (trajectory / per_call / verl layouts) written
//!     as JSONL or Parquet to any `Write`.
//! 11. [`backend`]: the `Backend` trait and the vLLM / SGLang clients over
//!     one pooled HTTP client, and their one stream pump.
//! 12. [`router`]: which backend serves a call: policies, sticky pins, health,
//!     admission control for sleep / wake, the backoff between retries.
//! 13. [`trajectory`]: exact multi-turn history, drift diagnosis, budgets.
//! 14. [`call`]: one LLM call's life: plan, route + retry before the first
//!     token, assemble text / ids / logprobs, record (detached from the
//!     client), and answers replayed to retries.
//! 15. [`verify`]: the teacher-forced replay check of recorded logprobs
//!     against a backend's prompt logprobs, on request and sampled in the
//!     background.
//! 16. `engine`: the bundled llama.cpp engine (continuous batching) and the
//!     stand-alone `tito engine` server; cargo feature `engine` (default on).
//! 17. [`api`]: axum routes (OpenAI, trajectories, admin, metrics); one
//!     straight async function per request: parse → prepare → run → respond.
//!     `api::gateway` holds the served models (`[[models]]`), each with its
//!     own renderer, backends and router, and picks one by a request's
//!     `model`.

pub mod api;
pub mod backend;
pub mod call;
pub mod config;
#[cfg(feature = "engine")]
pub mod engine;
pub mod error;
pub mod export;
pub mod logging;
pub mod metrics;
pub mod parse;
pub mod render;
pub mod router;
pub mod server;
pub mod store;
pub mod surface;
pub mod trajectory;
pub mod verify;

pub use api::{build_app, serve, AppState};
pub use config::Config;
