//! Added latency of the gateway over a direct call to the same backend.
//!
//! One run, side by side: a mock vLLM (in-process, loopback) is called
//! directly with token ids (`/v1/completions`), then through tito
//! (`/v1/chat/completions`: template render + tokenization + decode + a
//! durable SQLite span commit), at 1 and 64 concurrent clients. Prints p50 /
//! p99 latency, requests/s and the added latency. Run:
//!
//!     cargo bench --bench overhead
//!
//! Uses the built-in ChatML test tokenizer (no fetched fixtures needed).

#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_vllm::{MockVllm, Scripted};
use serde_json::json;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::{build_app, AppState, Config};

struct Stats {
    p50: Duration,
    p99: Duration,
    rps: f64,
}

async fn run(
    client: &reqwest::Client,
    url: &str,
    body: serde_json::Value,
    concurrency: usize,
    total: usize,
) -> Stats {
    let body = Arc::new(body);
    let per = total / concurrency;
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, body) = (client.clone(), url.to_string(), body.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(per);
                for _ in 0..per {
                    let t = Instant::now();
                    let resp = client.post(&url).json(&*body).send().await;
                    match resp {
                        Ok(r) if r.status().is_success() => {
                            let _ = r.bytes().await;
                        }
                        Ok(r) => panic!("bench request failed: {}", r.status()),
                        Err(e) => panic!("bench request failed: {e}"),
                    }
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
    Stats {
        p50: pct(0.50),
        p99: pct(0.99),
        rps: all.len() as f64 / elapsed.as_secs_f64(),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
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
    let backends = tito::backend::build_backends(&config).expect("backends");
    let state = AppState::new(config, renderer.clone(), backends, store).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, build_app(state)).await;
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
    let direct_body = json!({"prompt": prompt, "max_tokens": 64, "return_token_ids": true});
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
