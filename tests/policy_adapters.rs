//! LoRA adapters of the served model: `[[model.adapters]]` are listed by
//! `/v1/models` and picked by a request's `model` (vLLM gets the adapter as
//! `model`, SGLang as `lora_path`); an unknown id is a 404 naming the served
//! ids; `/admin/adapters` loads, replaces and unloads an adapter on the
//! vLLM mock with vLLM's request shapes, draining the adapter's calls in
//! flight first (none is lost); the config refuses bad adapter tables.

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
    let listed: Value = g
        .client
        .get(g.url("/admin/adapters"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
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
        (json!({"name": "x", "path": "/p", "mode": "abort"}), "mode"),
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
    let t: Value = g
        .client
        .get(g.url("/v1/trajectories/d-1"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    let calls = t["calls"]
        .as_array()
        .unwrap_or_else(|| panic!("calls: {t}"));
    assert_eq!(calls.len(), 1, "{t}");
    assert_eq!(calls[0]["finish_reason"], "stop", "{t}");
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
    let err = tito::Config::from_toml(&format!(
        "{base}[[model.adapters]]\nname = \"a\"\npath = \"/a\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:1\"\nkind = \"engine\"\n"
    ))
    .expect_err("refused")
    .to_string();
    assert!(
        err.contains("model.adapters") && err.contains("no LoRA"),
        "{err}"
    );
    let err = tito::Config::from_toml(&format!("{base}[[model.adapters]]\nname = \"a\"\n{vllm}"))
        .expect_err("refused")
        .to_string();
    assert!(err.contains("path"), "{err}");
}
