//! Reasoning parsers: the reasoning block becomes `reasoning_content`, the
//! rest `content`. Runs before the tool parser, which sees only the content
//! part. One [`ReasoningParser`] with a [`Mode`] per model family; the full
//! and the streamed parse share the rules below.
//!
//! Rules common to every mode:
//! - A leading `<think>` (after whitespace) is dropped and opens reasoning.
//!   `<think>` in mid-text is never a tag.
//! - Reasoning ends at the first end marker of the mode; with none, the
//!   whole rest is reasoning and there is no content.
//! - Reasoning is trimmed of surrounding whitespace; the content after the
//!   end loses its leading whitespace. Empty parts are `None`.
//!
//! Per mode (config `[model] reasoning_parser`):
//! - `think` (Qwen3 and alike): the output starts inside reasoning only if
//!   the prompt already opened `<think>` (`started_in_reasoning`, see
//!   [`prompt_opens_reasoning`]) or it begins with `<think>`; otherwise the
//!   whole text is content, verbatim (a stray `</think>` included).
//! - `glm45` (GLM-4.5 / 4.6): the same rules as `think`: the template does
//!   not open `<think>`, output without it is content (thinking disabled).
//! - `deepseek_r1`: the output always starts inside reasoning (the template
//!   opened `<think>`), whatever the prompt detection says.
//! - `kimi_k2` (Kimi K2-Thinking, K2.5): like `deepseek_r1`, and a tool-call
//!   section marker also ends reasoning; the marker stays in the content for
//!   the tool parser. The earliest end marker wins.
//!
//! Must not: look for tool calls, or treat `<think>` in mid-text as a tag.

use super::scan::{scan_markers, Scan};
use super::stream::DeltaEvent;

const OPEN: &str = "<think>";
/// The tag that ends reasoning.
pub const CLOSE: &str = "</think>";
/// Kimi K2 tool-call section starts (plural and singular spellings).
const KIMI_SECTIONS: [&str; 2] = [
    "<|tool_calls_section_begin|>",
    "<|tool_call_section_begin|>",
];
const THINK_ENDS: &[&str] = &[CLOSE];
const KIMI_ENDS: &[&str] = &[CLOSE, KIMI_SECTIONS[0], KIMI_SECTIONS[1]];

/// The model family a [`ReasoningParser`] follows (see the module rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Think,
    Glm45,
    DeepSeekR1,
    KimiK2,
}

impl Mode {
    fn ends(self) -> &'static [&'static str] {
        match self {
            Mode::KimiK2 => KIMI_ENDS,
            _ => THINK_ENDS,
        }
    }

    /// The end marker that `s` starts with, if any.
    fn end_at(self, s: &str) -> Option<&'static str> {
        self.ends().iter().copied().find(|m| s.starts_with(m))
    }

    /// Where the content starts, relative to an end marker found at 0.
    fn content_skip(marker: &str) -> usize {
        if marker == CLOSE {
            CLOSE.len()
        } else {
            0
        }
    }
}

/// True when the rendered prompt ends inside an opened `<think>` block
/// (e.g. Qwen3-Thinking-2507 or DeepSeek-R1-0528 generation prompts).
pub fn prompt_opens_reasoning(prompt_text: &str) -> bool {
    prompt_text.trim_end().ends_with(OPEN)
}

/// True when the rendered prompt ends with a closed `<think></think>`
/// block: the template switched thinking off (Qwen3's `enable_thinking:
/// false`, Kimi K2.5 without thinking), so the reply has no reasoning to
/// split, whatever the parser's mode.
pub fn prompt_closes_reasoning(prompt_text: &str) -> bool {
    prompt_text.trim_end().ends_with(CLOSE)
}

/// Splits reasoning from content (see the module rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParser {
    started_in_reasoning: bool,
    mode: Mode,
}

impl ReasoningParser {
    /// The `think` parser.
    pub fn new(started_in_reasoning: bool) -> Self {
        Self::with_mode(Mode::Think, started_in_reasoning)
    }

    /// The parser of a family; `started_in_reasoning` as for `think`.
    pub fn with_mode(mode: Mode, started_in_reasoning: bool) -> Self {
        let always = matches!(mode, Mode::DeepSeekR1 | Mode::KimiK2);
        ReasoningParser {
            started_in_reasoning: started_in_reasoning || always,
            mode,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// First end marker in `body`: its offset and the marker.
    fn find_end(&self, body: &str) -> Option<(usize, &'static str)> {
        self.mode
            .ends()
            .iter()
            .filter_map(|m| body.find(m).map(|i| (i, *m)))
            .min_by_key(|&(i, _)| i)
    }

    /// `(reasoning_content, content part)`.
    pub fn split<'a>(&self, text: &'a str) -> (Option<String>, &'a str) {
        let t = text.trim_start();
        let body = match t.strip_prefix(OPEN) {
            Some(b) => b,
            None if self.started_in_reasoning => t,
            None => return (None, text),
        };
        let (reasoning, rest) = match self.find_end(body) {
            Some((i, m)) => (&body[..i], body[i + Mode::content_skip(m)..].trim_start()),
            None => (body, ""),
        };
        let reasoning = reasoning.trim();
        ((!reasoning.is_empty()).then(|| reasoning.to_owned()), rest)
    }

    /// A streaming splitter with the same rules.
    pub fn stream(&self) -> ReasoningStream {
        ReasoningStream {
            started: self.started_in_reasoning,
            mode: self.mode,
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
    mode: Mode,
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
                let ends = self.mode.ends();
                let (upto, closed) = match scan_markers(&self.text, self.cursor, ends) {
                    Scan::Start(p) => (p, self.mode.end_at(&self.text[p..])),
                    Scan::Partial(p) if !end => (p, None),
                    _ => (self.text.len(), None),
                };
                self.emit_reasoning(upto, closed.is_some() || end, out);
                if let Some(marker) = closed {
                    self.cursor = upto + Mode::content_skip(marker);
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
    fn split_mode(mode: Mode, text: &str, started: bool) -> (Option<String>, String) {
        let (r, c) = ReasoningParser::with_mode(mode, started).split(text);
        (r, c.to_owned())
    }

    fn some(x: &str) -> Option<String> {
        Some(x.to_owned())
    }

    #[test]
    fn deepseek_r1_starts_inside_reasoning() {
        let r1 = |t: &str| split_mode(Mode::DeepSeekR1, t, false);
        // The template opened <think>: no opening tag in the output.
        assert_eq!(
            r1("Let me think.\n</think>\n\nThe answer."),
            (some("Let me think."), "The answer.".into())
        );
        // A leading <think> is still dropped.
        assert_eq!(
            r1("\n<think>\nStep.\n</think>\n\nOk"),
            (some("Step."), "Ok".into())
        );
        // No </think>: all reasoning, no content (vLLM extract_reasoning).
        assert_eq!(
            r1("Still thinking "),
            (some("Still thinking"), String::new())
        );
        assert_eq!(r1("<think>\nnot done"), (some("not done"), String::new()));
        // Stray tags: a mid-text <think> is reasoning text, a second
        // </think> is content.
        assert_eq!(
            r1("a <think> b</think> c </think> d"),
            (some("a <think> b"), "c </think> d".into())
        );
        // Whitespace only.
        assert_eq!(r1(" \n </think>\n\n Hi "), (None, "Hi ".into()));
        assert_eq!(r1("   "), (None, String::new()));
        assert_eq!(r1(""), (None, String::new()));
        // The prompt flag changes nothing.
        assert_eq!(
            split_mode(Mode::DeepSeekR1, "x</think>y", true),
            r1("x</think>y")
        );
    }

    #[test]
    fn glm45_needs_an_opening_tag() {
        let glm = |t: &str, started: bool| split_mode(Mode::Glm45, t, started);
        // GLM-4.5 writes "\n<think>...</think>\n<answer>".
        assert_eq!(
            glm("\n<think>Plan it.</think>\nThe answer.", false),
            (some("Plan it."), "The answer.".into())
        );
        // No <think>: content verbatim (thinking disabled, vLLM glm45).
        assert_eq!(
            glm("Plain answer </think> kept\n", false),
            (None, "Plain answer </think> kept\n".into())
        );
        // A prompt that opened <think> (GLM-4.7 style) starts inside it.
        assert_eq!(
            glm("Plan.</think>Answer", true),
            (some("Plan."), "Answer".into())
        );
        // Unterminated: all reasoning.
        assert_eq!(
            glm("<think>\ncut off", false),
            (some("cut off"), String::new())
        );
        // Mid-text tags are text.
        assert_eq!(
            glm("x <think>y</think> z", false),
            (None, "x <think>y</think> z".into())
        );
        assert_eq!(
            glm("<think>a <think> b</think>\n\nc </think>", false),
            (some("a <think> b"), "c </think>".into())
        );
        assert_eq!(glm("<think>\n\n</think>\n\n", false), (None, String::new()));
    }

    #[test]
    fn kimi_k2_ends_at_a_tool_section() {
        let kimi = |t: &str| split_mode(Mode::KimiK2, t, false);
        assert_eq!(
            kimi("<think>Plan.</think>\nAnswer"),
            (some("Plan."), "Answer".into())
        );
        assert_eq!(
            kimi("Plan.</think>Answer"),
            (some("Plan."), "Answer".into())
        );
        // A tool-call section ends reasoning and stays in the content.
        let sec = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0";
        assert_eq!(
            kimi(&format!("<think>Need f. {sec}")),
            (some("Need f."), sec.into())
        );
        let singular = "<|tool_call_section_begin|>x";
        assert_eq!(
            kimi(&format!("Need f.\n{singular}")),
            (some("Need f."), singular.into())
        );
        // The earliest marker wins: a later </think> is content.
        assert_eq!(
            kimi(&format!("r {sec} </think> c")),
            (some("r"), format!("{sec} </think> c"))
        );
        // After </think>, a section is content.
        assert_eq!(
            kimi(&format!("r</think>c{sec}")),
            (some("r"), format!("c{sec}"))
        );
        // A section with no reasoning before it.
        assert_eq!(kimi(sec), (None, sec.into()));
        // Unterminated: all reasoning.
        assert_eq!(kimi("<think>going"), (some("going"), String::new()));
        // Stray tags inside reasoning are text.
        assert_eq!(
            kimi("a <think> <|tool_calls b</think>"),
            (some("a <think> <|tool_calls b"), String::new())
        );
        assert_eq!(kimi("  \n "), (None, String::new()));
    }

    #[test]
    fn think_ignores_kimi_markers() {
        let sec = "<|tool_calls_section_begin|>";
        assert_eq!(
            split(&format!("<think>r {sec} x"), false),
            (Some(format!("r {sec} x")), String::new())
        );
        assert_eq!(ReasoningParser::new(false).mode(), Mode::Think);
    }
}
