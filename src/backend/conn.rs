//! HTTP/1.1 connections to one `http://` backend, each driven by the call
//! that uses it: the transport of the generate path of the vLLM and SGLang
//! clients.
//!
//! A pooled reqwest connection is a task of its own. A call hands its request
//! to that task and gets each piece of the answer back from it, one task
//! waking another at every step, often across the runtime's threads. Here a
//! call checks a connection out of the pool (or opens one) and polls it
//! itself, in its own task, while it waits for the answer's head and while it
//! reads the body. hyper hands the head and each piece of the body to their
//! receivers by waking them, here the very task polling the connection: the
//! gateway spawns that task through [`crate::inline_wake`], so such a wake
//! is one more round of its poll, not a reschedule. A connection whose answer was read to its end goes back to
//! the pool, where nothing polls it; one the server closed meanwhile is found
//! closed when it is next checked out, and dropped. A connection idle for
//! longer than [`IDLE_LIMIT`] is dropped unused: it may be about to be closed
//! by the server, and nothing else would ever close it. Dropping a body
//! before its end drops its connection: the backend sees the close and
//! cancels the request.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::Stream;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::BackendError;
use crate::error::with_causes;

type ReqBody = Full<Bytes>;

/// One open connection: the handle that sends on it and the state machine
/// that reads and writes its socket when polled.
struct Conn {
    send: http1::SendRequest<ReqBody>,
    io: http1::Connection<TokioIo<TcpStream>, ReqBody>,
}

impl Conn {
    /// Polls the connection once, with nobody to wake (it reads a close the
    /// server sent while it sat idle), and says whether it takes a request.
    fn usable(&mut self) -> bool {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        match Pin::new(&mut self.io).poll(&mut cx) {
            Poll::Ready(_) => false,
            Poll::Pending => self.send.is_ready(),
        }
    }
}

/// Where a backend is reached: the socket address (or name) and what its
/// requests carry as `Host` and path prefix.
#[derive(Debug, Clone)]
struct Target {
    connect: ConnectTo,
    host_header: String,
    prefix: String,
}

#[derive(Debug, Clone)]
enum ConnectTo {
    Addr(SocketAddr),
    Name(String, u16),
}

/// The idle connections to one backend.
pub struct Pool {
    backend: String,
    target: Target,
    connect_timeout: Duration,
    /// Oldest first, each with the time it came back.
    idle: Mutex<VecDeque<(Conn, Instant)>>,
}

/// At most this many idle connections are kept per backend.
const MAX_IDLE: usize = 1024;

/// Idle connections older than this are dropped. vLLM and SGLang serve with
/// uvicorn, which closes a connection idle for 5 s; one reused just as the
/// server closes it fails its call.
pub const IDLE_LIMIT: Duration = Duration::from_secs(2);

impl Pool {
    /// The pool for `url`, or `None` when it is not a plain `http://` URL:
    /// TLS, credentials (basic auth) and a query are left to the caller's
    /// general client.
    pub fn for_url(backend: &str, url: &str, connect_timeout: Duration) -> Option<Arc<Pool>> {
        let url = url::Url::parse(url).ok()?;
        let plain = url.scheme() == "http"
            && url.username().is_empty()
            && url.password().is_none()
            && url.query().is_none();
        if !plain {
            return None;
        }
        let port = url.port_or_known_default()?;
        let connect = match url.host()? {
            url::Host::Ipv4(ip) => ConnectTo::Addr(SocketAddr::from((ip, port))),
            url::Host::Ipv6(ip) => ConnectTo::Addr(SocketAddr::from((ip, port))),
            url::Host::Domain(name) => ConnectTo::Name(name.to_string(), port),
        };
        let host = url.host_str()?;
        let host_header = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        Some(Arc::new(Pool {
            backend: backend.to_string(),
            target: Target {
                connect,
                host_header,
                prefix: url.path().trim_end_matches('/').to_string(),
            },
            connect_timeout,
            idle: Mutex::new(VecDeque::new()),
        }))
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<(Conn, Instant)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The newest idle connection that is still open and young enough, if
    /// any. One too old means all are: they all go.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle();
        while let Some((mut conn, since)) = idle.pop_back() {
            if since.elapsed() > IDLE_LIMIT {
                idle.clear();
                return None;
            }
            if conn.usable() {
                return Some(conn);
            }
        }
        None
    }

    fn checkin(&self, conn: Conn) {
        let now = Instant::now();
        let mut idle = self.idle();
        while idle
            .front()
            .is_some_and(|(_, since)| now.duration_since(*since) > IDLE_LIMIT)
        {
            idle.pop_front();
        }
        if idle.len() < MAX_IDLE {
            idle.push_back((conn, now));
        }
    }

    async fn open(&self) -> Result<Conn, BackendError> {
        let connect = async {
            let stream = match &self.target.connect {
                ConnectTo::Addr(addr) => TcpStream::connect(addr).await,
                ConnectTo::Name(name, port) => TcpStream::connect((name.as_str(), *port)).await,
            }?;
            stream.set_nodelay(true)?;
            Ok::<_, std::io::Error>(stream)
        };
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| self.unreachable("connect timed out".to_string()))?
            .map_err(|e| self.unreachable(format!("cannot connect: {e}")))?;
        let (send, io) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.unreachable(format!("cannot connect: {}", with_causes(&e))))?;
        Ok(Conn { send, io })
    }

    fn unreachable(&self, message: String) -> BackendError {
        BackendError::Unreachable {
            backend: self.backend.clone(),
            message,
        }
    }

    /// POSTs `body` as JSON to `path` (after the URL's own path) and returns
    /// the answer's status and its body, which drives the connection as it
    /// is read.
    pub async fn post(
        self: &Arc<Self>,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(StatusCode, DrivenBody), BackendError> {
        let body = Bytes::from(body);
        // A pooled connection the server closes just as this request goes
        // out hands the request back unsent: it goes out once more, on a
        // new connection.
        let mut reused = self.checkout();
        loop {
            let fresh = reused.is_none();
            let Conn { mut send, io } = match reused.take() {
                Some(c) => c,
                None => self.open().await?,
            };
            let request = Request::post(format!("{}{path}", self.target.prefix))
                .header(hyper::header::HOST, &self.target.host_header)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(body.clone()))
                .map_err(|e| self.unreachable(format!("cannot build the request: {e}")))?;
            let mut answer = std::pin::pin!(send.try_send_request(request));
            let mut io = Some(io);
            let head = std::future::poll_fn(|cx| {
                if let Some(conn) = io.as_mut() {
                    if Pin::new(conn).poll(cx).is_ready() {
                        // Closed or failed. Dropping the connection resolves
                        // the answer with the reason (and the request, if it
                        // never went out).
                        io = None;
                    }
                }
                answer.as_mut().poll(cx)
            })
            .await;
            match head {
                Ok(resp) => {
                    let (parts, incoming) = resp.into_parts();
                    return Ok((
                        parts.status,
                        DrivenBody {
                            conn: io.map(|io| Conn { send, io }),
                            body: incoming,
                            pool: Arc::clone(self),
                            ended: false,
                        },
                    ));
                }
                Err(e) if !fresh && e.message().is_some() => continue,
                Err(e) => return Err(self.unreachable(with_causes(&e.into_error()))),
            }
        }
    }
}

/// The body of one answer. Reading it drives its connection; read to its
/// end, the connection goes back to the pool.
pub struct DrivenBody {
    /// `None` once the connection has closed.
    conn: Option<Conn>,
    body: Incoming,
    pool: Arc<Pool>,
    ended: bool,
}

impl Stream for DrivenBody {
    type Item = Result<Bytes, BackendError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this.ended {
                return Poll::Ready(None);
            }
            if let Some(conn) = this.conn.as_mut() {
                if Pin::new(&mut conn.io).poll(cx).is_ready() {
                    // What it delivered before closing is in the body.
                    this.conn = None;
                }
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Poll::Ready(Some(Ok(data))),
                    _ => continue,
                },
                Poll::Ready(Some(Err(e))) => {
                    this.ended = true;
                    this.conn = None;
                    return Poll::Ready(Some(Err(BackendError::Protocol {
                        backend: this.pool.backend.clone(),
                        message: format!("reading the answer: {}", with_causes(&e)),
                    })));
                }
                Poll::Ready(None) => {
                    this.ended = true;
                    if let Some(conn) = this.conn.take() {
                        this.pool.checkin(conn);
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;

    /// How the test server answers each request.
    #[derive(Clone, Copy)]
    enum Answer {
        /// A whole chunked answer; the connection stays open.
        Whole,
        /// A whole answer; the server closes the connection when the test
        /// says so.
        WholeThenClose,
        /// The head and a first chunk, then nothing more.
        Partial,
    }

    /// What the server saw: each request's head, and each connection's end.
    enum Seen {
        Head(String),
        Closed,
    }

    /// A raw HTTP/1.1 server on port 0 that counts its connections.
    async fn server(
        answer: Answer,
    ) -> (
        String,
        Arc<AtomicUsize>,
        mpsc::UnboundedReceiver<Seen>,
        Arc<tokio::sync::Notify>,
    ) {
        let close = Arc::new(tokio::sync::Notify::new());
        let close_now = Arc::clone(&close);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::unbounded_channel();
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let tx = tx.clone();
                let close = Arc::clone(&close_now);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut chunk = [0u8; 4096];
                        let n = sock.read(&mut chunk).await.unwrap_or(0);
                        if n == 0 {
                            let _ = tx.send(Seen::Closed);
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).to_string();
                        let Some(end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let head = text[..end].to_string();
                        let length: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(str::to_string)
                            })
                            .and_then(|v| v.trim().parse().ok())
                            .unwrap_or(0);
                        if buf.len() < end + 4 + length {
                            continue;
                        }
                        buf.drain(..end + 4 + length);
                        let _ = tx.send(Seen::Head(head));
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                        let reply = match answer {
                            Answer::Partial => format!("{head}5\r\nfirst\r\n"),
                            _ => format!("{head}5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n"),
                        };
                        if sock.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                        if matches!(answer, Answer::WholeThenClose) {
                            close.notified().await;
                            let _ = sock.shutdown().await;
                            drop(sock);
                            let _ = tx.send(Seen::Closed);
                            return;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}"), accepted, rx, close)
    }

    fn pool(url: &str) -> Arc<Pool> {
        Pool::for_url("b", url, Duration::from_secs(5)).expect("an http URL")
    }

    async fn read_all(mut body: DrivenBody) -> String {
        let mut text = String::new();
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.expect("chunk")).expect("utf-8"));
        }
        text
    }

    #[tokio::test]
    async fn answers_read_to_their_end_share_one_connection() {
        let (url, accepted, mut seen, _) = server(Answer::Whole).await;
        let pool = pool(&format!("{url}/prefix/"));
        for _ in 0..3 {
            let (status, body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
            assert_eq!(status, StatusCode::OK);
            assert_eq!(read_all(body).await, "firstsecond");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let Some(Seen::Head(head)) = seen.recv().await else {
            panic!("no request")
        };
        let host = url.trim_start_matches("http://");
        assert!(
            head.starts_with("POST /prefix/generate HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase()
                .contains(&format!("\r\nhost: {host}")),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase().contains("\r\ncontent-length: 2"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let (url, accepted, mut seen, close) = server(Answer::WholeThenClose).await;
        let pool = pool(&url);
        for round in 1..=2 {
            let (_, body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
            assert_eq!(read_all(body).await, "firstsecond");
            assert!(matches!(seen.recv().await, Some(Seen::Head(_))));
            // The connection is back in the pool; the server closes it
            // before the next request goes out.
            assert_eq!(pool.idle().len(), 1);
            close.notify_one();
            assert!(matches!(seen.recv().await, Some(Seen::Closed)));
            assert_eq!(accepted.load(Ordering::SeqCst), round);
        }
    }

    #[tokio::test]
    async fn dropping_a_body_before_its_end_closes_its_connection() {
        let (url, accepted, mut seen, _) = server(Answer::Partial).await;
        let pool = pool(&url);
        let (_, mut body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
        assert_eq!(body.next().await.expect("a chunk").expect("data"), "first");
        assert!(matches!(seen.recv().await, Some(Seen::Head(_))));
        drop(body);
        // The backend sees the close (and cancels the request).
        assert!(matches!(seen.recv().await, Some(Seen::Closed)));
        // The next call opens a new connection.
        let (_, mut body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
        assert_eq!(body.next().await.expect("a chunk").expect("data"), "first");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_idle_too_long_is_not_reused() {
        let (url, accepted, _seen, _) = server(Answer::Whole).await;
        let pool = pool(&url);
        let (_, body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
        assert_eq!(read_all(body).await, "firstsecond");
        assert_eq!(pool.idle().len(), 1);
        // Back-date its return past the limit.
        if let Some((_, since)) = pool.idle().front_mut() {
            *since = since
                .checked_sub(IDLE_LIMIT + Duration::from_millis(1))
                .expect("a time before");
        }
        let (_, body) = pool.post("/generate", b"{}".to_vec()).await.expect("post");
        assert_eq!(read_all(body).await, "firstsecond");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // The new one is kept; the old one is gone.
        assert_eq!(pool.idle().len(), 1);
    }

    #[tokio::test]
    async fn an_unreachable_backend_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        drop(listener);
        let err = pool(&format!("http://{addr}"))
            .post("/generate", Vec::new())
            .await
            .err()
            .expect("no server");
        assert!(matches!(err, BackendError::Unreachable { .. }), "{err:?}");
    }

    #[test]
    fn only_plain_http_urls_get_a_pool() {
        assert!(Pool::for_url("b", "https://example.com", Duration::from_secs(1)).is_none());
        assert!(Pool::for_url("b", "not a url", Duration::from_secs(1)).is_none());
        assert!(Pool::for_url("b", "http://u:p@h:1", Duration::from_secs(1)).is_none());
        assert!(Pool::for_url("b", "http://h:1/?a=b", Duration::from_secs(1)).is_none());
        let p = Pool::for_url("b", "http://[::1]:8000/v/", Duration::from_secs(1)).expect("pool");
        assert_eq!(p.target.host_header, "[::1]:8000");
        assert_eq!(p.target.prefix, "/v");
        let p = Pool::for_url("b", "http://gpu-3", Duration::from_secs(1)).expect("pool");
        assert_eq!(p.target.host_header, "gpu-3");
        assert!(matches!(p.target.connect, ConnectTo::Name(ref n, 80) if n == "gpu-3"));
    }
}
