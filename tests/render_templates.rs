//! The chat templates tito ships (`templates/`, `[model] chat_template` by
//! name): a multi-turn conversation re-rendered equals the previous prompt
//! followed by exactly the tokens the model sampled, so training on the
//! re-render trains on what was generated. The reference check against
//! transformers' `apply_chat_template` is tests/python/test_templates.py.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{json, Value as Json};
use tito::config::ModelConfig;
use tito::render::{RenderInput, Renderer};

fn renderer(tokenizer: &str, template: &str) -> Arc<Renderer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/tokenizers")
        .join(tokenizer);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "{} is missing: run scripts/fetch-tokenizers.sh",
        dir.display()
    );
    let model = ModelConfig {
        tokenizer: dir,
        chat_template: PathBuf::from(template),
        ..Default::default()
    };
    Renderer::load(&model).expect("tokenizer and template load")
}

fn ids(r: &Renderer, messages: &[Json], tools: Option<&[Json]>) -> Vec<u32> {
    r.render_ids(&RenderInput {
        messages,
        tools,
        add_generation_prompt: true,
        kwargs: None,
    })
    .expect("renders")
}

/// Turn 1 is rendered and "sampled"; turn 2 appends the assistant message
/// as a client would echo it plus `next`. Returns (turn-1 prompt + sampled
/// ids, turn-2 prompt).
fn two_turns(
    r: &Renderer,
    first: &[Json],
    tools: Option<&[Json]>,
    sampled_text: &str,
    echoed: Json,
    next: &[Json],
) -> (Vec<u32>, Vec<u32>) {
    let mut history = ids(r, first, tools);
    history.extend(r.encode(sampled_text).expect("encodes"));
    let mut second: Vec<Json> = first.to_vec();
    second.push(echoed);
    second.extend(next.iter().cloned());
    (history, ids(r, &second, tools))
}

fn weather_tool() -> Json {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

#[test]
fn qwen3_keep_think_re_renders_earlier_reasoning_as_sampled() {
    let first = [
        json!({"role": "system", "content": "You are terse."}),
        json!({"role": "user", "content": "What is 2+2?"}),
    ];
    let sampled = "<think>\nTwo plus two.\n</think>\n\n4<|im_end|>";
    let echoed = json!({"role": "assistant", "content": "4", "reasoning_content": "Two plus two."});
    let next = [json!({"role": "user", "content": "And 3+3?"})];
    let keep = renderer("qwen3", "qwen3-keep-think");
    let (history, again) = two_turns(&keep, &first, None, sampled, echoed.clone(), &next);
    assert!(
        again.starts_with(&history),
        "turn 2 does not continue turn 1's sampled tokens"
    );
    // Qwen3's own template drops the earlier reasoning: the re-render is not
    // what was sampled (why the shipped template exists).
    let own = renderer("qwen3", "");
    let (history, again) = two_turns(&own, &first, None, sampled, echoed, &next);
    assert!(!again.starts_with(&history));
}

#[test]
fn qwen3_keep_think_round_trips_tool_calls_and_results() {
    let tools = [weather_tool()];
    let first = [json!({"role": "user", "content": "Weather in Paris?"})];
    let sampled = "<think>\nI should call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>";
    let echoed = json!({"role": "assistant", "content": "", "reasoning_content": "I should call the tool.",
        "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
    let next = [json!({"role": "tool", "tool_call_id": "c1", "content": "22 C, sunny"})];
    let keep = renderer("qwen3", "qwen3-keep-think");
    let (history, again) = two_turns(&keep, &first, Some(&tools), sampled, echoed, &next);
    assert!(
        again.starts_with(&history),
        "the tool-call turn is not re-rendered as sampled"
    );
    let text = keep
        .decode(&again[history.len()..], false)
        .expect("decodes");
    assert_eq!(
        text,
        "\n<|im_start|>user\n<tool_response>\n22 C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama31_tools_round_trips_a_json_tool_call() {
    let tools = [weather_tool()];
    let first = [
        json!({"role": "system", "content": "Use tools when they help."}),
        json!({"role": "user", "content": "Weather in Paris?"}),
    ];
    let sampled = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}<|eot_id|>";
    let echoed = json!({"role": "assistant", "content": null,
        "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]});
    let next = [json!({"role": "tool", "tool_call_id": "c1", "content": "22 C, sunny"})];
    let r = renderer("llama3_1", "llama3.1-tools");
    let (history, again) = two_turns(&r, &first, Some(&tools), sampled, echoed, &next);
    assert!(
        again.starts_with(&history),
        "the call is not re-rendered as sampled"
    );
    let text = r.decode(&again[history.len()..], false).expect("decodes");
    assert_eq!(
        text,
        "<|start_header_id|>ipython<|end_header_id|>\n\n22 C, sunny<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    let prompt = r.render(&RenderInput {
        messages: &first,
        tools: Some(&tools),
        add_generation_prompt: true,
        kwargs: None,
    });
    let prompt = prompt.expect("renders");
    assert!(prompt.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nUse tools when they help.<|eot_id|>"), "{prompt}");
    assert!(prompt.contains("\"name\": \"get_weather\""), "{prompt}");
}

#[test]
fn an_unknown_template_name_lists_the_shipped_ones() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/tokenizers/qwen3");
    let model = ModelConfig {
        tokenizer: dir,
        chat_template: PathBuf::from("qwen3-keep-thinking"),
        ..Default::default()
    };
    let Err(e) = Renderer::load(&model) else {
        panic!("a name that is neither shipped nor a file must be refused");
    };
    let msg = e.to_string();
    assert!(
        msg.contains("qwen3-keep-think") && msg.contains("llama3.1-tools"),
        "{msg}"
    );
}
