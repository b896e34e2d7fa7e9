//! Sampled Harmony ids → the OpenAI assistant message, as deltas: the
//! crate's `StreamableParser` reads the ids; `analysis` text is reasoning,
//! `final` and recipient-less `commentary` text is content, and a message
//! to `functions.NAME` is a tool call, sent whole when its `<|call|>` ends
//! it (its arguments are the message's text, as the model wrote them).
//!
//! The full parse is this stream run over all ids, so the two agree by
//! construction. Output the crate cannot parse is never an error: from the
//! failing id on, the decoded text is content and the outcome says why.

use openai_harmony::chat::{Message, Role};
use openai_harmony::{HarmonyEncoding, StreamableParser};

use crate::parse::{ChatOutput, DeltaEvent, EventAssembler, IdGen, ParseContext, ParseOutcome};

/// One choice's Harmony ids, parsed as they arrive.
pub struct HarmonyStream {
    enc: HarmonyEncoding,
    parser: Option<StreamableParser>,
    ctx: ParseContext,
    ids: IdGen,
    assembled: EventAssembler,
    /// Messages of the parser already turned into events.
    seen: usize,
    calls: usize,
    /// Why the output is not (all) well-formed Harmony.
    malformed: Option<String>,
    /// Ids from the one the parser refused on: content, decoded at the end.
    rest: Vec<u32>,
    /// The message that last gave reasoning / content text: text from a
    /// later message starts on a new line, as vLLM joins them.
    last_reasoning: Option<usize>,
    last_content: Option<usize>,
    finished: bool,
}

impl std::fmt::Debug for HarmonyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarmonyStream")
            .field("calls", &self.calls)
            .field("malformed", &self.malformed)
            .finish()
    }
}

/// Where a message's text goes.
enum Part {
    Reasoning,
    Content,
    /// A tool call to this function.
    Call(String),
}

/// The function a recipient names, as vLLM's chat serving reads it:
/// `functions.NAME`, or a bare name that is not a built-in tool.
fn function_of(recipient: &str) -> Option<String> {
    if let Some(name) = recipient.strip_prefix("functions.") {
        return (!name.is_empty()).then(|| name.to_owned());
    }
    let builtin =
        ["python", "browser", "container"].contains(&recipient.split('.').next().unwrap_or(""));
    let special = recipient.starts_with("<|") || recipient == "assistant";
    (!recipient.is_empty() && !builtin && !special).then(|| recipient.to_owned())
}

fn part_of(channel: Option<&str>, recipient: Option<&str>) -> Part {
    if let Some(name) = recipient.and_then(function_of) {
        return Part::Call(name);
    }
    match channel {
        Some("analysis") => Part::Reasoning,
        _ => Part::Content,
    }
}

impl HarmonyStream {
    pub fn new(enc: &HarmonyEncoding, ctx: ParseContext, ids: IdGen) -> Self {
        let (parser, malformed) = match StreamableParser::new(enc.clone(), Some(Role::Assistant)) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(format!("harmony parser: {e:#}"))),
        };
        HarmonyStream {
            enc: enc.clone(),
            parser,
            ctx,
            ids,
            assembled: EventAssembler::default(),
            seen: 0,
            calls: 0,
            malformed,
            rest: Vec::new(),
            last_reasoning: None,
            last_content: None,
            finished: false,
        }
    }

    /// Feeds sampled ids; returns the events to send now.
    pub fn push(&mut self, ids: &[u32]) -> Vec<DeltaEvent> {
        let mut out = Vec::new();
        for &id in ids {
            if self.finished {
                break;
            }
            let Some(parser) = self.parser.as_mut() else {
                self.rest.push(id);
                continue;
            };
            if let Err(e) = parser.process(id) {
                self.fail(format!("{e:#}"), id);
                continue;
            }
            let delta = parser.last_content_delta().ok().flatten();
            if let Some(d) = delta.filter(|d| !d.is_empty()) {
                let channel = parser.current_channel();
                let recipient = parser.current_recipient();
                let message = parser.messages().len();
                let joined = |last: &mut Option<usize>, d: String| {
                    let first_of_later = last.is_some_and(|m| m != message);
                    *last = Some(message);
                    if first_of_later {
                        format!("\n{d}")
                    } else {
                        d
                    }
                };
                match part_of(channel.as_deref(), recipient.as_deref()) {
                    Part::Reasoning => {
                        out.push(DeltaEvent::Reasoning(joined(&mut self.last_reasoning, d)))
                    }
                    Part::Content => {
                        out.push(DeltaEvent::Content(joined(&mut self.last_content, d)))
                    }
                    Part::Call(_) => {} // sent whole when the message ends
                }
            }
            self.completed(&mut out);
        }
        self.sent(out)
    }

    /// Ends the ids; returns the last events.
    pub fn finish(&mut self) -> Vec<DeltaEvent> {
        if self.finished {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Some(parser) = self.parser.as_mut() {
            if let Err(e) = parser.process_eos() {
                self.malformed = Some(format!("{e:#}"));
            }
            self.completed(&mut out);
        }
        if !self.rest.is_empty() {
            let bytes = self
                .enc
                .tokenizer()
                .decode_bytes(&self.rest)
                .unwrap_or_default();
            out.push(DeltaEvent::Content(
                String::from_utf8_lossy(&bytes).into_owned(),
            ));
        }
        self.finished = true;
        self.sent(out)
    }

    /// The parser refused `id`: it and every later id become content.
    fn fail(&mut self, why: String, id: u32) {
        self.malformed = Some(why);
        self.parser = None;
        self.rest.push(id);
    }

    /// Events for the messages the parser completed since the last look.
    fn completed(&mut self, out: &mut Vec<DeltaEvent>) {
        let Some(parser) = self.parser.as_ref() else {
            return;
        };
        let done: Vec<Message> = parser
            .messages()
            .get(self.seen..)
            .unwrap_or_default()
            .to_vec();
        self.seen += done.len();
        for m in done {
            let Part::Call(name) = part_of(m.channel.as_deref(), m.recipient.as_deref()) else {
                continue;
            };
            let arguments = text_of(&m);
            let known = self
                .ctx
                .tool_names
                .as_ref()
                .is_none_or(|names| names.contains(&name));
            if !known {
                self.malformed = Some(format!("unknown function name '{name}'"));
                out.push(DeltaEvent::Content(arguments));
                continue;
            }
            let index = self.calls;
            self.calls += 1;
            out.push(DeltaEvent::ToolCallStart {
                index,
                id: self.ids.next_id(),
                name,
            });
            out.push(DeltaEvent::ToolCallArguments { index, arguments });
        }
    }

    fn sent(&mut self, mut out: Vec<DeltaEvent>) -> Vec<DeltaEvent> {
        out.retain(
            |ev| !matches!(ev, DeltaEvent::Content(s) | DeltaEvent::Reasoning(s) if s.is_empty()),
        );
        for ev in &out {
            self.assembled.push(ev);
        }
        out
    }

    /// Calls when any were sent; else malformed when something was; else none.
    pub fn outcome(&self) -> ParseOutcome {
        match (&self.malformed, self.calls) {
            (_, n) if n > 0 => ParseOutcome::Calls(n),
            (Some(why), _) => ParseOutcome::Malformed(format!("harmony: {why}")),
            (None, _) => ParseOutcome::NoCalls,
        }
    }

    /// The message assembled from every event sent so far.
    pub fn output(&self) -> ChatOutput {
        self.assembled.output(self.outcome())
    }

    /// The whole parse of `ids` (what the stream of the same ids assembles).
    pub fn parse(enc: &HarmonyEncoding, ids: &[u32], ctx: ParseContext, gen: IdGen) -> ChatOutput {
        let mut s = HarmonyStream::new(enc, ctx, gen);
        s.push(ids);
        s.finish();
        s.output()
    }
}

fn text_of(m: &Message) -> String {
    m.content
        .iter()
        .filter_map(|c| match c {
            openai_harmony::chat::Content::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect()
}
