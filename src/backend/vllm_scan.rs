//! A single-pass reader of the common vLLM stream chunk, into the same
//! [`Chunk`] serde builds, for the one decoding every streamed token pays
//! (serde reads one in ~1.3 to 1.5 µs). Measured and not kept: see
//! docs/benchmarks.md, "Where the median's spread comes from, and a vLLM
//! chunk reader not kept".
//!
//! It reads only what the decoder uses (`choices[].token_ids`,
//! `choices[].logprobs.token_logprobs` / `.top_logprobs`,
//! `choices[].finish_reason`, `object`) and checks the grammar of what it
//! skips. Anything it does not handle exactly as serde would gives `None`,
//! and the caller parses the chunk with serde instead: error chunks
//! (`error`, `message`, `code`, `object: "error"`), a key written with an
//! escape, a `\u` escape or a control character in any string, an integer
//! written where a logprob goes (serde converts it differently), a
//! duplicate field, nesting deeper than [`MAX_DEPTH`], trailing text.
//! Numbers are converted by serde_json's own parser, so a logprob read here
//! has the same bits as one read by serde (`vllm_scan_tests.rs` checks
//! both readers agree on generated and mutated chunks).

use super::{Choice, Chunk, CompletionLogprobs, TopLogprobs};

/// Deeper nesting is left to serde.
const MAX_DEPTH: u32 = 32;

/// The chunk in `text`, or `None` when serde must read it.
pub(super) fn chunk(text: &str) -> Option<Chunk> {
    let mut s = Scan {
        b: text.as_bytes(),
        text,
        i: 0,
    };
    let mut out = Chunk {
        choices: None,
        error: None,
        object: None,
        message: None,
        code: None,
    };
    let (mut seen_choices, mut seen_object) = (false, false);
    s.object(|s, key| match key {
        "choices" => {
            once(&mut seen_choices)?;
            out.choices = s.nullable(|s| {
                let mut choices = Vec::with_capacity(1);
                s.array(|s| {
                    choices.push(choice(s)?);
                    Some(())
                })?;
                Some(choices)
            })?;
            Some(())
        }
        "object" => {
            once(&mut seen_object)?;
            let object = s.nullable(Scan::plain_string)?;
            if object == Some("error") {
                return None;
            }
            out.object = object.map(str::to_string);
            Some(())
        }
        "error" | "message" | "code" => None,
        _ => s.skip_value(1),
    })?;
    s.ws();
    (s.i == s.b.len()).then_some(out)
}

fn choice(s: &mut Scan<'_>) -> Option<Choice> {
    let mut out = Choice {
        token_ids: None,
        logprobs: None,
        finish_reason: None,
    };
    let mut seen = [false; 3];
    s.object(|s, key| match key {
        "token_ids" => {
            once(&mut seen[0])?;
            out.token_ids = s.nullable(|s| {
                let mut ids = Vec::with_capacity(1);
                s.array(|s| {
                    ids.push(s.token_id()?);
                    Some(())
                })?;
                Some(ids)
            })?;
            Some(())
        }
        "logprobs" => {
            once(&mut seen[1])?;
            out.logprobs = s.nullable(logprobs)?;
            Some(())
        }
        "finish_reason" => {
            once(&mut seen[2])?;
            out.finish_reason = s.nullable(Scan::plain_string)?.map(str::to_string);
            Some(())
        }
        _ => s.skip_value(3),
    })?;
    Some(out)
}

fn logprobs(s: &mut Scan<'_>) -> Option<CompletionLogprobs> {
    let mut out = CompletionLogprobs {
        token_logprobs: None,
        top_logprobs: None,
    };
    let mut seen = [false; 2];
    s.object(|s, key| match key {
        "token_logprobs" => {
            once(&mut seen[0])?;
            out.token_logprobs = s.nullable(|s| {
                let mut numbers = Vec::with_capacity(1);
                s.array(|s| {
                    numbers.push(s.nullable(|s| s.float().map(|f| f as f32))?);
                    Some(())
                })?;
                Some(numbers)
            })?;
            Some(())
        }
        "top_logprobs" => {
            once(&mut seen[1])?;
            out.top_logprobs = s.nullable(|s| {
                let mut positions = Vec::with_capacity(1);
                s.array(|s| {
                    positions.push(s.nullable(top)?);
                    Some(())
                })?;
                Some(positions)
            })?;
            Some(())
        }
        _ => s.skip_value(4),
    })?;
    Some(out)
}

/// One position's `{"token_id:ID": logprob, ..}`: as [`TopLogprobs`]'s
/// serde reader, entries whose key is not a token id or whose value is not
/// a number are skipped.
fn top(s: &mut Scan<'_>) -> Option<TopLogprobs> {
    let mut out = Vec::with_capacity(1);
    s.object(|s, key| {
        let id = super::parse_token_key(key);
        match s.peek()? {
            b'-' | b'0'..=b'9' => {
                let value = s.float()?;
                if let Some(id) = id {
                    out.push((id, value as f32));
                }
                Some(())
            }
            _ => s.skip_value(5),
        }
    })?;
    Some(TopLogprobs(out))
}

/// How many bytes at the start of `b` satisfy `keep`.
fn span(b: &[u8], keep: impl Fn(u8) -> bool) -> usize {
    b.iter().position(|&c| !keep(c)).unwrap_or(b.len())
}

/// A field serde would refuse to see twice.
fn once(seen: &mut bool) -> Option<()> {
    if std::mem::replace(seen, true) {
        return None;
    }
    Some(())
}

struct Scan<'a> {
    b: &'a [u8],
    text: &'a str,
    i: usize,
}

impl<'a> Scan<'a> {
    // The loops below count in a local and store the position once: a
    // loop that bumps `self.i` in place kept it in memory, a store per byte.
    fn ws(&mut self) {
        self.i += span(&self.b[self.i.min(self.b.len())..], |c| {
            matches!(c, b' ' | b'\n' | b'\t' | b'\r')
        });
    }

    /// The next byte after whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// `null` (then `None`), or what `f` reads.
    fn nullable<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            return Some(None);
        }
        f(self).map(Some)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `{ "key": value, ... }`, `f` reading each value after its key.
    fn object(&mut self, mut f: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.plain_string()?;
            self.eat(b':')?;
            f(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// `[ value, ... ]`, `f` reading each value.
    fn array(&mut self, mut f: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            f(self)?;
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes or control characters, borrowed.
    fn plain_string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let end = start
            + span(self.b.get(start..)?, |c| {
                c != b'"' && c != b'\\' && c >= 0x20
            });
        if self.b.get(end) != Some(&b'"') {
            return None;
        }
        self.i = end + 1;
        self.text.get(start..end)
    }

    /// A string as JSON allows it, except `\u` escapes (serde checks those
    /// further than this would).
    fn skip_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        let mut at = self.i;
        loop {
            at += span(self.b.get(at..)?, |c| c != b'"' && c != b'\\' && c >= 0x20);
            match *self.b.get(at)? {
                b'"' => {
                    self.i = at + 1;
                    return Some(());
                }
                b'\\' => {
                    match *self.b.get(at + 1)? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                        _ => return None,
                    }
                    at += 2;
                }
                _ => return None,
            }
        }
    }

    /// JSON's number grammar; the number's text, and whether it has a
    /// fraction or an exponent.
    fn number(&mut self) -> Option<(&'a str, bool)> {
        self.ws();
        let start = self.i;
        if self.b.get(self.i) == Some(&b'-') {
            self.i += 1;
        }
        match *self.b.get(self.i)? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        let mut float = false;
        if self.b.get(self.i) == Some(&b'.') {
            self.i += 1;
            self.some_digits()?;
            float = true;
        }
        if let Some(b'e' | b'E') = self.b.get(self.i) {
            self.i += 1;
            if let Some(b'+' | b'-') = self.b.get(self.i) {
                self.i += 1;
            }
            self.some_digits()?;
            float = true;
        }
        Some((self.text.get(start..self.i)?, float))
    }

    fn digits(&mut self) {
        self.i += span(&self.b[self.i.min(self.b.len())..], |c| c.is_ascii_digit());
    }

    fn some_digits(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }

    /// A number with a fraction or an exponent, as serde_json reads it (an
    /// integer is left to serde, which converts it to f32 another way).
    fn float(&mut self) -> Option<f64> {
        match self.number()? {
            (text, true) => serde_json::from_str(text).ok(),
            (_, false) => None,
        }
    }

    /// A token id: digits, no sign, fraction or exponent, within u32.
    fn token_id(&mut self) -> Option<u32> {
        match self.number()? {
            (text, false) if !text.starts_with('-') => text.parse().ok(),
            _ => None,
        }
    }

    /// Any JSON value, checked and passed over; `depth`: the nesting it is at.
    fn skip_value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' if depth < MAX_DEPTH => self.object(|s, _| s.skip_value(depth + 1)),
            b'[' if depth < MAX_DEPTH => self.array(|s| s.skip_value(depth + 1)),
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'-' | b'0'..=b'9' => self.number().map(|_| ()),
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "vllm_scan_tests.rs"]
mod tests;
