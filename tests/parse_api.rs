//! The public surface of `tito::parse` the chat handler uses: parser
//! selection by config name, request tool names, the combined parse, and
//! the OpenAI JSON shapes.

use serde_json::json;
use tito::parse::{
    parse_output, reasoning_parser, tool_parser, IdGen, IdStyle, ParseContext, ParseError,
    ParseOutcome, ToolCall,
};

#[test]
fn parsers_by_config_name() {
    const ALL: [&str; 9] = [
        "hermes",
        "llama3_json",
        "mistral",
        "deepseek_v3",
        "deepseek_v31",
        "qwen3_coder",
        "glm45",
        "kimi_k2",
        "pythonic",
    ];
    for name in ALL {
        let p = tool_parser(name).expect("known name").expect("a parser");
        assert_eq!(p.name(), name);
    }
    assert!(tool_parser("none").expect("known name").is_none());
    assert!(matches!(tool_parser("qwen"), Err(ParseError::UnknownToolParser(n)) if n == "qwen"));
    let needs: Vec<bool> = ALL
        .iter()
        .map(|n| {
            tool_parser(n)
                .ok()
                .flatten()
                .map(|p| p.requires_special_tokens())
        })
        .map(|b| b.expect("a parser"))
        .collect();
    assert_eq!(
        needs,
        [false, true, true, false, false, false, false, true, false]
    );
    assert_eq!(
        tool_parser("mistral").ok().flatten().map(|p| p.id_style()),
        Some(IdStyle::Mistral9)
    );
    assert!(reasoning_parser("", false).expect("known").is_none());
    assert!(reasoning_parser("none", false).expect("known").is_none());
    assert!(reasoning_parser("think", true).expect("known").is_some());
    assert!(reasoning_parser("r1", false).is_err());
}

#[test]
fn request_tool_names() {
    let tools = json!([
        {"type": "function", "function": {"name": "calculator", "parameters": {}}},
        {"type": "function", "function": {"name": "lookup"}},
    ]);
    let ctx = ParseContext::from_tools(Some(&tools));
    assert_eq!(
        ctx.tool_names,
        Some(vec!["calculator".to_string(), "lookup".to_string()])
    );
    assert_eq!(ParseContext::from_tools(None).tool_names, None);
    // Parameter schemas by name, for the formats that type their values.
    assert_eq!(ctx.tool_parameters.len(), 1);
    assert_eq!(ctx.parameter_schema("calculator", "x"), None);
    let typed = ParseContext::from_tools(Some(&json!([{"type": "function", "function": {
        "name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}])));
    assert_eq!(
        typed.parameter_schema("f", "n"),
        Some(&json!({"type": "integer"}))
    );

    let p = tool_parser("hermes").expect("known").expect("a parser");
    let text = "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
    let strict = p.parse(text, &ctx, &mut IdGen::seeded(1, IdStyle::OpenAi));
    assert!(matches!(&strict.outcome, ParseOutcome::Malformed(r) if r.contains("search")));
    assert_eq!(strict.content.as_deref(), Some(text));
    let open = p.parse(
        text,
        &ParseContext::default(),
        &mut IdGen::seeded(1, IdStyle::OpenAi),
    );
    assert_eq!(open.outcome, ParseOutcome::Calls(1));
}

#[test]
fn combined_parse_and_openai_shapes() {
    let r = reasoning_parser("think", false).expect("known");
    let p = tool_parser("hermes").expect("known");
    let text = "<think>\nneed math\n</think>\n\nComputing.\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"e\": \"2+2\"}}\n</tool_call>";
    let out = parse_output(
        text,
        r.as_ref(),
        p.as_deref(),
        &ParseContext::default(),
        &mut IdGen::seeded(4, IdStyle::OpenAi),
    );
    assert_eq!(out.reasoning_content.as_deref(), Some("need math"));
    assert_eq!(out.content.as_deref(), Some("Computing."));
    assert_eq!(out.outcome, ParseOutcome::Calls(1));
    let calls = out.tool_calls_json().expect("has calls");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "calculator");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"e":"2+2"}"#);
    assert!(calls[0]["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("call_")));

    let plain = parse_output(
        "  hi  ",
        None,
        None,
        &ParseContext::default(),
        &mut IdGen::seeded(0, IdStyle::OpenAi),
    );
    assert_eq!(plain.content.as_deref(), Some("  hi  "));
    assert_eq!(plain.tool_calls_json(), None);
    assert_eq!(plain.outcome, ParseOutcome::NoCalls);

    let call = ToolCall {
        id: "call_x".into(),
        name: "f".into(),
        arguments: "{}".into(),
    };
    assert_eq!(
        call.to_openai_json(),
        json!({"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{}"}})
    );
}

#[test]
fn outcome_labels_and_serialization() {
    assert_eq!(ParseOutcome::NoCalls.label(), "no_calls");
    assert_eq!(ParseOutcome::Calls(2).label(), "calls");
    assert_eq!(
        ParseOutcome::Malformed("x".into()).to_string(),
        "malformed: x"
    );
    assert_eq!(
        serde_json::to_value(ParseOutcome::NoCalls).ok(),
        Some(json!("no_calls"))
    );
    assert_eq!(
        serde_json::to_value(ParseOutcome::Calls(2)).ok(),
        Some(json!({"calls": 2}))
    );
    assert_eq!(
        serde_json::to_value(ParseOutcome::Malformed("bad".into())).ok(),
        Some(json!({"malformed": "bad"}))
    );
}
