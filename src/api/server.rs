//! The gateway's HTTP/1.1 server: accepts connections and serves each in a
//! task of its own, polled through [`crate::inline_wake`] so that the
//! hand-overs inside one connection (hyper's request body, the backend
//! connection a call drives) do not bounce its task between the runtime's
//! threads.
//!
//! It does what `axum::serve` did for the gateway, and no more: HTTP/1.1
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{oneshot, Notify};

    /// A test that fails rather than hangs when what it waits for never comes.
    const FAILSAFE: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_answers_the_request_in_flight_then_closes_every_connection() {
        let entered = Arc::new(Notify::new());
        let release = Arc::new(Notify::new());
        let (e, r) = (entered.clone(), release.clone());
        let app = Router::new()
            .route("/quick", get(|| async { "quick" }))
            .route(
                "/slow",
                get(move || {
                    let (e, r) = (e.clone(), r.clone());
                    async move {
                        e.notify_one();
                        r.notified().await;
                        "slow"
                    }
                }),
            );
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, app, async {
            let _ = stopped.await;
        }));

        // One client idle on a kept-alive connection, one with a request in
        // flight.
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /quick HTTP/1.1\r\nhost: t\r\n\r\n")
            .await
            .expect("send");
        let mut answer = Vec::new();
        while !answer.ends_with(b"quick") {
            let mut buf = [0u8; 1024];
            let n = idle.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed before its answer");
            answer.extend_from_slice(&buf[..n]);
        }
        let slow = tokio::spawn(reqwest::get(format!("http://{addr}/slow")));
        tokio::time::timeout(FAILSAFE, entered.notified())
            .await
            .expect("the slow request reached its handler");

        stop.send(()).expect("the server waits for the signal");
        // The idle connection is closed...
        let mut rest = [0u8; 64];
        let n = tokio::time::timeout(FAILSAFE, idle.read(&mut rest))
            .await
            .expect("closed")
            .expect("read");
        assert_eq!(n, 0);
        // ...while the request in flight keeps the server running until it
        // is answered, in full.
        assert!(!server.is_finished());
        release.notify_one();
        let slow = tokio::time::timeout(FAILSAFE, slow)
            .await
            .expect("answered")
            .expect("task")
            .expect("slow");
        assert_eq!(slow.status(), 200);
        assert_eq!(slow.text().await.expect("body"), "slow");
        // Then it ends, and nothing is accepted any more.
        tokio::time::timeout(FAILSAFE, server)
            .await
            .expect("the server ended")
            .expect("task");
        assert!(TcpStream::connect(addr).await.is_err());
    }
}
