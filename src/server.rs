//! The HTTP/1.1 server of `tito serve` and `tito engine`: `axum::serve`
//! over a listener that holds at most `max_connections` connections open
//! at once and turns Nagle's algorithm off on each.
//!
//! At the cap the listener stops accepting: new connections wait in the
//! kernel's accept backlog and are taken as open ones close, so a burst
//! past the cap is served late, never refused half-open. Shutdown is
//! axum's graceful one: stop accepting, let each connection finish the
//! request in flight (idle ones close at once), return once all closed.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use axum::Router;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that accepts while fewer than its cap of connections are
/// open.
pub struct CappedListener {
    inner: TcpListener,
    open: Arc<Semaphore>,
}

impl CappedListener {
    pub fn new(inner: TcpListener, max_connections: usize) -> Self {
        CappedListener {
            inner,
            open: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }
}

/// An accepted connection; its place under the cap is freed when it drops.
pub struct Connection {
    io: TcpStream,
    _place: OwnedSemaphorePermit,
}

impl Listener for CappedListener {
    type Io = Connection;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Connection, SocketAddr) {
        // The semaphore is never closed, so acquiring only waits.
        let place = loop {
            if let Ok(p) = self.open.clone().acquire_owned().await {
                break p;
            }
        };
        // axum's accept for `TcpListener` retries (with a pause) on the
        // errors a busy server sees, such as running out of descriptors.
        let (io, addr) = Listener::accept(&mut self.inner).await;
        // Small streamed writes (SSE chunks) would otherwise wait for the
        // client's delayed ACK, up to 40 ms on Linux.
        if let Err(e) = io.set_nodelay(true) {
            tracing::debug!(error = %e, "could not set TCP_NODELAY");
        }
        (Connection { io, _place: place }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Serves `app` on `listener`, at most `max_connections` connections at
/// once, until `shutdown` resolves; then drains gracefully (module doc).
pub async fn serve(
    listener: TcpListener,
    max_connections: usize,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let listener = CappedListener::new(listener, max_connections);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        // axum's serve returns an error only for the listener's own
        // failures; accept errors are retried inside it.
        tracing::error!(error = %e, "the HTTP server stopped");
    }
}
