//! A small byte-level BPE tokenizer with a ChatML template, built in code, for
//! unit and integration tests that must not depend on fetched fixtures.
//! Every byte is a token, plus a few merges, plus ChatML special tokens.

use serde_json::{json, Value as Json};
use tokenizers::Tokenizer;

use super::{sha256_hex, Renderer, TokenizerSource};

/// Ids 0..=255 are bytes, 256..=259 merges, then the special tokens (the
/// tokenizers crate numbers added tokens after the model vocabulary).
pub const IM_START: u32 = 260;
pub const IM_END: u32 = 261;
pub const ENDOFTEXT: u32 = 262;

/// ChatML, as Qwen-style models render it.
pub const CHATML_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

pub use super::bytelevel::byte_to_char;

fn tokenizer_json() -> Json {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_to_char(b).to_string(), json!(b as u32));
    }
    // A few merges so multi-byte tokens exist: "He", "ll", "Hell", "Ġw".
    let merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("Ġ", "w")];
    for (id, (a, b)) in (256u32..).zip(merges) {
        vocab.insert(format!("{a}{b}"), json!(id));
    }
    let added = |id: u32, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(IM_START, "<|im_start|>"), added(IM_END, "<|im_end|>"), added(ENDOFTEXT, "<|endoftext|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": false,
                  "vocab": vocab, "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>()}
    })
}

/// The test tokenizer as a source, with `<|im_end|>` as EOS.
pub fn chatml_source() -> TokenizerSource {
    let text = tokenizer_json().to_string();
    #[allow(clippy::expect_used)]
    let tokenizer =
        Tokenizer::from_bytes(text.as_bytes()).expect("built-in test tokenizer is valid");
    TokenizerSource {
        tokenizer,
        chat_template: Some(CHATML_TEMPLATE.to_string()),
        bos_token: None,
        eos_token: Some("<|im_end|>".into()),
        pad_token: Some("<|endoftext|>".into()),
        unk_token: None,
        eos_token_ids: vec![IM_END],
        max_model_len: Some(4096),
        sha256: sha256_hex(text.as_bytes()),
    }
}

/// A renderer over the test tokenizer.
pub fn chatml_renderer() -> std::sync::Arc<Renderer> {
    #[allow(clippy::expect_used)]
    let r = Renderer::new(chatml_source(), None).expect("built-in test template compiles");
    std::sync::Arc::new(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrips_bytes_and_specials() {
        let r = chatml_renderer();
        let ids = r.encode("Hello wörld <|im_end|>").expect("encodes");
        assert_eq!(r.token_to_id("<|im_end|>"), Some(IM_END));
        assert_eq!(r.token_to_id("<|im_start|>"), Some(IM_START));
        assert!(ids.contains(&IM_END));
        assert_eq!(
            r.decode(&ids, false).expect("decodes"),
            "Hello wörld <|im_end|>"
        );
        assert_eq!(r.decode(&ids, true).expect("decodes"), "Hello wörld ");
    }
}
