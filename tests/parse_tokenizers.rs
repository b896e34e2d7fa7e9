//! The parsers over text decoded by real tokenizers: the markers survive the
//! decode modes the module doc promises, and a token-by-token decode fed to
//! the stream gives the non-streamed result.
//!
//! Fixtures: .cache/tokenizers/<name>/ from scripts/fetch-tokenizers.sh.

use std::path::PathBuf;
use std::sync::Arc;

use tito::config::ModelConfig;
use tito::parse::stream::compare_chunked;
use tito::parse::{ParseContext, ParseOutcome, ReasoningParser};
use tito::render::Renderer;

fn renderer(name: &str) -> Arc<Renderer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/tokenizers")
        .join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "tokenizer {name} missing at {}: run scripts/fetch-tokenizers.sh",
        dir.display()
    );
    let model = ModelConfig {
        tokenizer: dir,
        ..ModelConfig::default()
    };
    Renderer::load(&model).expect("renderer loads from the fetched tokenizer")
}

/// Text deltas as an incremental detokenizer releases them: one per token,
/// held while the decoded prefix ends in an incomplete character.
fn token_deltas(r: &Renderer, ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut out = Vec::new();
    let mut prev = String::new();
    for i in 1..=ids.len() {
        let cur = r.decode(&ids[..i], skip_special).expect("decodes");
        if cur.ends_with('\u{FFFD}') && i < ids.len() {
            continue;
        }
        let delta = cur
            .strip_prefix(prev.as_str())
            .expect("decoding is prefix-stable");
        out.push(delta.to_owned());
        prev = cur;
    }
    out
}

struct Sample<'a> {
    tokenizer: &'a str,
    parser: &'a str,
    reasoning: Option<ReasoningParser>,
    text: &'a str,
    marker: Option<&'a str>,
    expect_calls: &'a [(&'a str, &'a str)],
    expect_reasoning: Option<&'a str>,
}

fn check(s: &Sample) {
    let r = renderer(s.tokenizer);
    let ids = r.encode(s.text).expect("encodes");
    if let Some(m) = s.marker {
        let id = r.token_to_id(m).expect("the marker is one token");
        assert!(ids.contains(&id), "{m} encodes as its own token");
    }
    let ctx = ParseContext {
        tool_names: Some(s.expect_calls.iter().map(|(n, _)| n.to_string()).collect()),
        ..Default::default()
    };
    for skip_special in [true, false] {
        let deltas = token_deltas(&r, &ids, skip_special);
        let chunks: Vec<&str> = deltas.iter().map(String::as_str).collect();
        let label = format!("{} skip_special={skip_special}", s.tokenizer);
        let (full, streamed, _) =
            compare_chunked(&chunks, s.reasoning.as_ref(), s.parser, &ctx, 11);
        assert_eq!(streamed, full, "{label}");
        assert_eq!(
            full.outcome,
            ParseOutcome::Calls(s.expect_calls.len()),
            "{label}"
        );
        let got: Vec<(&str, &str)> = full
            .tool_calls
            .iter()
            .map(|c| (c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(got, s.expect_calls, "{label}");
        assert_eq!(
            full.reasoning_content.as_deref(),
            s.expect_reasoning,
            "{label}"
        );
    }
}

#[test]
fn qwen3_hermes_with_thinking() {
    check(&Sample {
        tokenizer: "qwen3",
        parser: "hermes",
        reasoning: Some(ReasoningParser::new(false)),
        text: "<think>\nThe user wants 17*23; use the calculator.\n</think>\n\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"17 * 23\"}}\n</tool_call>\n<tool_call>\n{\"name\":\"lookup\",\"arguments\":{\"term\":\"Zürich\"}}\n</tool_call>",
        marker: Some("<tool_call>"),
        expect_calls: &[
            ("calculator", r#"{"expression":"17 * 23"}"#),
            ("lookup", r#"{"term":"Zürich"}"#),
        ],
        expect_reasoning: Some("The user wants 17*23; use the calculator."),
    });
}

#[test]
fn deepseek_v3_template_format() {
    check(&Sample {
        tokenizer: "deepseek_v3",
        parser: "deepseek_v3",
        reasoning: None,
        text: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"東京\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        marker: Some("<｜tool▁calls▁begin｜>"),
        expect_calls: &[("get_weather", r#"{"city":"東京"}"#), ("get_time", "{}")],
        expect_reasoning: None,
    });
}

#[test]
fn llama3_untagged_json() {
    check(&Sample {
        tokenizer: "llama3_1",
        parser: "llama3_json",
        reasoning: None,
        text: "{\"name\": \"search\", \"parameters\": {\"query\": \"rust serde\", \"limit\": 3}}",
        marker: None,
        expect_calls: &[("search", r#"{"query":"rust serde","limit":3}"#)],
        expect_reasoning: None,
    });
}

#[test]
fn qwen3_coder_xml_with_thinking() {
    check(&Sample {
        tokenizer: "qwen3",
        parser: "qwen3_coder",
        reasoning: Some(ReasoningParser::new(false)),
        text: "<think>\nWeather first.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        marker: Some("<tool_call>"),
        // No schemas in this context: the values stay strings.
        expect_calls: &[("get_weather", r#"{"city":"Zürich","days":"3"}"#)],
        expect_reasoning: Some("Weather first."),
    });
}

#[test]
fn deepseek_v31_format() {
    check(&Sample {
        tokenizer: "deepseek_v3",
        parser: "deepseek_v31",
        reasoning: None,
        text: "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"東京\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        marker: Some("<｜tool▁calls▁begin｜>"),
        expect_calls: &[("get_weather", r#"{"city":"東京"}"#), ("get_time", "{}")],
        expect_reasoning: None,
    });
}

#[test]
fn llama3_pythonic_list() {
    check(&Sample {
        tokenizer: "llama3_1",
        parser: "pythonic",
        reasoning: None,
        text: "[search(query=\"rust serde\", limit=3), get_time(tz='UTC')]",
        marker: None,
        expect_calls: &[
            ("search", r#"{"query":"rust serde","limit":3}"#),
            ("get_time", r#"{"tz":"UTC"}"#),
        ],
        expect_reasoning: None,
    });
}
