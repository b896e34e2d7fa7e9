//! The fast byte-level BPE encoder against the `tokenizers` crate, on the
//! fetched Qwen3, Llama 3.1 and DeepSeek V3 tokenizers: fixed edge cases and
//! seeded random text built from pieces that stress each step (added tokens,
//! NFC, contractions under case folding, whitespace lookahead, digits, CJK,
//! long words that take the heap merge, all-ASCII text that takes the
//! hand-written pre-tokenizer). The golden tests
//! (`render_goldens.rs`) separately check the same encoder against Python
//! transformers' ids.

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tito::config::ModelConfig;
use tito::render::Renderer;

fn load(name: &str) -> std::sync::Arc<Renderer> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/tokenizers")
        .join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "tokenizer {name} missing: run scripts/fetch-tokenizers.sh"
    );
    let model = ModelConfig {
        tokenizer: dir,
        ..ModelConfig::default()
    };
    Renderer::load(&model).expect("renderer loads")
}

const PIECES: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<｜begin▁of▁sentence｜>",
    "<｜Assistant｜>",
    "<|im_start",
    "im_end|>",
    "<",
    "|",
    ">",
    "'s",
    "'S",
    "'t",
    "'re",
    "'VE",
    "'Ll",
    "'d",
    "'ſ",
    "'K",
    "’s",
    "''",
    " ",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\r\n",
    "\t",
    " \n",
    "\u{a0}",
    "\u{3000}",
    "\u{2028}",
    "hello",
    "Hello",
    "WORLD",
    "naïve",
    "café",
    "e\u{301}",
    "a\u{30a}",
    "Å",
    "\u{212b}",
    "ﬁ",
    "Ⅻ",
    "²",
    "½",
    "١٢٣",
    "0",
    "7",
    "42",
    "123",
    "2026",
    "3.14",
    "1,000",
    "日本",
    "語",
    "のテ",
    "キスト",
    "中文",
    "한국어",
    "Ελλάδα",
    "русский",
    "עברית",
    "ไทย",
    "🤖",
    "🚀",
    "👨‍👩‍👧",
    "\u{fe0f}",
    "!",
    "?",
    "...",
    "--",
    "==>",
    "{",
    "}",
    "\"",
    "\\",
    "fn main() {",
    "    ",
    "\t\t",
    "_",
    "__init__",
    "x:=1",
    "#",
    "@",
    "$",
    "%",
    "^",
    "&&",
];

fn random_text(rng: &mut StdRng, ascii_only: bool) -> String {
    let pieces: Vec<&str> = PIECES
        .iter()
        .copied()
        .filter(|p| !ascii_only || p.is_ascii())
        .collect();
    let n = rng.random_range(1..24);
    (0..n)
        .map(|_| pieces[rng.random_range(0..pieces.len())])
        .collect()
}

fn check(name: &str, r: &Renderer, text: &str) {
    let fast = r.encode(text).expect("fast encode");
    let reference = r.encode_reference(text).expect("reference encode");
    assert_eq!(
        fast, reference,
        "{name}: fast and reference differ on {text:?}"
    );
}

const EDGES: &[&str] = &[
    "",
    " ",
    "\n",
    "<|im_end|>",
    "<|im_end|><|im_end|>",
    "a<|im_end|>b",
    "   \n   x",
    "x   ",
    "it's IT'S It'S it'ſ",
    "a b  c   d    e\t\tf\n\ng",
];

#[test]
fn fast_encoder_matches_the_crate_on_every_byte_level_fixture() {
    let mut rng = StdRng::seed_from_u64(0x7175);
    for name in ["qwen3", "llama3_1", "deepseek_v3"] {
        let r = load(name);
        assert!(r.has_fast_encoder(), "{name} should get the fast encoder");
        for text in EDGES {
            check(name, &r, text);
        }
        for len in [47, 48, 49, 200, 5000] {
            check(name, &r, &"a".repeat(len));
            check(name, &r, &"xyz".repeat(len));
            check(name, &r, &" ".repeat(len));
            let word: String = (0..len)
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect();
            check(name, &r, &word);
        }
        for i in 0..4000 {
            // A quarter all-ASCII: that text takes the hand-written
            // pre-tokenizer (Qwen3, Llama 3.1), the rest the regex.
            let text = random_text(&mut rng, i % 4 == 0);
            check(name, &r, &text);
        }
    }
}

#[test]
fn tokenizers_it_does_not_understand_keep_the_crate() {
    // Gemma 3: SentencePiece-style BPE with byte fallback.
    let r = load("gemma3");
    assert!(!r.has_fast_encoder());
    let text = "Hello <start_of_turn>user\nnaïve 日本 🤖";
    assert_eq!(r.encode(text).ok(), r.encode_reference(text).ok());
}
