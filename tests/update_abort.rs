//! Weight updates in `abort` mode: generations in flight are stopped, keep
//! what they sampled, and continue on the new weights with one answer to
//! the client; the record is one call whose version spans mark the seam.
//! Backends are [`common::versioned`] mocks whose tokens and logprobs are a
//! function of (sequence position, weight version), on vLLM's and SGLang's
//! wire.

mod common;

use common::versioned::{VersionedMock, Wire};
use common::{sse_events, start_gateway, Gateway};
use serde_json::{json, Value};

/// v1 writes lowercase letters, v2 uppercase (by position); each version's
/// logprob is its own function of the position.
fn letters() -> Box<common::versioned::TokenFn> {
    Box::new(|pos, version| {
        let base = if version == "v2" { b'A' } else { b'a' };
        let id = u32::from(base + (pos % 26) as u8);
        (id, logprob(pos, version))
    })
}

fn logprob(pos: usize, version: &str) -> f32 {
    let shift = if version == "v2" { 1.0 } else { 0.0 };
    -0.01 * (pos % 50) as f32 - shift
}

async fn gateway(mock: &VersionedMock, extra: &str) -> Gateway {
    let g = start_gateway(config(mock, extra)).await;
    label_v1(&g).await;
    g
}

fn config(mock: &VersionedMock, extra: &str) -> tito::Config {
    let text = format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = 512\n{}\n[store]\nurl = \"memory://\"\n{extra}",
        mock.backend_toml()
    );
    tito::Config::from_toml(&text).expect("config")
}

async fn label_v1(g: &Gateway) {
    // Label the weights the mock starts with, so they have a number.
    let (status, _) = post(g, "/admin/weights", json!({"version": "v1"})).await;
    assert_eq!(status, 200);
}

async fn post(g: &Gateway, path: &str, body: Value) -> (u16, Value) {
    let r = g.post(path, body).await;
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
        "stream": stream, "ignore_eos": true})
}

/// The text of a streamed chat answer, and its last finish reason.
fn streamed_text(events: &[String]) -> (String, String) {
    let mut text = String::new();
    let mut finish = String::new();
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).expect("chunk");
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

/// What v1 then v2 write for `n` tokens from sequence position `from`,
/// switching after `seam` tokens.
fn expected(from: usize, seam: usize, n: usize) -> (Vec<u32>, Vec<f32>, String) {
    let f = letters();
    let (mut ids, mut lps) = (Vec::new(), Vec::new());
    for k in 0..n {
        let v = if k < seam { "v1" } else { "v2" };
        let (id, lp) = f(from + k, v);
        ids.push(id);
        lps.push(lp);
    }
    let text = ids.iter().map(|&i| char::from(i as u8)).collect();
    (ids, lps, text)
}

/// Runs one call of `max_tokens` on trajectory `tid` through an update
/// `begin(abort)` → `commit(v2)` that interrupts it after `seam` tokens.
async fn interrupted_call(wire: Wire, stream: bool, tid: &str) {
    let mock = VersionedMock::start(wire, "v1", letters()).await;
    let g = gateway(&mock, "").await;
    let (seam, max_tokens) = (5usize, 12u32);
    mock.hold_after(Some(seam));
    let client = g.client.clone();
    let url = g.url(&format!("/t/{tid}/v1/chat/completions"));
    let call = tokio::spawn(async move {
        client
            .post(url)
            .json(&chat(max_tokens, stream))
            .send()
            .await
            .expect("send")
    });
    mock.wait_held(1).await;
    mock.hold_after(None);
    let (status, begun) = post(&g, "/admin/weights/begin", json!({"mode": "abort"})).await;
    assert_eq!(status, 200, "{begun}");
    assert_eq!(begun["mode"], "abort");
    mock.push_weights("v2");
    let (status, committed) = post(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
    assert_eq!(status, 200, "{committed}");
    assert_eq!(committed["version_seq"], 2);
    let resp = call.await.expect("call task");
    assert_eq!(resp.status(), 200);
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "one request, one continuation");
    let (prompt_key, max_key) = match wire {
        Wire::Vllm => ("/prompt", "/max_tokens"),
        Wire::Sglang => ("/input_ids", "/sampling_params/max_new_tokens"),
    };
    let ids_of = |v: &Value| -> Vec<u32> {
        serde_json::from_value(v.pointer(prompt_key).cloned().expect("prompt")).expect("ids")
    };
    let prompt = ids_of(&requests[0]);
    let (ids, lps, text) = expected(prompt.len(), seam, max_tokens as usize);
    // The continuation: the prompt, then exactly the ids sampled so far,
    // asking for what is left.
    let mut continued = prompt.clone();
    continued.extend_from_slice(&ids[..seam]);
    assert_eq!(ids_of(&requests[1]), continued);
    assert_eq!(
        requests[1].pointer(max_key),
        Some(&json!(max_tokens as usize - seam))
    );
    let (got, finish) = if stream {
        streamed_text(&sse_events(resp).await)
    } else {
        let v: Value = resp.json().await.expect("json");
        (
            v["choices"][0]["message"]["content"]
                .as_str()
                .expect("content")
                .to_string(),
            v["choices"][0]["finish_reason"]
                .as_str()
                .expect("finish")
                .to_string(),
        )
    };
    assert_eq!(got, text, "one answer across the seam");
    assert_eq!(finish, "length", "max_tokens honoured across the seam");
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    let calls = t["calls"].as_array().expect("calls");
    assert_eq!(calls.len(), 1, "one call in the store");
    let c = &calls[0];
    let sampled: Vec<u32> = serde_json::from_value(c["sampled_ids"].clone()).expect("ids");
    assert_eq!(sampled, ids);
    let recorded: Vec<f32> = serde_json::from_value(c["logprobs"].clone()).expect("logprobs");
    assert_eq!(
        recorded, lps,
        "each token's logprob from the weights that sampled it"
    );
    assert_eq!(
        c["versions"],
        json!([{"start": 0, "version": "v1", "seq": 1}, {"start": seam, "version": "v2", "seq": 2}])
    );
    assert_eq!(mock.aborted(), 1);
    // The export: each response token with its version's number.
    let rows = g.export_jsonl("layout=trajectory").await;
    let row = rows
        .iter()
        .find(|r| r["trajectory_id"] == tid)
        .expect("the trajectory's row");
    let mut want = vec![json!(1); seam];
    want.extend(vec![json!(2); max_tokens as usize - seam]);
    assert_eq!(row["response_versions"], json!(want));
    assert_eq!(row["min_version"], 1);
    assert_eq!(row["max_version"], 2);
}

#[tokio::test]
async fn vllm_non_streamed_call_continues_across_an_abort_update() {
    interrupted_call(Wire::Vllm, false, "vns").await;
}

#[tokio::test]
async fn vllm_streamed_call_continues_across_an_abort_update() {
    interrupted_call(Wire::Vllm, true, "vs").await;
}

#[tokio::test]
async fn sglang_non_streamed_call_continues_across_an_abort_update() {
    interrupted_call(Wire::Sglang, false, "sns").await;
}

#[tokio::test]
async fn sglang_streamed_call_continues_across_an_abort_update() {
    interrupted_call(Wire::Sglang, true, "ss").await;
}

/// A stop string whose first half v1 sampled before the seam and whose
/// second half v2 sampled after it ends the answer there.
#[tokio::test]
async fn a_stop_string_across_the_seam_stops_the_answer() {
    // v1 writes only `S`, v2 only `T`: "ST" exists only across the seam.
    let token: Box<common::versioned::TokenFn> = Box::new(|pos, version| {
        let id = if version == "v2" { b'T' } else { b'S' };
        (u32::from(id), -0.1 - 0.001 * (pos % 10) as f32)
    });
    let mock = VersionedMock::start(Wire::Vllm, "v1", token).await;
    let g = gateway(&mock, "").await;
    mock.hold_after(Some(4));
    let client = g.client.clone();
    let url = g.url("/t/stop/v1/chat/completions");
    let call = tokio::spawn(async move {
        let mut body = chat(30, false);
        body["stop"] = json!(["ST"]);
        client.post(url).json(&body).send().await.expect("send")
    });
    mock.wait_held(1).await;
    mock.hold_after(None);
    let (status, _) = post(&g, "/admin/weights/begin", json!({"mode": "abort"})).await;
    assert_eq!(status, 200);
    mock.push_weights("v2");
    let (status, _) = post(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
    assert_eq!(status, 200);
    let v: Value = call.await.expect("task").json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "SSS", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], "ST");
    let t = g.get_json("/v1/trajectories/stop").await;
    let sampled: Vec<u32> =
        serde_json::from_value(t["calls"][0]["sampled_ids"].clone()).expect("ids");
    assert_eq!(
        sampled,
        vec![83, 83, 83, 83, 84],
        "the ids up to the one that completed the stop string"
    );
}

/// A tool call whose JSON arguments the update cut in two parses as one
/// call, streamed and not.
#[tokio::test]
async fn a_tool_call_cut_inside_its_arguments_parses_as_one_call() {
    const CALL: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for stream in [false, true] {
        // The same text from both versions, by response position (the
        // first token generated is position 0).
        let origin = std::sync::Arc::new(std::sync::Mutex::new(None::<usize>));
        let token: Box<common::versioned::TokenFn> = Box::new(move |pos, _version| {
            let at = *origin.lock().expect("lock").get_or_insert(pos);
            let p = pos - at;
            let id = CALL
                .as_bytes()
                .get(p)
                .map_or(tito::render::testing::IM_END, |b| u32::from(*b));
            (id, -0.2)
        });
        let mock = VersionedMock::start(Wire::Vllm, "v1", token).await;
        let g = gateway(&mock, "").await;
        // Inside `"Paris"`.
        let cut = CALL.find("Par").expect("in the text") + 2;
        mock.hold_after(Some(cut));
        let client = g.client.clone();
        let url = g.url(&format!("/t/tool-{stream}/v1/chat/completions"));
        let call = tokio::spawn(async move {
            let body = json!({"messages": [{"role": "user", "content": "weather?"}],
                "max_tokens": 200, "stream": stream,
                "tools": [{"type": "function", "function": {"name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]});
            client.post(url).json(&body).send().await.expect("send")
        });
        mock.wait_held(1).await;
        mock.hold_after(None);
        let (status, _) = post(&g, "/admin/weights/begin", json!({"mode": "abort"})).await;
        assert_eq!(status, 200);
        let (status, _) = post(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
        assert_eq!(status, 200);
        let resp = call.await.expect("task");
        assert_eq!(resp.status(), 200);
        let (name, args, finish) = if stream {
            let (mut name, mut args, mut finish) = (String::new(), String::new(), String::new());
            for e in sse_events(resp).await.iter().filter(|e| *e != "[DONE]") {
                let v: Value = serde_json::from_str(e).expect("chunk");
                for tc in v["choices"][0]["delta"]["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                {
                    name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                    args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
                }
                if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
                    finish = f.to_string();
                }
            }
            (name, args, finish)
        } else {
            let v: Value = resp.json().await.expect("json");
            let calls = v["choices"][0]["message"]["tool_calls"]
                .as_array()
                .expect("tool calls")
                .clone();
            assert_eq!(calls.len(), 1, "{v}");
            (
                calls[0]["function"]["name"]
                    .as_str()
                    .expect("name")
                    .to_string(),
                calls[0]["function"]["arguments"]
                    .as_str()
                    .expect("args")
                    .to_string(),
                v["choices"][0]["finish_reason"]
                    .as_str()
                    .expect("finish")
                    .to_string(),
            )
        };
        assert_eq!(name, "get_weather");
        let args: Value = serde_json::from_str(&args).expect("arguments are JSON");
        assert_eq!(args, json!({"city": "Paris"}));
        assert_eq!(finish, "tool_calls");
        assert_eq!(mock.aborted(), 1, "the call was cut");
    }
}

/// `[trajectory] max_staleness = 1`: a sample started at v1 is answered
/// as a spent budget once the fleet is two versions on (no backend call,
/// recorded `stale`), or refused with `on_stale = "error"`.
#[tokio::test]
async fn a_sample_more_than_max_staleness_versions_behind_is_stopped() {
    for on_stale in ["length", "error"] {
        let mock = VersionedMock::start(Wire::Vllm, "v1", letters()).await;
        let extra = format!("[trajectory]\nmax_staleness = 1\non_stale = \"{on_stale}\"\n");
        let g = gateway(&mock, &extra).await;
        let tid = format!("stale-{on_stale}");
        let path = format!("/t/{tid}/v1/chat/completions");
        let first: Value = g
            .post(&path, chat(3, false))
            .await
            .json()
            .await
            .expect("json");
        let reply = first["choices"][0]["message"]["content"].clone();
        let next = json!({"messages": [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}],
            "max_tokens": 3, "ignore_eos": true});
        // One version on: still within the bound.
        assert_eq!(
            post(&g, "/admin/weights", json!({"version": "v2"})).await.0,
            200
        );
        let r = g.post(&path, next.clone()).await;
        assert_eq!(r.status(), 200);
        assert_eq!(mock.requests().len(), 2);
        // Two versions on: past it.
        assert_eq!(
            post(&g, "/admin/weights", json!({"version": "v3"})).await.0,
            200
        );
        let (status, v) = post(&g, &path, next).await;
        assert_eq!(
            mock.requests().len(),
            2,
            "no backend call for a stale sample"
        );
        if on_stale == "error" {
            assert_eq!(status, 409, "{v}");
            assert_eq!(v["error"]["code"], "stale_trajectory");
            let m = v["error"]["message"].as_str().expect("message");
            assert!(m.contains("v1") && m.contains("v3"), "{m}");
        } else {
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["choices"][0]["finish_reason"], "length");
            assert_eq!(v["choices"][0]["message"]["content"], "");
            let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
            assert_eq!(t["calls"][2]["finish_reason"], "stale");
        }
    }
}

/// `keep` on servers that pause in place and report per-token versions
/// (vLLM 0.33, SGLang 0.5.20+): no continuation request, the stream goes on
/// after the commit, and the record's spans come from the server's report.
async fn kept_call(wire: Wire, stream: bool, tid: &str) {
    let mock = VersionedMock::start(wire, "v1", letters()).await;
    // Probing as `tito serve` does: the first probe learns that the server
    // reports versions, before any call.
    let (g, _probes) = common::start_gateway_probing(config(&mock, "")).await;
    label_v1(&g).await;
    if wire == Wire::Vllm {
        mock.wait_version_asked().await;
    }
    let (seam, max_tokens) = (5usize, 12u32);
    mock.hold_after(Some(seam));
    let client = g.client.clone();
    let url = g.url(&format!("/t/{tid}/v1/chat/completions"));
    let call = tokio::spawn(async move {
        client
            .post(url)
            .json(&chat(max_tokens, stream))
            .send()
            .await
            .expect("send")
    });
    mock.wait_held(1).await;
    mock.hold_after(None);
    let (status, begun) = post(&g, "/admin/weights/begin", json!({"mode": "keep"})).await;
    assert_eq!(status, 200, "{begun}");
    assert_eq!(begun["mode"], "keep", "{begun}");
    // The held stream now waits for the resume.
    mock.release_held();
    mock.push_weights("v2");
    let (status, _) = post(&g, "/admin/weights/commit", json!({"version": "v2"})).await;
    assert_eq!(status, 200);
    let resp = call.await.expect("task");
    assert_eq!(resp.status(), 200);
    assert_eq!(mock.requests().len(), 1, "no continuation request");
    assert_eq!(mock.aborted(), 0);
    let prompt_key = match wire {
        Wire::Vllm => "/prompt",
        Wire::Sglang => "/input_ids",
    };
    let prompt = mock.requests()[0]
        .pointer(prompt_key)
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let (ids, lps, text) = expected(prompt, seam, max_tokens as usize);
    let got = if stream {
        streamed_text(&sse_events(resp).await).0
    } else {
        let v: Value = resp.json().await.expect("json");
        v["choices"][0]["message"]["content"]
            .as_str()
            .expect("content")
            .to_string()
    };
    assert_eq!(got, text);
    let t = g.get_json(&format!("/v1/trajectories/{tid}")).await;
    let c = &t["calls"][0];
    assert_eq!(c["sampled_ids"], json!(ids));
    let recorded: Vec<f32> = serde_json::from_value(c["logprobs"].clone()).expect("logprobs");
    assert_eq!(recorded, lps);
    assert_eq!(
        c["versions"],
        json!([{"start": 0, "version": "v1", "seq": 1}, {"start": seam, "version": "v2", "seq": 2}])
    );
    let b = g.get_json("/admin/backends").await;
    assert_eq!(b["backends"][0]["keep"], "keep", "{b}");
}

#[tokio::test]
async fn vllm_keep_pauses_a_stream_in_place_and_records_the_servers_seam() {
    kept_call(Wire::Vllm, true, "vk").await;
    kept_call(Wire::Vllm, false, "vk2").await;
}

#[tokio::test]
async fn sglang_keep_pauses_a_stream_in_place_and_records_the_servers_seam() {
    kept_call(Wire::Sglang, true, "sk").await;
    kept_call(Wire::Sglang, false, "sk2").await;
}

/// A server that cannot report where the new weights begin (vLLM before
/// 0.33) runs `keep` as `abort`, and says so.
#[tokio::test]
async fn keep_on_a_server_without_version_reports_runs_as_abort() {
    let mock = VersionedMock::start(Wire::Vllm, "v1", letters()).await;
    mock.set_server_version("0.32.0");
    let g = gateway(&mock, "").await;
    mock.hold_after(Some(3));
    let client = g.client.clone();
    let url = g.url("/t/kfb/v1/chat/completions");
    let call = tokio::spawn(async move {
        client
            .post(url)
            .json(&chat(8, false))
            .send()
            .await
            .expect("send")
    });
    mock.wait_held(1).await;
    mock.hold_after(None);
    let (status, begun) = post(&g, "/admin/weights/begin", json!({"mode": "keep"})).await;
    assert_eq!(status, 200, "{begun}");
    assert_eq!(begun["mode"], "abort");
    assert_eq!(begun["asked_mode"], "keep");
    assert!(
        begun["fallback"]
            .as_str()
            .is_some_and(|f| f.contains("0.33")),
        "{begun}"
    );
    mock.push_weights("v2");
    assert_eq!(
        post(&g, "/admin/weights/commit", json!({"version": "v2"}))
            .await
            .0,
        200
    );
    assert_eq!(call.await.expect("task").status(), 200);
    assert_eq!(mock.requests().len(), 2, "continued as in abort mode");
    let b = g.get_json("/admin/backends").await;
    assert!(
        b["backends"][0]["keep"]
            .as_str()
            .is_some_and(|k| k.starts_with("runs as abort")),
        "{b}"
    );
    assert_eq!(b["backends"][0]["update_modes"], json!(["wait", "abort"]));
}
