//! Tool calls end to end on the real Llama 3.1 tokenizer with the shipped
//! `llama3.1-tools` template, which prints no content on a tool-call turn:
//! the turn after a tool call still continues the sample, the sampled call
//! kept verbatim and the tool result added as observation tokens.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, real_renderer, start_gateway_with};
use serde_json::{json, Value};

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

fn ids_of(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("ids")
}

#[tokio::test]
async fn the_turn_after_a_llama_tool_call_continues_the_sample() {
    for history in ["exact", "template"] {
        let r = real_renderer("llama3_1", "llama3.1-tools");
        let mock = MockVllm::start(Scripted::default()).await;
        let mut cfg = config(
            &[mock.url()],
            &format!("[trajectory]\nhistory = \"{history}\"\n"),
        );
        cfg.model.tool_parser = "llama3_json".into();
        let g = start_gateway_with(cfg, r.clone()).await;
        let eot = r.token_to_id("<|eot_id|>").expect("eot");
        let call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        let sampled = [r.encode(call).expect("enc"), vec![eot]].concat();
        mock.push(Scripted::ids(sampled.clone()));
        let path = format!("/t/llama-{history}/v1/chat/completions");
        let user = json!({"role": "user", "content": "Weather in Paris?"});
        let body = g
            .post_json(
                &path,
                json!({"messages": [user], "tools": [weather_tool()], "return_token_ids": true}),
            )
            .await;
        let message = &body["choices"][0]["message"];
        assert_eq!(body["choices"][0]["finish_reason"], "tool_calls", "{body}");
        let id = message["tool_calls"][0]["id"].clone();
        let prompt1 = ids_of(&body["prompt_token_ids"]);

        let answer = [r.encode("It is 22 C.").expect("enc"), vec![eot]].concat();
        mock.push(Scripted::ids(answer));
        let echoed = json!({"role": "assistant", "content": null, "tool_calls": [{
            "id": id, "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
        let tool = json!({"role": "tool", "tool_call_id": id, "content": "22 C"});
        let body2 = g
            .post_json(
                &path,
                json!({"messages": [user, echoed, tool], "tools": [weather_tool()],
                       "return_token_ids": true}),
            )
            .await;
        let prompt2 = ids_of(&body2["prompt_token_ids"]);
        let prefix = [prompt1, sampled.clone()].concat();
        assert!(
            prompt2.starts_with(&prefix),
            "{history}: turn 2's prompt starts with turn 1's prompt and sampled ids"
        );
        let delta = r.decode(&prompt2[prefix.len()..], false).expect("decodes");
        assert_eq!(
            delta,
            "<|start_header_id|>ipython<|end_header_id|>\n\n22 C<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            "{history}"
        );
        let t = g
            .get_json(&format!("/v1/trajectories/llama-{history}"))
            .await;
        let calls = t["calls"].as_array().expect("calls");
        assert_eq!(calls.len(), 2, "{t}");
        assert_eq!(calls[1]["parent_call"], 0, "{history}: {t}");
        assert_eq!(calls[1]["sample_index"], 0, "{history}: {t}");
    }
}
