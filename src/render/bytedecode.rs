//! Exact decoding for tokenizers whose decoder is `ByteLevel` alone (Qwen,
//! Llama 3, DeepSeek V3): each id's bytes are worked out once, at load, by
//! the rule the `tokenizers` crate applies on every `decode` call, so a
//! decode is a copy of bytes per id and one UTF-8 check.
//!
//! The rule (tokenizers 0.21, `TokenizerImpl::decode` and the `ByteLevel`
//! decoder): an id names the added token with that id, else the model's
//! token; an id that names neither is dropped, and so is a special token
//! when special tokens are skipped; a token whose every char is one of
//! GPT-2's byte chars stands for those bytes, any other token for its own
//! UTF-8; the bytes of all the ids, joined, are read as UTF-8 with U+FFFD
//! for what is not. The incremental detokenizer decodes two short windows
//! per sampled token, and through `tokenizers` each of those allocated a
//! string per id and several more for the decoder's chain.
//!
//! Must not: differ from `Tokenizer::decode` for any id sequence
//! (tests/render_decode.rs checks every id of the fetched tokenizers and
//! seeded random sequences against it).

use tokenizers::decoders::DecoderWrapper;
use tokenizers::Tokenizer;

use super::bytelevel::char_to_byte;

pub struct ByteDecoder {
    /// Every id's bytes, in id order (none for an id no token has).
    bytes: Vec<u8>,
    /// `ends[id]` is where id's bytes end in `bytes` (they start where the
    /// previous id's end).
    ends: Vec<u32>,
    /// Whether the id's token is special (dropped when those are skipped).
    special: Vec<bool>,
}

impl ByteDecoder {
    /// The table for `tokenizer`'s ids below `count` (its largest id, added
    /// tokens included, plus one), or `None` when its decoder is not
    /// `ByteLevel` alone (those decode through `tokenizers`).
    pub fn new(tokenizer: &Tokenizer, count: usize) -> Option<ByteDecoder> {
        if !matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_))) {
            return None;
        }
        let added = tokenizer.get_added_vocabulary();
        let mut bytes = Vec::new();
        let mut ends = Vec::with_capacity(count);
        let mut special = Vec::with_capacity(count);
        for id in 0..count {
            let token = tokenizer.id_to_token(u32::try_from(id).ok()?);
            if let Some(token) = &token {
                let start = bytes.len();
                for c in token.chars() {
                    match char_to_byte(c) {
                        Some(b) => bytes.push(b),
                        None => {
                            bytes.truncate(start);
                            bytes.extend_from_slice(token.as_bytes());
                            break;
                        }
                    }
                }
            }
            ends.push(u32::try_from(bytes.len()).ok()?);
            special.push(token.is_some_and(|t| added.is_special_token(&t)));
        }
        Some(ByteDecoder {
            bytes,
            ends,
            special,
        })
    }

    /// What `Tokenizer::decode(ids, skip_special_tokens)` returns.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.decode_checked(ids, skip_special_tokens).0
    }

    /// [`ByteDecoder::decode`], and whether the ids' bytes were valid UTF-8
    /// (no byte replaced). The text is each id's bytes in turn, so two such
    /// texts joined are the text of the two id sequences joined.
    pub fn decode_checked(&self, ids: &[u32], skip_special_tokens: bool) -> (String, bool) {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            if let Some(piece) = self.piece(id, skip_special_tokens) {
                out.extend_from_slice(piece);
            }
        }
        match String::from_utf8(out) {
            Ok(s) => (s, true),
            Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), false),
        }
    }

    fn piece(&self, id: u32, skip_special_tokens: bool) -> Option<&[u8]> {
        let i = id as usize;
        if skip_special_tokens && *self.special.get(i)? {
            return None;
        }
        let start = match i.checked_sub(1) {
            Some(prev) => *self.ends.get(prev)? as usize,
            None => 0,
        };
        let end = *self.ends.get(i)? as usize;
        self.bytes.get(start..end)
    }
}
