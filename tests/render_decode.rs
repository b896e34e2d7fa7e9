//! The table decoder (`render::bytedecode`) against the `tokenizers` crate's
//! `decode`, on the fetched tokenizers whose decoder is `ByteLevel` (Qwen3,
//! Llama 3.1, DeepSeek V3): every id alone, both ways of treating special
//! tokens, and seeded random sequences that split multi-byte characters,
//! mix in added and special tokens and ids past the vocabulary. Gemma 3's
//! SentencePiece decoder keeps decoding through `tokenizers`.

mod common;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tito::render::Renderer;

fn load(name: &str) -> std::sync::Arc<Renderer> {
    common::real_renderer(name, "")
}

fn same(r: &Renderer, ids: &[u32], skip: bool) {
    let fast = r.decode(ids, skip).expect("decodes");
    let reference = r.decode_reference(ids, skip).expect("reference decodes");
    assert_eq!(fast, reference, "ids {ids:?}, skip_special_tokens {skip}");
}

fn check(name: &str) {
    let r = load(name);
    assert!(r.has_fast_decoder(), "{name} decodes through the table");
    let count = r.vocab_size();
    // Every id alone, and a few past the end of the vocabulary.
    for id in 0..count + 4 {
        same(&r, &[id], true);
        same(&r, &[id], false);
    }
    // Ids with multi-byte UTF-8 pieces, to split characters across ids.
    let text = "añ 日本語 🎉 naïve Ωμέγα ключ <think>x</think> \u{200b}";
    let mut pool = r.encode(text).expect("encodes");
    let specials = [
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "<|begin_of_text|>",
        "<|eot_id|>",
        "<｜begin▁of▁sentence｜>",
    ];
    pool.extend(specials.iter().filter_map(|s| r.token_to_id(s)));
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..20_000 {
        let len = rng.random_range(1..10);
        let ids: Vec<u32> = (0..len)
            .map(|_| match rng.random_range(0..10) {
                0..=5 => pool[rng.random_range(0..pool.len())],
                6..=8 => rng.random_range(0..count),
                _ => count + rng.random_range(0..3),
            })
            .collect();
        same(&r, &ids, rng.random_bool(0.5));
    }
}

#[test]
fn qwen3_decodes_as_tokenizers_does() {
    check("qwen3");
}

#[test]
fn llama3_1_decodes_as_tokenizers_does() {
    check("llama3_1");
}

#[test]
fn deepseek_v3_decodes_as_tokenizers_does() {
    check("deepseek_v3");
}

#[test]
fn a_sentencepiece_decoder_keeps_the_tokenizers_path() {
    let r = load("gemma3");
    assert!(!r.has_fast_decoder());
    let ids = r.encode("ción ok").expect("encodes");
    same(&r, &ids, true);
}
