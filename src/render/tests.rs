//! Unit tests of what `Renderer::render` hands a template, with a tiny
//! word-level tokenizer (the real tokenizers are checked by
//! tests/render_goldens.rs).

use serde_json::{json, Value as Json};
use tokenizers::Tokenizer;

use super::{alias_reasoning_fields, hf, RenderError, RenderInput, Renderer, TokenizerSource};

fn tiny_tokenizer() -> Tokenizer {
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [
            {"id": 0, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false,
             "normalized": false, "special": true}
        ],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}
        },
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<s>": 0, "<unk>": 1, "hi": 2, "there": 3}, "unk_token": "<unk>"}
    });
    Tokenizer::from_bytes(spec.to_string().as_bytes()).expect("tiny tokenizer spec is valid")
}

fn renderer(template: &str) -> Renderer {
    let source = TokenizerSource {
        tokenizer: tiny_tokenizer(),
        chat_template: None,
        bos_token: Some("<s>".into()),
        eos_token: Some("</s>".into()),
        pad_token: None,
        unk_token: Some("<unk>".into()),
        eos_token_ids: vec![],
        max_model_len: None,
        sha256: String::new(),
    };
    Renderer::new(source, Some(template.into())).expect("test template compiles")
}

fn render(
    r: &Renderer,
    messages: &[Json],
    kwargs: Option<&serde_json::Map<String, Json>>,
) -> String {
    let input = RenderInput {
        messages,
        kwargs,
        ..RenderInput::default()
    };
    r.render(&input).expect("test template renders")
}

#[test]
fn special_tokens_are_variables_and_kwargs_override_them() {
    let r = renderer(
        "{{ bos_token }}|{{ eos_token }}|{{ unk_token }}|{{ pad_token is defined }}|{{ flag }}",
    );
    assert_eq!(render(&r, &[], None), "<s>|</s>|<unk>|False|");
    let kwargs = json!({"eos_token": "<end>", "flag": true});
    let kwargs = kwargs.as_object().expect("object");
    assert_eq!(render(&r, &[], Some(kwargs)), "<s>|<end>|<unk>|False|True");
}

#[test]
fn the_render_s_own_variables_win_over_kwargs_of_their_name() {
    let r = renderer(
        "{{ messages | length }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}",
    );
    let kwargs = json!({"messages": [1, 2, 3], "tools": [1], "documents": [1], "add_generation_prompt": true});
    let kwargs = kwargs.as_object().expect("object");
    let messages = [json!({"role": "user", "content": "x"})];
    assert_eq!(render(&r, &messages, Some(kwargs)), "1|True|True|False");
}

#[test]
fn tools_and_documents_are_none_when_absent() {
    // transformers always passes both, so `tools is not none` is false without tools.
    let r = renderer("{{ tools is defined }} {{ tools is none }} {{ documents is none }}");
    assert_eq!(render(&r, &[], None), "True True True");
    let tools = [json!({"type": "function"})];
    let input = RenderInput {
        tools: Some(&tools),
        ..RenderInput::default()
    };
    assert_eq!(r.render(&input).expect("renders"), "True False True");
}

#[test]
fn reasoning_fields_are_aliased_like_transformers() {
    let m = json!({"role": "assistant", "content": "x", "reasoning": "why"});
    let aliased = alias_reasoning_fields(&m);
    let keys: Vec<&str> = aliased
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "thinking",
            "role",
            "content",
            "reasoning",
            "reasoning_content"
        ]
    );
    assert_eq!(aliased["reasoning_content"], "why");
    assert_eq!(aliased["thinking"], "why");
    // A null reasoning field does not count; nothing else changes.
    let plain = json!({"role": "assistant", "content": "x", "reasoning_content": null});
    let passed = alias_reasoning_fields(&plain);
    assert!(
        matches!(passed, std::borrow::Cow::Borrowed(_)),
        "not copied"
    );
    assert_eq!(*passed, plain);
    let r = renderer("{% for m in messages %}{{ m.reasoning_content }}{% endfor %}");
    assert_eq!(render(&r, &[m], None), "why");
}

#[test]
fn raise_exception_is_a_template_error_with_its_message() {
    let r = renderer("{{ raise_exception('roles must alternate') }}");
    let err = r
        .render(&RenderInput::default())
        .expect_err("template raises");
    assert!(
        matches!(&err, RenderError::Template(m) if m.contains("roles must alternate")),
        "{err}"
    );
}

#[test]
fn broken_template_fails_at_load() {
    let source = TokenizerSource {
        tokenizer: tiny_tokenizer(),
        chat_template: None,
        bos_token: None,
        eos_token: None,
        pad_token: None,
        unk_token: None,
        eos_token_ids: vec![],
        max_model_len: None,
        sha256: String::new(),
    };
    let err = Renderer::new(source, Some("{% for %}".into())).err();
    assert!(matches!(err, Some(RenderError::TemplateCompile(_))));
}

#[test]
fn encode_adds_no_bos_even_when_the_tokenizer_would() {
    let r = renderer("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}");
    let messages = [json!({"role": "user", "content": " hi there"})];
    let input = RenderInput {
        messages: &messages,
        ..RenderInput::default()
    };
    // The template wrote BOS once; the post-processor's BOS is not added.
    assert_eq!(r.render_ids(&input).expect("renders"), vec![0, 2, 3]);
}

#[test]
fn special_token_vars_read_strings_dicts_and_extra_tokens() {
    let config = json!({
        "bos_token": {"__type": "AddedToken", "content": "<｜begin▁of▁sentence｜>"},
        "eos_token": "<end_of_turn>",
        "pad_token": null,
        "additional_special_tokens": ["<a>"],
        "extra_special_tokens": {"image_token": "<image_soft_token>"}
    });
    let vars = hf::special_token_vars(&config);
    assert_eq!(
        Json::Object(vars),
        json!({"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<end_of_turn>",
               "image_token": "<image_soft_token>"})
    );
}
