//! Golden test: tito's chat-template rendering + tokenization must give
//! exactly the token ids Python transformers gives, for real tokenizers.
//!
//! Fixtures: tests/fixtures/goldens/<name>.json (chat cases) and
//! tests/fixtures/goldens/encode/<name>.json (plain-text encodings), written by
//! scripts/gen_goldens.py from the tokenizers that scripts/fetch-tokenizers.sh
//! puts in .cache/tokenizers/<name>/.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value as Json;
use tito::config::ModelConfig;
use tito::render::{RenderInput, Renderer};

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<Json>,
    tools: Option<Vec<Json>>,
    add_generation_prompt: bool,
    chat_template_kwargs: Option<serde_json::Map<String, Json>>,
    reference: String,
    /// transformers fails on this case (`text` holds its error): tito must fail.
    expect_error: bool,
    text: String,
    ids: Vec<u32>,
}

/// A plain text as transformers encodes it, with and without the
/// tokenizer's own special tokens.
#[derive(Deserialize)]
struct EncodeCase {
    text: String,
    ids: Vec<u32>,
    ids_no_special: Vec<u32>,
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load_renderer(name: &str) -> std::sync::Arc<Renderer> {
    let dir = root().join(".cache/tokenizers").join(name);
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

fn load_fixture<T: serde::de::DeserializeOwned>(relative: &str) -> T {
    let path = root().join("tests/fixtures/goldens").join(relative);
    let text = std::fs::read_to_string(&path).expect("golden fixture is committed");
    serde_json::from_str(&text).expect("golden fixture parses")
}

fn check_encode(renderer: &Renderer, case: &EncodeCase) -> Option<String> {
    let with = renderer.encode_with_special_tokens(&case.text);
    let without = renderer.encode(&case.text);
    match (with, without) {
        (Ok(w), Ok(wo)) if w == case.ids && wo == case.ids_no_special => None,
        (w, wo) => Some(format!(
            "encode {:?}: tito {w:?} / {wo:?}, golden {:?} / {:?}",
            case.text, case.ids, case.ids_no_special
        )),
    }
}

/// Up to 60 chars either side of byte offset `at`, on char boundaries.
fn around(s: &str, at: usize) -> String {
    let mut lo = at.saturating_sub(60).min(s.len());
    while !s.is_char_boundary(lo) {
        lo -= 1;
    }
    let mut hi = (at + 60).min(s.len());
    while !s.is_char_boundary(hi) {
        hi += 1;
    }
    format!("{:?}", &s[lo..hi])
}

fn first_diff<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()))
}

/// Renders one case; `None` when it matches, else a description of the drift.
fn check(renderer: &Renderer, case: &Case) -> Option<String> {
    let input = RenderInput {
        messages: &case.messages,
        tools: case.tools.as_deref(),
        add_generation_prompt: case.add_generation_prompt,
        kwargs: case.chat_template_kwargs.as_ref(),
    };
    if case.expect_error {
        // A template's own raise_exception message must come through verbatim.
        let raised = case.text.strip_prefix("error: TemplateError: ");
        return match renderer.render(&input) {
            Err(tito::render::RenderError::Template(m)) if raised.is_none_or(|r| m.contains(r)) => {
                None
            }
            other => Some(format!(
                "transformers fails ({}), tito gave {other:?}",
                case.text
            )),
        };
    }
    let text = match renderer.render(&input) {
        Ok(t) => t,
        Err(e) => return Some(format!("render failed: {e}")),
    };
    let ids = match renderer.encode(&text) {
        Ok(ids) => ids,
        Err(e) => return Some(format!("encode failed: {e}")),
    };
    // The public one-step path must agree with render + encode.
    match renderer.render_ids(&input) {
        Ok(one_step) if one_step == ids => {}
        Ok(_) => return Some("render_ids differs from encode(render)".into()),
        Err(e) => return Some(format!("render_ids failed: {e}")),
    }
    if ids == case.ids {
        return None;
    }
    let mut msg = String::new();
    if text != case.text {
        let at = first_diff(text.as_bytes(), case.text.as_bytes());
        msg.push_str(&format!(
            "text differs at byte {at}:\n    tito:   {}\n    golden: {}\n",
            around(&text, at),
            around(&case.text, at)
        ));
    }
    let at = first_diff(&ids, &case.ids);
    let window = |v: &[u32]| v[at.saturating_sub(3)..(at + 5).min(v.len())].to_vec();
    msg.push_str(&format!(
        "ids differ at position {at} (len tito {} vs golden {}): tito {:?} golden {:?}",
        ids.len(),
        case.ids.len(),
        window(&ids),
        window(&case.ids)
    ));
    Some(msg)
}

fn run_goldens(name: &str) {
    let renderer = load_renderer(name);
    let cases: Vec<Case> = load_fixture(&format!("{name}.json"));
    let encodes: Vec<EncodeCase> = load_fixture(&format!("encode/{name}.json"));
    assert!(
        !cases.is_empty() && !encodes.is_empty(),
        "no golden cases for {name}"
    );
    let mut failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            check(&renderer, c).map(|m| format!("[{name}/{} ({})] {m}", c.name, c.reference))
        })
        .collect();
    failures.extend(
        encodes
            .iter()
            .filter_map(|c| check_encode(&renderer, c).map(|m| format!("[{name}/encode] {m}"))),
    );
    assert!(
        failures.is_empty(),
        "{} of {} golden cases drift:\n{}",
        failures.len(),
        cases.len() + encodes.len(),
        failures.join("\n")
    );
}

#[test]
fn qwen3_matches_transformers() {
    run_goldens("qwen3");
}

#[test]
fn llama3_1_matches_transformers() {
    run_goldens("llama3_1");
}

#[test]
fn deepseek_v3_matches_transformers() {
    run_goldens("deepseek_v3");
}

#[test]
fn gemma3_matches_transformers() {
    run_goldens("gemma3");
}

#[test]
fn every_fixture_file_has_a_test() {
    let dir = root().join("tests/fixtures/goldens");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("golden fixture dir exists")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .filter_map(|p| {
            Path::new(&p)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    // jinja_snippets.json needs no tokenizer: the render unit tests check it.
    // gpt_oss.json and gpt_oss_parse.json are Harmony goldens from PyPI
    // openai-harmony (scripts/gen_goldens_harmony.py), not transformers: they
    // tests/render_harmony.rs checks them. vision.json holds Qwen-VL image
    // placeholder counts from transformers' image processor
    // (scripts/gen_goldens_vision.py): tests/render_vision.rs checks it.
    assert_eq!(
        names,
        [
            "deepseek_v3",
            "gemma3",
            "gpt_oss",
            "gpt_oss_parse",
            "jinja_snippets",
            "llama3_1",
            "qwen3",
            "vision"
        ]
    );
}
