//! The tokenizer tito builds from GGUF metadata gives the same ids as
//! llama.cpp's own tokenizer for the same file.
#![cfg(feature = "engine")]

mod engine_support;

use tito::engine::direct::llama_tokenize;
use tito::render::gguf::load_tokenizer;

const TEXTS: &[&str] = &[
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand\r\nCRLF",
    "Numbers: 1234567890 3.14159 -42 1e10 0x1F",
    "日本語のテキストと中文文本",
    "한국어 텍스트",
    "Emoji 🎉🚀 and flags 🇫🇷 and ZWJ 👩‍💻",
    "Ünïcödé àccents, ß, œ, Ελληνικά, русский",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "def f(x):\n\treturn x ** 2  # square\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm you're they've we'll he'd",
    "HAVING having HaViNg",
    "a",
    " ",
    "\n",
    "          ten spaces",
    "mixed123abc456 and 7 8 9",
    "URL: https://example.com/path?q=1&r=two#frag",
    "JSON {\"key\": [1, 2, {\"nested\": null}], \"b\": true}",
    "Math: ∑_{i=1}^{n} i² = n(n+1)/2 ≤ ∞",
    "repeated!!!??? ... --- ***",
];

#[test]
fn gguf_tokenizer_matches_llama_cpp() {
    let path = engine_support::model_path();
    let source = load_tokenizer(&path).expect("GGUF tokenizer builds");
    let reference = llama_tokenize(&path, TEXTS).expect("llama.cpp loads the vocabulary");
    let mut mismatches = Vec::new();
    for (text, want) in TEXTS.iter().zip(&reference) {
        let got = source
            .tokenizer
            .encode_fast(*text, false)
            .expect("encodes")
            .get_ids()
            .to_vec();
        if &got != want {
            mismatches.push(format!("{text:?}: tito {got:?} != llama.cpp {want:?}"));
        }
        let round = source.tokenizer.decode(&got, false).expect("decodes");
        assert_eq!(&round, text, "decode(encode(x)) must give x back");
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
}

#[test]
fn gguf_metadata_gives_template_eos_and_context() {
    let source = load_tokenizer(&engine_support::model_path()).expect("GGUF tokenizer builds");
    let template = source.chat_template.expect("SmolLM2 ships a chat template");
    assert!(template.contains("<|im_start|>"), "{template}");
    let im_end = source
        .tokenizer
        .token_to_id("<|im_end|>")
        .expect("<|im_end|> is a token");
    assert!(
        source.eos_token_ids.contains(&im_end),
        "{:?}",
        source.eos_token_ids
    );
    assert_eq!(source.max_model_len, Some(8192));
    assert_eq!(source.sha256.len(), 64);
}
