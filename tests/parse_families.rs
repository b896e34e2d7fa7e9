//! The newer tool-call formats (`qwen3_coder`, `glm45`, `kimi_k2`,
//! `pythonic`, `deepseek_v31`): each fixture parses as its format promises,
//! and the streamed parse equals the full one at every char boundary split,
//! char by char, and under random chunkings (arguments split anywhere,
//! malformed calls included); Kimi's model-written ids survive streaming;
//! the config's accepted names and `tool_parser` agree.

mod chunking;

use chunking::{boundaries, check_event_order, split_at_points, Rng};
use serde_json::{json, Value as Json};
use tito::config::{Config, TOOL_PARSERS};
use tito::parse::stream::compare_chunked;
use tito::parse::{tool_parser, DeltaEvent, ParseContext, ParseOutcome, ReasoningParser};

/// The request's tools: names and typed parameter schemas.
fn tools() -> Json {
    json!([
        {"type": "function", "function": {"name": "calc", "parameters": {
            "type": "object",
            "properties": {
                "expr": {"type": "string"},
                "n": {"type": "integer"},
                "opts": {"type": "object"},
                "flag": {"type": "boolean"}
            }
        }}},
        {"type": "function", "function": {"name": "lookup", "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}}
        }}}
    ])
}

/// Checks one text under every 2-way split, char by char, and random
/// chunkings; returns the full parse.
fn check_all_chunkings(
    parser: &str,
    reasoning: Option<&ReasoningParser>,
    ctx: &ParseContext,
    text: &str,
    rng: &mut Rng,
    random_chunkings: usize,
) -> tito::parse::ChatOutput {
    let b = boundaries(text);
    let mut chunkings: Vec<Vec<usize>> = b.iter().map(|&p| vec![p]).collect();
    if b.len() > 2 {
        chunkings.push(b[1..b.len() - 1].to_vec());
    }
    for _ in 0..random_chunkings {
        let mut pts: Vec<usize> = (0..rng.below(8)).map(|_| b[rng.below(b.len())]).collect();
        pts.sort_unstable();
        chunkings.push(pts);
    }
    let mut reference = None;
    for pts in chunkings {
        let chunks = split_at_points(text, &pts);
        let label = format!("{parser} {text:?} chunks {chunks:?}");
        let (full, streamed, events) = compare_chunked(&chunks, reasoning, parser, ctx, 42);
        assert_eq!(streamed, full, "{label}");
        check_event_order(&events, &label);
        match &reference {
            None => reference = Some(full),
            Some(r) => assert_eq!(&full, r, "{label}: full parse must not depend on chunking"),
        }
    }
    reference.expect("at least one chunking")
}

/// What a fixture parses to with the request's tools.
enum Want {
    Calls(&'static [(&'static str, &'static str)]),
    NoCalls,
    Malformed,
}

fn fixtures(parser: &str) -> Vec<(String, Want)> {
    use Want::*;
    let q = |name: &str, params: &[(&str, &str)]| {
        let body: String = params
            .iter()
            .map(|(k, v)| format!("<parameter={k}>\n{v}\n</parameter>\n"))
            .collect();
        format!("<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>")
    };
    let g = |name: &str, pairs: &[(&str, &str)]| {
        let body: String = pairs
            .iter()
            .map(|(k, v)| format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n"))
            .collect();
        format!("<tool_call>{name}\n{body}</tool_call>")
    };
    let k = |id: &str, args: &str| {
        format!("<|tool_call_begin|>{id}<|tool_call_argument_begin|>{args}<|tool_call_end|>")
    };
    let (ks, ke) = ("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>");
    let d = |name: &str, args: &str| {
        format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>")
    };
    let (ds, de) = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>");
    let s = |t: &str| t.to_owned();
    match parser {
        "qwen3_coder" => vec![
            (
                q("calc", &[("expr", "1 + 2"), ("n", "3")]),
                Calls(&[("calc", r#"{"expr":"1 + 2","n":3}"#)]),
            ),
            (
                format!(
                    "Let me check.\n\n{}\n{}",
                    q("lookup", &[("q", "é ü &amp; <b>")]),
                    q(
                        "calc",
                        &[
                            ("opts", "{\"a\": [1, {\"b\": \"</parameter>\"}]}"),
                            ("flag", "true")
                        ]
                    )
                ),
                Calls(&[
                    ("lookup", r#"{"q":"é ü &amp; <b>"}"#),
                    (
                        "calc",
                        r#"{"opts":{"a":[1,{"b":"</parameter>"}]},"flag":true}"#,
                    ),
                ]),
            ),
            (
                format!("{} after text ", q("calc", &[("expr", "x\ny")])),
                Calls(&[("calc", r#"{"expr":"x\ny"}"#)]),
            ),
            (
                s("<tool_call>\n<function=calc>\n<parameter=expr>\n1+"),
                Malformed,
            ),
            (q("rm", &[]), Malformed),
            (
                format!("{}<tool_call>\n<function=calc>", q("calc", &[])),
                Malformed,
            ),
            (s("a < b and <tool_ca is not a tag"), NoCalls),
            (s(""), NoCalls),
            (s("   "), NoCalls),
        ],
        "glm45" => vec![
            (
                g("calc", &[("expr", "1 + 2"), ("n", "3")]),
                Calls(&[("calc", r#"{"expr":"1 + 2","n":3}"#)]),
            ),
            (
                format!(
                    "Let me check.\n{}\n{}",
                    g("lookup", &[("q", " 東京 ")]),
                    g(
                        "calc",
                        &[
                            ("opts", "{\"a\": [1, {\"b\": \"</arg_key>\"}]}"),
                            ("flag", "True")
                        ]
                    )
                ),
                Calls(&[
                    ("lookup", r#"{"q":" 東京 "}"#),
                    (
                        "calc",
                        r#"{"opts":{"a":[1,{"b":"</arg_key>"}]},"flag":true}"#,
                    ),
                ]),
            ),
            (
                s("<tool_call>calc\n<arg_key>expr</arg_key>\n<arg_value>1+"),
                Malformed,
            ),
            (g("rm", &[]), Malformed),
            (s("<tool_call>calc\njunk</tool_call>"), Malformed),
            (s("x <tool_cal y"), NoCalls),
        ],
        "kimi_k2" => vec![
            (
                format!("{ks}{}{ke}", k("functions.calc:0", "{\"expr\": \"1+2\"}")),
                Calls(&[("calc", r#"{"expr":"1+2"}"#)]),
            ),
            (
                format!(
                    "Sure.{ks}\n{}\n{}{ke} done",
                    k("functions.lookup:0", "{\"q\": \"é\"}"),
                    k(
                        "functions.calc:1",
                        "{\"expr\": \"x\", \"opts\": {\"k\": [1, 2]}}"
                    )
                ),
                Calls(&[
                    ("lookup", r#"{"q":"é"}"#),
                    ("calc", r#"{"expr":"x","opts":{"k":[1,2]}}"#),
                ]),
            ),
            (format!("{ks}{}", k("functions.calc:0", "{}")), Malformed),
            (format!("{ks}{}{ke}", k("functions.calc", "{}")), Malformed),
            (
                format!("{ks}{}{ke}", k("functions.calc:0", "{\"e\": ")),
                Malformed,
            ),
            (s("Text with <| and <|tool but no call."), NoCalls),
        ],
        "pythonic" => vec![
            (
                s("[calc(expr=\"1+2\", n=3)]"),
                Calls(&[("calc", r#"{"expr":"1+2","n":3}"#)]),
            ),
            (
                s("[lookup(q='é ü'), calc(expr=\"a\\\"b\", opts={'k': [1, None, True]})]"),
                Calls(&[
                    ("lookup", r#"{"q":"é ü"}"#),
                    ("calc", r#"{"expr":"a\"b","opts":{"k":[1,null,true]}}"#),
                ]),
            ),
            (
                s("<|python_start|>[lookup(q=\"x\")]<|python_end|>"),
                Calls(&[("lookup", r#"{"q":"x"}"#)]),
            ),
            (s("  \n[calc()]\n "), Calls(&[("calc", "{}")])),
            (s("[1, 2, 3]"), NoCalls),
            (s("The answer: [calc(expr=\"1\")]"), NoCalls),
            (s("[calc(expr=\"1+"), Malformed),
            (s("[calc(\"positional\")]"), Malformed),
            (s("[rm(path='/')]"), Malformed),
        ],
        "deepseek_v31" => vec![
            (
                format!("{ds}{}{de}", d("calc", "{\"expr\": \"1\"}")),
                Calls(&[("calc", r#"{"expr":"1"}"#)]),
            ),
            (
                format!(
                    "Let me.{ds}{}\n{}{de}",
                    d("calc", "{}"),
                    d("lookup", "{\"q\": \"é\"}")
                ),
                Calls(&[("calc", "{}"), ("lookup", r#"{"q":"é"}"#)]),
            ),
            (format!("{ds}{}{de}", d("calc", "{\"e\": ")), Malformed),
            (format!("{ds}{}", d("calc", "{}")), Malformed),
            (s("Text with ｜ and <｜tool but no call."), NoCalls),
        ],
        other => panic!("no fixtures for {other}"),
    }
}

const FAMILIES: [&str; 5] = [
    "qwen3_coder",
    "glm45",
    "kimi_k2",
    "pythonic",
    "deepseek_v31",
];

#[test]
fn fixtures_parse_as_documented_at_every_chunking() {
    let mut rng = Rng(11);
    let typed = ParseContext::from_tools(Some(&tools()));
    for parser in FAMILIES {
        for (text, want) in fixtures(parser) {
            let full = check_all_chunkings(parser, None, &typed, &text, &mut rng, 40);
            let label = format!("{parser} {text:?}: {full:?}");
            match want {
                Want::Calls(calls) => {
                    assert_eq!(full.outcome, ParseOutcome::Calls(calls.len()), "{label}");
                    let got: Vec<(&str, &str)> = full
                        .tool_calls
                        .iter()
                        .map(|c| (c.name.as_str(), c.arguments.as_str()))
                        .collect();
                    assert_eq!(got, calls, "{label}");
                }
                Want::NoCalls => {
                    assert_eq!(full.outcome, ParseOutcome::NoCalls, "{label}");
                    assert_eq!(
                        full.content.as_deref(),
                        Some(text.as_str()).filter(|t| !t.is_empty())
                    );
                }
                Want::Malformed => {
                    assert!(
                        matches!(full.outcome, ParseOutcome::Malformed(_)),
                        "{label}"
                    );
                    assert_eq!(full.content.as_deref(), Some(text.as_str()), "{label}");
                    assert!(full.tool_calls.is_empty(), "{label}");
                }
            }
            // Without the request's tools: any name, untyped values.
            check_all_chunkings(parser, None, &ParseContext::default(), &text, &mut rng, 10);
        }
    }
}

#[test]
fn reasoning_then_xml_calls_every_chunking() {
    let mut rng = Rng(12);
    let typed = ParseContext::from_tools(Some(&tools()));
    for started in [false, true] {
        let r = ReasoningParser::new(started);
        let prefix = if started {
            "Opened.\n</think>\n\n"
        } else {
            "<think>\nCall calc.\n</think>\n\n"
        };
        for parser in ["qwen3_coder", "glm45"] {
            for (text, _) in fixtures(parser) {
                let text = format!("{prefix}{text}");
                let full = check_all_chunkings(parser, Some(&r), &typed, &text, &mut rng, 10);
                assert!(full.reasoning_content.is_some(), "{parser} {text:?}");
            }
        }
    }
}

#[test]
fn kimi_ids_are_the_models_in_every_chunking() {
    let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:3<|tool_call_argument_begin|>{\"q\": \"a\"}<|tool_call_end|><|tool_call_begin|>functions.calc:4<|tool_call_argument_begin|>{\"expr\": \"2\"}<|tool_call_end|><|tool_calls_section_end|>";
    let ctx = ParseContext::from_tools(Some(&tools()));
    let b = boundaries(text);
    for (i, &p) in b.iter().enumerate() {
        let chunks = if i % 2 == 0 {
            split_at_points(text, &[p])
        } else {
            split_at_points(text, &b[1..b.len() - 1])
        };
        for seed in [1, 2] {
            let (full, streamed, events) = compare_chunked(&chunks, None, "kimi_k2", &ctx, seed);
            assert_eq!(streamed, full);
            let ids: Vec<&str> = events
                .iter()
                .filter_map(|e| match e {
                    DeltaEvent::ToolCallStart { id, .. } => Some(id.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(ids, ["functions.lookup:3", "functions.calc:4"]);
            let msg = full.tool_calls_json().expect("calls");
            assert_eq!(msg[1]["id"], "functions.calc:4");
        }
    }
}

/// Random texts glued from each format's markers and value pieces: many
/// malformed in odd ways, which is where the scan and the full parse could
/// disagree (or a parser could panic).
#[test]
fn random_fragment_texts() {
    let common = [
        " ", "\n", "text", "é", "{", "}", "\"", "'", ":", ",", "[", "]", "(", ")", "=", "<", ">",
        "1",
    ];
    let per: [(&str, &[&str]); 5] = [
        ("qwen3_coder", &["<tool_call>", "</tool_call>", "<function=calc>", "</function>", "<parameter=n>", "</parameter>", "<tool_", "<tool_call>\n<function=lookup>\n<parameter=q>\nx\n</parameter>\n</function>\n</tool_call>"]),
        ("glm45", &["<tool_call>", "</tool_call>", "calc\n", "<arg_key>n</arg_key>", "<arg_value>", "</arg_value>", "<tool_call>lookup\n<arg_key>q</arg_key><arg_value>x</arg_value></tool_call>"]),
        ("kimi_k2", &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>", "functions.calc:0", "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool", "<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>"]),
        ("pythonic", &["[", "calc(", "lookup(q='x')", "n=1", "]", "<|python_start|>", "<|python_end|>", "[calc(n=2)]", "True", "\\"]),
        ("deepseek_v31", &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>calc<｜tool▁sep｜>{}<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup<｜tool▁sep｜>{\"q\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"]),
    ];
    let ctx = ParseContext::from_tools(Some(&tools()));
    let mut rng = Rng(13);
    for (parser, own) in per {
        let mut seen_calls = 0;
        for _ in 0..150 {
            let n = 1 + rng.below(8);
            let text: String = (0..n)
                .map(|_| {
                    if rng.below(2) == 0 {
                        own[rng.below(own.len())]
                    } else {
                        common[rng.below(common.len())]
                    }
                })
                .collect();
            let full = check_all_chunkings(parser, None, &ctx, &text, &mut rng, 5);
            match &full.outcome {
                ParseOutcome::Calls(_) => seen_calls += 1,
                _ => assert_eq!(
                    full.content.as_deref(),
                    Some(text.as_str()).filter(|t| !t.is_empty())
                ),
            }
        }
        assert!(
            seen_calls > 0,
            "{parser}: the generator never produced a valid call"
        );
    }
}

#[test]
fn config_and_parse_agree_on_names() {
    for name in TOOL_PARSERS {
        match tool_parser(name) {
            Ok(Some(p)) => assert_eq!(p.name(), *name),
            // gpt_oss: Harmony output, read from its ids by the renderer.
            Ok(None) => assert!(["none", "gpt_oss"].contains(name), "{name}"),
            Err(e) => panic!("config accepts {name} but parse does not: {e}"),
        }
    }
    // The other way: every name parse's error lists is in the config list.
    let err = tool_parser("bogus").expect_err("unknown name").to_string();
    let listed = err
        .rsplit_once('(')
        .and_then(|(_, l)| l.strip_suffix(')'))
        .expect("the error lists the names");
    let mut listed: Vec<&str> = listed.split(" | ").collect();
    let mut accepted = TOOL_PARSERS.to_vec();
    listed.sort_unstable();
    accepted.sort_unstable();
    assert_eq!(listed, accepted);
    for name in FAMILIES {
        assert!(TOOL_PARSERS.contains(&name), "{name}");
    }

    let cfg = |name: &str| {
        Config::from_toml(&format!(
            "[model]\ntokenizer = \"x\"\ntool_parser = \"{name}\"\n[[backends]]\nurl = \"http://127.0.0.1:8001\"\nkind = \"vllm\"\n"
        ))
    };
    for name in TOOL_PARSERS {
        assert!(cfg(name).is_ok(), "{name}");
    }
    let refused = cfg("qwen")
        .expect_err("an unknown name is refused")
        .to_string();
    for name in TOOL_PARSERS {
        assert!(refused.contains(name), "{refused} lacks {name}");
    }
}
