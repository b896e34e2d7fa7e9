//! gpt-oss's Harmony format: tito's prompt ids equal PyPI `openai-harmony`'s
//! on the shared corpus (tests/fixtures/goldens/gpt_oss.json, written by
//! scripts/gen_goldens_harmony.py with the same request mapping), and
//! sampled ids parse into the messages the package parses them into
//! (gpt_oss_parse.json), whole and streamed at every split.
//!
//! Needs `$TIKTOKEN_ENCODINGS_BASE` (scripts/env.sh sets it to the folder
//! scripts/fetch-tokenizers.sh builds `o200k_base.tiktoken` in).

mod common;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value as Json};
use tito::parse::{DeltaEvent, EventAssembler, IdGen, IdStyle, ParseContext, ParseOutcome};
use tito::render::harmony::HarmonyStream;
use tito::render::{RenderInput, Renderer};

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    chat_template_kwargs: Option<serde_json::Map<String, Json>>,
    add_generation_prompt: bool,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ParseCase {
    name: String,
    ids: Vec<u32>,
    messages: Vec<ParsedMessage>,
}

#[derive(Deserialize)]
struct ParsedMessage {
    channel: Option<String>,
    recipient: Option<String>,
    text: String,
}

fn fixture<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/goldens")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("golden fixture is committed");
    serde_json::from_str(&text).expect("golden fixture parses")
}

fn renderer() -> Arc<Renderer> {
    assert!(
        std::env::var_os("TIKTOKEN_ENCODINGS_BASE").is_some(),
        "TIKTOKEN_ENCODINGS_BASE is unset: source scripts/env.sh (after scripts/fetch-tokenizers.sh)"
    );
    common::real_renderer("gptoss", "harmony")
}

fn input(c: &Case) -> RenderInput<'_> {
    RenderInput {
        messages: &c.messages,
        tools: c.tools.as_deref(),
        add_generation_prompt: c.add_generation_prompt,
        kwargs: c.chat_template_kwargs.as_ref(),
    }
}

#[test]
fn prompt_ids_equal_openai_harmony_on_the_corpus() {
    let r = renderer();
    let cases: Vec<Case> = fixture("gpt_oss.json");
    assert!(cases.len() >= 10, "at least 10 conversations");
    let mut failures = Vec::new();
    for c in &cases {
        match r.render_ids(&input(c)) {
            Ok(ids) if ids == c.ids => {}
            Ok(ids) => {
                let at = ids.iter().zip(&c.ids).position(|(a, b)| a != b);
                failures.push(format!(
                    "{}: differs at {at:?} (tito {} ids, golden {})",
                    c.name,
                    ids.len(),
                    c.ids.len()
                ));
            }
            Err(e) => failures.push(format!("{}: {e}", c.name)),
        }
        // The text form is the decoding of those ids, and gives them back.
        let text = r.render(&input(c)).expect("renders");
        assert_eq!(
            r.decode(&c.ids, false).expect("decodes"),
            text,
            "{}",
            c.name
        );
        assert_eq!(
            r.rendered_ids(&text, &input(c)).expect("ids"),
            c.ids,
            "{}",
            c.name
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Plain text (what completions prompts and logprob bytes go through) is
/// encoded by the fast BPE path exactly as by the `tokenizers` crate, on
/// every golden conversation's text.
#[test]
fn the_fast_encoder_agrees_with_the_tokenizers_crate_on_the_corpus() {
    let r = renderer();
    let cases: Vec<Case> = fixture("gpt_oss.json");
    for c in &cases {
        let text = r.decode(&c.ids, false).expect("decodes");
        assert_eq!(
            r.encode(&text).expect("encodes"),
            r.encode_reference(&text).expect("encodes"),
            "{}",
            c.name
        );
    }
}

/// What the package's messages make of an OpenAI message, as tito serves
/// them: analysis is reasoning, final and recipient-less commentary are
/// content (several joined by a newline), a message to `functions.NAME` a
/// call with the message's text as its arguments.
fn expected(msgs: &[ParsedMessage]) -> (Option<String>, Option<String>, Vec<(String, String)>) {
    let join = |keep: &dyn Fn(&ParsedMessage) -> bool| {
        let parts: Vec<&str> = msgs
            .iter()
            .filter(|m| keep(m))
            .map(|m| m.text.as_str())
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n"))
    };
    let reasoning = join(&|m| m.channel.as_deref() == Some("analysis") && m.recipient.is_none());
    let content = join(&|m| m.channel.as_deref() != Some("analysis") && m.recipient.is_none());
    let calls = msgs
        .iter()
        .filter_map(|m| {
            let name = m.recipient.as_deref()?.strip_prefix("functions.")?;
            Some((name.to_owned(), m.text.clone()))
        })
        .collect();
    (reasoning, content, calls)
}

fn stream_in(r: &Renderer, chunks: &[&[u32]]) -> (tito::parse::ChatOutput, Vec<DeltaEvent>) {
    let h = r.harmony().expect("a Harmony renderer");
    let mut s = HarmonyStream::new(
        h.encoding(),
        ParseContext::default(),
        IdGen::seeded(9, IdStyle::OpenAi),
    );
    let mut events = Vec::new();
    for c in chunks {
        events.extend(s.push(c));
    }
    events.extend(s.finish());
    (s.output(), events)
}

#[test]
fn sampled_ids_parse_as_openai_harmony_parses_them_whole_and_streamed() {
    let r = renderer();
    let cases: Vec<ParseCase> = fixture("gpt_oss_parse.json");
    assert!(cases.len() >= 5);
    for c in &cases {
        let (whole, _) = stream_in(&r, &[&c.ids]);
        let (reasoning, content, calls) = expected(&c.messages);
        assert_eq!(whole.reasoning_content, reasoning, "{}", c.name);
        assert_eq!(whole.content, content, "{}", c.name);
        let got: Vec<(String, String)> = whole
            .tool_calls
            .iter()
            .map(|t| (t.name.clone(), t.arguments.clone()))
            .collect();
        assert_eq!(got, calls, "{}", c.name);
        let outcome = match calls.len() {
            0 => ParseOutcome::NoCalls,
            n => ParseOutcome::Calls(n),
        };
        assert_eq!(whole.outcome, outcome, "{}", c.name);
        // Every split point, and one id at a time: the same message.
        for at in 0..=c.ids.len() {
            let (out, events) = stream_in(&r, &[&c.ids[..at], &c.ids[at..]]);
            assert_eq!(out, whole, "{} split at {at}", c.name);
            let mut asm = EventAssembler::default();
            events.iter().for_each(|e| asm.push(e));
            assert_eq!(asm.output(out.outcome.clone()), whole, "{}", c.name);
        }
        let singles: Vec<&[u32]> = c.ids.chunks(1).collect();
        assert_eq!(stream_in(&r, &singles).0, whole, "{} id by id", c.name);
    }
}

#[test]
fn output_the_package_cannot_parse_is_content_with_the_reason() {
    let r = renderer();
    let text = "<|channel|>final<|message|>fine<|end|>stray text<|return|>";
    let ids = r.encode(text).expect("encodes");
    let (out, _) = stream_in(&r, &[&ids]);
    assert_eq!(
        out.content.as_deref().map(|c| c.starts_with("fine")),
        Some(true)
    );
    assert!(out
        .content
        .as_deref()
        .is_some_and(|c| c.contains("stray text")));
    assert!(matches!(out.outcome, ParseOutcome::Malformed(ref why) if why.starts_with("harmony")));
}

#[test]
fn a_call_to_a_function_the_request_does_not_offer_is_content() {
    let r = renderer();
    let text = "<|channel|>commentary to=functions.rm_rf <|constrain|>json<|message|>{\"path\":\"/\"}<|call|>";
    let ids = r.encode(text).expect("encodes");
    let h = r.harmony().expect("harmony");
    let ctx = ParseContext::from_tools(Some(
        &json!([{"type": "function", "function": {"name": "get_weather"}}]),
    ));
    let out = HarmonyStream::parse(h.encoding(), &ids, ctx, IdGen::seeded(1, IdStyle::OpenAi));
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.content.as_deref(), Some("{\"path\":\"/\"}"));
    assert!(matches!(out.outcome, ParseOutcome::Malformed(ref why) if why.contains("rm_rf")));
}

#[test]
fn bad_requests_are_template_errors_naming_the_cause() {
    let r = renderer();
    let msgs = [json!({"role": "user", "content": "hi"})];
    let kw = |v: Json| v.as_object().cloned();
    for (kwargs, tools, why) in [
        (
            kw(json!({"reasoning_effort": "max"})),
            None,
            "reasoning_effort",
        ),
        (
            kw(json!({"conversation_start_date": 5})),
            None,
            "conversation_start_date",
        ),
        (None, Some(vec![json!({"type": "web_search"})]), "tool type"),
    ] {
        let err = r
            .render_ids(&RenderInput {
                messages: &msgs,
                tools: tools.as_deref(),
                add_generation_prompt: true,
                kwargs: kwargs.as_ref(),
            })
            .expect_err("refused");
        assert!(err.to_string().contains(why), "{err}");
    }
    let odd = [json!({"role": "narrator", "content": "hi"})];
    let err = r
        .render_ids(&RenderInput {
            messages: &odd,
            ..Default::default()
        })
        .expect_err("refused");
    assert!(err.to_string().contains("narrator"), "{err}");
}

/// The prompt is rendered message by message, each message's ids cached:
/// a second render (every message cached) and the crate's render of the
/// whole conversation at once give the same ids, on every golden case.
#[test]
fn cached_message_renders_equal_the_crates_whole_conversation() {
    use openai_harmony::chat::Role;
    let r = renderer();
    let h = r.harmony().expect("harmony");
    let cases: Vec<Case> = fixture("gpt_oss.json");
    for c in &cases {
        let first = r.render_ids(&input(c)).expect("renders");
        let again = r.render_ids(&input(c)).expect("renders");
        let convo = tito::render::harmony::conversation(
            &c.messages,
            c.tools.as_deref(),
            c.chat_template_kwargs.as_ref(),
        )
        .expect("maps");
        let whole = if c.add_generation_prompt {
            h.encoding()
                .render_conversation_for_completion(&convo.messages, Role::Assistant, None)
        } else {
            h.encoding().render_conversation(&convo.messages, None)
        }
        .expect("the crate renders");
        assert_eq!(first, whole, "{}", c.name);
        assert_eq!(again, whole, "{}", c.name);
    }
}
