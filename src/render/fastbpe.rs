//! A fast, exact encoder for byte-level BPE tokenizers (Qwen 2/3, Llama 3,
//! DeepSeek V3, GPT-2 style), used by [`super::Renderer::encode`] in place of
//! the `tokenizers` crate, which spends most of its time building offsets,
//! alignments and per-token strings that tito never reads (about 1.4 us per
//! token; this path is several times faster, `cargo bench --bench render`).
//!
//! It does what the crate does for `encode(text, add_special_tokens=false)`,
//! step by step: split on added tokens (leftmost-longest, the non-normalized
//! ones first, then the normalized ones in the gaps), normalize each gap
//! (NFC by the crate's own normalizer, skipped for ASCII, which NFC leaves
//! alone), pre-tokenize with the `Split` regexes in order (Isolated; on
//! ASCII text, Qwen's and Llama 3's pattern by the hand-written scanner in
//! `pretok`), then byte-level BPE by merge rank (lowest rank first, leftmost
//! among equals).
//!
//! Only tokenizers whose configuration it understands completely get it
//! ([`FastBpe::from_tokenizer`] says why not otherwise), and even those must
//! reproduce the crate on a probe corpus at load, or the renderer keeps the
//! crate. `tests/render_fastbpe.rs` compares both on fixtures and random text.

use std::sync::Mutex;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use fancy_regex::Regex;
use rustc_hash::FxHashMap;
use serde_json::Value as Json;
use tokenizers::{NormalizedString, Normalizer, Tokenizer};

use super::bytelevel::char_to_byte;
use super::pretok::AsciiScanner;

/// Words longer than this (in bytes) merge with a heap, O(n log n); shorter
/// ones with a plain scan, which is faster for them.
const SCAN_MAX: usize = 48;

/// Distinct words the word cache holds before it starts over: at most
/// about 4.6 MB (a word of [`SCAN_MAX`] bytes may keep as many ids), under
/// 1 MB for words of a few bytes and ids.
const CACHE_WORDS: usize = 1 << 14;

/// Added tokens of one matching pass.
struct AddedPass {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

impl AddedPass {
    fn new(tokens: &[(String, u32)]) -> Result<Option<AddedPass>, String> {
        if tokens.is_empty() {
            return Ok(None);
        }
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(tokens.iter().map(|(c, _)| c.as_str()))
            .map_err(|e| format!("added tokens: {e}"))?;
        Ok(Some(AddedPass {
            matcher,
            ids: tokens.iter().map(|(_, id)| *id).collect(),
        }))
    }
}

pub struct FastBpe {
    first: Option<AddedPass>,
    /// Normalized added tokens, matched in the gaps of the first pass (only
    /// with an identity normalizer, where normalized text is the text).
    second: Option<AddedPass>,
    nfc: bool,
    splits: Vec<Regex>,
    /// Replaces the single split regex on ASCII text, when it is Qwen's or
    /// Llama 3's pattern.
    scanner: Option<AsciiScanner>,
    vocab: FxHashMap<Vec<u8>, u32>,
    byte_ids: [u32; 256],
    /// (left, right) → (rank, merged id).
    merges: FxHashMap<(u32, u32), (u32, u32)>,
    ignore_merges: bool,
    words: WordCache,
}

/// A word's bytes and its ids.
type WordIds = FxHashMap<Box<[u8]>, Box<[u32]>>;

/// The ids of words merged before. A word's BPE depends on its bytes alone
/// (the vocab and merges are fixed), so a remembered word is exact, and the
/// words of prompts repeat (system prompts, tool schemas, the template's own
/// text), and merging is most of a fresh prompt's encoding. Short words only ([`SCAN_MAX`] bytes at most);
/// full, it is emptied and fills again. A thread that finds it locked by
/// another merges without it.
struct WordCache {
    words: Mutex<WordIds>,
    capacity: usize,
}

impl WordCache {
    fn new(capacity: usize) -> WordCache {
        WordCache {
            words: Mutex::new(FxHashMap::default()),
            capacity,
        }
    }

    /// One byte is one id: nothing to merge, nothing worth remembering.
    fn holds(word: &[u8]) -> bool {
        word.len() > 1
    }

    /// Appends `word`'s ids to `out` if it is remembered.
    fn get(&self, word: &[u8], out: &mut Vec<u32>) -> bool {
        if !Self::holds(word) {
            return false;
        }
        let Ok(words) = self.words.try_lock() else {
            return false;
        };
        match words.get(word) {
            Some(ids) => {
                out.extend_from_slice(ids);
                true
            }
            None => false,
        }
    }

    fn put(&self, word: &[u8], ids: &[u32]) {
        if !Self::holds(word) {
            return;
        }
        let Ok(mut words) = self.words.try_lock() else {
            return;
        };
        if words.len() >= self.capacity {
            words.clear();
        }
        if self.capacity > 0 {
            words.insert(word.into(), ids.into());
        }
    }
}

fn token_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(char_to_byte).collect()
}

fn is_identity_normalizer(n: &Json) -> bool {
    n.is_null()
        || (n["type"] == "Sequence" && n["normalizers"].as_array().is_some_and(|a| a.is_empty()))
}

/// The `Split` regexes of a supported pre-tokenizer, in order.
fn split_patterns(pre: &Json) -> Result<Vec<String>, String> {
    const GPT2: &str =
        r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    let byte_level_ok = |p: &Json| p["add_prefix_space"] == false;
    match pre["type"].as_str() {
        Some("ByteLevel") if byte_level_ok(pre) && pre["use_regex"] == true => {
            Ok(vec![GPT2.to_string()])
        }
        Some("Sequence") => {
            let steps = pre["pretokenizers"].as_array().ok_or("no pretokenizers")?;
            let (last, splits) = steps.split_last().ok_or("empty pre-tokenizer")?;
            if last["type"] != "ByteLevel" || !byte_level_ok(last) {
                return Err("pre-tokenizer does not end in ByteLevel".into());
            }
            let mut out = Vec::new();
            if last["use_regex"] == true {
                out.push(GPT2.to_string());
            }
            let mut patterns = Vec::new();
            for s in splits {
                let ok =
                    s["type"] == "Split" && s["behavior"] == "Isolated" && s["invert"] == false;
                let pattern = s["pattern"]["Regex"].as_str();
                match pattern {
                    Some(p) if ok => patterns.push(p.to_string()),
                    _ => return Err(format!("unsupported pre-tokenizer step {s}")),
                }
            }
            patterns.extend(out);
            Ok(patterns)
        }
        _ => Err(format!("unsupported pre-tokenizer {}", pre["type"])),
    }
}

impl FastBpe {
    /// Builds the fast path from the tokenizer's own serialized form, or says
    /// why this tokenizer is not one it handles exactly.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<FastBpe, String> {
        let json: Json = tokenizer
            .to_string(false)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_json::from_str(&s).map_err(|e| e.to_string()))?;
        let model = &json["model"];
        if model["type"] != "BPE" || model["byte_fallback"] == true {
            return Err("not a byte-level BPE model".into());
        }
        if !model["dropout"].is_null()
            || !model["continuing_subword_prefix"]
                .as_str()
                .unwrap_or("")
                .is_empty()
            || !model["end_of_word_suffix"]
                .as_str()
                .unwrap_or("")
                .is_empty()
        {
            return Err("BPE options (dropout, affixes) not supported".into());
        }
        let identity = is_identity_normalizer(&json["normalizer"]);
        let nfc = json["normalizer"]["type"] == "NFC";
        if !identity && !nfc {
            return Err(format!("unsupported normalizer {}", json["normalizer"]));
        }
        let patterns = split_patterns(&json["pre_tokenizer"])?;
        let scanner = match patterns.as_slice() {
            [only] => AsciiScanner::for_pattern(only),
            _ => None,
        };
        let splits = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| format!("pattern {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;

        let (mut plain, mut normalized) = (Vec::new(), Vec::new());
        for t in json["added_tokens"].as_array().into_iter().flatten() {
            if t["lstrip"] == true || t["rstrip"] == true || t["single_word"] == true {
                return Err("added tokens with lstrip/rstrip/single_word".into());
            }
            let content = t["content"].as_str().ok_or("added token without content")?;
            let id = t["id"].as_u64().ok_or("added token without id")? as u32;
            if content.is_empty() {
                continue;
            }
            if t["normalized"] == true {
                normalized.push((content.to_string(), id));
            } else {
                plain.push((content.to_string(), id));
            }
        }
        if !normalized.is_empty() && !identity {
            return Err("normalized added tokens under a normalizer".into());
        }

        let vocab_json = model["vocab"].as_object().ok_or("BPE without vocab")?;
        let mut vocab = FxHashMap::default();
        let mut by_text: FxHashMap<&str, u32> = FxHashMap::default();
        for (token, id) in vocab_json {
            let id = id.as_u64().ok_or("vocab id")? as u32;
            by_text.insert(token.as_str(), id);
            if let Some(bytes) = token_bytes(token) {
                vocab.insert(bytes, id);
            }
        }
        let mut byte_ids = [0u32; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            *slot = *vocab
                .get(&vec![b as u8])
                .ok_or_else(|| format!("no token for byte {b}"))?;
        }
        let mut merges = FxHashMap::default();
        for (rank, m) in model["merges"].as_array().into_iter().flatten().enumerate() {
            let (a, b) = match m {
                Json::String(s) => s.split_once(' ').ok_or("merge without a space")?,
                Json::Array(p) if p.len() == 2 => (
                    p[0].as_str().ok_or("merge part")?,
                    p[1].as_str().ok_or("merge part")?,
                ),
                _ => return Err("unreadable merge".into()),
            };
            let id = |t: &str| by_text.get(t).copied();
            let joined = format!("{a}{b}");
            match (id(a), id(b), id(&joined)) {
                // Like the crate, a later duplicate overrides an earlier one.
                (Some(x), Some(y), Some(z)) => {
                    merges.insert((x, y), (rank as u32, z));
                }
                _ => return Err(format!("merge {a:?} {b:?} outside the vocab")),
            }
        }
        Ok(FastBpe {
            first: AddedPass::new(&plain)?,
            second: AddedPass::new(&normalized)?,
            nfc,
            splits,
            scanner,
            vocab,
            byte_ids,
            merges,
            ignore_merges: model["ignore_merges"] == true,
            words: WordCache::new(CACHE_WORDS),
        })
    }

    /// Encodes like `tokenizer.encode(text, false)`. `tokenizer` is the one
    /// this was built from (its normalizer handles non-ASCII text).
    pub fn encode(&self, tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, String> {
        let mut out = Vec::with_capacity(text.len() / 3 + 4);
        let mut gap = |piece: &str, out: &mut Vec<u32>| -> Result<(), String> {
            match &self.second {
                Some(pass) => split_added(pass, piece, out, |p, out| {
                    self.encode_plain(tokenizer, p, out)
                }),
                None => self.encode_plain(tokenizer, piece, out),
            }
        };
        match &self.first {
            Some(pass) => split_added(pass, text, &mut out, &mut gap)?,
            None => gap(text, &mut out)?,
        }
        Ok(out)
    }

    /// Text without added tokens: normalize, pre-tokenize, BPE.
    fn encode_plain(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), String> {
        if text.is_empty() {
            return Ok(());
        }
        let normalized;
        let text = if self.nfc && !text.is_ascii() {
            let mut n = NormalizedString::from(text);
            if let Some(norm) = tokenizer.get_normalizer() {
                norm.normalize(&mut n).map_err(|e| e.to_string())?;
            }
            normalized = n.get().to_string();
            normalized.as_str()
        } else {
            text
        };
        self.pre_tokenize(text, 0, out)
    }

    /// Applies split `level` and the ones after it, then BPE on each word.
    fn pre_tokenize(&self, text: &str, level: usize, out: &mut Vec<u32>) -> Result<(), String> {
        if let (0, Some(scanner)) = (level, &self.scanner) {
            if text.is_ascii() {
                scanner.split(text, |word| self.bpe(word.as_bytes(), out));
                return Ok(());
            }
        }
        let Some(re) = self.splits.get(level) else {
            self.bpe(text.as_bytes(), out);
            return Ok(());
        };
        let mut last = 0;
        for m in re.find_iter(text) {
            let m = m.map_err(|e| format!("pre-tokenizer: {e}"))?;
            if m.start() > last {
                self.pre_tokenize(&text[last..m.start()], level + 1, out)?;
            }
            if m.end() > m.start() {
                self.pre_tokenize(m.as_str(), level + 1, out)?;
            }
            last = m.end();
        }
        if last < text.len() {
            self.pre_tokenize(&text[last..], level + 1, out)?;
        }
        Ok(())
    }

    fn bpe(&self, word: &[u8], out: &mut Vec<u32>) {
        if self.ignore_merges {
            if let Some(id) = self.vocab.get(word) {
                out.push(*id);
                return;
            }
        }
        if word.len() > SCAN_MAX {
            self.bpe_heap(word, out);
            return;
        }
        if !self.words.get(word, out) {
            let start = out.len();
            self.bpe_scan(word, out);
            self.words.put(word, &out[start..]);
        }
    }

    fn rank(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.merges.get(&(a, b)).copied()
    }

    /// Short words: repeatedly merge the lowest-ranked adjacent pair, in
    /// place at the end of `out` (no allocation per word).
    fn bpe_scan(&self, word: &[u8], out: &mut Vec<u32>) {
        let start = out.len();
        out.extend(word.iter().map(|b| self.byte_ids[*b as usize]));
        loop {
            let parts = &out[start..];
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..parts.len().saturating_sub(1) {
                if let Some((rank, id)) = self.rank(parts[i], parts[i + 1]) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, i, id));
                    }
                }
            }
            let Some((_, i, id)) = best else { break };
            out[start + i] = id;
            out.remove(start + i + 1);
        }
    }

    /// Long words: the same merges in O(n log n) with a heap over a linked
    /// list of symbols; stale heap entries are skipped when popped.
    pub(crate) fn bpe_heap(&self, word: &[u8], out: &mut Vec<u32>) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let n = word.len();
        let mut ids: Vec<u32> = word.iter().map(|b| self.byte_ids[*b as usize]).collect();
        let mut next: Vec<usize> = (1..=n).collect(); // n = none
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect(); // usize::MAX = none
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        for i in 0..n.saturating_sub(1) {
            if let Some((rank, id)) = self.rank(ids[i], ids[i + 1]) {
                heap.push(Reverse((rank, i, id)));
            }
        }
        while let Some(Reverse((rank, i, id))) = heap.pop() {
            let j = next[i];
            if !alive[i] || j >= n || self.rank(ids[i], ids[j]) != Some((rank, id)) {
                continue;
            }
            ids[i] = id;
            alive[j] = false;
            next[i] = next[j];
            if next[j] < n {
                prev[next[j]] = i;
            }
            if prev[i] != usize::MAX {
                let p = prev[i];
                if let Some((r, m)) = self.rank(ids[p], ids[i]) {
                    heap.push(Reverse((r, p, m)));
                }
            }
            if next[i] < n {
                if let Some((r, m)) = self.rank(ids[i], ids[next[i]]) {
                    heap.push(Reverse((r, i, m)));
                }
            }
        }
        let mut i = 0;
        while i < n {
            out.push(ids[i]);
            i = next[i];
        }
    }
}

/// Splits `text` at the pass's tokens, pushing their ids and handing the
/// text between them to `gap`.
fn split_added(
    pass: &AddedPass,
    text: &str,
    out: &mut Vec<u32>,
    mut gap: impl FnMut(&str, &mut Vec<u32>) -> Result<(), String>,
) -> Result<(), String> {
    let mut last = 0;
    for m in pass.matcher.find_iter(text) {
        if m.start() > last {
            gap(&text[last..m.start()], out)?;
        }
        out.push(pass.ids[m.pattern().as_usize()]);
        last = m.end();
    }
    if last < text.len() {
        gap(&text[last..], out)?;
    }
    Ok(())
}

/// Text the renderer encodes with both paths at load: they must agree.
pub const PROBES: &[&str] = &[
    "Hello, world! It's 2026-11-22; we're testing 1234567 tokens.",
    "  leading spaces\n\n\ttabs\r\nCRLF   trailing   ",
    "I'LL SAY IT'S fine, you'd've thought. 'S 'T 're",
    "日本語のテキストと中文混合 text, émigré café naïve, Ελληνικά, русский",
    "code: fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); }\n    indented",
    "emoji 🤖🚀 and combining e\u{301} a\u{30a} and nbsp\u{a0}here",
    "<think>\nreasoning\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>",
    "numbers 3.14159 1,000,000 -42 0x1F 12345678901234567890",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3() -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(".cache/tokenizers/qwen3/tokenizer.json");
        Tokenizer::from_file(&path).expect("run scripts/fetch-tokenizers.sh")
    }

    /// Remembered words give the crate's ids, whether the cache holds every
    /// word, starts over every two words, or holds none.
    #[test]
    fn remembered_words_encode_as_the_crate_does() {
        let tokenizer = qwen3();
        let mut texts: Vec<String> = PROBES.iter().map(|p| p.to_string()).collect();
        texts.push("the sea, the sea; the seas and the sea's seasons".into());
        texts.push("Write one short sentence about the sea. (request 17)".into());
        for capacity in [CACHE_WORDS, 2, 0] {
            let mut fast = FastBpe::from_tokenizer(&tokenizer).expect("qwen3 qualifies");
            fast.words = WordCache::new(capacity);
            // Twice: the second pass finds the first one's words.
            for text in texts.iter().chain(texts.iter()) {
                let want = tokenizer
                    .encode_fast(text.as_str(), false)
                    .expect("encodes");
                let got = fast.encode(&tokenizer, text).expect("encodes");
                assert_eq!(got, want.get_ids(), "capacity {capacity}, text {text:?}");
            }
            let held = fast.words.words.lock().map(|w| w.len()).unwrap_or(0);
            assert!(held <= capacity, "capacity {capacity} holds {held}");
            if capacity == CACHE_WORDS {
                assert!(held > 20, "the corpus's words were remembered ({held})");
            }
        }
    }
}
