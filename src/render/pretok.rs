//! A hand-written scanner for the pre-tokenizer regex of the Qwen 2/3 and
//! Llama 3 tokenizers, on ASCII text only (non-ASCII text goes through the
//! regex). The pattern, alternatives tried in order at each position:
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,k}
//! | ?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
//! ```
//!
//! with k = 1 (Qwen) or 3 (Llama 3). On ASCII, `\p{L}` is `[A-Za-z]`, `\p{N}`
//! is `[0-9]` and `\s` is `[\t\n\x0B\x0C\r ]`; every position starts a match,
//! so the pieces tile the text. `tests/render_fastbpe.rs` checks the scanner
//! against the regex on random ASCII.

/// The two patterns, exactly as their `tokenizer.json` files spell them.
const QWEN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[derive(Clone, Copy, Debug)]
pub struct AsciiScanner {
    max_digits: usize,
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_digit(b: u8) -> bool {
    b.is_ascii_digit()
}

fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

fn is_newline(b: u8) -> bool {
    b == b'\r' || b == b'\n'
}

/// Neither whitespace, letter nor digit.
fn is_other(b: u8) -> bool {
    !is_space(b) && !is_letter(b) && !is_digit(b)
}

impl AsciiScanner {
    /// The scanner for this pre-tokenizer pattern, if it is one of the two.
    pub fn for_pattern(pattern: &str) -> Option<AsciiScanner> {
        match pattern {
            QWEN => Some(AsciiScanner { max_digits: 1 }),
            LLAMA3 => Some(AsciiScanner { max_digits: 3 }),
            _ => None,
        }
    }

    /// Calls `piece` with each pre-token of ASCII `text`, in order.
    pub fn split<'t>(&self, text: &'t str, mut piece: impl FnMut(&'t str)) {
        let b = text.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let end = self.match_at(b, i);
            piece(&text[i..end]);
            i = end;
        }
    }

    /// End of the match starting at `i` (always at least one byte).
    fn match_at(&self, b: &[u8], i: usize) -> usize {
        let n = b.len();
        let run = |from: usize, pred: fn(u8) -> bool| {
            let mut j = from;
            while j < n && pred(b[j]) {
                j += 1;
            }
            j
        };
        let c = b[i];
        // (?i:'s|'t|'re|'ve|'m|'ll|'d)
        if c == b'\'' && i + 1 < n {
            let lower = |k: usize| b.get(k).map(u8::to_ascii_lowercase);
            match lower(i + 1) {
                Some(b's' | b't' | b'm' | b'd') => return i + 2,
                Some(b'r' | b'v') if lower(i + 2) == Some(b'e') => return i + 3,
                Some(b'l') if lower(i + 2) == Some(b'l') => return i + 3,
                _ => {}
            }
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if is_letter(c) {
            return run(i, is_letter);
        }
        if !is_newline(c) && !is_digit(c) && i + 1 < n && is_letter(b[i + 1]) {
            return run(i + 1, is_letter);
        }
        // \p{N}{1,k}
        if is_digit(c) {
            let mut j = i;
            while j < n && j - i < self.max_digits && is_digit(b[j]) {
                j += 1;
            }
            return j;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let others_from = if c == b' ' { i + 1 } else { i };
        if others_from < n && is_other(b[others_from]) {
            let j = run(others_from, is_other);
            return run(j, is_newline);
        }
        // Here c is whitespace: the alternatives left all start with \s.
        let ws_end = run(i, is_space);
        // \s*[\r\n]+ : up to and including the last newline of the run.
        if let Some(last) = (i..ws_end).rev().find(|&k| is_newline(b[k])) {
            return last + 1;
        }
        // \s+(?!\S) : the whole run at the end of text, else all but its last
        // character (which then joins the next token), if that leaves one.
        if ws_end == n {
            return ws_end;
        }
        if ws_end - i > 1 {
            return ws_end - 1;
        }
        // \s+
        ws_end
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn by_regex(re: &fancy_regex::Regex, text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut last = 0;
        for m in re.find_iter(text) {
            let m = m.expect("regex");
            if m.start() > last {
                out.push(text[last..m.start()].to_string());
            }
            out.push(m.as_str().to_string());
            last = m.end();
        }
        if last < text.len() {
            out.push(text[last..].to_string());
        }
        out
    }

    #[test]
    fn scanner_splits_ascii_exactly_like_the_regex() {
        // Apostrophes and contraction letters in both cases, every ASCII
        // whitespace, digits, punctuation, plain letters.
        let alphabet: &[u8] = b"'''sStTrReEvVmMlLdDaZq09 5  \t\n\r\x0b\x0c.,!?-_(){}\"#";
        let mut rng = StdRng::seed_from_u64(7);
        for pattern in [QWEN, LLAMA3] {
            let re = fancy_regex::Regex::new(pattern).expect("pattern");
            let scanner = AsciiScanner::for_pattern(pattern).expect("scanner");
            for _ in 0..20_000 {
                let len = rng.random_range(0..32);
                let text: String = (0..len)
                    .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
                    .collect();
                let mut mine = Vec::new();
                scanner.split(&text, |p| mine.push(p.to_string()));
                assert_eq!(mine, by_regex(&re, &text), "{pattern} on {text:?}");
            }
        }
    }

    #[test]
    fn only_the_two_known_patterns_get_a_scanner() {
        assert!(AsciiScanner::for_pattern(QWEN).is_some());
        assert!(AsciiScanner::for_pattern(LLAMA3).is_some());
        assert!(AsciiScanner::for_pattern(r"\s+|\S+").is_none());
    }
}
