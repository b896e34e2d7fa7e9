//! Added latency of the gateway over a direct call to the same backend.
//!
//! One run, side by side: a mock vLLM (in-process, loopback) is called
//! directly with token ids (`/v1/completions`, streamed with the sampled
//! token's logprob, exactly as tito calls it), then through tito
//! (`/v1/chat/completions`: template render + tokenization + decode + a
//! durable SQLite span commit), at 1 and 64 concurrent clients. Prints p50 /
//! p99 latency, requests/s and the added latency. Run:
//!
//!     cargo bench --bench overhead
//!
//! Uses the built-in ChatML test tokenizer (no fetched fixtures needed).
//!
//! `cargo bench --bench overhead -- --auth` instead compares, in one run,
//! two gateways over the same mock at 64 concurrent clients: one with
//! `[auth] api_keys` set (every request checked against three keys) and one
//! open, in alternating rounds; it prints each round and the median ratio.
//! Throughput on a shared machine is noisy, so it also measures the check
//! itself (ns per request) against the gateway's CPU time per request (the
//! process's CPU per request through tito minus that of direct calls, which
//! is the client's and the mock's share).

#[path = "common/load.rs"]
mod load;
#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::sync::Arc;

use load::{ms, MakeRequest, Stats, Until};
use mock_vllm::{MockVllm, Scripted};
use serde_json::json;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::{build_app, AppState, Config};

/// Posts `body` to `url` until `total` requests completed; every one must
/// succeed.
async fn run(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
    concurrency: usize,
    total: usize,
) -> Stats {
    let (client, url, body) = (client.clone(), url.to_string(), Arc::new(body));
    let make: MakeRequest = Arc::new(move || client.post(&url).json(&*body));
    let stats = load::run(&make, concurrency, Until::Total(total)).await;
    assert_eq!(stats.errors, 0, "bench requests failed");
    stats
}

/// A gateway on a free port over `mock`, with `extra` TOML; its address.
async fn start_tito(mock: &MockVllm, dir: &std::path::Path, extra: &str) -> std::net::SocketAddr {
    let config = Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 4096\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n\
         [store]\nurl = \"sqlite://{}/spans.db\"\n{extra}",
        mock.url(),
        dir.display()
    ))
    .expect("config");
    let store = tito::store::open(&config.store.url).expect("store");
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, chatml_renderer(), backends, store).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        tito::server::serve(
            listener,
            tito::config::DEFAULT_MAX_CONNECTIONS,
            build_app(state),
            std::future::pending(),
        )
        .await;
    });
    addr
}

/// Open vs `[auth] api_keys`, alternating rounds at 64 concurrent clients.
async fn auth_overhead(mock: &MockVllm, client: &reqwest::Client, body: serde_json::Value) {
    const KEY: &str = "bench-key-3-of-3";
    let (d1, d2) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let open = start_tito(mock, d1.path(), "").await;
    let keyed = start_tito(
        mock,
        d2.path(),
        &format!("[auth]\napi_keys = [\"bench-key-1-of-3\", \"bench-key-2-of-3\", \"{KEY}\"]\n"),
    )
    .await;
    let body = Arc::new(body);
    let make = |addr: std::net::SocketAddr, key: Option<&'static str>| -> MakeRequest {
        let (client, body) = (client.clone(), body.clone());
        let url = format!("http://{addr}/v1/chat/completions");
        Arc::new(move || {
            let r = client.post(&url).json(&*body);
            match key {
                Some(k) => r.bearer_auth(k),
                None => r,
            }
        })
    };
    let (open_req, keyed_req) = (make(open, None), make(keyed, Some(KEY)));
    for m in [&open_req, &keyed_req] {
        load::run(m, 8, Until::Total(400)).await;
    }
    println!("| round | open req/s | api_keys req/s | ratio | open p50 ms | api_keys p50 ms |");
    println!("|---|---|---|---|---|---|");
    let mut ratios = Vec::new();
    for round in 1..=6 {
        let o = load::run(&open_req, 64, Until::Total(6400)).await;
        let k = load::run(&keyed_req, 64, Until::Total(6400)).await;
        assert_eq!(o.errors + k.errors, 0, "bench requests failed");
        let ratio = k.rps / o.rps;
        ratios.push(ratio);
        println!(
            "| {round} | {:.0} | {:.0} | {ratio:.3} | {} | {} |",
            o.rps,
            k.rps,
            ms(o.p50),
            ms(k.p50)
        );
    }
    ratios.sort_by(f64::total_cmp);
    let median = (ratios[2] + ratios[3]) / 2.0;
    println!("median api_keys / open throughput: {median:.3}");

    // The check alone, as the middleware runs it.
    let cfg = Config::from_toml(&format!(
        "[model]\ntokenizer = \"unused\"\n[[backends]]\nurl = \"http://x:1\"\nkind = \"vllm\"\n\
         [auth]\napi_keys = [\"bench-key-1-of-3\", \"bench-key-2-of-3\", \"{KEY}\"]\n"
    ))
    .expect("config");
    let auth = tito::api::auth::Auth::from_config(&cfg).expect("auth");
    let mut headers = axum::http::HeaderMap::new();
    headers.insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {KEY}").parse().expect("header"),
    );
    let n = 1_000_000u32;
    let t0 = std::time::Instant::now();
    let mut allowed = 0u32;
    for _ in 0..n {
        allowed +=
            u32::from(auth.allows(tito::api::auth::Role::Api, std::hint::black_box(&headers)));
    }
    assert_eq!(allowed, n);
    let check_ns = t0.elapsed().as_nanos() as f64 / f64::from(n);
    // Gateway CPU per request: tito rounds minus direct rounds, same client.
    let direct_url = format!("{}/v1/completions", mock.url());
    let prompt: Vec<u32> = "hello".bytes().map(u32::from).collect();
    let direct = Arc::new(
        json!({"prompt": prompt, "max_tokens": 64, "return_token_ids": true,
        "stream": true, "logprobs": 0, "return_tokens_as_token_ids": true}),
    );
    let (c2, d2) = (client.clone(), direct.clone());
    let direct_req: MakeRequest = Arc::new(move || c2.post(&direct_url).json(&*d2));
    let per_request_cpu = |make: MakeRequest| async move {
        let before = process_cpu_s();
        let s = load::run(&make, 64, Until::Total(6400)).await;
        assert_eq!(s.errors, 0);
        (process_cpu_s() - before) / 6400.0
    };
    let direct_cpu = per_request_cpu(direct_req).await;
    let tito_cpu = per_request_cpu(open_req.clone()).await;
    let gateway_us = (tito_cpu - direct_cpu) * 1e6;
    println!(
        "auth check: {check_ns:.0} ns per request; gateway CPU per request: {gateway_us:.0} µs; \
         check / gateway CPU = {:.3}%",
        check_ns / 10.0 / gateway_us
    );
}

/// CPU seconds (user + system) this process used so far.
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces): utime is the
    // 12th, stime the 13th, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

#[tokio::main]
async fn main() {
    let renderer = chatml_renderer();
    let reply: Vec<u32> = "Sure, here you go."
        .bytes()
        .map(u32::from)
        .chain([IM_END])
        .collect();
    let mock = MockVllm::start(Scripted::ids(reply)).await;
    mock.quiet();
    let dir = tempfile::tempdir().expect("tempdir");
    let addr = start_tito(&mock, dir.path(), "").await;
    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write one short sentence about the sea."}
    ]);
    let prompt = renderer
        .render_ids(&tito::render::RenderInput {
            messages: &serde_json::from_value::<Vec<serde_json::Value>>(messages.clone())
                .expect("msgs"),
            add_generation_prompt: true,
            ..Default::default()
        })
        .expect("render");
    // The direct call is the one tito makes: streamed, with the sampled
    // token's logprob.
    let direct_body = json!({"prompt": prompt, "max_tokens": 64, "return_token_ids": true,
                             "stream": true, "logprobs": 0, "return_tokens_as_token_ids": true});
    let tito_body = json!({"messages": messages, "max_tokens": 64});
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    if std::env::args().any(|a| a == "--auth") {
        auth_overhead(&mock, &client, tito_body).await;
        return;
    }
    let direct_url = format!("{}/v1/completions", mock.url());
    let tito_url = format!("http://{addr}/v1/chat/completions");
    // Warm up both paths (connections, allocator, SQLite pages).
    run(&client, &direct_url, direct_body.clone(), 8, 400).await;
    run(&client, &tito_url, tito_body.clone(), 8, 400).await;
    println!("| concurrency | path | p50 ms | p99 ms | req/s |");
    println!("|---|---|---|---|---|");
    for (concurrency, total) in [(1usize, 3000usize), (64, 12800)] {
        let d = run(
            &client,
            &direct_url,
            direct_body.clone(),
            concurrency,
            total,
        )
        .await;
        let t = run(&client, &tito_url, tito_body.clone(), concurrency, total).await;
        println!(
            "| {concurrency} | direct | {} | {} | {:.0} |",
            ms(d.p50),
            ms(d.p99),
            d.rps
        );
        println!(
            "| {concurrency} | tito | {} | {} | {:.0} |",
            ms(t.p50),
            ms(t.p99),
            t.rps
        );
        println!(
            "| {concurrency} | added | {} | {} | {:.2}x |",
            ms(t.p50.saturating_sub(d.p50)),
            ms(t.p99.saturating_sub(d.p99)),
            t.rps / d.rps
        );
    }
}
