//! The gateway's HTTP server (`tito::server::serve`): a graceful
//! shutdown answers the request in flight, closes idle kept-alive
//! connections, and stops accepting.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use tito::config::DEFAULT_MAX_CONNECTIONS;
use tito::server::serve;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
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
    let server = tokio::spawn(serve(listener, DEFAULT_MAX_CONNECTIONS, app, async {
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

/// Reads one HTTP/1.1 answer whose body ends with `end`.
async fn read_answer(conn: &mut TcpStream, end: &[u8]) -> Vec<u8> {
    let mut answer = Vec::new();
    while !answer.ends_with(end) {
        let mut buf = [0u8; 1024];
        let n = conn.read(&mut buf).await.expect("read");
        assert!(n > 0, "closed before its answer");
        answer.extend_from_slice(&buf[..n]);
    }
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_past_the_cap_waits_until_one_closes() {
    let app = Router::new().route("/quick", get(|| async { "quick" }));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(serve(listener, 1, app, std::future::pending()));

    let request = b"GET /quick HTTP/1.1\r\nhost: t\r\n\r\n";
    let mut first = TcpStream::connect(addr).await.expect("connect");
    first.write_all(request).await.expect("send");
    read_answer(&mut first, b"quick").await;
    // The kernel completes the second handshake (the accept backlog), but
    // the server does not take the connection while the first is open.
    let mut second = TcpStream::connect(addr).await.expect("connect");
    second.write_all(request).await.expect("send");
    let mut buf = [0u8; 64];
    let waited = tokio::time::timeout(Duration::from_millis(300), second.read(&mut buf)).await;
    assert!(waited.is_err(), "served past the connection cap");
    // Once the first closes, the second is taken and answered.
    drop(first);
    tokio::time::timeout(FAILSAFE, read_answer(&mut second, b"quick"))
        .await
        .expect("served once a place is free");
}
