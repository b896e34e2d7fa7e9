//! Tool calls end to end on the real Qwen3 tokenizer: the model's tool call
//! is parsed into OpenAI `tool_calls`, the agent echoes it back re-serialized
//! with the tool result, and the next prompt carries the sampled ids
//! verbatim with the tool result as mask-0 observation tokens.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, sse_events, start_gateway_with, Gateway};
use serde_json::{json, Value};
use tito::render::Renderer;

fn qwen3() -> std::sync::Arc<Renderer> {
    common::real_renderer("qwen3", "")
}

/// Ids for `text` tokenized piece by piece: valid, but not what a fresh
/// tokenization of the whole text gives.
fn non_canonical(r: &Renderer, pieces: &[&str]) -> Vec<u32> {
    pieces
        .iter()
        .flat_map(|p| r.encode(p).expect("enc"))
        .collect()
}

fn tools() -> Value {
    json!([{"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}])
}

async fn setup() -> (MockVllm, Gateway, Vec<u32>) {
    let r = qwen3();
    let mock = MockVllm::start(Scripted::default()).await;
    let g = start_gateway_with(config(&[mock.url()], ""), r.clone()).await;
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    // Odd JSON spacing and a word split into characters.
    let call = non_canonical(
        &r,
        &[
            "<tool_call>",
            "\n{\"name\":  \"",
            "c",
            "a",
            "l",
            "c",
            "ulator",
            "\", \"arguments\": {\"expression\":\"2+2\"}}\n",
            "</tool_call>",
        ],
    );
    let sampled1 = [call, vec![im_end]].concat();
    (mock, g, sampled1)
}

#[tokio::test]
async fn tool_call_round_trip_keeps_sampled_ids() {
    let (mock, g, sampled1) = setup().await;
    let r = g.renderer.clone();
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    mock.push(Scripted::ids(sampled1.clone()));
    let user = json!({"role": "user", "content": "What is 2+2?"});
    let resp = g
        .post(
            "/t/tools-1/v1/chat/completions",
            json!({"messages": [user], "tools": tools(), "return_token_ids": true}),
        )
        .await;
    let body: Value = resp.json().await.expect("json");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "calculator");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("args"))
        .expect("json args");
    assert_eq!(args, json!({"expression": "2+2"}));
    assert_eq!(choice["token_ids"], json!(sampled1));
    let prompt1: Vec<u32> = serde_json::from_value(body["prompt_token_ids"].clone()).expect("ids");

    // The agent echoes the call re-serialized (other spacing, content null) plus the result.
    let echoed = json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": call["id"], "type": "function",
        "function": {"name": "calculator", "arguments": "{\"expression\": \"2+2\"}"}}]});
    let tool_msg = json!({"role": "tool", "tool_call_id": call["id"], "content": "4"});
    let answer = [r.encode("The answer is 4.").expect("enc"), vec![im_end]].concat();
    mock.push(Scripted::ids(answer.clone()));
    let resp = g
        .post(
            "/t/tools-1/v1/chat/completions",
            json!({"messages": [user, echoed, tool_msg], "tools": tools(), "return_token_ids": true}),
        )
        .await;
    let body2: Value = resp.json().await.expect("json");
    assert_eq!(
        body2["choices"][0]["message"]["content"],
        "The answer is 4."
    );
    let prompt2: Vec<u32> = serde_json::from_value(body2["prompt_token_ids"].clone()).expect("ids");
    assert_eq!(&prompt2[..prompt1.len()], &prompt1[..]);
    assert_eq!(
        &prompt2[prompt1.len()..prompt1.len() + sampled1.len()],
        &sampled1[..],
        "sampled ids verbatim"
    );
    let observation = &prompt2[prompt1.len() + sampled1.len()..];
    let obs_text = r.decode(observation, false).expect("dec");
    assert!(
        obs_text.contains("<tool_response>\n4\n</tool_response>"),
        "{obs_text:?}"
    );
    assert_eq!(mock.last_request()["prompt"], json!(prompt2));

    let t = g.get_json("/v1/trajectories/tools-1").await;
    assert_eq!(t["calls"][0]["parse_outcome"], "calls(1)");
    assert_eq!(t["calls"][1]["parse_outcome"], "no_calls");
    let cause = t["drift"][0]["cause"].as_str().expect("drift recorded");
    assert!(
        ["tool_call_rerender", "bpe_retokenization"].contains(&cause),
        "{cause}"
    );

    let rows = g.export_jsonl("layout=trajectory").await;
    let row = rows.first().expect("one row");
    let mask: Vec<u8> = serde_json::from_value(row["response_mask"].clone()).expect("mask");
    let want: Vec<u8> = [
        vec![1; sampled1.len()],
        vec![0; observation.len()],
        vec![1; answer.len()],
    ]
    .concat();
    assert_eq!(mask, want);
}

#[tokio::test]
async fn streamed_tool_call_deltas_equal_the_message() {
    let (mock, g, sampled1) = setup().await;
    let req = json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "tools": tools(),
                     "return_token_ids": true});
    mock.push(Scripted::ids(sampled1.clone()));
    let plain: Value = g
        .post("/v1/chat/completions", req.clone())
        .await
        .json()
        .await
        .expect("json");
    mock.push(Scripted::ids(sampled1.clone()));
    let mut sreq = req.clone();
    sreq["stream"] = json!(true);
    let events = sse_events(g.post("/v1/chat/completions", sreq).await).await;
    let mut ids = Vec::new();
    let mut name = String::new();
    let mut args = String::new();
    let mut finish = None;
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        for ch in c["choices"].as_array().expect("choices") {
            ids.extend(ch["token_ids"].as_array().cloned().unwrap_or_default());
            for tc in ch["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                name.push_str(tc["function"]["name"].as_str().unwrap_or_default());
                args.push_str(tc["function"]["arguments"].as_str().unwrap_or_default());
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    assert_eq!(json!(ids), json!(sampled1));
    let call = &plain["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(name, call["name"].as_str().expect("name"));
    assert_eq!(args, call["arguments"].as_str().expect("args"));
    assert_eq!(finish.as_deref(), Some("tool_calls"));
}

/// A streamed tool call carries the id recorded for it, so an agent that
/// echoes the message it rebuilt from the deltas continues the same sample
/// (found by scripts/soak.sh: every streamed trajectory split into samples).
#[tokio::test]
async fn a_streamed_tool_call_is_continued_by_its_echo() {
    let (mock, g, sampled1) = setup().await;
    let im_end = g.renderer.token_to_id("<|im_end|>").expect("im_end");
    let user = json!({"role": "user", "content": "What is 2+2?"});
    mock.push(Scripted::ids(sampled1.clone()));
    let req = json!({"messages": [user], "tools": tools(), "stream": true});
    let events = sse_events(g.post("/t/streamed-1/v1/chat/completions", req).await).await;
    let (mut id, mut name, mut args) = (String::new(), String::new(), String::new());
    for e in events.iter().filter(|e| e.as_str() != "[DONE]") {
        let c: Value = serde_json::from_str(e).expect("chunk");
        for ch in c["choices"].as_array().expect("choices") {
            for tc in ch["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
            {
                id.push_str(tc["id"].as_str().unwrap_or_default());
                name.push_str(tc["function"]["name"].as_str().unwrap_or_default());
                args.push_str(tc["function"]["arguments"].as_str().unwrap_or_default());
            }
        }
    }
    let recorded = g.get_json("/v1/trajectories/streamed-1").await;
    assert_eq!(
        recorded["calls"][0]["response"]["tool_calls"][0]["id"],
        json!(id),
        "{recorded}"
    );
    // The agent's next turn: the streamed message as the SDK rebuilds it.
    let echoed = json!({"role": "assistant", "content": null, "tool_calls": [{
        "id": id, "type": "function", "function": {"name": name, "arguments": args}}]});
    let tool_msg = json!({"role": "tool", "tool_call_id": id, "content": "4"});
    mock.push(Scripted::ids(vec![b'4'.into(), im_end]));
    let r = g
        .post(
            "/t/streamed-1/v1/chat/completions",
            json!({"messages": [user, echoed, tool_msg], "tools": tools()}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let t = g.get_json("/v1/trajectories/streamed-1").await;
    assert_eq!(t["calls"][1]["sample_index"], 0, "{t}");
    assert_eq!(t["calls"][1]["parent_call"], 0, "{t}");
}

#[tokio::test]
async fn malformed_tool_call_is_plain_content() {
    let (mock, g, _) = setup().await;
    let r = g.renderer.clone();
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    let broken = [
        r.encode("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {oops\n</tool_call>")
            .expect("enc"),
        vec![im_end],
    ]
    .concat();
    mock.push(Scripted::ids(broken.clone()));
    let body: Value = g
        .post(
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "tools": tools(), "return_token_ids": true}),
        )
        .await
        .json()
        .await
        .expect("json");
    let c = &body["choices"][0];
    assert_eq!(c["finish_reason"], "stop");
    assert!(c["message"]["tool_calls"].is_null());
    assert!(c["message"]["content"]
        .as_str()
        .expect("content")
        .contains("{oops"));
    assert_eq!(c["token_ids"], json!(broken));
}

/// The next turn with a tool added, or a changed `chat_template_kwargs`:
/// the prefix tito would reuse was rendered with the old context, so the
/// call starts a new sample whose prompt lists the new tool, with a
/// `context_change` drift event naming what changed. With the context
/// unchanged the turn continues. Alike on the live gateway and on a fresh
/// one (the hot view rebuilt from the store).
#[tokio::test]
async fn a_changed_tool_list_or_template_kwargs_starts_a_new_sample() {
    let r = qwen3();
    let mock = MockVllm::start(Scripted::default()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}/spans.db", dir.path().display());
    let store = tito::store::open(&url).expect("store");
    let im_end = r.token_to_id("<|im_end|>").expect("im_end");
    let clock = json!({"type": "function", "function": {"name": "clock",
        "description": "The time", "parameters": {"type": "object", "properties": {}}}});
    let more_tools = json!([tools()[0].clone(), clock]);
    let kwargs = json!({"enable_thinking": false});
    let functions = json!([tools()[0]["function"].clone()]);
    // (case, field naming the tools, turn 1's, turn 2's, kwargs, changed)
    let cases = [
        ("same", "tools", tools(), tools(), Value::Null, json!([])),
        (
            "added",
            "tools",
            tools(),
            more_tools,
            Value::Null,
            json!(["tools"]),
        ),
        (
            "kwargs",
            "tools",
            tools(),
            tools(),
            kwargs,
            json!(["chat_template_kwargs"]),
        ),
        // Legacy `functions`, mapped to tools live and read back from the
        // stored request on the fresh gateway.
        (
            "functions",
            "functions",
            functions.clone(),
            functions.clone(),
            Value::Null,
            json!([]),
        ),
    ];
    let cases = [false, true]
        .into_iter()
        .flat_map(|fresh| cases.clone().map(|c| (fresh, c)));
    for (fresh, (name, field, tools1, tools2, kwargs2, changed)) in cases {
        let continues = changed == json!([]);
        let first =
            common::start_gateway_on(config(&[mock.url()], ""), r.clone(), store.clone()).await;
        let tid = format!("ctx-{name}-{fresh}");
        let name = format!("{name}, fresh gateway {fresh}");
        let path = format!("/t/{tid}/v1/chat/completions");
        let user = json!({"role": "user", "content": "Hi"});
        mock.push(Scripted::ids(
            [r.encode("Hello.").expect("enc"), vec![im_end]].concat(),
        ));
        let body1 = first
            .post_json(
                &path,
                json!({"messages": [user], field: tools1, "return_token_ids": true}),
            )
            .await;
        assert_eq!(
            body1["choices"][0]["message"]["content"], "Hello.",
            "{body1}"
        );
        // The next turn, on a fresh gateway over the same store or not.
        let second = if fresh {
            common::start_gateway_on(config(&[mock.url()], ""), r.clone(), store.clone()).await
        } else {
            first
        };
        mock.push(Scripted::ids(
            [r.encode("Sure.").expect("enc"), vec![im_end]].concat(),
        ));
        let mut req = json!({"messages": [user, {"role": "assistant", "content": "Hello."},
                                          {"role": "user", "content": "Time?"}],
                             field: tools2, "return_token_ids": true});
        if !kwargs2.is_null() {
            req["chat_template_kwargs"] = kwargs2;
        }
        let body2 = second.post_json(&path, req).await;
        let prompt2: Vec<u32> =
            serde_json::from_value(body2["prompt_token_ids"].clone()).expect("ids");
        let t = second.get_json(&format!("/v1/trajectories/{tid}")).await;
        let drift = &t["calls"][1]["drift"];
        if continues {
            assert_eq!(t["calls"][1]["parent_call"], 0, "{name}: {t}");
            assert_eq!(t["calls"][1]["sample_index"], 0, "{name}: {t}");
            assert_eq!(*drift, Value::Null, "{name}: {t}");
        } else {
            assert_eq!(t["calls"][1]["parent_call"], Value::Null, "{name}: {t}");
            assert_eq!(t["calls"][1]["sample_index"], 1, "{name}: {t}");
            assert_eq!(drift["cause"], "context_change", "{name}: {t}");
            assert_eq!(drift["details"]["previous_call"], 0, "{name}: {t}");
            assert_eq!(drift["details"]["changed"], changed, "{name}: {t}");
            // Where the new prompt leaves call 0's prompt and sampled ids.
            let call0: Vec<u32> = t["calls"][0]["prompt_delta_ids"]
                .as_array()
                .into_iter()
                .flatten()
                .chain(
                    t["calls"][0]["sampled_ids"]
                        .as_array()
                        .into_iter()
                        .flatten(),
                )
                .map(|v| v.as_u64().expect("id") as u32)
                .collect();
            let same = call0.iter().zip(&prompt2).take_while(|(a, b)| a == b);
            assert_eq!(drift["position"], same.count(), "{name}: {t}");
        }
        let text = r.decode(&prompt2, false).expect("decodes");
        assert_eq!(
            text.contains("\"clock\""),
            name.starts_with("added,"),
            "{name}: {text}"
        );
    }
}
