//! `http(s)://` image URLs: refused unasked while `[model] image_fetch` is
//! off or the host is not listed (a loopback listener sees no connection),
//! fetched from a listed host otherwise, without following redirects and
//! within `max_image_bytes`; the request as stored names the image by hash.

mod common;
mod vision_support;

use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::StatusCode;
use serde_json::{json, Value};
use vision_support::*;

/// A listener nothing answers on: whether anyone connected is read from
/// its backlog (a connect completes there before the client goes on).
struct Untouched(std::net::TcpListener);

impl Untouched {
    fn new() -> Self {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        Untouched(l)
    }

    fn addr(&self) -> String {
        self.0.local_addr().expect("addr").to_string()
    }

    fn connected(&self) -> bool {
        self.0.accept().is_ok()
    }
}

/// An image host: `/cat.png` (a PNG), `/moved` (a redirect to it),
/// `/big.png` (more bytes than the limit), `/text` (not an image).
async fn image_host(png: Vec<u8>) -> String {
    use axum::routing::get;
    let cat = png.clone();
    let app = axum::Router::new()
        .route(
            "/cat.png",
            get(move || {
                let b = cat.clone();
                async move { ([(CONTENT_TYPE, "image/png")], b) }
            }),
        )
        .route(
            "/moved",
            get(|| async { (StatusCode::FOUND, [(LOCATION, "/cat.png")], "") }),
        )
        .route(
            "/big.png",
            get(|| async { ([(CONTENT_TYPE, "image/png")], vec![0u8; 4096]) }),
        )
        .route(
            "/text",
            get(|| async { ([(CONTENT_TYPE, "text/html")], "<html></html>") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr.to_string()
}

fn ask(url: &str) -> Value {
    json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": url}}]}]})
}

async fn refused(s: &Setup, tid: &str, url: &str, cause: &str) {
    let resp =
        s.g.post(&format!("/t/{tid}/v1/chat/completions"), ask(url))
            .await;
    assert_eq!(resp.status(), 400, "{url}");
    let err: Value = resp.json().await.expect("json");
    let msg = error_message(&err);
    assert!(msg.contains(cause), "{url}: {msg}");
    assert!(
        s.store.get_trajectory(tid).await.expect("read").is_none(),
        "{tid}"
    );
}

#[tokio::test]
async fn with_fetching_off_no_url_is_fetched() {
    let s = setup(vec![], "").await;
    let listener = Untouched::new();
    let url = format!("http://{}/cat.png", listener.addr());
    refused(&s, "off-1", &url, "fetching is off").await;
    assert!(!listener.connected(), "no connection was attempted");
    assert!(s.seen.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn only_listed_hosts_are_fetched_and_redirects_are_not_followed() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let cat = png(40, 30, 9);
    let host = image_host(cat.clone()).await;
    let other = Untouched::new();
    let extra =
        format!("image_fetch = true\nimage_fetch_hosts = [\"{host}\"]\nmax_image_bytes = 2048\n");
    let answer = [qwen.encode("A cat.").expect("enc"), vec![im_end]].concat();
    let s = setup(vec![answer], &extra).await;

    refused(
        &s,
        "host-1",
        &format!("http://{}/cat.png", other.addr()),
        "not in [model] image_fetch_hosts",
    )
    .await;
    assert!(
        !other.connected(),
        "a host not listed is never connected to"
    );
    refused(&s, "host-2", &format!("http://{host}/moved"), "HTTP 302").await;
    refused(
        &s,
        "host-3",
        &format!("http://{host}/big.png"),
        "max_image_bytes = 2048",
    )
    .await;
    refused(
        &s,
        "host-4",
        &format!("http://{host}/text"),
        "text/html is not supported",
    )
    .await;
    assert!(
        s.seen.lock().expect("lock").is_empty(),
        "no backend was asked"
    );

    let url = format!("http://{host}/cat.png");
    let resp = s.g.post("/t/host-5/v1/chat/completions", ask(&url)).await;
    assert_eq!(resp.status(), 200);
    let seen = s.seen.lock().expect("lock").clone();
    assert_eq!(seen[0]["image_data"], json!([data_url(&cat)]));
    let t = s
        .store
        .get_trajectory("host-5")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(t.calls[0].images[0].sha256, sha(&cat));
    let stored = s
        .store
        .image(&sha(&cat))
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(stored.bytes.as_slice(), cat.as_slice());
    // The stored request names the image by hash, not by the URL.
    let request = t.calls[0].request.to_string();
    assert!(!request.contains(&url), "{request}");
    assert!(request.contains(&format!("sha256:{}", sha(&cat))));
}

#[test]
fn fetching_needs_its_hosts_named() {
    let base = "[model]\nname = \"m\"\ntokenizer = \"t\"\n";
    for (extra, key) in [
        ("image_fetch = true\n", "model.image_fetch_hosts"),
        (
            "image_fetch = true\nimage_fetch_hosts = [\"http://x\"]\n",
            "model.image_fetch_hosts",
        ),
        ("image_fetch_timeout_s = 0\n", "model.image_fetch_timeout_s"),
        (
            "max_images_per_request = 0\n",
            "model.max_images_per_request",
        ),
        ("vision = \"llava\"\n", "vision"),
    ] {
        let err = tito::Config::from_toml(&format!("{base}{extra}")).expect_err(extra);
        assert!(err.to_string().contains(key), "{extra}: {err}");
    }
}
