//! The `think` reasoning parser: `<think>...</think>` becomes
//! `reasoning_content`, the rest `content`. Runs before the tool parser,
//! which sees only the content part.
//!
//! Rules (the same for the full and the streamed parse):
//! - If the prompt already opened `<think>` (`started_in_reasoning`, see
//!   [`prompt_opens_reasoning`]), the output starts inside reasoning; a
//!   leading `<think>` is still accepted and dropped.
//! - Otherwise reasoning exists only if the output (after leading
//!   whitespace) starts with `<think>`; else the whole text is content,
//!   verbatim (a stray `</think>` included).
//! - Reasoning is trimmed of surrounding whitespace; the content after
//!   `</think>` loses its leading whitespace. Unterminated reasoning: all
//!   reasoning, no content. Empty parts are `None`.
//!
//! Must not: look for tool calls, or treat `<think>` in mid-text as a tag.

use super::scan::{scan_markers, Scan};
use super::stream::DeltaEvent;

const OPEN: &str = "<think>";
/// The tag that ends reasoning.
pub const CLOSE: &str = "</think>";

/// True when the rendered prompt ends inside an opened `<think>` block
/// (e.g. Qwen3-Thinking-2507 or DeepSeek-R1-0528 generation prompts).
pub fn prompt_opens_reasoning(prompt_text: &str) -> bool {
    prompt_text.trim_end().ends_with(OPEN)
}

/// Splits `<think>` reasoning from content (see the module rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParser {
    started_in_reasoning: bool,
}

impl ReasoningParser {
    pub fn new(started_in_reasoning: bool) -> Self {
        ReasoningParser {
            started_in_reasoning,
        }
    }

    /// `(reasoning_content, content part)`.
    pub fn split<'a>(&self, text: &'a str) -> (Option<String>, &'a str) {
        let t = text.trim_start();
        let body = match t.strip_prefix(OPEN) {
            Some(b) => b,
            None if self.started_in_reasoning => t,
            None => return (None, text),
        };
        let (reasoning, rest) = match body.find(CLOSE) {
            Some(i) => (&body[..i], body[i + CLOSE.len()..].trim_start()),
            None => (body, ""),
        };
        let reasoning = reasoning.trim();
        ((!reasoning.is_empty()).then(|| reasoning.to_owned()), rest)
    }

    /// A streaming splitter with the same rules.
    pub fn stream(&self) -> ReasoningStream {
        ReasoningStream {
            started: self.started_in_reasoning,
            text: String::new(),
            cursor: 0,
            state: State::Opening,
            reasoning_started: false,
            content_started: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet known whether the output opens with `<think>`.
    Opening,
    Reasoning,
    /// No reasoning at all: everything is content, verbatim.
    Plain,
    /// After `</think>`: content, leading whitespace dropped.
    After,
}

/// Incremental [`ReasoningParser`]: yields `Reasoning` and `Content` events.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    started: bool,
    text: String,
    /// Bytes of `text` already turned into events (or dropped).
    cursor: usize,
    state: State,
    reasoning_started: bool,
    content_started: bool,
}

impl ReasoningStream {
    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> Vec<DeltaEvent> {
        self.text.push_str(delta);
        let mut out = Vec::new();
        self.advance(&mut out, false);
        out
    }

    /// Ends the text; flushes what was held back.
    pub fn finish(&mut self) -> Vec<DeltaEvent> {
        let mut out = Vec::new();
        self.advance(&mut out, true);
        out
    }

    fn advance(&mut self, out: &mut Vec<DeltaEvent>, end: bool) {
        if self.state == State::Opening {
            let lead = self.text.len() - self.text.trim_start().len();
            let rest = &self.text[lead..];
            if rest.starts_with(OPEN) {
                self.state = State::Reasoning;
                self.cursor = lead + OPEN.len();
            } else if !end && OPEN.starts_with(rest) {
                return;
            } else if self.started {
                self.state = State::Reasoning;
                self.cursor = lead;
            } else {
                self.state = State::Plain;
            }
        }
        match self.state {
            State::Opening => {}
            State::Reasoning => {
                let (upto, closed) = match scan_markers(&self.text, self.cursor, &[CLOSE]) {
                    Scan::Start(p) => (p, true),
                    Scan::Partial(p) if !end => (p, false),
                    _ => (self.text.len(), false),
                };
                self.emit_reasoning(upto, closed || end, out);
                if closed {
                    self.cursor = upto + CLOSE.len();
                    self.state = State::After;
                    self.advance(out, end);
                }
            }
            State::Plain | State::After => {
                let mut piece = &self.text[self.cursor..];
                if self.state == State::After && !self.content_started {
                    piece = piece.trim_start();
                }
                if !piece.is_empty() {
                    self.content_started = true;
                    out.push(DeltaEvent::Content(piece.to_owned()));
                }
                self.cursor = self.text.len();
            }
        }
    }

    /// Emits reasoning text in `cursor..upto`: leading whitespace of the
    /// reasoning dropped, trailing whitespace held (dropped if `last`).
    fn emit_reasoning(&mut self, upto: usize, last: bool, out: &mut Vec<DeltaEvent>) {
        let mut start = self.cursor;
        if !self.reasoning_started {
            let seg = &self.text[start..upto];
            start = upto - seg.trim_start().len();
            self.cursor = start;
        }
        let seg = &self.text[start..upto];
        let keep = seg.trim_end();
        if !keep.is_empty() {
            self.reasoning_started = true;
            out.push(DeltaEvent::Reasoning(keep.to_owned()));
            self.cursor = start + keep.len();
        }
        if last {
            self.cursor = upto;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str, started: bool) -> (Option<String>, String) {
        let (r, c) = ReasoningParser::new(started).split(text);
        (r, c.to_owned())
    }

    #[test]
    fn full_splits() {
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(
            split("<think>\nLet me think.\n</think>\n\nThe answer.", false),
            (s("Let me think."), "The answer.".into())
        );
        assert_eq!(
            split("Let me think.\n</think>\n\nAnswer", true),
            (s("Let me think."), "Answer".into())
        );
        assert_eq!(
            split("<think>\nstill going", false),
            (s("still going"), String::new())
        );
        assert_eq!(
            split("still going", true),
            (s("still going"), String::new())
        );
        assert_eq!(
            split("No reasoning </think> here", false),
            (None, "No reasoning </think> here".into())
        );
        assert_eq!(
            split("<think>\n\n</think>\n\nHi", false),
            (None, "Hi".into())
        );
        assert_eq!(
            split("  x <think> y", false),
            (None, "  x <think> y".into())
        );
    }

    #[test]
    fn prompt_detection() {
        assert!(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens_reasoning("<|im_start|>assistant\n"));
    }
}
