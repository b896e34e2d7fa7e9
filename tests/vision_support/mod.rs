//! Shared by the vision tests: images, a vision model directory (the Qwen3
//! vocabulary with a Qwen2-VL preprocessor config and a Qwen-VL template),
//! and SGLang `/generate` and vLLM `/inference/v1/generate` mocks that
//! expand image pads as those servers do.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tito::render::Renderer;
use tito::store::DynStore;

use crate::common::{start_gateway_on, Gateway};

pub const PAD: &str = "<|image_pad|>";

/// A PNG of `w` x `h` pixels, each pixel's colour from `seed`.
pub fn png(w: u32, h: u32, seed: u8) -> Vec<u8> {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([seed, (x % 256) as u8, (y % 256) as u8])
    });
    let mut out = std::io::Cursor::new(Vec::new());
    img.write_to(&mut out, image::ImageFormat::Png)
        .expect("png encodes");
    out.into_inner()
}

pub fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

pub fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A model directory: the Qwen3 tokenizer files and a Qwen2-VL
/// preprocessor_config.json (factor 28, at most 64 pads an image).
pub fn model_dir() -> tempfile::TempDir {
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/tokenizers/qwen3");
    assert!(
        src.join("tokenizer.json").is_file(),
        "{} is missing: run scripts/fetch-tokenizers.sh",
        src.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).expect("copy tokenizer");
    }
    let pre = json!({"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2,
                     "min_pixels": 3136, "max_pixels": 50176,
                     "image_processor_type": "Qwen2VLImageProcessor"});
    std::fs::write(dir.path().join("preprocessor_config.json"), pre.to_string()).expect("write");
    dir
}

pub fn config_text(dir: &std::path::Path, backend: &str, kind: &str, extra: &str) -> String {
    let template = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/templates/qwen_vl_tools.jinja");
    format!(
        "[model]\nname = \"test-model\"\ntokenizer = \"{}\"\nchat_template = \"{}\"\n\
         vision = \"qwen2_vl\"\nmax_model_len = 4096\n{extra}\n\
         [[backends]]\nurl = \"{backend}\"\nkind = \"{kind}\"\n[store]\nurl = \"memory://\"\n",
        dir.display(),
        template.display()
    )
}

pub type Seen = Arc<Mutex<Vec<Value>>>;

/// The processor of `model_dir`'s preprocessor_config.json.
pub fn vision() -> tito::render::vision::VisionConfig {
    tito::render::vision::VisionConfig {
        max_pixels: 50176,
        ..tito::render::vision::VisionConfig::defaults(tito::render::vision::VisionFamily::Qwen2Vl)
    }
}

/// What SGLang's multimodal processor (`input_ids`, `image_data`) and
/// vLLM's `/inference/v1/generate` (`token_ids`, `content_parts`) do with a
/// prompt and its images: the i-th pad becomes the i-th image's pad run
/// (plus `extra` pads on the first image, to play a processor that counts
/// differently).
pub fn expand(body: &Value, extra: usize) -> Vec<u32> {
    let pad = 151655;
    let (ids, urls) = if body.get("token_ids").is_some() {
        let urls: Vec<Value> = body["content_parts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| p["url"].clone())
            .collect();
        (&body["token_ids"], urls)
    } else {
        let urls = body["image_data"].as_array().cloned().unwrap_or_default();
        (&body["input_ids"], urls)
    };
    let ids: Vec<u32> = serde_json::from_value(ids.clone()).expect("ids");
    let limits = tito::render::image::ImageLimits::default();
    let mut counts = urls.iter().map(|u| {
        let im =
            tito::render::image::parse_image_url(u.as_str().expect("url"), &limits).expect("image");
        let (w, h) = im.oriented_size();
        vision()
            .image_grid(u64::from(h), u64::from(w))
            .expect("grid")
            .pad_count
    });
    let mut first = true;
    let mut out = Vec::new();
    for id in ids {
        if id != pad {
            out.push(id);
            continue;
        }
        let n = counts.next().expect("an image for each pad") + if first { extra } else { 0 };
        first = false;
        out.extend(std::iter::repeat_n(pad, n));
    }
    assert!(counts.next().is_none(), "a pad for each image");
    out
}

/// SGLang's `/generate`: each request logged, answered with the next
/// scripted ids in one cumulative event, echoing the expanded prompt when
/// asked (`return_prompt_token_ids`), `extra` pads off on its first image.
pub async fn sglang_mock(script: Vec<Vec<u32>>) -> (String, Seen) {
    sglang_mock_counting(script, 0).await
}

pub async fn sglang_mock_counting(script: Vec<Vec<u32>>, extra: usize) -> (String, Seen) {
    use axum::routing::{get, post};
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
    let generate = move |axum::Json(body): axum::Json<Value>| {
        let log = log.clone();
        let script = script.clone();
        async move {
            let echo =
                (body["return_prompt_token_ids"] == json!(true)).then(|| expand(&body, extra));
            log.lock().expect("lock").push(body);
            let answer = script.lock().expect("lock").pop_front().unwrap_or_default();
            let lps: Vec<Value> = answer.iter().map(|id| json!([-0.5, id, null])).collect();
            let meta = json!({"completion_tokens": answer.len(),
                              "finish_reason": {"type": "stop"},
                              "output_token_logprobs": lps});
            let mut ev = json!({"output_ids": answer, "meta_info": meta});
            if let Some(ids) = echo {
                ev["prompt_token_ids"] = json!(ids);
            }
            (
                [("content-type", "text/event-stream")],
                format!("data: {ev}\n\ndata: [DONE]\n\n"),
            )
        }
    };
    let app = axum::Router::new()
        .route("/generate", post(generate))
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

/// vLLM's `/inference/v1/generate` (`vllm serve --enable-scale-out`): each
/// request logged, answered with the next scripted ids over two chunks
/// (the first echoing the expanded prompt when `return_token_ids` is set,
/// `extra` pads off on its first image), logprobs with ids when asked.
pub async fn vllm_generate_mock(script: Vec<Vec<u32>>, extra: usize) -> (String, Seen) {
    use axum::routing::{get, post};
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let script = Arc::new(Mutex::new(std::collections::VecDeque::from(script)));
    let generate = move |axum::Json(body): axum::Json<Value>| {
        let log = log.clone();
        let script = script.clone();
        async move {
            let echo = (body["return_token_ids"] == json!(true)).then(|| expand(&body, extra));
            let logprobs = body["sampling_params"]["logprobs"].is_number();
            log.lock().expect("lock").push(body);
            let answer = script.lock().expect("lock").pop_front().unwrap_or_default();
            let (head, tail) = answer.split_at(answer.len() / 2);
            let choice = |ids: &[u32], finish: Value| {
                let content: Vec<Value> = ids
                    .iter()
                    .map(|id| json!({"token_id": id, "logprob": -0.5, "rank": 1,
                                     "top_logprobs": [{"token_id": id, "logprob": -0.5, "rank": 1}]}))
                    .collect();
                json!({"index": 0, "token_ids": ids, "finish_reason": finish,
                       "logprobs": if logprobs { json!({"content": content}) } else { Value::Null }})
            };
            let mut first = json!({"request_id": "r", "choices": [choice(head, Value::Null)]});
            if let Some(ids) = echo {
                first["prompt_token_ids"] = json!(ids);
            }
            let last = json!({"request_id": "r", "choices": [choice(tail, json!("stop"))]});
            (
                [("content-type", "text/event-stream")],
                format!("data: {first}\n\ndata: {last}\n\ndata: [DONE]\n\n"),
            )
        }
    };
    let app = axum::Router::new()
        .route("/inference/v1/generate", post(generate))
        .route("/health", get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

pub struct Setup {
    pub g: Gateway,
    pub store: DynStore,
    pub seen: Seen,
    pub _dir: tempfile::TempDir,
}

pub async fn setup(script: Vec<Vec<u32>>, extra: &str) -> Setup {
    let dir = model_dir();
    let (url, seen) = sglang_mock(script).await;
    let config =
        tito::Config::from_toml(&config_text(dir.path(), &url, "sglang", extra)).expect("config");
    let renderer = Renderer::load(&config.model).expect("vision model loads");
    let store = tito::store::open_with_options("memory://", &Default::default()).expect("store");
    let g = start_gateway_on(config, renderer, store.clone()).await;
    Setup {
        g,
        store,
        seen,
        _dir: dir,
    }
}

/// Ids of `pieces` encoded one by one: valid, not canonical.
pub fn pieces(r: &Renderer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .flat_map(|p| r.encode(p).expect("enc"))
        .collect()
}

pub fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "zoom", "description": "Zoom into the picture",
        "parameters": {"type": "object", "properties": {"factor": {"type": "integer"}}, "required": ["factor"]}}}])
}

/// The lengths of the runs of `pad` in `ids`, in order.
pub fn runs(ids: &[u32], pad: u32) -> Vec<usize> {
    let mut out = Vec::new();
    let mut n = 0;
    for &id in ids.iter().chain([u32::MAX].iter()) {
        if id == pad {
            n += 1;
        } else if n > 0 {
            out.push(n);
            n = 0;
        }
    }
    out
}

impl Setup {
    /// Trajectory `tid` as stored.
    pub async fn stored(&self, tid: &str) -> tito::store::Trajectory {
        self.store
            .get_trajectory(tid)
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("trajectory {tid} is stored"))
    }

    /// A chat call of `tid` whose one user message is the image at `url`.
    pub async fn ask_image(&self, tid: &str, url: &str) -> reqwest::Response {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}]});
        self.g
            .post(&format!("/t/{tid}/v1/chat/completions"), body)
            .await
    }
}

/// The message of an OpenAI-shaped error body.
pub fn error_message(err: &Value) -> &str {
    err["error"]["message"].as_str().unwrap_or_default()
}
