//! The reasoning parser families (`think`, `deepseek_r1`, `glm45`,
//! `kimi_k2`): for every text and every chunking the assembled stream
//! equals the full parse, and each family splits as its model writes.

mod chunking;

use chunking::{boundaries, split_at_points, Rng};
use tito::parse::stream::compare_chunked;
use tito::parse::{
    reasoning_parser, ChatStream, DeltaEvent, IdGen, IdStyle, ParseContext, ParseError,
    ReasoningMode, ReasoningParser,
};

const FAMILIES: [&str; 4] = ["think", "deepseek_r1", "glm45", "kimi_k2"];

fn parser(name: &str, started: bool) -> ReasoningParser {
    reasoning_parser(name, started)
        .expect("known name")
        .expect("a parser")
}

/// Every 2-way split, char by char, and random chunkings: the stream
/// equals the full parse, which does not depend on the chunking.
fn check(name: &str, started: bool, tools: &str, text: &str, rng: &mut Rng, random: usize) {
    let r = parser(name, started);
    let ctx = ParseContext::default();
    let b = boundaries(text);
    let mut chunkings: Vec<Vec<usize>> = b.iter().map(|&p| vec![p]).collect();
    if b.len() > 2 {
        chunkings.push(b[1..b.len() - 1].to_vec());
    }
    for _ in 0..random {
        let mut pts: Vec<usize> = (0..rng.below(8)).map(|_| b[rng.below(b.len())]).collect();
        pts.sort_unstable();
        chunkings.push(pts);
    }
    let mut reference = None;
    for pts in chunkings {
        let chunks = split_at_points(text, &pts);
        let label = format!("{name} started={started} {tools} chunks {chunks:?}");
        let (full, streamed, events) = compare_chunked(&chunks, Some(&r), tools, &ctx, 7);
        assert_eq!(streamed, full, "{label}");
        for ev in &events {
            if let DeltaEvent::Content(s) | DeltaEvent::Reasoning(s) = ev {
                assert!(!s.is_empty(), "{label}: empty delta");
            }
        }
        match &reference {
            None => reference = Some(full),
            Some(prev) => assert_eq!(&full, prev, "{label}: chunking changed the parse"),
        }
    }
}

const SECTION: &str = "<|tool_calls_section_begin|>";

fn texts() -> Vec<String> {
    let mut v: Vec<String> = [
        "<think>\nLet me think.\n</think>\n\nThe answer.",
        "Reasoning without an opening tag.\n</think>\n\nAnswer é ü",
        "\n<think>GLM plans.</think>\nGLM answers.",
        "No reasoning at all, é.",
        "<think>\nunterminated reasoning ",
        "unterminated, no tags ",
        "a <think> b</think> c </think> d",
        "x <think>y</think> z",
        "<think>\n\n</think>\n\n",
        "  <thi",
        "<think>x</thi",
        "</think>",
        "   ",
        "",
        "<think>Need f. <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        "Need f.\n<|tool_call_section_begin|>x",
        "r <|tool_calls_section_begin|> </think> c",
        "r</think>c<|tool_calls_section_begin|>",
        "<|tool_calls_section_begin|>",
        "almost <|tool_calls_sect but not",
        "<think>ends in a partial <|tool_calls_sec",
        "<think>ends in a partial </thi",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push(format!("{SECTION}{SECTION}"));
    v
}

#[test]
fn every_family_every_chunking() {
    let mut rng = Rng(11);
    for name in FAMILIES {
        for started in [false, true] {
            for text in texts() {
                check(name, started, "none", &text, &mut rng, 20);
            }
        }
    }
}

#[test]
fn families_then_hermes_tools_every_chunking() {
    let mut rng = Rng(12);
    let call = "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"e\": \"1+1\"}}\n</tool_call>";
    let prefixes = [
        "<think>\nI should call calc.\n</think>\n\n",
        "Reasoning from an opened prompt.\n</think>\n\n",
        "",
    ];
    for name in FAMILIES {
        for started in [false, true] {
            for prefix in prefixes {
                let text = format!("{prefix}Calling.\n{call}");
                check(name, started, "hermes", &text, &mut rng, 10);
            }
        }
    }
}

/// Random texts glued from the tags and markers of every family.
#[test]
fn random_fragment_texts() {
    let pieces = [
        "<think>",
        "</think>",
        "<thi",
        "</th",
        SECTION,
        "<|tool_call_section_begin|>",
        "<|tool_calls",
        "<|",
        " ",
        "\n",
        "text",
        "é",
        "<",
        "|",
    ];
    let mut rng = Rng(13);
    for _ in 0..300 {
        let n = 1 + rng.below(8);
        let text: String = (0..n).map(|_| pieces[rng.below(pieces.len())]).collect();
        let name = FAMILIES[rng.below(FAMILIES.len())];
        let started = rng.below(2) == 0;
        check(name, started, "none", &text, &mut rng, 5);
    }
}

fn full(name: &str, started: bool, text: &str) -> (Option<String>, Option<String>) {
    let (out, _, _) = compare_chunked(
        &[text],
        Some(&parser(name, started)),
        "none",
        &ParseContext::default(),
        0,
    );
    (out.reasoning_content, out.content)
}

#[test]
fn each_family_splits_as_its_model_writes() {
    let s = |x: &str| Some(x.to_owned());
    // DeepSeek-R1: the template opened <think>; the prompt flag is moot.
    for started in [false, true] {
        assert_eq!(
            full("deepseek_r1", started, "Hmm.\n</think>\n\nHi"),
            (s("Hmm."), s("Hi"))
        );
        assert_eq!(
            full("deepseek_r1", started, "Hmm, cut"),
            (s("Hmm, cut"), None)
        );
    }
    // GLM-4.5: without <think> the output is content.
    assert_eq!(
        full("glm45", false, "\n<think>Plan.</think>\nAnswer"),
        (s("Plan."), s("Answer"))
    );
    assert_eq!(
        full("glm45", false, "Hmm.</think>Hi"),
        (None, s("Hmm.</think>Hi"))
    );
    // think: the same without the prompt flag.
    assert_eq!(
        full("think", false, "Hmm.</think>Hi"),
        (None, s("Hmm.</think>Hi"))
    );
    // Kimi K2: a tool section ends reasoning and stays content.
    let sec = format!("{SECTION}<|tool_call_begin|>functions.f:0");
    assert_eq!(
        full("kimi_k2", false, &format!("<think>Need f.\n{sec}")),
        (s("Need f."), Some(sec.clone()))
    );
    assert_eq!(
        full("think", true, &format!("Need f.\n{sec}")),
        (Some(format!("Need f.\n{sec}")), None)
    );
}

#[test]
fn kimi_reasoning_streams_before_the_section() {
    let r = parser("kimi_k2", false);
    assert_eq!(r.mode(), ReasoningMode::KimiK2);
    let mut s = ChatStream::new(
        Some(&r),
        None,
        ParseContext::default(),
        IdGen::seeded(0, IdStyle::OpenAi),
    );
    assert_eq!(
        s.push("Need f. "),
        vec![DeltaEvent::Reasoning("Need f.".into())]
    );
    // A possible marker start is held back...
    assert_eq!(s.push("<|tool_"), vec![]);
    // ...and released as content once it is one.
    assert_eq!(
        s.push("calls_section_begin|>"),
        vec![DeltaEvent::Content(SECTION.into())]
    );
    assert_eq!(
        s.push("</think>"),
        vec![DeltaEvent::Content("</think>".into())]
    );
    assert_eq!(s.finish(), vec![]);
}

#[test]
fn names_and_errors() {
    for name in FAMILIES {
        assert!(reasoning_parser(name, false).expect("known").is_some());
    }
    // Every name the config accepts builds.
    for name in [
        "",
        "none",
        "think",
        "deepseek_r1",
        "glm45",
        "kimi_k2",
        "gpt_oss",
    ] {
        let text = format!("[model]\ntokenizer = \"x\"\nreasoning_parser = \"{name}\"\n");
        tito::Config::from_toml(&text).expect(name);
        reasoning_parser(name, false).expect(name);
    }
    // gpt-oss: Harmony is parsed from token ids, not by a text parser.
    assert!(reasoning_parser("gpt_oss", false).expect("known").is_none());
    let err = reasoning_parser("qwen3", false).expect_err("unknown");
    assert!(matches!(&err, ParseError::UnknownReasoningParser(n) if n == "qwen3"));
    let msg = err.to_string();
    for name in FAMILIES.iter().chain(&["gpt_oss", "none"]) {
        assert!(msg.contains(name), "{name} not in {msg}");
    }
}
