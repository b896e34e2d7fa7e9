//! Token ids to text, incrementally, with stop strings.
//!
//! Sampled ids arrive one at a time; clients get text deltas that never split
//! a multi-byte character, and text that might be the start of a stop string
//! is held back until it is resolved. When a stop string completes, the text
//! is cut before it while the ids keep every sampled token up to and including
//! the one that completed it (the ids stay exactly what the model sampled).
//! Each id decodes two short windows (the text since the last released
//! character), never the whole sequence: a reply's decoding costs time linear
//! in its length.
//!
//! The gateway's calls decode through their [`Renderer`]; the bundled
//! engine's server, which has a tokenizer and no chat template, through a
//! [`Detokenizer`].

use std::collections::HashMap;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::bytedecode::ByteDecoder;
use super::{RenderError, Renderer};

/// Token ids to text, as `tokenizers`' `decode` makes it.
pub trait Decode: Send + Sync {
    /// The text of `ids` (empty when the tokenizer fails).
    fn decode_text(&self, ids: &[u32], skip_special_tokens: bool) -> String;
}

impl Decode for Renderer {
    fn decode_text(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.decode(ids, skip_special_tokens).unwrap_or_default()
    }
}

/// A tokenizer and its decoding: through the table of each id's bytes where
/// the tokenizer allows one (byte-level BPE), else through `tokenizers`.
/// The [`Renderer`] decodes through one; the engine's server, which has no
/// chat template, uses one alone.
pub struct Detokenizer {
    tokenizer: Tokenizer,
    table: Option<ByteDecoder>,
}

impl Detokenizer {
    pub fn new(tokenizer: Tokenizer) -> Detokenizer {
        let vocab = tokenizer.get_vocab(true);
        Detokenizer::with_vocab(tokenizer, &vocab)
    }

    /// With the tokenizer's vocabulary map (added tokens included) already
    /// built: its largest id bounds the table.
    pub(crate) fn with_vocab(tokenizer: Tokenizer, vocab: &HashMap<String, u32>) -> Detokenizer {
        let ids = vocab.values().max().map_or(0, |m| *m as usize + 1);
        let table = ByteDecoder::new(&tokenizer, ids);
        Detokenizer { tokenizer, table }
    }

    /// The tokenizer, for what else it does (encoding, token strings).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Token ids to text, as `tokenizers`' `decode` makes it.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, RenderError> {
        match &self.table {
            Some(table) => Ok(table.decode(ids, skip_special_tokens)),
            None => self.decode_reference(ids, skip_special_tokens),
        }
    }

    /// [`Detokenizer::decode`], and whether the text can be joined to
    /// another such text: the table decoder, and bytes that are valid UTF-8.
    /// When both `a`'s and `b`'s texts can, the text of `a` then `b` is the
    /// two texts joined.
    pub fn decode_joinable(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<(String, bool), RenderError> {
        match &self.table {
            Some(table) => Ok(table.decode_checked(ids, skip_special_tokens)),
            None => Ok((self.decode_reference(ids, skip_special_tokens)?, false)),
        }
    }

    /// Whether [`Detokenizer::decode`] runs the table decoder.
    pub fn has_table(&self) -> bool {
        self.table.is_some()
    }

    /// [`Detokenizer::decode`] through the `tokenizers` crate, always: the
    /// reference the table decoder is checked against.
    pub fn decode_reference(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<String, RenderError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| RenderError::Tokenize(e.to_string()))
    }
}

impl Decode for Detokenizer {
    fn decode_text(&self, ids: &[u32], skip_special_tokens: bool) -> String {
        self.decode(ids, skip_special_tokens).unwrap_or_default()
    }
}

pub struct TextAssembler {
    decoder: Arc<dyn Decode>,
    skip_special: bool,
    stop: Vec<String>,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// All text decoded so far (released + held back).
    text: String,
    /// Bytes of `text` already handed out.
    released: usize,
    /// Index in `stop` of the stop string that ended the text.
    matched: Option<usize>,
}

impl TextAssembler {
    pub fn new(decoder: Arc<dyn Decode>, skip_special: bool, stop: Vec<String>) -> Self {
        TextAssembler {
            decoder,
            skip_special,
            stop,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            text: String::new(),
            released: 0,
            matched: None,
        }
    }

    /// True once a stop string was seen; later tokens must not be pushed.
    pub fn stopped(&self) -> bool {
        self.matched.is_some()
    }

    /// The stop string that ended the text: the first to complete as the
    /// text grew (of two completed by the same token, the one starting
    /// earlier, then the first listed).
    pub fn stop_string(&self) -> Option<&str> {
        self.matched
            .and_then(|i| self.stop.get(i))
            .map(String::as_str)
    }

    /// Adds one sampled id; returns the text that may be released now.
    pub fn push(&mut self, id: u32) -> String {
        if self.stopped() {
            return String::new();
        }
        self.ids.push(id);
        let window = &self.ids[self.prefix_offset..];
        let prefix_len = self.read_offset - self.prefix_offset;
        let prefix = self.decode(&window[..prefix_len]);
        let full = self.decode(window);
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.starts_with(&prefix) {
            if let Some(new) = full.get(prefix.len()..) {
                self.text.push_str(new);
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
            }
        }
        self.release()
    }

    /// Ends the sequence: returns whatever is still held back (a stop-string
    /// prefix that never completed, or bytes of an unfinished character).
    pub fn finish(&mut self) -> String {
        if !self.stopped() {
            // Decode the unread tail as-is, replacement characters included.
            let window = &self.ids[self.prefix_offset..];
            let prefix_len = self.read_offset - self.prefix_offset;
            let prefix = self.decode(&window[..prefix_len]);
            let full = self.decode(window);
            if let Some(rest) = full.strip_prefix(prefix.as_str()) {
                self.text.push_str(rest);
            }
            self.read_offset = self.ids.len();
            self.prefix_offset = self.read_offset;
            self.check_stop();
        }
        let end = self.text.len();
        let out = self
            .text
            .get(self.released..end)
            .unwrap_or_default()
            .to_string();
        self.released = end;
        out
    }

    /// The complete text handed out so far.
    #[cfg(test)]
    pub fn text(&self) -> &str {
        &self.text[..self.released]
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.decoder.decode_text(ids, self.skip_special)
    }

    fn check_stop(&mut self) {
        if self.stop.is_empty() || self.stopped() {
            return;
        }
        let longest = self.stop.iter().map(String::len).max().unwrap_or(0);
        // A stop string can only start in the unreleased part or just before it.
        let mut from = self.released.saturating_sub(longest);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hay = &self.text[from..];
        let hit = self
            .stop
            .iter()
            .enumerate()
            .filter_map(|(i, s)| hay.find(s.as_str()).map(|pos| (pos, i)))
            .min();
        if let Some((pos, i)) = hit {
            let cut = (from + pos).max(self.released);
            self.text.truncate(cut);
            self.matched = Some(i);
        }
    }

    fn release(&mut self) -> String {
        self.check_stop();
        let end = if self.stopped() {
            self.text.len()
        } else {
            self.text.len() - self.held_back()
        };
        if end <= self.released {
            return String::new();
        }
        let out = self.text[self.released..end].to_string();
        self.released = end;
        out
    }

    /// Length of the longest suffix of the text that is a proper prefix of a
    /// stop string (that text might still become a stop string).
    fn held_back(&self) -> usize {
        let unreleased = &self.text[self.released..];
        let mut best = 0;
        for s in &self.stop {
            let max = (s.len() - 1).min(unreleased.len());
            for k in (best + 1..=max).rev() {
                let start = unreleased.len() - k;
                if unreleased.is_char_boundary(start) && s.starts_with(&unreleased[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::testing::{chatml_renderer, IM_END};

    fn run(text: &str, stop: &[&str], extra: &[u32]) -> (Vec<String>, String, bool, usize) {
        let r = chatml_renderer();
        let mut ids = r.encode(text).expect("encodes");
        ids.extend_from_slice(extra);
        let mut a = TextAssembler::new(r, true, stop.iter().map(|s| s.to_string()).collect());
        let mut deltas = Vec::new();
        let mut consumed = 0;
        for id in ids {
            consumed += 1;
            let d = a.push(id);
            if !d.is_empty() {
                deltas.push(d);
            }
            if a.stopped() {
                break;
            }
        }
        let tail = a.finish();
        if !tail.is_empty() {
            deltas.push(tail);
        }
        (deltas, a.text().to_string(), a.stopped(), consumed)
    }

    #[test]
    fn never_splits_multibyte_characters() {
        let text = "añ 日本語 🎉 ok";
        let (deltas, full, _, _) = run(text, &[], &[]);
        assert_eq!(full, text);
        assert_eq!(deltas.concat(), text);
        assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')));
    }

    #[test]
    fn stop_string_cuts_text_but_keeps_completing_token() {
        let (_, full, stopped, consumed) = run("Hello STOP more", &["STOP"], &[]);
        assert!(stopped);
        assert_eq!(full, "Hello ");
        // Consumed ids end at the token completing "STOP", not later.
        let r = chatml_renderer();
        let upto = r.encode("Hello STOP").expect("encodes").len();
        assert_eq!(consumed, upto);
    }

    #[test]
    fn the_matched_stop_string_is_the_earliest_in_the_text() {
        let matched = |text: &str, stop: &[&str]| {
            let r = chatml_renderer();
            let ids = r.encode(text).expect("encodes");
            let mut a = TextAssembler::new(r, true, stop.iter().map(|s| s.to_string()).collect());
            for id in ids {
                a.push(id);
            }
            a.finish();
            a.stop_string().map(str::to_string)
        };
        assert_eq!(matched("x B y A z", &["A", "B"]).as_deref(), Some("B"));
        // Text grows a token at a time: the one complete first wins.
        assert_eq!(matched("x AB z", &["AB", "A"]).as_deref(), Some("A"));
        assert_eq!(matched("x AB z", &["B", "x A"]).as_deref(), Some("x A"));
        assert_eq!(matched("nothing here", &["A"]), None);
    }

    #[test]
    fn held_back_prefix_is_released_when_it_does_not_complete() {
        let (deltas, full, stopped, _) = run("a ST b", &["STOP"], &[]);
        assert!(!stopped);
        assert_eq!(full, "a ST b");
        assert_eq!(deltas.concat(), "a ST b");
    }

    #[test]
    fn special_tokens_are_skipped_or_kept() {
        let (_, full, _, _) = run("hi", &[], &[IM_END]);
        assert_eq!(full, "hi");
        let r = chatml_renderer();
        let mut a = TextAssembler::new(r, false, vec![]);
        for id in [b'h' as u32, IM_END] {
            a.push(id);
        }
        a.finish();
        assert_eq!(a.text(), "h<|im_end|>");
    }

    /// Counts the ids it is asked to decode.
    struct Counting {
        inner: Arc<Renderer>,
        ids: std::sync::atomic::AtomicUsize,
    }

    impl Decode for Counting {
        fn decode_text(&self, ids: &[u32], skip_special_tokens: bool) -> String {
            self.ids
                .fetch_add(ids.len(), std::sync::atomic::Ordering::Relaxed);
            self.inner.decode_text(ids, skip_special_tokens)
        }
    }

    #[test]
    fn each_id_decodes_a_short_window_not_the_sequence() {
        let counting = Arc::new(Counting {
            inner: chatml_renderer(),
            ids: Default::default(),
        });
        let text = "Ünïcode and ascii, 日本語 and 🎉 emoji, repeated. ".repeat(60);
        let ids = counting.inner.encode(&text).expect("encodes");
        let mut a = TextAssembler::new(counting.clone(), true, Vec::new());
        let mut out: String = ids.iter().map(|&id| a.push(id)).collect();
        out.push_str(&a.finish());
        assert_eq!(out, text);
        // Two windows of a few ids each per id; decoding the whole
        // sequence at every id would be about n^2 / 2 ids.
        let decoded = counting.ids.load(std::sync::atomic::Ordering::Relaxed);
        let n = ids.len();
        eprintln!("{decoded} ids decoded for {n} sampled");
        assert!(n > 2_000, "{n}");
        assert!(decoded < 8 * n, "{decoded} ids decoded for {n} sampled");
    }
}
