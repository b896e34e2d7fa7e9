//! A vision agent's trajectory: 10 turns, each adding one 1024x768 PNG
//! (a tool result's screenshot) to a conversation the agent resends whole,
//! through the gateway in-process (`vision = "qwen2_vl"`, the Qwen3
//! vocabulary, Qwen2.5-VL's shipped processor values: 999 pads an image) in
//! front of an SGLang `/generate` mock, recorded in a SQLite store.
//!
//! Reports, per turn: the whole call (HTTP in, images checked, prompt
//! rendered and expanded, SGLang asked, recorded), and apart from it the
//! two image costs: checking one image (base64, PNG decode, SHA-256) and
//! `Renderer::render_ids` of the whole conversation with its placeholder
//! runs expanded. Then the store's bytes for the trajectory (the same
//! screenshot every turn vs a new one every turn) and the export's MB/s with
//! the images inline (JSONL and Parquet).
//!
//! Needs `.cache/tokenizers/qwen3` (scripts/fetch-tokenizers.sh).
//! Run: cargo bench --bench vision

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use tito::render::image::{parse_image_url, ImageLimits};
use tito::render::placeholders::image_part;
use tito::render::{RenderInput, Renderer};

const TURNS: usize = 10;
const TEMPLATE: &str = "tests/fixtures/templates/qwen_vl_tools.jinja";

/// A 1024x768 screenshot-like PNG: flat panels, a gradient and some
/// noise, different per `seed`.
fn screenshot(seed: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(1024, 768, |x, y| {
        let panel = (x / 128 + y / 96 + seed) % 5;
        let noise = (x.wrapping_mul(2_654_435_761) ^ y.wrapping_mul(40_503) ^ seed) % 16;
        match panel {
            0 => image::Rgb([240, 240, 240]),
            1 => image::Rgb([(x % 256) as u8, (y % 256) as u8, 128]),
            _ => image::Rgb([noise as u8 * 8, 60 + noise as u8, 200]),
        }
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .unwrap_or_else(|e| panic!("png: {e}"));
    out.into_inner()
}

fn data_url(b: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(b)
    )
}

fn model_dir() -> Option<tempfile::TempDir> {
    let src = std::path::PathBuf::from(".cache/tokenizers/qwen3");
    if !src.join("tokenizer.json").is_file() {
        return None;
    }
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap_or_else(|e| panic!("copy: {e}"));
    }
    let pre = json!({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                     "temporal_patch_size": 2, "merge_size": 2});
    std::fs::write(dir.path().join("preprocessor_config.json"), pre.to_string())
        .unwrap_or_else(|e| panic!("write: {e}"));
    Some(dir)
}

/// SGLang's `/generate`, answering `answer` in one cumulative event.
async fn sglang_mock(answer: Vec<u32>) -> String {
    use axum::routing::{get, post};
    let generate = move |axum::Json(_body): axum::Json<Value>| {
        let answer = answer.clone();
        async move {
            let lps: Vec<Value> = answer.iter().map(|id| json!([-0.5, id, null])).collect();
            let meta = json!({"completion_tokens": answer.len(), "finish_reason": {"type": "stop"},
                              "output_token_logprobs": lps});
            let ev = json!({"output_ids": answer, "meta_info": meta});
            (
                [("content-type", "text/event-stream")],
                format!("data: {ev}\n\ndata: [DONE]\n\n"),
            )
        }
    };
    let app = axum::Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { "ok" }))
        // A prompt's images come as data URLs: megabytes a request.
        .layer(axum::extract::DefaultBodyLimit::disable());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}

/// A gateway on `store_url`; its address.
async fn gateway(dir: &std::path::Path, backend: &str, store_url: &str) -> String {
    let text = format!(
        "[server]\nmax_body_bytes = 268435456\n[model]\nname = \"m\"\ntokenizer = \"{}\"\n\
         chat_template = \"{TEMPLATE}\"\nvision = \"qwen2_vl\"\nmax_model_len = 65536\n\
         [[backends]]\nurl = \"{backend}\"\nkind = \"sglang\"\n[store]\nurl = \"{store_url}\"\n",
        dir.display()
    );
    let config = tito::Config::from_toml(&text).unwrap_or_else(|e| panic!("config: {e}"));
    let renderer = Renderer::load(&config.model).unwrap_or_else(|e| panic!("renderer: {e}"));
    let options = tito::store::StoreOptions::from(&config.store);
    let store = tito::store::open_with_options(&config.store.url, &options)
        .unwrap_or_else(|e| panic!("store: {e}"));
    let backends = tito::api::build_backends(&config).unwrap_or_else(|e| panic!("backends: {e}"));
    let state = tito::AppState::new(config, renderer, backends, store)
        .unwrap_or_else(|e| panic!("state: {e}"));
    state
        .restore()
        .await
        .unwrap_or_else(|e| panic!("restore: {e}"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(async move {
        tito::server::serve(
            listener,
            tito::config::DEFAULT_MAX_CONNECTIONS,
            tito::build_app(state),
            std::future::pending(),
        )
        .await;
    });
    format!("http://{addr}")
}

/// The messages of turn `t` (0-based): a user ask, then per earlier turn
/// the assistant's call and a tool result holding screenshot `shots[i]`.
fn messages(t: usize, shots: &[String]) -> Vec<Value> {
    let mut m =
        vec![json!({"role": "user", "content": "Open the settings page and enable dark mode."})];
    for (i, shot) in shots.iter().enumerate().take(t) {
        let id = format!("call_{i}");
        m.push(
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "screenshot", "arguments": "{}"}}]}),
        );
        m.push(json!({"role": "tool", "tool_call_id": id, "content": [
            {"type": "text", "text": format!("step {i}")},
            {"type": "image_url", "image_url": {"url": shot}}]}));
    }
    m
}

/// One agent's trajectory of `TURNS` calls: a user ask with screenshot 0,
/// then per turn the served tool call and its result, screenshot `t`. The
/// time of each call.
async fn run(client: &reqwest::Client, addr: &str, tid: &str, shots: &[String]) -> Vec<Duration> {
    let tools = json!([{"type": "function", "function": {"name": "screenshot",
        "description": "Take a screenshot", "parameters": {"type": "object", "properties": {}}}}]);
    let mut m = vec![json!({"role": "user", "content": [
        {"type": "text", "text": "Open the settings page and enable dark mode."},
        {"type": "image_url", "image_url": {"url": shots[0]}}]})];
    let mut times = Vec::new();
    for t in 1..=TURNS {
        let body = json!({"messages": m, "tools": tools, "max_tokens": 64});
        let start = Instant::now();
        let resp = client
            .post(format!("{addr}/t/{tid}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("post: {e}"));
        let status = resp.status();
        let answer: Value = resp.json().await.unwrap_or_default();
        times.push(start.elapsed());
        assert!(status.is_success(), "turn {t}: {status} {answer}");
        let message = answer["choices"][0]["message"].clone();
        let id = message["tool_calls"][0]["id"].clone();
        m.push(message);
        if let Some(shot) = shots.get(t) {
            m.push(json!({"role": "tool", "tool_call_id": id, "content": [
                {"type": "text", "text": format!("step {t}")},
                {"type": "image_url", "image_url": {"url": shot}}]}));
        }
    }
    times
}

fn file_mib(path: &std::path::Path) -> f64 {
    std::fs::metadata(path).map_or(0.0, |m| m.len() as f64 / (1 << 20) as f64)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let Some(dir) = model_dir() else {
        println!("vision bench: .cache/tokenizers/qwen3 is missing (scripts/fetch-tokenizers.sh)");
        return;
    };
    let pngs: Vec<Vec<u8>> = (0..TURNS as u32).map(screenshot).collect();
    let shots: Vec<String> = pngs.iter().map(|p| data_url(p)).collect();
    println!(
        "screenshot: 1024x768 PNG, {:.0} KiB ({:.0} KiB as a data URL)",
        pngs[0].len() as f64 / 1024.0,
        shots[0].len() as f64 / 1024.0
    );

    // One image checked: base64, PNG decode, SHA-256 (best of 5).
    let limits = ImageLimits::default();
    let check = (0..5)
        .map(|_| {
            let t = Instant::now();
            let im = parse_image_url(&shots[0], &limits).unwrap_or_else(|e| panic!("image: {e}"));
            assert_eq!((im.width, im.height), (1024, 768));
            t.elapsed()
        })
        .min()
        .unwrap_or_default();
    println!(
        "check one image (base64 + PNG decode + sha256): {:.2} ms",
        ms(check)
    );

    // Render + expansion of the whole conversation at turns 1, 5, 10.
    let model = tito::config::ModelConfig {
        tokenizer: dir.path().to_path_buf(),
        chat_template: TEMPLATE.into(),
        vision: tito::config::VisionName::Qwen2Vl,
        ..Default::default()
    };
    let renderer = Renderer::load(&model).unwrap_or_else(|e| panic!("renderer: {e}"));
    for t in [1, 5, 10] {
        let checked: Vec<String> = vec![String::new(); t];
        let mut m = messages(t, &checked);
        for msg in m.iter_mut().filter(|m| m["role"] == "tool") {
            msg["content"][1] = image_part(&"0".repeat(64), 1024, 768);
        }
        let input = RenderInput {
            messages: &m,
            tools: None,
            add_generation_prompt: true,
            kwargs: None,
        };
        let mut best = Duration::MAX;
        let mut n = 0;
        for _ in 0..20 {
            let start = Instant::now();
            n = renderer
                .render_ids(&input)
                .unwrap_or_else(|e| panic!("render: {e}"))
                .len();
            best = best.min(start.elapsed());
        }
        println!(
            "render + expand, turn {t:>2} ({t} images, {n} prompt tokens): {:.3} ms",
            ms(best)
        );
    }

    // Whole calls through the gateway, and the store's bytes.
    let qwen = Renderer::load(&tito::config::ModelConfig {
        tokenizer: dir.path().to_path_buf(),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("qwen3: {e}"));
    let call = "<tool_call>\n{\"name\": \"screenshot\", \"arguments\": {}}\n</tool_call>";
    let mut answer = qwen.encode(call).unwrap_or_default();
    answer.extend(qwen.token_to_id("<|im_end|>"));
    let backend = sglang_mock(answer).await;
    let client = reqwest::Client::new();
    for (label, same) in [
        ("a new screenshot every turn", false),
        ("the same screenshot every turn", true),
    ] {
        let db = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let url = format!("sqlite://{}/spans.db", db.path().display());
        let addr = gateway(dir.path(), &backend, &url).await;
        let used: Vec<String> = if same {
            vec![shots[0].clone(); TURNS]
        } else {
            shots.clone()
        };
        let times = run(&client, &addr, "vision-1", &used).await;
        let per_turn: Vec<String> = times.iter().map(|d| format!("{:.1}", ms(*d))).collect();
        println!("{label}: call ms per turn [{}]", per_turn.join(", "));
        let distinct = if same { 1 } else { TURNS };
        let image_bytes: usize = pngs.iter().take(distinct).map(Vec::len).sum();
        println!(
            "  store for the trajectory: spans.db {:.2} MiB + WAL {:.2} MiB ({distinct} distinct \
             images: {:.2} MiB of PNG)",
            file_mib(&db.path().join("spans.db")),
            file_mib(&db.path().join("spans.db-wal")),
            image_bytes as f64 / (1 << 20) as f64
        );
        if !same {
            // Export with images inline, of 10 such trajectories.
            // Each its own screenshots, as agents' are.
            let mut exported_png = pngs.iter().map(Vec::len).sum::<usize>();
            for i in 2..=10u32 {
                let own: Vec<Vec<u8>> =
                    (0..TURNS as u32).map(|t| screenshot(i * 100 + t)).collect();
                exported_png += own.iter().map(Vec::len).sum::<usize>();
                let own: Vec<String> = own.iter().map(|p| data_url(p)).collect();
                run(&client, &addr, &format!("vision-{i}"), &own).await;
            }
            let store = tito::store::open_with_options(&url, &Default::default())
                .unwrap_or_else(|e| panic!("store: {e}"));
            for format in [tito::export::Format::Jsonl, tito::export::Format::Parquet] {
                let opts =
                    tito::export::ExportOptions::new(format, tito::export::Layout::Trajectory);
                let store: Arc<dyn tito::store::SpanStore> = store.clone();
                let (took, bytes) = tokio::task::spawn_blocking(move || {
                    let mut best = (Duration::MAX, 0usize);
                    for _ in 0..3 {
                        let it = store
                            .scan(&Default::default())
                            .unwrap_or_else(|e| panic!("scan: {e}"));
                        let mut out = Vec::new();
                        let start = Instant::now();
                        tito::export::export(it, &*store, &opts, &mut out, &mut |_| {})
                            .unwrap_or_else(|e| panic!("export: {e}"));
                        best = best.min((start.elapsed(), out.len()));
                    }
                    best
                })
                .await
                .unwrap_or_else(|e| panic!("join: {e}"));
                println!(
                    "  export {format:?} of 10 trajectories, images inline: {:.1} MiB ({:.1} MiB of \
                     PNG) in {:.0} ms = {:.0} MB/s written, {:.0} MB/s of image bytes",
                    bytes as f64 / (1 << 20) as f64,
                    exported_png as f64 / (1 << 20) as f64,
                    ms(took),
                    bytes as f64 / took.as_secs_f64() / 1e6,
                    exported_png as f64 / took.as_secs_f64() / 1e6
                );
            }
        }
    }
}
