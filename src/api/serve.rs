//! `tito serve`: builds each served model's renderer and backends, opens
//! the store, binds, serves until the shutdown signal, then drains the
//! calls in flight until `drain_timeout_s`.

use std::future::Future;
use std::time::Duration;

use super::{auth, build_app, Gateway};
use crate::backend::DynBackend;
use crate::config::Config;
use crate::render::Renderer;

/// Builds the configured `[[backends]]`, in order: HTTP clients, and the
/// bundled engine started in-process for `url = "engine"`. Done at start-up,
/// here, so that `backend` knows nothing of `engine`.
pub fn build_backends(config: &Config) -> anyhow::Result<Vec<DynBackend>> {
    config
        .backends
        .iter()
        .map(|b| match b.kind {
            crate::config::BackendKind::Engine if b.url == "engine" => start_engine(config, b),
            _ => crate::backend::build_backend(b, &config.router),
        })
        .collect()
}

#[cfg(feature = "engine")]
fn start_engine(config: &Config, b: &crate::config::BackendConfig) -> anyhow::Result<DynBackend> {
    Ok(crate::engine::EngineBackend::start_named(
        &config.engine,
        &b.display_name(),
        &config.model.adapters,
    )?)
}

/// Unreachable after config validation, which refuses `url = "engine"` in
/// a build without the engine; kept as a second guard.
#[cfg(not(feature = "engine"))]
fn start_engine(_: &Config, _: &crate::config::BackendConfig) -> anyhow::Result<DynBackend> {
    anyhow::bail!("{}", crate::config::ENGINE_NOT_BUILT)
}

pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Before anything is loaded or bound: an exposed gateway without tokens
    // does not start.
    auth::check_exposure(&config, &auth::Auth::from_config(&config)?)?;
    if !config.server.admin_token.is_empty() {
        tracing::warn!(
            "server.admin_token is deprecated and will be removed: move it to [auth] admin_tokens"
        );
    }
    let mut built = Vec::new();
    for view in config.served() {
        built.push((Renderer::load(&view.model)?, build_backends(&view)?));
    }
    if built[0].1.is_empty() {
        tracing::warn!(
            "no [[backends]] configured: calls answer 503 and /ready is 503 until POST /admin/backends adds one"
        );
    }
    // Opening a SQLite store creates and migrates its file: blocking work,
    // kept off the runtime's threads.
    let options = crate::store::StoreOptions::from(&config.store);
    let url = config.store.url.clone();
    let store =
        tokio::task::spawn_blocking(move || crate::store::open_with_options(&url, &options))
            .await??;
    let listener = tokio::net::TcpListener::bind(&config.server.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, model = %config.model.name, "tito listening");
    let ack = config.store.ack;
    let marked = store.begin_run(ack).await?;
    if marked > 0 {
        tracing::warn!(
            marked,
            "the previous run used store.ack = \"queued\" and did not end \
            cleanly: its active trajectories are marked incomplete"
        );
    }
    let gateway = Gateway::new(&config, built, store)?;
    let state = gateway.primary().clone();
    state.restore().await?;
    let health: Vec<_> = gateway
        .models()
        .iter()
        .map(|m| m.router.start_health_checks())
        .collect();
    let drain = Duration::from_secs(state.config.server.drain_timeout_s);
    // The drain deadline, set when the signal arrives.
    let (stopping, mut deadline) = tokio::sync::watch::channel(None);
    let running: Vec<_> = gateway.models().iter().map(|m| m.calls.clone()).collect();
    let in_flight = move || running.iter().map(|c| c.running()).sum::<usize>();
    let max_connections = state.config.server.max_connections;
    let app = build_app(gateway.clone());
    let server = crate::server::serve(listener, max_connections, app, async move {
        shutdown.await;
        tracing::info!(
            drain_timeout_s = drain.as_secs(),
            in_flight = in_flight(),
            "shutting down: finishing calls in flight"
        );
        stopping.send_replace(Some(tokio::time::Instant::now() + drain));
    });
    // On the signal the server stops accepting; connections with calls in
    // flight are served to their end, until the deadline.
    let drained = tokio::select! {
        () = server => true,
        () = async {
            let at = match deadline.wait_for(Option::is_some).await {
                Ok(at) => *at,
                Err(_) => None,
            };
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending::<()>().await,
            }
        } => false,
    };
    // Calls whose client left may still be recording: wait for them too,
    // until the same deadline.
    let at = (*deadline.borrow()).unwrap_or_else(tokio::time::Instant::now);
    let mut idle = drained;
    for m in gateway.models() {
        let left = at.saturating_duration_since(tokio::time::Instant::now());
        idle &= m.calls.wait_idle(left).await;
    }
    if !idle {
        tracing::warn!(
            in_flight = gateway
                .models()
                .iter()
                .map(|m| m.calls.running())
                .sum::<usize>(),
            "drain timeout (server.drain_timeout_s) reached: exiting with calls in flight; \
             they are not recorded"
        );
    }
    for h in health {
        h.stop().await;
    }
    // Dropping the last handle on a SQLite store waits for its writer to
    // commit what is still queued: blocking, so off the runtime's threads.
    let store = state.store.store.clone();
    drop((state, gateway));
    let _ = tokio::task::spawn_blocking(move || drop(store)).await;
    Ok(())
}
