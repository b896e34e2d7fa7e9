//! tito: a token-in, token-out OpenAI-compatible gateway for agentic RL.
//!
//! Layout (data flows top to bottom):
//! - [`config`]: `config.toml`, parsed strictly and validated once.
//! - [`api`]: axum routes (OpenAI, trajectories, admin, metrics); one straight
//!   async function per request.
//! - [`render`]: chat template + tokenizer; prompt token ids are made here.
//! - [`backend`]: the `Backend` trait and the vLLM / SGLang / engine clients.
//! - [`engine`]: the bundled llama.cpp engine (continuous batching) and the
//!   stand-alone `tito engine` server.
//! - [`error`]: the one API error type and its OpenAI JSON / SSE shapes.

pub mod api;
pub mod backend;
pub mod config;
pub mod engine;
pub mod error;
pub mod render;

pub use api::{build_app, serve, AppState};
pub use config::Config;
