//! The Messages event stream of a chat call, as Anthropic streams a
//! message: `message_start` (the message with no content), `ping`, then
//! per content block `content_block_start`, its deltas (`thinking_delta`
//! and, last, its `signature_delta`; `text_delta`; `input_json_delta`, the
//! tool call's arguments as sampled) and `content_block_stop`; then
//! `message_delta` (`stop_reason`, `stop_sequence`, `usage`) and
//! `message_stop`. Every event is named (`event:`): the `anthropic` SDK
//! drops unnamed ones. A failure after the stream began is an `error`
//! event in Anthropic's shape.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::stop_of;
use crate::api::stream::{Deltas, Encoder, Out};
use crate::call::{Answer, ChoiceEvent, ParseSetup};
use crate::error::ApiError;
use crate::parse::DeltaEvent;
use crate::surface::messages as wire;

/// The block being streamed.
enum Open {
    Thinking { index: usize, text: String },
    Text { index: usize },
    ToolUse { index: usize },
}

pub struct MessagesEncoder {
    model: String,
    stop_sequences: Arc<Vec<String>>,
    deltas: Deltas,
    id: String,
    input_tokens: usize,
    next_index: usize,
    open: Option<Open>,
}

impl MessagesEncoder {
    pub(super) fn new(
        model: String,
        stop_sequences: Arc<Vec<String>>,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> Self {
        MessagesEncoder {
            model,
            stop_sequences,
            deltas: Deltas::new(parsing, forced),
            id: String::new(),
            input_tokens: 0,
            next_index: 0,
            open: None,
        }
    }

    fn event(kind: &'static str, mut payload: Json, out: &mut Vec<Out>) {
        if let Some(obj) = payload.as_object_mut() {
            obj.insert("type".into(), json!(kind));
        }
        out.push(Out::named(kind, &payload));
    }

    fn start(&mut self, out: &mut Vec<Out>) {
        let message = json!({"id": self.id, "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}});
        Self::event("message_start", json!({"message": message}), out);
        Self::event("ping", json!({}), out);
    }

    fn begin(&mut self, block: Json, out: &mut Vec<Out>) -> usize {
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        Self::event(
            "content_block_start",
            json!({"index": index, "content_block": block}),
            out,
        );
        index
    }

    fn delta_event(index: usize, delta: Json, out: &mut Vec<Out>) {
        Self::event(
            "content_block_delta",
            json!({"index": index, "delta": delta}),
            out,
        );
    }

    /// Ends the open block; a thinking block gets its signature first.
    fn close(&mut self, out: &mut Vec<Out>) {
        let index = match self.open.take() {
            None => return,
            Some(Open::Thinking { index, text }) => {
                let signature = wire::signature(&self.id, &text);
                Self::delta_event(
                    index,
                    json!({"type": "signature_delta", "signature": signature}),
                    out,
                );
                index
            }
            Some(Open::Text { index }) | Some(Open::ToolUse { index }) => index,
        };
        Self::event("content_block_stop", json!({"index": index}), out);
    }

    fn push(&mut self, d: DeltaEvent, out: &mut Vec<Out>) {
        match d {
            DeltaEvent::Reasoning(s) => {
                if !matches!(self.open, Some(Open::Thinking { .. })) {
                    let block = json!({"type": "thinking", "thinking": "", "signature": ""});
                    let index = self.begin(block, out);
                    self.open = Some(Open::Thinking {
                        index,
                        text: String::new(),
                    });
                }
                if let Some(Open::Thinking { index, text }) = &mut self.open {
                    text.push_str(&s);
                    let index = *index;
                    Self::delta_event(index, json!({"type": "thinking_delta", "thinking": s}), out);
                }
            }
            DeltaEvent::Content(s) => {
                let index = match self.open {
                    Some(Open::Text { index }) => index,
                    _ => {
                        let index = self.begin(json!({"type": "text", "text": ""}), out);
                        self.open = Some(Open::Text { index });
                        index
                    }
                };
                Self::delta_event(index, json!({"type": "text_delta", "text": s}), out);
            }
            DeltaEvent::ToolCallStart { id, name, .. } => {
                let block = json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                let index = self.begin(block, out);
                self.open = Some(Open::ToolUse { index });
            }
            DeltaEvent::ToolCallArguments { arguments, .. } => {
                if let Some(Open::ToolUse { index }) = self.open {
                    Self::delta_event(
                        index,
                        json!({"type": "input_json_delta", "partial_json": arguments}),
                        out,
                    );
                }
            }
        }
    }

    /// The served message's blocks as events.
    fn served_blocks(&mut self, served: &Json, reasoning_and_text: bool, out: &mut Vec<Out>) {
        let text = |k: &str| {
            served
                .get(k)
                .and_then(Json::as_str)
                .filter(|s| !s.is_empty())
        };
        if reasoning_and_text {
            if let Some(r) = text("reasoning_content") {
                self.push(DeltaEvent::Reasoning(r.to_string()), out);
            }
            if let Some(t) = text("content") {
                self.push(DeltaEvent::Content(t.to_string()), out);
            }
        }
        for (index, c) in wire::tool_calls(served).into_iter().enumerate() {
            self.push(
                DeltaEvent::ToolCallStart {
                    index,
                    id: c.id.to_string(),
                    name: c.name.to_string(),
                },
                out,
            );
            self.push(
                DeltaEvent::ToolCallArguments {
                    index,
                    arguments: c.arguments.to_string(),
                },
                out,
            );
        }
    }

    fn finish(&mut self, answer: &Answer, out: &mut Vec<Out>) {
        self.close(out);
        let Some(choice) = answer.choices.first() else {
            return;
        };
        let (stop_reason, stop_sequence) = stop_of(choice, &self.stop_sequences);
        Self::event(
            "message_delta",
            json!({"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                   "usage": {"input_tokens": answer.prompt_tokens(),
                             "output_tokens": choice.ids.len()}}),
            out,
        );
        Self::event("message_stop", json!({}), out);
    }
}

impl Encoder for MessagesEncoder {
    fn open(&mut self, id: &str, prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out> {
        self.id = id.to_string();
        self.input_tokens = prompts.first().map_or(0, |p| p.len());
        self.deltas.open(n);
        let mut out = Vec::new();
        self.start(&mut out);
        out
    }

    fn delta(&mut self, _id: &str, ev: &ChoiceEvent) -> Vec<Out> {
        let mut out = Vec::new();
        for d in self.deltas.of(ev) {
            self.push(d, &mut out);
        }
        out
    }

    fn end(&mut self, answer: &Answer) -> Vec<Out> {
        let mut out = Vec::new();
        if self.deltas.forced() {
            if let Some(choice) = answer.choices.first() {
                let served = choice.served.clone();
                self.served_blocks(&served, false, &mut out);
            }
        }
        self.finish(answer, &mut out);
        out
    }

    fn replay(&mut self, answer: &Answer) -> Vec<Out> {
        self.id = answer.request_id.clone();
        self.input_tokens = answer.prompt_tokens();
        let mut out = Vec::new();
        self.start(&mut out);
        if let Some(choice) = answer.choices.first() {
            let served = choice.served.clone();
            self.served_blocks(&served, true, &mut out);
        }
        self.finish(answer, &mut out);
        out
    }

    fn error(&mut self, e: &ApiError) -> Vec<Out> {
        let mut out = Vec::new();
        Self::event("error", e.anthropic_body(), &mut out);
        out
    }

    fn done(&self) -> Option<Out> {
        None
    }
}
