//! tito: a token-in, token-out OpenAI-compatible gateway for agentic RL.
//!
//! Layout (data flows top to bottom):
//! - [`config`]: `config.toml`, parsed strictly and validated once.
//! - [`api`]: axum routes (OpenAI, trajectories, admin, metrics); one straight
//!   async function per request.
//! - [`render`]: chat template + tokenizer; prompt token ids are made here,
//!   and sampled ids become text, incrementally (`render::detok`).
//! - [`call`]: one LLM call's life: plan, route + retry before the first
//!   token, assemble text / ids / logprobs, record (detached from the
//!   client), and answers replayed to retries.
//! - [`backend`]: the `Backend` trait and the vLLM / SGLang / engine clients,
//!   their one stream pump, and the HTTP/1 connections a call drives itself.
//! - [`router`]: which backend serves a call: policies, sticky pins, health,
//!   admission control for sleep / wake.
//! - [`metrics`]: Prometheus series, labelled by matched route.
//! - [`trajectory`]: exact multi-turn history, drift diagnosis, budgets.
//! - `engine`: the bundled llama.cpp engine (continuous batching) and the
//!   stand-alone `tito engine` server; cargo feature `engine` (default on).
//! - [`error`]: the one API error type and its OpenAI JSON / SSE shapes.
//! - [`store`]: the durable span store (trait, memory, SQLite, PostgreSQL
//!   shared by gateway replicas) and sample reconstruction from stored calls.
//! - [`parse`]: tool-call and `<think>` reasoning parsers over decoded text,
//!   full and streamed.
//! - [`export`]: training rows (trajectory / per_call / verl layouts) written
//!   as JSONL or Parquet to any `Write`.
//! - [`verify`]: the teacher-forced replay check of recorded logprobs against
//!   a backend's prompt logprobs, on request and sampled in the background.
//! - [`logging`]: the log output of every command (text or JSON lines).
//! - [`phases`]: where a request's time goes, phase by phase (cargo
//!   feature `phase-timing`, for `scripts/bench-phases.sh`).
//! - [`inline_wake`]: tasks whose futures do not wake themselves across the
//!   runtime's threads (each served connection, a streamed answer, a call
//!   left by its client).

pub mod api;
pub mod backend;
pub mod call;
pub mod config;
#[cfg(feature = "engine")]
pub mod engine;
pub mod error;
pub mod export;
pub mod inline_wake;
pub mod logging;
pub mod metrics;
pub mod parse;
pub mod phases;
pub mod render;
pub mod router;
pub mod store;
pub mod trajectory;
pub mod verify;

pub use api::{build_app, serve, AppState};
pub use config::Config;
