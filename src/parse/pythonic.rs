//! `pythonic` tool calls (Llama 3.2, Llama 4, ToolACE): the whole reply is a
//! Python list of calls with keyword arguments whose values are literals,
//! `[get_weather(city="Paris", days=3), get_time(tz='UTC')]`, optionally
//! wrapped as Llama 4 does in `<|python_start|>…<|python_end|>`. Values
//! become JSON (see `pylit`); text before the list means no calls.
//!
//! A reply that starts with `[` but not with `[NAME(` (a plain list, a
//! markdown link) is an ordinary answer. The wrapper tokens are special: a
//! decode that skips them leaves the bare list, which parses the same. Must
//! not: evaluate Python, accept positional arguments, or look for calls
//! after prose.

use serde_json::{Map, Value as Json};

use super::json::short;
use super::pylit::Reader;
use super::scan::Scan;
use super::{Extract, RawCall, ToolParser};

const PY_START: &str = "<|python_start|>";
const PY_END: &str = "<|python_end|>";

#[derive(Debug, Clone, Copy)]
pub struct Pythonic;

/// `[NAME(` after optional whitespace: the list is meant as calls.
fn looks_like_calls(body: &str) -> bool {
    let mut r = Reader::new(body);
    if !r.eat('[') {
        return false;
    }
    r.skip_ws();
    if r.ident().is_none() {
        return false;
    }
    r.skip_ws();
    r.eat('(')
}

fn one_call(r: &mut Reader) -> Result<RawCall, String> {
    r.skip_ws();
    let name = r
        .ident()
        .ok_or_else(|| format!("expected a function name, found {:?}", short(r.rest())))?;
    r.skip_ws();
    if !r.eat('(') {
        return Err(format!("expected '(' after {name}"));
    }
    let mut args = Map::new();
    loop {
        r.skip_ws();
        if r.eat(')') {
            break;
        }
        let before = r.clone();
        let key = r.ident().filter(|_| {
            r.skip_ws();
            r.eat('=')
        });
        let Some(key) = key else {
            let what = short(before.rest());
            return Err(format!(
                "{name}: expected a keyword argument, found {what:?}"
            ));
        };
        let value = r.value().map_err(|e| format!("{name}({key}=...): {e}"))?;
        if args.insert(key.to_owned(), value).is_some() {
            return Err(format!("{name}: keyword argument {key:?} repeated"));
        }
        r.skip_ws();
        if !r.eat(',') && r.peek() != Some(')') {
            return Err(format!("{name}: expected ',' or ')'"));
        }
    }
    Ok(RawCall {
        name: name.to_owned(),
        arguments: Json::Object(args).to_string(),
    })
}

/// The calls of `body` (the list and what may follow it).
fn call_list(body: &str, wrapped: bool) -> Result<Vec<RawCall>, String> {
    let mut r = Reader::new(body);
    r.eat('[');
    let mut calls = Vec::new();
    loop {
        r.skip_ws();
        if r.eat(']') {
            break;
        }
        calls.push(one_call(&mut r).map_err(|e| format!("call {}: {e}", calls.len()))?);
        r.skip_ws();
        if !r.eat(',') && r.peek() != Some(']') {
            return Err(if r.at_end() {
                "unterminated call list".into()
            } else {
                format!("expected ',' or ']', found {:?}", short(r.rest()))
            });
        }
    }
    let mut rest = r.rest().trim_start();
    if wrapped {
        rest = rest.strip_prefix(PY_END).unwrap_or(rest);
    }
    if !rest.trim().is_empty() {
        return Err(format!(
            "unexpected text after the call list: {:?}",
            short(rest.trim_start())
        ));
    }
    Ok(calls)
}

impl ToolParser for Pythonic {
    fn name(&self) -> &'static str {
        "pythonic"
    }

    fn requires_special_tokens(&self) -> bool {
        false
    }

    fn scan(&self, text: &str, _from: usize) -> Scan {
        let lead = text.len() - text.trim_start().len();
        let rest = &text[lead..];
        if rest.is_empty() {
            // Only whitespace so far: a `[` may still come first.
            return if text.is_empty() {
                Scan::Clear
            } else {
                Scan::Partial(0)
            };
        }
        if rest.starts_with('[') || rest.starts_with(PY_START) {
            Scan::Start(lead)
        } else if PY_START.starts_with(rest) {
            Scan::Partial(lead)
        } else {
            Scan::Clear
        }
    }

    fn extract(&self, text: &str) -> Extract {
        let lead = text.len() - text.trim_start().len();
        let (body, wrapped) = match text[lead..].strip_prefix(PY_START) {
            Some(b) => (b.trim_start(), true),
            None => (&text[lead..], false),
        };
        if !looks_like_calls(body) {
            return if wrapped {
                Extract::Malformed(format!("{PY_START} is not followed by [NAME(...)]"))
            } else {
                Extract::NoCalls
            };
        }
        match call_list(body, wrapped) {
            Ok(calls) => Extract::Calls {
                outside: text[..lead].to_owned(),
                calls,
            },
            Err(e) => Extract::Malformed(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{IdGen, IdStyle, ParseContext, ParseOutcome, ParsedOutput};

    fn parse(text: &str) -> ParsedOutput {
        let ctx = ParseContext {
            tool_names: Some(vec!["get_weather".into(), "get_time".into()]),
            ..Default::default()
        };
        Pythonic.parse(text, &ctx, &mut IdGen::seeded(4, IdStyle::OpenAi))
    }

    fn args(text: &str) -> Vec<String> {
        let out = parse(text);
        assert!(
            matches!(out.outcome, ParseOutcome::Calls(_)),
            "{text}: {out:?}"
        );
        out.tool_calls.into_iter().map(|c| c.arguments).collect()
    }

    #[test]
    fn single_and_several_calls() {
        let out = parse("[get_weather(city=\"Paris\", days=3)]");
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.tool_calls[0].name, "get_weather");
        assert_eq!(out.tool_calls[0].arguments, r#"{"city":"Paris","days":3}"#);
        assert_eq!(out.content, None);

        let out = parse("\n [get_weather(city='Oslo'),\n  get_time(tz=\"UTC\", ),\n get_time()]\n");
        assert_eq!(out.outcome, ParseOutcome::Calls(3));
        assert_eq!(out.tool_calls[1].arguments, r#"{"tz":"UTC"}"#);
        assert_eq!(out.tool_calls[2].arguments, "{}");
        assert_eq!(out.content, None);
    }

    #[test]
    fn literal_values_become_json() {
        let got = args(
            r#"[get_weather(s='it\'s "q"', d="tab\there\u00e9\x41", i=-12, h=0x1F, f=2.5e-1, big=1_000, t=True, n=None, fl=False, l=[1, 'a', [None]], m={'k': {"n": 1}, 2: 'two'}, e={}, raw=r'\d+', cat='a' "b", tri='''x
y''')]"#,
        );
        assert_eq!(
            got[0],
            r#"{"s":"it's \"q\"","d":"tab\there\u00e9A","i":-12,"h":31,"f":0.25,"big":1000,"t":true,"n":null,"fl":false,"l":[1,"a",[null]],"m":{"k":{"n":1},"2":"two"},"e":{},"raw":"\\d+","cat":"ab","tri":"x\ny"}"#
                .replace("\\u00e9", "é")
        );
        let unicode = args("[get_time(tz=\"Europe/Zürich\", note='日本 ✓')]");
        assert_eq!(unicode[0], r#"{"tz":"Europe/Zürich","note":"日本 ✓"}"#);
        // JSON-looking strings stay strings and round-trip.
        let nested = args(r#"[get_time(q='{"a": [1, {"b": "</x>"}]}')]"#);
        assert_eq!(nested[0], r#"{"q":"{\"a\": [1, {\"b\": \"</x>\"}]}"}"#);
    }

    #[test]
    fn llama4_wrapper() {
        let out = parse("<|python_start|>[get_time(tz=\"UTC\")]<|python_end|>");
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
        assert_eq!(out.content, None);
        let out = parse("<|python_start|>[get_time(tz=\"UTC\")]");
        assert_eq!(out.outcome, ParseOutcome::Calls(1));
    }

    #[test]
    fn plain_answers_are_not_calls() {
        for text in [
            "The weather is nice.",
            "[1, 2, 3]",
            "[]",
            "[Docs](https://example.com) say so.",
            "Sure: [get_weather(city='Paris')]",
            "  ",
            "",
        ] {
            let out = parse(text);
            assert_eq!(out.outcome, ParseOutcome::NoCalls, "{text}");
            assert_eq!(out.content.as_deref(), (!text.is_empty()).then_some(text));
        }
    }

    #[test]
    fn malformed_keeps_whole_text() {
        for (text, why) in [
            ("[get_weather('Paris')]", "keyword argument"),
            ("[get_weather(city=Paris)]", "not a literal"),
            ("[get_weather(city='Paris') ", "unterminated"),
            ("[get_weather(city='Paris')] and more", "unexpected text"),
            ("[get_weather(city='Paris'", "expected ',' or ')'"),
            ("[get_weather(city='Par", "unterminated string"),
            ("[get_weather(a=1, a=2)]", "repeated"),
            ("[get_weather(a=1+2)]", "expected ',' or ')'"),
            ("[get_weather(a=(1, 2))]", "unexpected '('"),
            ("[get_weather(a=b'x')]", "not a literal"),
            ("[get_weather(a=1j)]", "bad number"),
            ("[get_weather(a=007)]", "leading zeros"),
            ("[get_weather(a={[1]: 2})]", "dict keys"),
            ("[get_weather(), 3]", "call 1"),
            ("[lookup(q='x')]", "unknown function"),
            ("<|python_start|>hello", "is not followed"),
            (
                "<|python_start|>[get_time()]<|python_end|> more",
                "unexpected text",
            ),
        ] {
            let out = parse(text);
            assert_eq!(out.content.as_deref(), Some(text));
            assert!(out.tool_calls.is_empty());
            match out.outcome {
                ParseOutcome::Malformed(r) => assert!(r.contains(why), "{text}: {r} lacks {why}"),
                o => panic!("{text}: {o:?}"),
            }
        }
    }

    #[test]
    fn scan_agrees_with_the_region() {
        assert_eq!(Pythonic.scan("  [get", 0), Scan::Start(2));
        assert_eq!(Pythonic.scan(" <|python", 0), Scan::Partial(1));
        assert_eq!(Pythonic.scan("<|python_start|>", 0), Scan::Start(0));
        assert_eq!(Pythonic.scan("Hello [x(", 0), Scan::Clear);
        assert_eq!(Pythonic.scan("\n", 0), Scan::Partial(0));
        assert_eq!(Pythonic.scan("<b>", 0), Scan::Clear);
    }
}
