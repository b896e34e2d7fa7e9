//! The streaming invariant of `tito::parse`: for every example and every
//! chunking, the assembled stream equals the non-streamed parse (content,
//! reasoning, calls with ids, outcome), and the events are well-formed.

mod chunking;

use chunking::{boundaries, check_event_order, split_at_points, Rng};
use tito::parse::stream::compare_chunked;
use tito::parse::{
    tool_parser, ChatStream, DeltaEvent, IdGen, IdStyle, ParseContext, ParseOutcome,
    ReasoningParser,
};

struct Case<'a> {
    parser: &'a str,
    reasoning: Option<ReasoningParser>,
    names: Option<Vec<String>>,
    text: String,
}

/// Checks one text under every 2-way split, char-by-char, and random
/// chunkings.
fn check_all_chunkings(case: &Case, rng: &mut Rng, random_chunkings: usize) {
    let ctx = ParseContext {
        tool_names: case.names.clone(),
        ..Default::default()
    };
    let text = case.text.as_str();
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
        let label = format!("{} {:?} chunks {:?}", case.parser, text, chunks);
        let (full, streamed, events) =
            compare_chunked(&chunks, case.reasoning.as_ref(), case.parser, &ctx, 42);
        assert_eq!(streamed, full, "{label}");
        check_event_order(&events, &label);
        match &reference {
            None => reference = Some(full),
            Some(r) => assert_eq!(&full, r, "{label}: full parse must not depend on chunking"),
        }
    }
}

fn texts(parser: &str) -> Vec<&'static str> {
    match parser {
        "hermes" => vec![
            "Plain answer with  spaces.  \n",
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+2\"}}\n</tool_call>",
            "Let me check.\n\n<tool_call>\n{\"name\":\"lookup\" , \"arguments\":{\"q\" : \"é ü\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"calc\", \"arguments\": {}}\n</tool_call>",
            "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1+\n</tool_call>",
            "Wait <tool_call>{\"name\": \"calc\", \"arguments\": {}}",
            "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>",
            "a < b and <tool_ca is not a tag",
            "<tool_call>{\"name\": \"calc\"}</tool_call> after text ",
            "",
            "   ",
        ],
        "llama3_json" => vec![
            "{\"name\": \"calc\", \"parameters\": {\"expr\": \"2*3\"}}",
            "  {\"name\": \"calc\", \"parameters\": {}}; {\"name\": \"lookup\", \"parameters\": {\"q\": \"x\"}}",
            "<|python_tag|>{\"name\": \"lookup\", \"arguments\": {\"q\": \"y\"}}",
            "Sure.<|python_tag|>{\"name\": \"lookup\", \"parameters\": {}}",
            "{\"answer\": 42}",
            "{\"name\": \"calc\", \"parameters\": {\"e\": ",
            "{\"name\": \"calc\", \"parameters\": {}} trailing",
            "No call here {really}.",
            "<|python_tag|>not json",
        ],
        "mistral" => vec![
            "[TOOL_CALLS] [{\"name\": \"calc\", \"arguments\": {\"a\": 1}}]",
            "Thinking aloud. [TOOL_CALLS][{\"name\": \"calc\", \"arguments\": {}}, {\"name\": \"lookup\", \"arguments\": {\"q\": \"z\"}}]",
            "[TOOL_CALLS]calc[ARGS]{\"a\": 2}[TOOL_CALLS]lookup{\"q\": \"w\"}",
            "[TOOL_CALLS] [{\"name\": \"calc\", \"arguments\": {",
            "[TOOL_CALLS] [{\"name\": \"nope\", \"arguments\": {}}]",
            "Brackets [TOOL] are fine [x].",
        ],
        "deepseek_v3" => vec![
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"e\": \"1\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Let me.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{\"q\": \"é\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"e\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{}\n```<｜tool▁call▁end｜>",
            "Text with ｜ and <｜tool but no call.",
        ],
        _ => vec!["plain text", ""],
    }
}

const PARSERS: [&str; 5] = ["hermes", "llama3_json", "mistral", "deepseek_v3", "none"];

fn names() -> Option<Vec<String>> {
    Some(vec!["calc".into(), "lookup".into()])
}

#[test]
fn every_example_every_chunking() {
    let mut rng = Rng(1);
    for parser in PARSERS {
        for text in texts(parser) {
            for names in [names(), None] {
                let case = Case {
                    parser,
                    reasoning: None,
                    names,
                    text: text.to_owned(),
                };
                check_all_chunkings(&case, &mut rng, 40);
            }
        }
    }
}

#[test]
fn reasoning_then_tools_every_chunking() {
    let mut rng = Rng(2);
    let prefixes = [
        "<think>\nI should call calc.\n</think>\n\n",
        "Reasoning from an opened prompt.\n</think>\n\n",
        "<think>\n\n</think>\n\n",
        "",
    ];
    for started in [false, true] {
        for prefix in prefixes {
            for parser in ["hermes", "none"] {
                for text in texts(parser) {
                    let case = Case {
                        parser,
                        reasoning: Some(ReasoningParser::new(started)),
                        names: names(),
                        text: format!("{prefix}{text}"),
                    };
                    check_all_chunkings(&case, &mut rng, 10);
                }
            }
        }
    }
    for text in [
        "<think>\nunterminated reasoning ",
        "  <thi",
        "<think>x</thi",
        "   ",
        "no think </think> here",
    ] {
        for started in [false, true] {
            let case = Case {
                parser: "hermes",
                reasoning: Some(ReasoningParser::new(started)),
                names: None,
                text: text.into(),
            };
            check_all_chunkings(&case, &mut rng, 20);
        }
    }
}

/// Random texts glued from each format's markers and JSON pieces: many of
/// them malformed in odd ways, which is where the scan and the full parse
/// could disagree.
#[test]
fn random_fragment_texts() {
    let common = [
        " ",
        "\n",
        "text",
        "é",
        "{",
        "}",
        "\"",
        ":",
        ",",
        ";",
        "[",
        "]",
        "{\"name\": \"calc\", \"arguments\": {\"a\": 1}}",
    ];
    let per: [(&str, &[&str]); 4] = [
        ("hermes", &["<tool_call>", "</tool_call>", "<tool_", "<tool_call>\n{\"name\": \"lookup\", \"arguments\": {}}\n</tool_call>"]),
        ("llama3_json", &["<|python_tag|>", "<|py", "{\"name\": \"lookup\", \"parameters\": {}}", "; "]),
        ("mistral", &["[TOOL_CALLS]", "[TOOL_", "calc[ARGS]", "[{\"name\": \"calc\", \"arguments\": {}}]"]),
        ("deepseek_v3", &["<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{}\n```<｜tool▁call▁end｜>", "<｜tool"]),
    ];
    let mut rng = Rng(3);
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
            let think = rng.below(3) == 0;
            let case = Case {
                parser,
                reasoning: think.then(|| ReasoningParser::new(rng.below(2) == 0)),
                names: names(),
                text,
            };
            let ctx = ParseContext {
                tool_names: case.names.clone(),
                ..Default::default()
            };
            let (full, _, _) = compare_chunked(
                &[case.text.as_str()],
                case.reasoning.as_ref(),
                parser,
                &ctx,
                1,
            );
            if matches!(full.outcome, ParseOutcome::Calls(_)) {
                seen_calls += 1;
            }
            check_all_chunkings(&case, &mut rng, 5);
        }
        assert!(
            seen_calls > 0,
            "{parser}: the generator never produced a valid call"
        );
    }
}

#[test]
fn content_is_held_only_while_a_marker_may_start() {
    let p = tool_parser("hermes").expect("known").expect("a parser");
    let mut s = ChatStream::new(
        None,
        Some(p),
        ParseContext::default(),
        IdGen::seeded(0, IdStyle::OpenAi),
    );
    assert_eq!(s.push("Hello"), vec![DeltaEvent::Content("Hello".into())]);
    // Trailing whitespace and a possible tag start are held back.
    assert_eq!(s.push(" <tool"), vec![]);
    // Resolved as not a tag: released.
    assert_eq!(
        s.push("box> ok"),
        vec![DeltaEvent::Content(" <toolbox> ok".into())]
    );
    assert_eq!(s.push(" <tool_call>{\"name\""), vec![]);
    assert_eq!(
        s.push(": \"f\", \"arguments\": {\"x\": 1}}</tool_call>"),
        vec![]
    );
    let end = s.finish();
    assert!(matches!(&end[0], DeltaEvent::ToolCallStart { index: 0, name, .. } if name == "f"));
    assert_eq!(
        end[1],
        DeltaEvent::ToolCallArguments {
            index: 0,
            arguments: r#"{"x":1}"#.into()
        }
    );
    assert_eq!(end.len(), 2);
    let out = s.output();
    assert_eq!(out.content.as_deref(), Some("Hello <toolbox> ok"));
    assert_eq!(out.outcome, ParseOutcome::Calls(1));
    let delta = end[0].to_openai_delta();
    assert_eq!(delta["tool_calls"][0]["type"], "function");
    assert_eq!(delta["tool_calls"][0]["function"]["arguments"], "");
}

#[test]
fn malformed_stream_flushes_held_text_as_content() {
    let p = tool_parser("hermes").expect("known").expect("a parser");
    let mut s = ChatStream::new(
        None,
        Some(p),
        ParseContext::default(),
        IdGen::seeded(0, IdStyle::OpenAi),
    );
    let mut events = s.push("Try: <tool_call>{\"name\": \"f\", \"arguments\": {");
    events.extend(s.finish());
    assert_eq!(
        events,
        vec![
            DeltaEvent::Content("Try:".into()),
            DeltaEvent::Content(" <tool_call>{\"name\": \"f\", \"arguments\": {".into())
        ]
    );
    assert!(matches!(s.outcome(), ParseOutcome::Malformed(r) if r.contains("unterminated")));
}

#[test]
fn reasoning_deltas_stream_before_content() {
    let r = ReasoningParser::new(false);
    let mut s = ChatStream::new(
        Some(&r),
        None,
        ParseContext::default(),
        IdGen::seeded(0, IdStyle::OpenAi),
    );
    assert_eq!(s.push("<thi"), vec![]);
    assert_eq!(
        s.push("nk>\nStep one"),
        vec![DeltaEvent::Reasoning("Step one".into())]
    );
    assert_eq!(s.push(".\n</th"), vec![DeltaEvent::Reasoning(".".into())]);
    assert_eq!(
        s.push("ink>\n\nAnswer"),
        vec![DeltaEvent::Content("Answer".into())]
    );
    assert_eq!(s.finish(), vec![]);
    let out = s.output();
    assert_eq!(out.reasoning_content.as_deref(), Some("Step one."));
    assert_eq!(out.content.as_deref(), Some("Answer"));
    assert_eq!(
        r#"{"reasoning_content":"x"}"#,
        DeltaEvent::Reasoning("x".into())
            .to_openai_delta()
            .to_string()
    );
}
