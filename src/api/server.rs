//! The HTTP/1.1 server of `tito serve` and `tito engine`: accepts
//! connections and serves each in a task of its own, polled through
//! [`crate::inline_wake`] so that the hand-overs inside one connection
//! (hyper's request body, the backend connection a call drives) do not
//! bounce its task between the runtime's threads.
//!
//! It does what `axum::serve` did for them, and no more: HTTP/1.1
//! with keep-alive, `TCP_NODELAY` on every connection ([`no_delay`]), and a
//! graceful shutdown that stops accepting, lets each connection finish the
//! request in flight, and ends once every connection has closed.

use std::future::Future;

use axum::serve::{Listener, ListenerExt};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::inline_wake::inline;

/// A listener whose connections have Nagle's algorithm off, as servers of
/// small streamed writes need: with it on, each SSE chunk after the first
/// waits for the client's delayed ACK (up to 40 ms on Linux).
pub type NoDelayListener = axum::serve::TapIo<TcpListener, fn(&mut TcpStream)>;

pub fn no_delay(listener: TcpListener) -> NoDelayListener {
    fn set(tcp: &mut TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
    }
    listener.tap_io(set as fn(&mut TcpStream))
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops
/// accepting, asks every connection to close once its request in flight is
/// answered (idle ones close at once), and returns when all have closed.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) {
    let mut listener = no_delay(listener);
    let connections = TaskTracker::new();
    let (closing, closed) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let io = tokio::select! {
            (io, _) = listener.accept() => io,
            () = &mut shutdown => break,
        };
        connections.spawn(inline(connection(io, app.clone(), closed.clone())));
    }
    drop(listener);
    closing.send_replace(true);
    connections.close();
    connections.wait().await;
}

/// One connection, to its end or to its graceful close once `closing` says
/// so.
async fn connection(io: TcpStream, app: Router, mut closing: watch::Receiver<bool>) {
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        // The router is always ready; `oneshot` makes one call of a clone.
        app.clone().oneshot(req)
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        ended = conn.as_mut() => Some(ended),
        _ = closing.wait_for(|c| *c) => None,
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = ended {
        tracing::trace!(error = %e, "connection ended with an error");
    }
}
