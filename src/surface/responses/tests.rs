use serde_json::json;

use super::output::{self, Head, Outcome};
use super::*;

fn messages(body: &Json) -> Vec<Json> {
    let t = translate(body, None, false).expect("translates");
    t.chat["messages"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_string_input_is_one_user_message_after_the_instructions() {
    let body = json!({"model": "m", "instructions": "be brief", "input": "hi"});
    let t = translate(&body, None, false).expect("translates");
    assert_eq!(
        t.chat["messages"],
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    );
    assert_eq!(t.instructions, 1);
    assert!(t.store, "store defaults to true");
}

#[test]
fn items_become_one_assistant_turn_and_its_tool_results() {
    let body = json!({"input": [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "look it up"}], "encrypted_content": null},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "noon"}]},
    ]});
    assert_eq!(
        Json::Array(messages(&body)),
        json!([
            {"role": "user", "content": "weather in Paris?"},
            {"role": "assistant", "reasoning_content": "look it up", "content": "Checking.",
             "tool_calls": [
                {"id": "call_a", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
                {"id": "call_b", "type": "function",
                 "function": {"name": "get_time", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "noon"}]},
        ])
    );
}

#[test]
fn an_item_back_in_the_order_opens_the_next_assistant_turn() {
    let body = json!({"input": [
        {"role": "user", "content": "a"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]});
    let m = messages(&body);
    assert_eq!(m.len(), 3);
    assert_eq!(m[1]["tool_calls"][0]["id"], "c1");
    assert_eq!(m[1]["content"], "");
    assert_eq!(m[2], json!({"role": "assistant", "content": "done"}));
}

#[test]
fn previous_conversation_goes_between_the_instructions_and_the_input() {
    let prev = [
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": "hello"}),
    ];
    let body = json!({"instructions": "new rules", "input": "more"});
    let t = translate(&body, Some(&prev), false).expect("translates");
    let m = t.chat["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(m[0], json!({"role": "system", "content": "new rules"}));
    assert_eq!(&m[1..3], &prev);
    assert_eq!(m[3], json!({"role": "user", "content": "more"}));
    // A continuation's history, for the call after it: without the
    // instructions, then what it served.
    let served = json!({"role": "assistant", "content": "ok"});
    let c = continued(&m, t.instructions, &served);
    assert_eq!(c.len(), 4);
    assert_eq!(c[0], prev[0]);
    assert_eq!(c[3], served);
}

#[test]
fn tools_sampling_and_formats_map_onto_the_chat_request() {
    let body = json!({"input": "x", "max_output_tokens": 32, "temperature": 0.5, "top_p": 0.9,
        "tools": [{"type": "function", "name": "f", "description": "d",
                   "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
        "include": ["message.output_text.logprobs"], "top_logprobs": 2,
        "reasoning": {"effort": "low"}, "store": false, "metadata": {"k": "v"}});
    let t = translate(&body, None, true).expect("translates");
    let c = &t.chat;
    assert_eq!(c["max_tokens"], 32);
    assert_eq!(c["temperature"], 0.5);
    assert_eq!(
        c["tools"][0],
        json!({"type": "function", "function":
        {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": true}})
    );
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(c["response_format"]["json_schema"]["name"], "out");
    assert_eq!(c["logprobs"], true);
    assert_eq!(c["top_logprobs"], 2);
    assert_eq!(c["chat_template_kwargs"]["reasoning_effort"], "low");
    assert!(
        c.get("metadata").is_none(),
        "metadata is recorded, not sent"
    );
    assert!(t.logprobs && !t.store);
    // A template that does not read it: the effort is kept, not sent.
    let t = translate(&body, None, false).expect("translates");
    assert!(t.chat.get("chat_template_kwargs").is_none());
}

#[test]
fn what_is_not_built_is_refused_by_name() {
    let cases = [
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0]",
        ),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
        (json!({"input": "x", "prompt": {"id": "p"}}), "prompt"),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]}),
            "input[0].content[0].file_id",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "computer_call", "id": "c"}]}),
            "input[0]",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "allowed_tools", "tools": []}}),
            "tool_choice",
        ),
    ];
    for (body, param) in cases {
        let e = translate(&body, None, false).expect_err("refused");
        assert_eq!(e.param, param, "{body}");
        assert_eq!(e.code, Some("unsupported_parameter"), "{body}");
    }
}

#[test]
fn malformed_items_are_refused_naming_the_item() {
    let cases = [
        (json!({}), "input"),
        (json!({"input": 3}), "input"),
        (json!({"input": [{"content": "no role"}]}), "input[0]"),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
        (
            json!({"input": [{"type": "function_call_output", "output": "x"}]}),
            "input[0].call_id",
        ),
        (
            json!({"input": [
                {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_b", "output": "x"}]}),
            "input[1].call_id",
        ),
        (
            json!({"input": [{"role": "robot", "content": "x"}]}),
            "input[0].role",
        ),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (json!({"input": "x", "include": ["bogus"]}), "include[0]"),
        (json!({"input": "x", "instructions": 4}), "instructions"),
    ];
    for (body, param) in cases {
        let e = translate(&body, None, false).expect_err("refused");
        assert_eq!(e.param, param, "{body}");
        assert_eq!(e.code, None, "{body}");
    }
}

#[test]
fn the_output_comes_from_the_served_message_with_ids_from_the_response_id() {
    let request = json!({"input": "x", "tools": [{"type": "function", "name": "f"}]});
    let head = Head {
        id: "resp_abc",
        created_at: 10,
        model: "m",
        request: &request,
    };
    let served = json!({"role": "assistant", "reasoning_content": "think", "content": "hi",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]});
    let o = Outcome {
        served: &served,
        finish_reason: "tool_calls",
        completed_at: 11,
        input_tokens: 7,
        output_tokens: 5,
        reasoning_tokens: 2,
        logprobs: None,
        token_ids: None,
    };
    let r = output::finished(&head, &o);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"][0]["type"], "reasoning");
    assert_eq!(r["output"][0]["id"], "rs_abc");
    assert_eq!(r["output"][1]["id"], "msg_abc");
    assert_eq!(r["output"][1]["content"][0]["text"], "hi");
    assert_eq!(r["output"][2]["call_id"], "call_1");
    assert_eq!(r["output"][2]["arguments"], "{\"a\": 1}");
    assert_eq!(r["usage"]["total_tokens"], 12);
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 2);
    assert_eq!(r["tools"], request["tools"]);
    // `user` is a string in OpenAI's schema: absent unless the request set it.
    assert!(r.get("user").is_none(), "{r}");
    let named = json!({"input": "x", "user": "u-1"});
    let with_user = output::finished(
        &Head {
            request: &named,
            ..head
        },
        &o,
    );
    assert_eq!(with_user["user"], "u-1");
    // The same record, the same object.
    assert_eq!(r, output::finished(&head, &o));
    // A length cut: incomplete, naming why.
    let cut = Outcome {
        finish_reason: "length",
        ..o
    };
    let r = output::finished(&head, &cut);
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["output"][1]["status"], "incomplete");
}

#[test]
fn input_items_all_get_ids_and_list_content() {
    let request = json!({"input": [{"role": "user", "content": "hi"},
        {"type": "function_call_output", "call_id": "c", "output": "x", "id": "mine"}]});
    let items = output::input_items("resp_z", &request);
    assert_eq!(items[0]["id"], "in_z_0");
    assert_eq!(items[0]["type"], "message");
    assert_eq!(
        items[0]["content"],
        json!([{"type": "input_text", "text": "hi"}])
    );
    assert_eq!(items[1]["id"], "mine");
}

#[test]
fn input_images_become_chat_image_url_parts_in_messages_and_tool_outputs() {
    let body = json!({"input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"}]},
        {"type": "function_call", "call_id": "c1", "name": "snap", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": "sha256:ab"}]}]});
    let m = messages(&body);
    assert_eq!(
        m[0]["content"][1],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}})
    );
    let tool = m
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("tool message");
    assert_eq!(
        tool["content"],
        json!([{"type": "image_url", "image_url": {"url": "sha256:ab"}}])
    );
}
