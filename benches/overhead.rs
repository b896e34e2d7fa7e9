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
    let config = Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 4096\n\
         [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n\
         [store]\nurl = \"sqlite://{}/spans.db\"\n",
        mock.url(),
        dir.path().display()
    ))
    .expect("config");
    let store = tito::store::open(&config.store.url).expect("store");
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, renderer.clone(), backends, store).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(tito::api::no_delay(listener), build_app(state)).await;
    });
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
