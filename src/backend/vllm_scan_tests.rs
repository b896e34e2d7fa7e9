//! The one-pass chunk reader against serde: wherever it reads a chunk, serde
//! reads the same one; and it does read the chunks vLLM writes.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::Chunk;
use super::chunk;

fn by_serde(text: &str) -> Result<Chunk, serde_json::Error> {
    serde_json::from_str(text)
}

/// `Debug` shows -0.0 and every f32 exactly, so equal text is equal data.
fn same(text: &str) -> Option<bool> {
    let fast = chunk(text)?;
    let reference =
        by_serde(text).unwrap_or_else(|e| panic!("the scan read what serde refuses ({e}): {text}"));
    Some(format!("{fast:?}") == format!("{reference:?}"))
}

fn assert_read_alike(text: &str) {
    assert_eq!(same(text), Some(true), "{text}");
}

#[test]
fn reads_the_chunks_vllm_writes() {
    let cases = [
        // A token with its logprob and the sampled token among the top.
        r#"{"id":"cmpl-7","object":"text_completion","created":1764400000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,"text":"token_id:15234","token_ids":[15234],"finish_reason":null,"logprobs":{"tokens":["token_id:15234"],"token_logprobs":[-0.7123456716537476],"top_logprobs":[{"token_id:15234":-0.7123456716537476}],"text_offset":[0]}}],"usage":null}"#,
        // Text with escapes, top 3, a stop reason, the last chunk's usage.
        r#"{"id":"cmpl-7","object":"text_completion","created":1764400000,"model":"m","choices":[{"index":0,"text":"\"x\"\n\t\\","token_ids":[1,2],"finish_reason":"stop","stop_reason":null,"logprobs":{"tokens":["token_id:1","token_id:2"],"token_logprobs":[-1.5e-05,-2.25],"top_logprobs":[{"token_id:1":-1.5e-05,"token_id:9":-11.0},{"token_id:2":-2.25,"token_id:3":-0.125,"token_id:4":-3.0}],"text_offset":[0,3]}}],"usage":{"prompt_tokens":12,"completion_tokens":2,"total_tokens":14}}"#,
        // No logprobs asked, two choices, whitespace between tokens.
        "{ \"choices\" : [ {\"index\":0,\"text\":\"a\",\"token_ids\":[7],\"logprobs\":null,\"finish_reason\":null} ,\n{\"index\":1,\"text\":\"b\",\"token_ids\":[],\"logprobs\":null,\"finish_reason\":\"length\"} ] }\n",
        // Null numbers and positions, the empty chunk's shapes.
        r#"{"choices":[{"token_ids":[5,6],"logprobs":{"token_logprobs":[null,-0.5],"top_logprobs":[null,{"token_id:6":-0.5,"bos":-1.0,"token_id:8":null}]}}]}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":null}"#,
        r#"{}"#,
    ];
    for text in cases {
        assert_read_alike(text);
    }
}

#[test]
fn leaves_to_serde_what_it_does_not_read_exactly() {
    for text in [
        // Error chunks, both shapes.
        r#"{"error":{"message":"boom","code":500}}"#,
        r#"{"object":"error","message":"boom","code":400}"#,
        // A `\u` escape, a key written with an escape, an integer logprob.
        r#"{"choices":[{"text":"\u00e9","token_ids":[1]}]}"#,
        r#"{"choices":[{"token\u005fids":[1]}]}"#,
        r#"{"choices":[{"token_ids":[1],"logprobs":{"token_logprobs":[-1]}}]}"#,
        // A duplicate field, trailing text, a choice as a list, depth.
        r#"{"choices":[{"token_ids":[1],"token_ids":[2]}]}"#,
        r#"{"choices":[]} x"#,
        r#"{"choices":[[[1],null,null]]}"#,
        &format!(
            r#"{{"choices":[],"deep":{}1{}}}"#,
            "[".repeat(40),
            "]".repeat(40)
        ),
    ] {
        assert!(chunk(text).is_none(), "{text}");
    }
}

/// Random JSON values, some of which serde rejects.
fn value(rng: &mut StdRng, depth: u32, out: &mut String) {
    match rng.random_range(0..if depth > 3 { 5 } else { 7 }) {
        0 => out.push_str(["null", "true", "false", "nul", "True"][rng.random_range(0..5)]),
        1 => number(rng, out),
        2 | 3 => string(rng, out),
        4 => out.push_str(&rng.random_range(0..5_000_000_000u64).to_string()),
        5 => {
            out.push('[');
            for i in 0..rng.random_range(0..4) {
                if i > 0 {
                    out.push(',');
                }
                value(rng, depth + 1, out);
            }
            out.push(']');
        }
        _ => {
            out.push('{');
            for i in 0..rng.random_range(0..4) {
                if i > 0 {
                    out.push(',');
                }
                string(rng, out);
                out.push(':');
                value(rng, depth + 1, out);
            }
            out.push('}');
        }
    }
}

fn number(rng: &mut StdRng, out: &mut String) {
    const FORMS: [&str; 16] = [
        "-0.5",
        "-1e-7",
        "-1.5E+2",
        "0",
        "-0",
        "-0.0",
        "1e400",
        "-12",
        "01",
        "-.5",
        "1.",
        "-2.5e",
        "3",
        "-0.000001",
        "-9999.0",
        "-1.0000000000000002",
    ];
    if rng.random_bool(0.5) {
        out.push_str(FORMS[rng.random_range(0..FORMS.len())]);
    } else {
        let f: f64 = -rng.random::<f64>() * 20.0;
        out.push_str(&f.to_string());
        if rng.random_bool(0.3) {
            out.push_str(&format!("e{}", rng.random_range(-5..5)));
        }
    }
}

fn string(rng: &mut StdRng, out: &mut String) {
    const PIECES: [&str; 12] = [
        "a",
        "token_id:42",
        "é",
        "\\n",
        "\\\"",
        "\\u00e9",
        "\\x",
        "\t",
        " ",
        "\\/",
        "stop",
        "token_id:",
    ];
    out.push('"');
    for _ in 0..rng.random_range(0..4) {
        out.push_str(PIECES[rng.random_range(0..PIECES.len())]);
    }
    out.push('"');
}

fn ws(rng: &mut StdRng, out: &mut String) {
    if rng.random_bool(0.2) {
        out.push_str([" ", "\n", "\t ", "\r\n"][rng.random_range(0..4)]);
    }
}

/// One member `"key": value` of a chunk-like object, the key drawn from
/// `keys` (the fields the readers know, and others).
fn member(
    rng: &mut StdRng,
    keys: &[&str],
    out: &mut String,
    known: impl Fn(&mut StdRng, &str, &mut String),
) {
    let key = keys[rng.random_range(0..keys.len())];
    ws(rng, out);
    out.push('"');
    out.push_str(key);
    out.push('"');
    ws(rng, out);
    out.push(':');
    ws(rng, out);
    if rng.random_bool(0.1) {
        out.push_str("null");
    } else if rng.random_bool(0.9) {
        known(rng, key, out);
    } else {
        value(rng, 0, out);
    }
    ws(rng, out);
}

fn object(
    rng: &mut StdRng,
    keys: &[&str],
    n: usize,
    out: &mut String,
    known: impl Fn(&mut StdRng, &str, &mut String) + Copy,
) {
    out.push('{');
    for i in 0..n {
        if i > 0 {
            out.push(',');
        }
        member(rng, keys, out, known);
    }
    out.push('}');
}

fn list(rng: &mut StdRng, out: &mut String, item: impl Fn(&mut StdRng, &mut String)) {
    out.push('[');
    for i in 0..rng.random_range(0..4) {
        if i > 0 {
            out.push(',');
        }
        ws(rng, out);
        item(rng, out);
    }
    out.push(']');
}

fn known(rng: &mut StdRng, key: &str, out: &mut String) {
    match key {
        "choices" => list(rng, out, |rng, out| {
            let n = rng.random_range(0..6);
            object(
                rng,
                &[
                    "token_ids",
                    "logprobs",
                    "finish_reason",
                    "index",
                    "text",
                    "stop_reason",
                ],
                n,
                out,
                known,
            );
        }),
        "token_ids" => list(rng, out, |rng, out| {
            if rng.random_bool(0.9) {
                out.push_str(&rng.random_range(0..200_000u32).to_string());
            } else {
                value(rng, 2, out);
            }
        }),
        "logprobs" => {
            let n = rng.random_range(0..5);
            object(
                rng,
                &["token_logprobs", "top_logprobs", "tokens", "text_offset"],
                n,
                out,
                known,
            );
        }
        "token_logprobs" => list(rng, out, |rng, out| {
            if rng.random_bool(0.15) {
                out.push_str("null");
            } else {
                number(rng, out);
            }
        }),
        "top_logprobs" => list(rng, out, |rng, out| {
            if rng.random_bool(0.1) {
                out.push_str("null");
                return;
            }
            out.push('{');
            for i in 0..rng.random_range(0..4) {
                if i > 0 {
                    out.push(',');
                }
                if rng.random_bool(0.8) {
                    out.push_str(&format!("\"token_id:{}\"", rng.random_range(0..100u32)));
                } else {
                    string(rng, out);
                }
                out.push(':');
                if rng.random_bool(0.8) {
                    number(rng, out);
                } else {
                    value(rng, 3, out);
                }
            }
            out.push('}');
        }),
        "finish_reason" | "object" => {
            let words = [
                "\"stop\"",
                "\"length\"",
                "\"abort\"",
                "\"text_completion\"",
                "\"error\"",
                "\"st\\nop\"",
            ];
            out.push_str(words[rng.random_range(0..words.len())]);
        }
        _ => value(rng, 1, out),
    }
}

fn random_chunk(rng: &mut StdRng) -> String {
    let mut out = String::new();
    ws(rng, &mut out);
    let n = rng.random_range(0..6);
    object(
        rng,
        &[
            "choices", "choices", "object", "id", "model", "usage", "created", "error", "message",
        ],
        n,
        &mut out,
        known,
    );
    ws(rng, &mut out);
    out
}

/// Generated chunks: where the scan reads one, serde reads the same; and
/// the scan reads a good share of them (it is not refusing its way to
/// agreement).
#[test]
fn agrees_with_serde_on_generated_chunks() {
    let mut rng = StdRng::seed_from_u64(0x5ca9);
    let (mut read, mut total) = (0, 0);
    for _ in 0..40_000 {
        let text = random_chunk(&mut rng);
        total += 1;
        if let Some(alike) = same(&text) {
            assert!(alike, "{text}");
            read += 1;
        }
    }
    assert!(read * 5 > total, "the scan read {read} of {total}");
}

/// Valid chunks with a few bytes changed, dropped or added: wherever the
/// scan still reads one, serde reads the same.
#[test]
fn agrees_with_serde_on_mutated_chunks() {
    const BYTES: &[u8] = b"{}[],:\"\\ 0123456789.-eEnultrfa_x";
    let mut rng = StdRng::seed_from_u64(0x3e7);
    let mut read = 0;
    for _ in 0..40_000 {
        let mut bytes = random_chunk(&mut rng).into_bytes();
        for _ in 0..rng.random_range(1..4) {
            let at = rng.random_range(0..=bytes.len());
            let b = BYTES[rng.random_range(0..BYTES.len())];
            match rng.random_range(0..3) {
                0 if at < bytes.len() && bytes[at].is_ascii() => bytes[at] = b,
                1 if at < bytes.len() && bytes[at].is_ascii() => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, b),
            }
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        if let Some(alike) = same(&text) {
            assert!(alike, "{text}");
            read += 1;
        }
    }
    assert!(read > 1_000, "the scan read {read} mutated chunks");
}

#[test]
#[ignore]
fn timing_scratch() {
    let text = r#"{"id":"cmpl-0","object":"text_completion","created":1764400000,"model":"m","choices":[{"index":0,"text":"token_id:15234","token_ids":[15234],"finish_reason":null,"logprobs":{"tokens":["token_id:15234"],"token_logprobs":[-0.7123456716537476],"top_logprobs":[{"token_id:15234":-0.7123456716537476}],"text_offset":[0]}}]}"#;
    assert!(chunk(text).is_some());
    if std::env::var("SCAN_ONLY").is_ok() {
        for _ in 0..5_000_000 {
            std::hint::black_box(chunk(std::hint::black_box(text)));
        }
        return;
    }
    for _ in 0..3 {
        let t = std::time::Instant::now();
        for _ in 0..1_000_000 {
            std::hint::black_box(chunk(std::hint::black_box(text)));
        }
        let a = t.elapsed();
        let t = std::time::Instant::now();
        for _ in 0..1_000_000 {
            std::hint::black_box(by_serde(std::hint::black_box(text)).ok());
        }
        let b = t.elapsed();
        let t = std::time::Instant::now();
        for _ in 0..1_000_000 {
            std::hint::black_box(
                serde_json::from_str::<f64>(std::hint::black_box("-0.7123456716537476")).ok(),
            );
        }
        let c = t.elapsed();
        eprintln!("scan {:?} serde {:?} f64 {:?} per 1e6", a, b, c);
    }
}
