//! The bare hop: a gateway process made of tito's own HTTP server
//! (`api::server::serve`, the same accept loop and connection tasks) and its
//! backend client (`backend::conn::Pool`, the same driven connections) that
//! does nothing but forward: the request's bytes to the backend's text
//! `/v1/chat/completions`, the answer's bytes back. No parsing, rendering,
//! routing or recording. What it adds over a direct call is the least any
//! gateway built on these parts can add on the machine: the two loopback
//! hops, a process's wake-ups and the HTTP framing. tito's own work is what
//! it adds beyond that.
//!
//! The peers bench runs its own binary as this process (`run` when
//! `TITO_PEERS_BARE_HOP` names the backend; the port is in
//! `TITO_PEERS_BARE_HOP_PORT`), on a runtime built as `tito serve`'s is
//! (`#[tokio::main]`, one worker a core).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures::StreamExt;
use tito::backend::conn::Pool;

pub const BACKEND_VAR: &str = "TITO_PEERS_BARE_HOP";
pub const PORT_VAR: &str = "TITO_PEERS_BARE_HOP_PORT";

/// Serves the bare hop until killed.
pub async fn run(backend: &str, port: u16) {
    let pool = Pool::for_url("bare", backend, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("{backend}: the bare hop forwards to plain http:// only"));
    let app = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("bare hop: binding port {port}: {e}"));
    tito::api::server::serve(listener, app, std::future::pending()).await;
}

async fn forward(State(pool): State<Arc<Pool>>, body: Bytes) -> Response {
    let (status, mut answer) = match pool.post("/v1/chat/completions", body.to_vec()).await {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let mut bytes = Vec::new();
    while let Some(piece) = answer.next().await {
        match piece {
            Ok(piece) => bytes.extend_from_slice(&piece),
            Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
        }
    }
    (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response()
}
