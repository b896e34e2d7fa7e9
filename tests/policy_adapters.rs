//! LoRA adapters of the served model: `[[model.adapters]]` are listed by
//! `/v1/models` and picked by a request's `model` (vLLM gets the adapter as
//! `model`, SGLang as `lora_path`); an unknown id is a 404 naming the served
//! ids; `/admin/adapters` loads, replaces and unloads an adapter on the
//! vLLM mock with vLLM's request shapes, draining the adapter's calls in
//! flight first or (`mode: "abort"`) stopping them and continuing them
//! from what they sampled (none is lost); the config refuses bad adapter
//! tables.

mod common;
mod vision_support;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway, Gateway};
use serde_json::{json, Value};
use tito::render::testing::IM_END;

const TOKEN: &str = "s3cret-admin";

fn adapters_config(urls: &[String]) -> tito::Config {
    config(
        urls,
        &format!(
            "[server]\nadmin_token = \"{TOKEN}\"\n\
             [[model.adapters]]\nname = \"coder\"\npath = \"/loras/coder\"\n"
        ),
    )
}

fn reply(g: &Gateway, text: &str) -> Scripted {
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    Scripted::ids(ids)
}

async fn admin(g: &Gateway, body: Value) -> reqwest::Response {
    post_admin(&g.client, &g.url("/admin/adapters"), body).await
}

async fn post_admin(client: &reqwest::Client, url: &str, body: Value) -> reqwest::Response {
    client
        .post(url)
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("admin request")
}

async fn ask(g: &Gateway, tid: &str, model: &str) -> reqwest::Response {
    g.post(
        &format!("/t/{tid}/v1/chat/completions"),
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
}

#[tokio::test]
async fn models_lists_the_adapters_and_a_request_picks_one_by_its_id() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(adapters_config(&[mock.url()])).await;
    let models: Value = g.get_json("/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("list")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["test-model", "coder"]);
    assert_eq!(models["data"][1]["parent"], "test-model");
    assert_eq!(models["data"][0]["parent"], Value::Null);
    let one: Value = g.get_json("/v1/models/coder").await;
    assert_eq!(one["id"], "coder");

    mock.push(reply(&g, "base"));
    assert_eq!(ask(&g, "t-1", "test-model").await.status(), 200);
    assert!(mock.last_request().get("model").is_none(), "the base model");
    mock.push(reply(&g, "lora"));
    assert_eq!(ask(&g, "t-1", "coder").await.status(), 200);
    assert_eq!(mock.last_request()["model"], "coder");

    let r = ask(&g, "t-2", "nope").await;
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.expect("json");
    assert_eq!(err["error"]["code"], "model_not_found");
    let msg = err["error"]["message"].as_str().expect("message");
    assert!(
        msg.contains("`nope`") && msg.contains("test-model, coder"),
        "{msg}"
    );
    let r = g
        .client
        .get(g.url("/v1/models/nope"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn sglang_gets_the_adapter_as_lora_path() {
    let (url, seen) = vision_support::sglang_mock(vec![vec![IM_END]]).await;
    let mut text = String::from(
        "[model]\nname = \"test-model\"\ntokenizer = \"unused\"\nmax_model_len = 512\n\
         [[model.adapters]]\nname = \"coder\"\npath = \"/loras/coder\"\n",
    );
    text.push_str(&format!(
        "[[backends]]\nurl = \"{url}\"\nkind = \"sglang\"\n[store]\nurl = \"memory://\"\n"
    ));
    let g = start_gateway(tito::Config::from_toml(&text).expect("config")).await;
    assert_eq!(ask(&g, "s-1", "coder").await.status(), 200);
    let sent = seen.lock().expect("lock").clone();
    assert_eq!(sent[0]["lora_path"], "coder");
}

#[tokio::test]
async fn admin_adapters_loads_replaces_and_unloads_with_vllms_shapes() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(adapters_config(&[mock.url()])).await;

    // A new adapter: loaded on the backend, then served.
    let r = admin(
        &g,
        json!({"name": "planner", "path": "/loras/p1", "version": "p-1"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("json");
    assert_eq!(
        body["adapter"],
        json!({"name": "planner", "path": "/loras/p1",
                                       "version": "p-1", "loaded": true})
    );
    let loads: Vec<String> = mock
        .log()
        .into_iter()
        .filter(|l| l.contains("lora"))
        .collect();
    assert_eq!(loads.len(), 1);
    let (path, sent) = loads[0].split_once(' ').expect("a body");
    assert_eq!(path, "/v1/load_lora_adapter");
    let sent: Value = serde_json::from_str(sent).expect("json");
    assert_eq!(
        sent,
        json!({"lora_name": "planner", "lora_path": "/loras/p1",
                            "load_inplace": false})
    );
    mock.push(reply(&g, "plan"));
    assert_eq!(ask(&g, "a-1", "planner").await.status(), 200);
    assert_eq!(mock.last_request()["model"], "planner");

    // New weights for a served adapter: in place.
    let r = admin(
        &g,
        json!({"name": "planner", "path": "/loras/p2", "version": "p-2"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let last = mock
        .log()
        .into_iter()
        .rev()
        .find(|l| l.contains("lora"))
        .expect("a load");
    assert!(
        last.contains("\"load_inplace\":true") && last.contains("/loras/p2"),
        "{last}"
    );
    let listed = g.get_json_as("/admin/adapters", TOKEN).await;
    let planner = listed["adapters"]
        .as_array()
        .expect("list")
        .iter()
        .find(|a| a["name"] == "planner")
        .expect("listed")
        .clone();
    assert_eq!(planner["version"], "p-2");

    // Unloaded: refused by name, and no longer served.
    let r = admin(&g, json!({"name": "planner", "action": "unload"})).await;
    assert_eq!(r.status(), 200);
    let last = mock
        .log()
        .into_iter()
        .rev()
        .find(|l| l.contains("lora"))
        .expect("an unload");
    assert_eq!(last, "/v1/unload_lora_adapter {\"lora_name\":\"planner\"}");
    let r = ask(&g, "a-2", "planner").await;
    assert_eq!(r.status(), 404);
    let err: Value = r.json().await.expect("json");
    assert!(err["error"]["message"]
        .as_str()
        .expect("message")
        .contains("test-model, coder"));
    let r = admin(&g, json!({"name": "planner", "action": "unload"})).await;
    assert_eq!(r.status(), 404);

    // Bad changes are refused by name and reach no backend.
    let before = mock.log().len();
    for (body, param) in [
        (json!({"name": "x"}), "path"),
        (json!({"name": "test-model", "path": "/p"}), "name"),
        (json!({"name": "x", "path": "/p", "mode": "keep"}), "mode"),
        (
            json!({"name": "x", "path": "/p", "action": "swap"}),
            "action",
        ),
    ] {
        let r = admin(&g, body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let err: Value = r.json().await.expect("json");
        assert_eq!(err["error"]["param"], param, "{body}");
    }
    assert_eq!(mock.log().len(), before);

    // A backend that refuses: 502 naming it, the adapter not served.
    mock.state
        .loras
        .lock()
        .expect("lock")
        .insert("dup".into(), "/x".into());
    let r = admin(&g, json!({"name": "dup", "path": "/loras/d"})).await;
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.expect("json");
    assert!(body["backends"][0]["error"]
        .as_str()
        .expect("error")
        .contains("already been loaded"));
    assert_eq!(ask(&g, "a-3", "dup").await.status(), 404);
}

#[tokio::test]
async fn replacing_an_adapter_drains_its_calls_in_flight_and_loses_none() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(adapters_config(&[mock.url()])).await;
    let mut held = reply(&g, "slow answer");
    held.hold_after = Some(1);
    mock.push(held);
    let mut stream = g
        .post(
            "/t/d-1/v1/chat/completions",
            json!({"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true}),
        )
        .await;
    stream.chunk().await.expect("read").expect("a first chunk");
    mock.wait_held(1).await;

    // The replace waits for the call on `coder`; the base model is served
    // meanwhile.
    let replace = {
        let (client, url) = (g.client.clone(), g.url("/admin/adapters"));
        tokio::spawn(async move {
            let body = json!({"name": "coder", "path": "/loras/c2", "version": "c-2"});
            post_admin(&client, &url, body).await
        })
    };
    mock.push(reply(&g, "base"));
    assert_eq!(ask(&g, "d-2", "test-model").await.status(), 200);
    assert!(
        !mock.log().iter().any(|l| l.contains("lora")),
        "no load while the adapter's call runs"
    );
    mock.release_held();
    while stream.chunk().await.expect("read").is_some() {}
    let r = replace.await.expect("task");
    assert_eq!(r.status(), 200);
    assert!(mock.log().iter().any(|l| l.contains("/loras/c2")));
    // The load reached the backend once both streams (the base call's and
    // the drained one's) had ended.
    assert_eq!(*mock.state.lora_loads_after.lock().expect("lock"), [2]);
    // The drained call is recorded whole.
    let t = g.get_json_as("/v1/trajectories/d-1", TOKEN).await;
    let calls = t["calls"]
        .as_array()
        .unwrap_or_else(|| panic!("calls: {t}"));
    assert_eq!(calls.len(), 1, "{t}");
    assert_eq!(calls[0]["finish_reason"], "stop", "{t}");
}

/// The text of the `data:` chat chunks in `body`.
fn chunk_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

#[tokio::test]
async fn replacing_an_adapter_in_abort_mode_continues_its_calls_from_what_they_sampled() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(adapters_config(&[mock.url()])).await;
    let text = "one two three four five";
    let mut ids = g.renderer.encode(text).expect("encodes");
    ids.push(IM_END);
    let seam = 2;
    let mut held = Scripted::ids(ids.clone());
    held.hold_after = Some(seam);
    mock.push(held);
    let mut stream = g
        .post(
            "/t/ab-1/v1/chat/completions",
            json!({"model": "coder", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true}),
        )
        .await;
    // Read until the client has the first `seam` tokens: the gateway holds
    // exactly those when the change begins.
    let first = g.renderer.decode(&ids[..seam], true).expect("decodes");
    let mut body = String::new();
    while chunk_text(&body) != first {
        let chunk = stream.chunk().await.expect("read").expect("a chunk");
        body.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    mock.wait_held(1).await;
    // The continuation's answer: what the held stream had left.
    mock.push(Scripted::ids(ids[seam..].to_vec()));

    // The replace does not wait for the call (the held stream is never
    // released): the gateway stops it and continues it on the new weights.
    let change = admin(
        &g,
        json!({"name": "coder", "path": "/loras/c2", "version": "c-2", "mode": "abort"}),
    );
    // A bound on a change that should not wait at all (one that waited for
    // the held stream would never end).
    let r = tokio::time::timeout(std::time::Duration::from_secs(60), change)
        .await
        .expect("the change did not wait for the adapter's call");
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.expect("json");
    assert_eq!(report["mode"], "abort");
    assert_eq!(report["adapter"]["version"], "c-2");
    while let Some(chunk) = stream.chunk().await.expect("read") {
        body.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
    assert_eq!(
        chunk_text(&body),
        text,
        "one answer across the change: {body}"
    );
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");

    // The continuation came after the load, on the adapter, with the
    // prompt and exactly the ids sampled before the change.
    let log = mock.log();
    let load = log
        .iter()
        .position(|l| l.contains("/loras/c2"))
        .expect("a load");
    let generations: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, l)| l.starts_with("/v1/completions"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(
        generations.len(),
        2,
        "one request, one continuation: {log:?}"
    );
    assert!(generations[0] < load && load < generations[1], "{log:?}");
    let requests = mock.requests();
    let prompt_of = |v: &Value| -> Vec<u32> {
        serde_json::from_value(v["prompt"].clone()).expect("prompt ids")
    };
    let prompt = prompt_of(&requests[0]);
    let mut continued = prompt.clone();
    continued.extend_from_slice(&ids[..seam]);
    assert_eq!(prompt_of(&requests[1]), continued);
    assert_eq!(requests[1]["model"], "coder");

    // One call in the store, every sampled id verbatim.
    let t = g.get_json_as("/v1/trajectories/ab-1", TOKEN).await;
    let calls = t["calls"]
        .as_array()
        .unwrap_or_else(|| panic!("calls: {t}"));
    assert_eq!(calls.len(), 1, "{t}");
    assert_eq!(calls[0]["finish_reason"], "stop", "{t}");
    let sampled: Vec<u32> = serde_json::from_value(calls[0]["sampled_ids"].clone()).expect("ids");
    assert_eq!(sampled, ids);
    assert_eq!(calls[0]["adapter"], "coder");
}

#[tokio::test]
async fn unloading_an_adapter_in_abort_mode_ends_its_calls_with_a_clear_404() {
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway(adapters_config(&[mock.url()])).await;
    // Loaded through the gateway, so the mock has it to unload.
    let r = admin(&g, json!({"name": "coder", "path": "/loras/coder"})).await;
    assert_eq!(r.status(), 200);
    let mut held = reply(&g, "never finished");
    held.hold_after = Some(1);
    mock.push(held);
    let call = {
        let (client, url) = (g.client.clone(), g.url("/t/ab-2/v1/chat/completions"));
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({"model": "coder",
                              "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .expect("send")
        })
    };
    mock.wait_held(1).await;
    let r = admin(
        &g,
        json!({"name": "coder", "action": "unload", "mode": "abort"}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let resp = call.await.expect("task");
    assert_eq!(resp.status(), 404);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], "model_not_found");
    let msg = err["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("`coder` was unloaded"), "{msg}");
    let t = g
        .client
        .get(g.url("/v1/trajectories/ab-2"))
        .bearer_auth(TOKEN)
        .send()
        .await;
    let calls = match t {
        Ok(r) if r.status() == 200 => r.json::<Value>().await.expect("json")["calls"].clone(),
        _ => json!([]),
    };
    assert_eq!(calls, json!([]), "nothing recorded");
}

#[test]
fn the_config_refuses_bad_adapter_tables_by_key() {
    let base = "[model]\nname = \"m\"\ntokenizer = \"t\"\n";
    let vllm = "[[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"vllm\"\n";
    for (adapters, key, why) in [
        (
            "[[model.adapters]]\nname = \"a\"\npath = \"/a\"\n[[model.adapters]]\nname = \"a\"\npath = \"/b\"\n",
            "model.adapters[1].name",
            "unique",
        ),
        ("[[model.adapters]]\nname = \"m\"\npath = \"/a\"\n", "model.adapters[0].name", "unique"),
        ("[[model.adapters]]\nname = \"a b\"\npath = \"/a\"\n", "model.adapters[0].name", "printable"),
        ("[[model.adapters]]\nname = \"a\"\npath = \" \"\n", "model.adapters[0].path", "load"),
    ] {
        let err = tito::Config::from_toml(&format!("{base}{adapters}{vllm}"))
            .expect_err("refused")
            .to_string();
        assert!(err.contains(key) && err.contains(why), "{err}");
    }
    // The bundled engine serves adapters too (LoRA GGUFs, tests/engine_lora.rs).
    tito::Config::from_toml(&format!(
        "{base}[[model.adapters]]\nname = \"a\"\npath = \"/a\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"engine\"\n"
    ))
    .expect("an engine backend with adapters loads");
    let err = tito::Config::from_toml(&format!("{base}[[model.adapters]]\nname = \"a\"\n{vllm}"))
        .expect_err("refused")
        .to_string();
    assert!(err.contains("path"), "{err}");
}
