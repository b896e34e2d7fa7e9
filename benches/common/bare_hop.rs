//! The bare hop: a gateway process made of tito's own HTTP server
//! (`server::serve`, the same accept loop and connection tasks) and its
//! backend client (a pooled reqwest client, as the backends use) that
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

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;

pub const BACKEND_VAR: &str = "TITO_PEERS_BARE_HOP";
pub const PORT_VAR: &str = "TITO_PEERS_BARE_HOP_PORT";

/// Serves the bare hop until killed.
pub async fn run(backend: &str, port: u16) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .build()
        .unwrap_or_else(|e| panic!("bare hop: client: {e}"));
    let target = format!("{}/v1/chat/completions", backend.trim_end_matches('/'));
    let app = Router::new()
        .route("/v1/chat/completions", post(forward))
        .with_state((client, target));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("bare hop: binding port {port}: {e}"));
    let cap = tito::config::DEFAULT_MAX_CONNECTIONS;
    tito::server::serve(listener, cap, app, std::future::pending()).await;
}

async fn forward(
    State((client, target)): State<(reqwest::Client, String)>,
    body: Bytes,
) -> Response {
    let sent = client
        .post(&target)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(a) => a,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    match answer.bytes().await {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
