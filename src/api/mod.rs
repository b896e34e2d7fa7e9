//! HTTP layer: routes, shared state, server start-up.

pub mod export;
pub mod trajectories;

use std::future::Future;
use std::sync::Arc;

use axum::routing::get;
use axum::Router;

use crate::backend::DynBackend;
use crate::config::Config;
use crate::render::Renderer;

/// Shared state, grouped by module.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub renderer: Arc<Renderer>,
    pub backends: Arc<Vec<DynBackend>>,
}

pub fn build_app(state: AppState) -> Router {
    Router::new()
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}

pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let renderer = Renderer::load(&config.model)?;
    let backends = crate::backend::build_backends(&config)?;
    let listener = tokio::net::TcpListener::bind(&config.server.listen).await?;
    let state = AppState {
        config: Arc::new(config),
        renderer,
        backends: Arc::new(backends),
    };
    axum::serve(listener, build_app(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
