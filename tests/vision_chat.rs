//! Images end to end on the real Qwen3 vocabulary (which holds the Qwen-VL
//! vision tokens) with a Qwen-VL style template and `[model] vision =
//! "qwen2_vl"`, in front of an SGLang mock: placeholder runs exact in the
//! recorded prompt, one pad per image on SGLang's wire beside `image_data`,
//! images stored once, and every bad image refused before anything is asked
//! or recorded.

mod common;
mod vision_support;

use base64::Engine as _;
use common::{sse_events, start_gateway_on};
use serde_json::{json, Value};
use tito::render::Renderer;
use vision_support::*;

/// The first row's `images` and `image_grid_thw` of a Parquet export.
fn parquet_images(bytes: bytes::Bytes) -> (Vec<Vec<u8>>, Vec<Vec<i32>>) {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::Field;
    let reader = SerializedFileReader::new(bytes).expect("parquet opens");
    let row = reader
        .get_row_iter(None)
        .expect("rows")
        .next()
        .expect("a row")
        .expect("row");
    let (mut images, mut grids) = (Vec::new(), Vec::new());
    for (name, f) in row.get_column_iter() {
        let Field::ListInternal(list) = f else {
            continue;
        };
        match name.as_str() {
            "images" => {
                images = list
                    .elements()
                    .iter()
                    .map(|e| match e {
                        Field::Bytes(b) => b.data().to_vec(),
                        other => panic!("image element {other:?}"),
                    })
                    .collect()
            }
            "image_grid_thw" => {
                grids = list
                    .elements()
                    .iter()
                    .map(|e| match e {
                        Field::ListInternal(l) => l
                            .elements()
                            .iter()
                            .map(|x| match x {
                                Field::Int(v) => *v,
                                other => panic!("grid element {other:?}"),
                            })
                            .collect(),
                        other => panic!("grid {other:?}"),
                    })
                    .collect()
            }
            _ => {}
        }
    }
    (images, grids)
}

#[tokio::test]
async fn an_agent_with_an_image_in_its_prompt_and_one_in_a_tool_result_continues_exactly() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let call = pieces(
        &qwen,
        &[
            "<tool_call>",
            "\n{\"name\": \"zo",
            "om\", \"arguments\": {\"factor\": 2}}\n",
            "</tool_call>",
        ],
    );
    let answer2 = pieces(&qwen, &["A", " c", "at."]);
    let answer3 = pieces(&qwen, &["You", "'re welcome"]);
    let s = setup(
        vec![
            [call.clone(), vec![im_end]].concat(),
            [answer2.clone(), vec![im_end]].concat(),
            [answer3.clone(), vec![im_end]].concat(),
        ],
        "",
    )
    .await;
    let r = s.g.renderer.clone();
    let pad = r.token_to_id(PAD).expect("pad");
    // 64x48 resizes to 56x56: a 4x4 grid, 4 pads; 100x60 to 56x112: 8 pads.
    let (a, b) = (png(64, 48, 1), png(100, 60, 2));
    let user = json!({"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": data_url(&a)}}]});
    let path = "/t/vis-1/v1/chat/completions";
    let body = json!({"messages": [user], "tools": tools(), "return_token_ids": true});
    let first: Value = s.g.post(path, body).await.json().await.expect("json");
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let tool_call = first["choices"][0]["message"]["tool_calls"][0].clone();
    let prompt1: Vec<u32> = serde_json::from_value(first["prompt_token_ids"].clone()).expect("ids");
    assert_eq!(runs(&prompt1, pad), [4]);

    let assistant =
        json!({"role": "assistant", "content": null, "tool_calls": [tool_call.clone()]});
    let tool = json!({"role": "tool", "tool_call_id": tool_call["id"], "content": [
        {"type": "text", "text": "zoomed:"},
        {"type": "image_url", "image_url": {"url": data_url(&b)}}]});
    let messages2 = json!([user, assistant, tool]);
    let body = json!({"messages": messages2, "tools": tools(), "return_token_ids": true});
    let second: Value = s.g.post(path, body).await.json().await.expect("json");
    assert_eq!(
        second["choices"][0]["message"]["content"], "A cat.",
        "{second}"
    );
    let prompt2: Vec<u32> =
        serde_json::from_value(second["prompt_token_ids"].clone()).expect("ids");
    // The first prompt and its sampled ids verbatim, then the tool result.
    let kept = [prompt1.clone(), call.clone(), vec![im_end]].concat();
    assert_eq!(&prompt2[..kept.len()], kept.as_slice());
    assert_eq!(runs(&prompt2, pad), [4, 8]);

    let mut messages3 = messages2.as_array().expect("list").clone();
    messages3.push(json!({"role": "assistant", "content": "A cat."}));
    messages3.push(json!({"role": "user", "content": "Thanks!"}));
    let body = json!({"messages": messages3, "tools": tools(), "return_token_ids": true});
    let third: Value = s.g.post(path, body).await.json().await.expect("json");
    let prompt3: Vec<u32> = serde_json::from_value(third["prompt_token_ids"].clone()).expect("ids");
    let kept = [prompt2.clone(), answer2.clone(), vec![im_end]].concat();
    assert_eq!(&prompt3[..kept.len()], kept.as_slice());
    assert_eq!(runs(&prompt3, pad), [4, 8]);

    // SGLang got every image of each prompt, in order, and one pad for each.
    let seen = s.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 3);
    let want = [
        vec![data_url(&a)],
        vec![data_url(&a), data_url(&b)],
        vec![data_url(&a), data_url(&b)],
    ];
    for (sent, (images, prompt)) in seen
        .iter()
        .zip(want.iter().zip([&prompt1, &prompt2, &prompt3]))
    {
        assert_eq!(sent["image_data"], json!(images));
        let ids: Vec<u32> = serde_json::from_value(sent["input_ids"].clone()).expect("ids");
        assert_eq!(runs(&ids, pad), vec![1; images.len()]);
        let collapsed: Vec<u32> = prompt
            .iter()
            .enumerate()
            .filter(|&(i, &t)| t != pad || i == 0 || prompt[i - 1] != pad)
            .map(|(_, &t)| t)
            .collect();
        assert_eq!(ids, collapsed);
    }

    // One sample; the image tokens are prompt or observation (mask 0).
    let rows = s.g.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    let prompt: Vec<u32> = serde_json::from_value(row["prompt_ids"].clone()).expect("ids");
    let response: Vec<u32> = serde_json::from_value(row["response_ids"].clone()).expect("ids");
    let mask: Vec<u32> = serde_json::from_value(row["response_mask"].clone()).expect("mask");
    assert_eq!(prompt, prompt1);
    assert_eq!(
        [prompt.clone(), response.clone()].concat(),
        [prompt3.clone(), answer3, vec![im_end]].concat()
    );
    for (i, &t) in response.iter().enumerate() {
        if t == pad {
            assert_eq!(
                mask[i], 0,
                "image token at response position {i} is observation"
            );
        }
    }
    assert_eq!(runs(&response, pad), [8]);
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    assert_eq!(row["images"], json!([b64(&a), b64(&b)]));
    assert_eq!(row["image_sha256"], json!([sha(&a), sha(&b)]));
    assert_eq!(row["image_mime"], json!(["image/png", "image/png"]));
    assert_eq!(row["image_sizes"], json!([[64, 48], [100, 60]]));
    assert_eq!(row["image_grid_thw"], json!([[1, 4, 4], [1, 4, 8]]));
    // By reference: the hashes, and the bytes from GET /v1/images/{sha256}.
    let by_ref = s.g.export_jsonl("layout=trajectory&images=ref").await;
    assert_eq!(by_ref[0]["images"], json!([null, null]));
    assert_eq!(by_ref[0]["image_sha256"], row["image_sha256"]);
    let got =
        s.g.client
            .get(s.g.url(&format!("/v1/images/{}", sha(&b))))
            .send()
            .await
            .expect("get");
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "image/png");
    assert_eq!(got.bytes().await.expect("bytes").as_ref(), b.as_slice());
    let missing =
        s.g.client
            .get(s.g.url(&format!("/v1/images/{}", "f".repeat(64))))
            .send()
            .await
            .expect("get");
    assert_eq!(missing.status(), 404);
    let bad =
        s.g.client
            .get(s.g.url("/v1/images/nothex"))
            .send()
            .await
            .expect("get");
    assert_eq!(bad.status(), 400);
    // Parquet: the same images, as binary; the grids as lists of lists.
    let url = s.g.url("/v1/export?format=parquet&trajectory=vis-1");
    let bytes =
        s.g.client
            .get(url)
            .send()
            .await
            .expect("get")
            .bytes()
            .await
            .expect("body");
    let (images, grids) = parquet_images(bytes);
    assert_eq!(images, [a.clone(), b.clone()]);
    assert_eq!(grids, [[1, 4, 4], [1, 4, 8]]);
    let per_call = s.g.export_jsonl("layout=per_call").await;
    let shas: Vec<Value> = per_call.iter().map(|r| r["image_sha256"].clone()).collect();
    assert_eq!(
        shas,
        [
            json!([sha(&a)]),
            json!([sha(&a), sha(&b)]),
            json!([sha(&a), sha(&b)])
        ]
    );

    // The images are stored once each, by their hash; the calls name them.
    for bytes in [&a, &b] {
        let stored = s
            .store
            .image(&sha(bytes))
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(stored.bytes.as_slice(), bytes.as_slice());
        assert_eq!(stored.mime, "image/png");
    }
    let t = s.stored("vis-1").await;
    let names: Vec<Vec<String>> = t
        .calls
        .iter()
        .map(|c| c.images.iter().map(|i| i.sha256.clone()).collect())
        .collect();
    assert_eq!(
        names,
        [
            vec![sha(&a)],
            vec![sha(&a), sha(&b)],
            vec![sha(&a), sha(&b)]
        ]
    );
    assert_eq!(t.calls[2].images[1].grid_thw, [1, 4, 8]);
    // Each image's run, where the call's prompt holds it.
    let b_at = t.calls[2].images[1].offset as usize;
    assert_eq!(&prompt3[b_at..b_at + 8], &[pad; 8]);
    assert_eq!(t.calls[2].images[1].tokens, 8);
    // A response_length cut inside the second run ends the row where the
    // run starts and keeps only the first image.
    let cut_at = b_at - prompt1.len() + 3;
    let cut =
        s.g.export_jsonl(&format!("layout=trajectory&response_length={cut_at}"))
            .await;
    let kept: Vec<u32> = serde_json::from_value(cut[0]["response_ids"].clone()).expect("ids");
    assert_eq!(kept.len(), b_at - prompt1.len());
    assert_eq!(cut[0]["image_sha256"], json!([sha(&a)]));
    assert_eq!(cut[0]["truncated"], true);
    // SGLang echoed the prompts it expanded: each the recorded one.
    assert!(seen
        .iter()
        .all(|b| b["return_prompt_token_ids"] == json!(true)));
    // (The template's own re-rendering of the non-canonical ids is drift
    // of another cause.)
    let causes: Vec<Option<&str>> = t
        .calls
        .iter()
        .map(|c| c.drift.as_ref().map(|d| d.cause.as_str()))
        .collect();
    assert!(!causes.contains(&Some("image_placeholder")), "{causes:?}");
    // The request as stored holds references, not the bytes.
    let stored_request = t.calls[1].request.to_string();
    assert!(
        !stored_request.contains(&data_url(&b)[..60]),
        "{stored_request}"
    );
    assert!(stored_request.contains(&format!("sha256:{}", sha(&b))));
}

#[tokio::test]
async fn bad_images_are_refused_before_anything_is_asked_or_recorded() {
    let s = setup(
        vec![],
        "max_image_pixels = 10000\nmax_images_per_request = 2\n",
    )
    .await;
    let ok = data_url(&png(20, 20, 3));
    let jpeg_named_png = {
        let img = image::RgbImage::from_pixel(8, 8, image::Rgb([1, 2, 3]));
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Jpeg)
            .expect("jpeg");
        data_url(&out.into_inner())
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            json!([{"url": "data:image/png;base64,aGVsbG8gd29ybGQ="}]),
            "not a PNG, JPEG, WebP or GIF",
        ),
        (
            json!([{"url": jpeg_named_png}]),
            "declared image/png but its bytes are image/jpeg",
        ),
        (
            json!([{"url": "data:image/tiff;base64,AAAA"}]),
            "image/tiff is not supported",
        ),
        (
            json!([{"url": data_url(&png(200, 100, 4))}]),
            "max_image_pixels = 10000",
        ),
        (
            json!([{"url": ok}, {"url": ok}, {"url": ok}]),
            "max_images_per_request = 2",
        ),
        (
            json!([{"url": "https://example.com/cat.png"}]),
            "fetching is off",
        ),
        (
            json!([{"url": format!("sha256:{}", "0".repeat(64))}]),
            "is not stored",
        ),
    ];
    for (i, (urls, cause)) in cases.into_iter().enumerate() {
        let parts: Vec<Value> = urls
            .as_array()
            .expect("list")
            .iter()
            .map(|u| json!({"type": "image_url", "image_url": u}))
            .collect();
        let tid = format!("bad-{i}");
        for stream in [false, true] {
            let body = json!({"messages": [{"role": "user", "content": parts}], "stream": stream});
            let resp =
                s.g.post(&format!("/t/{tid}/v1/chat/completions"), body)
                    .await;
            assert_eq!(resp.status(), 400, "case {i} stream {stream}");
            let err: Value = resp.json().await.expect("json");
            let msg = error_message(&err);
            assert!(msg.contains(cause), "case {i}: {msg}");
        }
        assert!(
            s.store.get_trajectory(&tid).await.expect("read").is_none(),
            "case {i}"
        );
    }
    assert!(
        s.seen.lock().expect("lock").is_empty(),
        "no backend was asked"
    );
}

#[tokio::test]
async fn images_need_a_vision_model_and_an_sglang_backend() {
    // A text-only gateway (the ChatML test tokenizer, vision off).
    let g = common::start_gateway(common::config(&["http://127.0.0.1:9".into()], "")).await;
    let part = json!({"type": "image_url", "image_url": {"url": data_url(&png(8, 8, 5))}});
    let body = json!({"messages": [{"role": "user", "content": [part]}]});
    let resp = g.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert!(error_message(&err).contains("text-only model"), "{err}");
    assert_eq!(err["error"]["param"], "messages[0].content[0]");

    // A vision model behind vLLM: its token-in endpoint takes no images.
    let dir = model_dir();
    let text = config_text(dir.path(), "http://127.0.0.1:9", "vllm", "");
    let config = tito::Config::from_toml(&text).expect("config");
    let renderer = Renderer::load(&config.model).expect("loads");
    let store = tito::store::open_with_options("memory://", &Default::default()).expect("store");
    let g = start_gateway_on(config, renderer, store.clone()).await;
    let resp = g.post("/t/v-1/v1/chat/completions", body).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert!(
        error_message(&err).contains("need an SGLang backend"),
        "{err}"
    );
    assert!(store.get_trajectory("v-1").await.expect("read").is_none());
}

#[tokio::test]
async fn responses_and_messages_images_reach_sglang_as_image_data() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let answer = [qwen.encode("A dog.").expect("enc"), vec![im_end]].concat();
    let s = setup(vec![answer.clone(), answer.clone(), answer], "").await;
    let img = png(30, 90, 6);
    let b64 = base64::engine::general_purpose::STANDARD.encode(&img);
    let r: Value =
        s.g.post(
            "/t/resp-1/v1/responses",
            json!({"input": [{"role": "user", "content": [
                {"type": "input_text", "text": "What is it?"},
                {"type": "input_image", "image_url": data_url(&img)}]}]}),
        )
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(r["status"], "completed", "{r}");
    let resp = s
        .g
        .post(
            "/t/msg-1/v1/messages",
            json!({"model": "test-model", "max_tokens": 32, "stream": true, "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}},
                {"type": "text", "text": "What is it?"}]}]}),
        )
        .await;
    assert_eq!(resp.status(), 200);
    let events = sse_events(resp).await;
    assert!(events.iter().any(|e| e.contains("A dog.")), "{events:?}");
    let seen = s.seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2);
    for sent in &seen {
        assert_eq!(sent["image_data"], json!([data_url(&img)]));
    }
    for tid in ["resp-1", "msg-1"] {
        let t = s.stored(tid).await;
        assert_eq!(t.calls[0].images[0].sha256, sha(&img));
        let request = t.calls[0].request.to_string();
        assert!(
            !request.contains(&b64[..40]),
            "{tid}: bytes left in {request}"
        );
    }
}

#[tokio::test]
async fn a_gateway_restarted_on_the_store_continues_a_trajectory_with_images_exactly() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let answer1 = pieces(&qwen, &["Two", " cats"]);
    let answer2 = pieces(&qwen, &["St", "ill two"]);
    let dir = model_dir();
    let db = tempfile::tempdir().expect("tempdir");
    let (url, seen) = sglang_mock(vec![
        [answer1.clone(), vec![im_end]].concat(),
        [answer2.clone(), vec![im_end]].concat(),
    ])
    .await;
    let text = config_text(dir.path(), &url, "sglang", "").replace(
        "memory://",
        &format!("sqlite://{}/spans.db", db.path().display()),
    );
    let start = || async {
        let config = tito::Config::from_toml(&text).expect("config");
        let renderer = Renderer::load(&config.model).expect("loads");
        let store =
            tito::store::open_with_options(&config.store.url, &Default::default()).expect("store");
        start_gateway_on(config, renderer, store).await
    };
    let img = png(70, 50, 7);
    let user = json!({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(&img)}},
        {"type": "text", "text": "How many cats?"}]});
    let path = "/t/restart-1/v1/chat/completions";
    let first = start().await;
    let body = json!({"messages": [user], "return_token_ids": true});
    let one: Value = first.post(path, body).await.json().await.expect("json");
    let prompt1: Vec<u32> = serde_json::from_value(one["prompt_token_ids"].clone()).expect("ids");

    // A second gateway on the same store: the history comes from the store.
    let second = start().await;
    let messages = json!([user, {"role": "assistant", "content": "Two cats"},
                          {"role": "user", "content": "Sure?"}]);
    let body = json!({"messages": messages, "return_token_ids": true});
    let two: Value = second.post(path, body).await.json().await.expect("json");
    assert_eq!(
        two["choices"][0]["message"]["content"], "Still two",
        "{two}"
    );
    let prompt2: Vec<u32> = serde_json::from_value(two["prompt_token_ids"].clone()).expect("ids");
    let kept = [prompt1, answer1, vec![im_end]].concat();
    assert_eq!(
        &prompt2[..kept.len()],
        kept.as_slice(),
        "the first turn is kept verbatim"
    );
    let rows = second.export_jsonl("layout=trajectory").await;
    assert_eq!(rows.len(), 1, "one sample: {rows:?}");
    assert_eq!(rows[0]["image_sha256"], json!([sha(&img)]));
    assert_eq!(
        seen.lock().expect("lock")[1]["image_data"],
        json!([data_url(&img)])
    );
}

#[tokio::test]
async fn an_exif_rotated_image_counts_as_it_shows() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let s = setup(
        vec![[qwen.encode("Tall.").expect("enc"), vec![im_end]].concat()],
        "",
    )
    .await;
    // 200x50 stored, EXIF orientation 6 (a quarter turn): it shows 50x200,
    // as transformers' load_image and SGLang (exif_transpose) hand it on.
    let exif = [
        b"MM\0\x2a".as_slice(),
        &[0, 0, 0, 8, 0, 1],
        &[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0],
        &[0, 0, 0, 0],
    ]
    .concat();
    let mut jpeg = Vec::new();
    let mut enc = image::codecs::jpeg::JpegEncoder::new(&mut jpeg);
    image::ImageEncoder::set_exif_metadata(&mut enc, exif).expect("exif");
    let pixels = vec![128u8; 200 * 50 * 3];
    image::ImageEncoder::write_image(enc, &pixels, 200, 50, image::ExtendedColorType::Rgb8)
        .expect("jpeg");
    let url = format!(
        "data:image/jpeg;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(&jpeg)
    );
    assert_eq!(s.ask_image("exif-1", &url).await.status(), 200);
    let t = s.stored("exif-1").await;
    let im = &t.calls[0].images[0];
    assert_eq!((im.width, im.height), (50, 200));
    // 50x200 resizes to 56x196: 4 patches across, 14 down.
    assert_eq!(im.grid_thw, [1, 14, 4]);
}

#[tokio::test]
async fn a_backend_that_expands_an_image_differently_is_recorded_as_drift() {
    let qwen = common::real_renderer("qwen3", "");
    let im_end = qwen.token_to_id("<|im_end|>").expect("im_end");
    let dir = model_dir();
    let (url, _seen) = sglang_mock_counting(
        vec![[qwen.encode("Hm.").expect("enc"), vec![im_end]].concat()],
        1,
    )
    .await;
    let config =
        tito::Config::from_toml(&config_text(dir.path(), &url, "sglang", "")).expect("config");
    let renderer = Renderer::load(&config.model).expect("loads");
    let store = tito::store::open_with_options("memory://", &Default::default()).expect("store");
    let g = start_gateway_on(config, renderer, store.clone()).await;
    let body = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": data_url(&png(64, 48, 8))}}]}],
        "return_token_ids": true});
    let r: Value = g
        .post("/t/drift-1/v1/chat/completions", body)
        .await
        .json()
        .await
        .expect("json");
    let prompt: Vec<u32> = serde_json::from_value(r["prompt_token_ids"].clone()).expect("ids");
    let pad = g.renderer.token_to_id(PAD).expect("pad");
    let t = store
        .get_trajectory("drift-1")
        .await
        .expect("read")
        .expect("stored");
    let drift = t.calls[0].drift.as_ref().expect("a drift");
    assert_eq!(drift.cause, "image_placeholder");
    // The backend's run is one pad longer: they part right after tito's run.
    let end = prompt.iter().rposition(|&t| t == pad).expect("pads") + 1;
    assert_eq!(drift.position as usize, end);
    assert_eq!(drift.details["backend_len"], json!(prompt.len() + 1));
}

#[tokio::test]
async fn pixel_values_need_a_vision_model() {
    let g = common::start_gateway(common::config(&["http://127.0.0.1:9".into()], "")).await;
    let resp = reqwest::get(g.url("/v1/export?pixel_values=true"))
        .await
        .expect("export");
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["param"], "pixel_values");
    assert!(error_message(&err).contains("vision model"), "{err}");
    // Off (or absent) is the plain export.
    let resp = reqwest::get(g.url("/v1/export?pixel_values=false"))
        .await
        .expect("export");
    assert_eq!(resp.status(), 200);
}
