//! Streaming: text deltas in, OpenAI-style [`DeltaEvent`]s out.
//!
//! Invariant (tested for every example at every split point and random
//! chunkings): the events of a stream, assembled by [`EventAssembler`],
//! equal the non-streamed [`parse_output`](super::parse_output) of the whole
//! text, tool-call ids included when both use equally seeded [`IdGen`]s.
//!
//! How [`ToolStream`] keeps it: text before the first tool-call start
//! marker is streamed as content at once, except trailing whitespace and a
//! tail that might be the start of a marker (held until resolved). From the
//! start marker on, everything is held back until [`ToolStream::finish`],
//! which runs the full parse on the whole text and emits the rest of the
//! content, then per call `ToolCallStart` (index, id, name) followed by
//! `ToolCallArguments` (the arguments text). A call is never emitted before
//! the end because later text can still make the whole output malformed
//! (an unterminated second call, an unknown name), and a malformed output
//! must be plain content with no calls. The cost is small in practice: a
//! tool-call turn ends right after its last call. Must not: emit anything
//! that a later delta could contradict.

use serde_json::{json, Value as Json};

use super::{
    parse_output, ChatOutput, IdGen, ParseContext, ParseOutcome, ParsedOutput, ReasoningParser,
    ReasoningStream, Scan, ToolCall, ToolParser,
};

/// One incremental piece of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeltaEvent {
    Reasoning(String),
    Content(String),
    /// First event of a call: its index, id and name (arguments follow).
    ToolCallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of a call's arguments text.
    ToolCallArguments {
        index: usize,
        arguments: String,
    },
}

impl DeltaEvent {
    /// The OpenAI `choices[i].delta` object for this event.
    pub fn to_openai_delta(&self) -> Json {
        match self {
            DeltaEvent::Reasoning(s) => json!({"reasoning_content": s}),
            DeltaEvent::Content(s) => json!({"content": s}),
            DeltaEvent::ToolCallStart { index, id, name } => json!({"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            DeltaEvent::ToolCallArguments { index, arguments } => json!({"tool_calls": [{
                "index": index, "function": {"arguments": arguments},
            }]}),
        }
    }
}

/// Incremental tool-call parsing for one completion.
#[derive(Debug)]
pub struct ToolStream {
    parser: Box<dyn ToolParser>,
    ctx: ParseContext,
    ids: IdGen,
    text: String,
    scan_from: usize,
    in_region: bool,
    /// Bytes of `text` emitted as content.
    emitted: usize,
    output: Option<ParsedOutput>,
}

impl ToolStream {
    pub fn new(parser: Box<dyn ToolParser>, ctx: ParseContext, ids: IdGen) -> Self {
        ToolStream {
            parser,
            ctx,
            ids,
            text: String::new(),
            scan_from: 0,
            in_region: false,
            emitted: 0,
            output: None,
        }
    }

    /// Feeds a text delta.
    pub fn push(&mut self, delta: &str) -> Vec<DeltaEvent> {
        self.text.push_str(delta);
        if self.in_region || self.output.is_some() {
            return Vec::new();
        }
        let safe = match self.parser.scan(&self.text, self.scan_from) {
            Scan::Start(p) => {
                self.in_region = true;
                p
            }
            Scan::Partial(p) => {
                self.scan_from = p;
                p
            }
            Scan::Clear => {
                self.scan_from = self.text.len();
                self.text.len()
            }
        };
        let safe = safe.max(self.emitted);
        let piece = self.text[self.emitted..safe].trim_end();
        if piece.is_empty() {
            return Vec::new();
        }
        self.emitted += piece.len();
        vec![DeltaEvent::Content(piece.to_owned())]
    }

    /// Ends the text: runs the full parse and emits everything held back.
    pub fn finish(&mut self) -> Vec<DeltaEvent> {
        if self.output.is_some() {
            return Vec::new();
        }
        let out = self.parser.parse(&self.text, &self.ctx, &mut self.ids);
        let mut events = Vec::new();
        let content = out.content.as_deref().unwrap_or("");
        let sent = &self.text[..self.emitted];
        debug_assert!(
            content.starts_with(sent),
            "streamed content is not a prefix"
        );
        if let Some(rest) = content.strip_prefix(sent).filter(|r| !r.is_empty()) {
            events.push(DeltaEvent::Content(rest.to_owned()));
        }
        for (index, call) in out.tool_calls.iter().enumerate() {
            events.push(DeltaEvent::ToolCallStart {
                index,
                id: call.id.clone(),
                name: call.name.clone(),
            });
            events.push(DeltaEvent::ToolCallArguments {
                index,
                arguments: call.arguments.clone(),
            });
        }
        self.output = Some(out);
        events
    }

    /// The full parse, once [`ToolStream::finish`] ran.
    pub fn output(&self) -> Option<&ParsedOutput> {
        self.output.as_ref()
    }
}

/// Accumulates [`DeltaEvent`]s into a message, as an OpenAI client would.
#[derive(Debug, Clone, Default)]
pub struct EventAssembler {
    reasoning: String,
    content: String,
    calls: Vec<ToolCall>,
}

impl EventAssembler {
    pub fn push(&mut self, ev: &DeltaEvent) {
        match ev {
            DeltaEvent::Reasoning(s) => self.reasoning.push_str(s),
            DeltaEvent::Content(s) => self.content.push_str(s),
            DeltaEvent::ToolCallStart { index, id, name } => {
                if self.calls.len() <= *index {
                    self.calls.resize(
                        index + 1,
                        ToolCall {
                            id: String::new(),
                            name: String::new(),
                            arguments: String::new(),
                        },
                    );
                }
                if let Some(c) = self.calls.get_mut(*index) {
                    c.id.clone_from(id);
                    c.name.clone_from(name);
                }
            }
            DeltaEvent::ToolCallArguments { index, arguments } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.arguments.push_str(arguments);
                }
            }
        }
    }

    /// The message so far (`outcome` is supplied by the caller).
    pub fn output(&self, outcome: ParseOutcome) -> ChatOutput {
        let opt = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        ChatOutput {
            reasoning_content: opt(&self.reasoning),
            content: opt(&self.content),
            tool_calls: self.calls.clone(),
            outcome,
        }
    }
}

/// Streaming counterpart of [`parse_output`]: reasoning, then tool calls on
/// the content part.
#[derive(Debug)]
pub struct ChatStream {
    reasoning: Option<ReasoningStream>,
    tools: Option<ToolStream>,
    assembled: EventAssembler,
    finished: bool,
}

impl ChatStream {
    pub fn new(
        reasoning: Option<&ReasoningParser>,
        tools: Option<Box<dyn ToolParser>>,
        ctx: ParseContext,
        ids: IdGen,
    ) -> Self {
        ChatStream {
            reasoning: reasoning.map(ReasoningParser::stream),
            tools: tools.map(|p| ToolStream::new(p, ctx, ids)),
            assembled: EventAssembler::default(),
            finished: false,
        }
    }

    /// Feeds a text delta; returns the events to send now.
    pub fn push(&mut self, delta: &str) -> Vec<DeltaEvent> {
        if self.finished || delta.is_empty() {
            return Vec::new();
        }
        let pieces = match self.reasoning.as_mut() {
            Some(r) => r.push(delta),
            None => vec![DeltaEvent::Content(delta.to_owned())],
        };
        self.route(pieces, false)
    }

    /// Ends the text; returns the last events. Call once.
    pub fn finish(&mut self) -> Vec<DeltaEvent> {
        if self.finished {
            return Vec::new();
        }
        let pieces = self
            .reasoning
            .as_mut()
            .map(ReasoningStream::finish)
            .unwrap_or_default();
        let events = self.route(pieces, true);
        self.finished = true;
        events
    }

    fn route(&mut self, pieces: Vec<DeltaEvent>, end: bool) -> Vec<DeltaEvent> {
        let mut out = Vec::new();
        for piece in pieces {
            match (piece, self.tools.as_mut()) {
                (DeltaEvent::Content(c), Some(t)) => out.extend(t.push(&c)),
                (ev, _) => out.push(ev),
            }
        }
        if end {
            if let Some(t) = self.tools.as_mut() {
                out.extend(t.finish());
            }
        }
        out.retain(
            |ev| !matches!(ev, DeltaEvent::Content(s) | DeltaEvent::Reasoning(s) if s.is_empty()),
        );
        for ev in &out {
            self.assembled.push(ev);
        }
        out
    }

    /// The tool parser's outcome (`NoCalls` before `finish` or without one).
    pub fn outcome(&self) -> ParseOutcome {
        self.tools
            .as_ref()
            .and_then(ToolStream::output)
            .map(|o| o.outcome.clone())
            .unwrap_or(ParseOutcome::NoCalls)
    }

    /// The message assembled from every event sent so far; after `finish`
    /// it equals the non-streamed [`parse_output`] of the same text.
    pub fn output(&self) -> ChatOutput {
        self.assembled.output(self.outcome())
    }
}

/// Non-streamed and streamed parse of `chunks` (testing helper): returns
/// `(parse_output of the joined text, assembled stream output, events)`,
/// both with ids from `IdGen::seeded(seed, parser style)`.
pub fn compare_chunked(
    chunks: &[&str],
    reasoning: Option<&ReasoningParser>,
    tool_parser_name: &str,
    ctx: &ParseContext,
    seed: u64,
) -> (ChatOutput, ChatOutput, Vec<DeltaEvent>) {
    let text: String = chunks.concat();
    let make = || super::tool_parser(tool_parser_name).ok().flatten();
    let style = make()
        .map(|p| p.id_style())
        .unwrap_or(super::IdStyle::OpenAi);
    let full_parser = make();
    let full = parse_output(
        &text,
        reasoning,
        full_parser.as_deref(),
        ctx,
        &mut IdGen::seeded(seed, style),
    );
    let mut stream = ChatStream::new(reasoning, make(), ctx.clone(), IdGen::seeded(seed, style));
    let mut events = Vec::new();
    for c in chunks {
        events.extend(stream.push(c));
    }
    events.extend(stream.finish());
    (full, stream.output(), events)
}
