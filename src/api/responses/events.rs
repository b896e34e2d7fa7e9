//! The Responses event stream of a chat call (`ResponseStreamEvent` in
//! `shared/openai/openapi.yaml`): `response.created` and
//! `response.in_progress`, then for each output item `output_item.added`,
//! its content (`content_part.added`, `output_text.delta` or
//! `reasoning_text.delta` and their `.done`, `content_part.done`; for a
//! function call `function_call_arguments.delta` / `.done`) and
//! `output_item.done`; then `response.completed`, `response.incomplete`
//! (the output was cut at `max_output_tokens`) or `response.failed`.
//! `sequence_number` counts every event from 0; no `[DONE]` follows. An
//! item added starts empty (`content: []`, `arguments: ""`), as the OpenAI
//! SDK's stream helper, which appends every delta to it, requires.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::{outcome_of, text_logprobs, Shape};
use crate::api::stream::{Deltas, Encoder, Out};
use crate::call::{Answer, ChoiceEvent, ParseSetup};
use crate::error::ApiError;
use crate::parse::DeltaEvent;
use crate::render::Renderer;
use crate::surface::responses::output::{self, Head};

/// The item being streamed.
enum Open {
    Reasoning {
        index: usize,
        text: String,
    },
    Message {
        index: usize,
        text: String,
        logprobs: Vec<Json>,
    },
    Call {
        index: usize,
        n: usize,
        call: Json,
    },
}

pub struct ResponsesEncoder {
    renderer: Arc<Renderer>,
    request: Arc<Json>,
    model: String,
    created_at: i64,
    shape: Shape,
    deltas: Deltas,
    /// The response id (known at `open`).
    id: String,
    seq: u64,
    next_index: usize,
    open: Option<Open>,
    /// Function calls streamed so far.
    calls: usize,
}

impl ResponsesEncoder {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        renderer: Arc<Renderer>,
        request: Arc<Json>,
        model: String,
        created_at: i64,
        logprobs: bool,
        token_ids: bool,
        parsing: Option<Arc<ParseSetup>>,
        forced: bool,
    ) -> Self {
        ResponsesEncoder {
            renderer,
            request,
            model,
            created_at,
            shape: Shape {
                logprobs,
                token_ids,
            },
            deltas: Deltas::new(parsing, forced),
            id: String::new(),
            seq: 0,
            next_index: 0,
            open: None,
            calls: 0,
        }
    }

    fn head(&self) -> Head<'_> {
        Head {
            id: &self.id,
            created_at: self.created_at,
            model: &self.model,
            request: &self.request,
        }
    }

    /// One event: its `type` and `sequence_number` added to `payload`.
    fn event(&mut self, kind: &'static str, mut payload: Json, out: &mut Vec<Out>) {
        if let Some(obj) = payload.as_object_mut() {
            obj.insert("type".into(), json!(kind));
            obj.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        out.push(Out::named(kind, &payload));
    }

    fn start(&mut self, out: &mut Vec<Out>) {
        let snapshot = output::in_progress(&self.head());
        self.event("response.created", json!({"response": snapshot}), out);
        let snapshot = output::in_progress(&self.head());
        self.event("response.in_progress", json!({"response": snapshot}), out);
    }

    /// Opens a reasoning or message item unless one of its kind is open.
    fn ensure(&mut self, reasoning: bool, out: &mut Vec<Out>) {
        let open_kind = match &self.open {
            Some(Open::Reasoning { .. }) => Some(true),
            Some(Open::Message { .. }) => Some(false),
            _ => None,
        };
        if open_kind == Some(reasoning) {
            return;
        }
        self.close("completed", out);
        let index = self.next_index;
        self.next_index += 1;
        let (item, part, item_id) = if reasoning {
            let item = json!({"type": "reasoning", "id": output::reasoning_id(&self.id),
                "summary": [], "content": [], "encrypted_content": null, "status": "in_progress"});
            let part = json!({"type": "reasoning_text", "text": ""});
            (item, part, output::reasoning_id(&self.id))
        } else {
            let item = json!({"type": "message", "id": output::message_id(&self.id),
                "role": "assistant", "status": "in_progress", "content": []});
            (
                item,
                output::text_part("", Vec::new()),
                output::message_id(&self.id),
            )
        };
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
            out,
        );
        self.open = Some(if reasoning {
            Open::Reasoning {
                index,
                text: String::new(),
            }
        } else {
            Open::Message {
                index,
                text: String::new(),
                logprobs: Vec::new(),
            }
        });
    }

    /// Opens a function-call item for the served or streamed call `call`
    /// (`{id, function: {name}}`).
    fn open_call(&mut self, id: &str, name: &str, out: &mut Vec<Out>) {
        self.close("completed", out);
        let index = self.next_index;
        self.next_index += 1;
        let n = self.calls;
        self.calls += 1;
        let call = json!({"id": id, "type": "function",
            "function": {"name": name, "arguments": ""}});
        let mut item = output::call_item(&self.id, n, &call, "in_progress");
        item["arguments"] = json!("");
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.open = Some(Open::Call { index, n, call });
    }

    fn arguments(&mut self, piece: &str, out: &mut Vec<Out>) {
        let Some(Open::Call { index, n, call }) = &mut self.open else {
            return;
        };
        if let Some(Json::String(args)) = call.pointer_mut("/function/arguments") {
            args.push_str(piece);
        }
        let (index, item_id) = (*index, output::call_item_id(&self.id, *n));
        self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": piece}),
            out,
        );
    }

    /// Ends the open item with `status`.
    fn close(&mut self, status: &str, out: &mut Vec<Out>) {
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { index, text }) => {
                let item_id = output::reasoning_id(&self.id);
                let part = json!({"type": "reasoning_text", "text": text});
                self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text}),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                    out,
                );
                let item = output::reasoning_item(&self.id, &text, status);
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
            }
            Some(Open::Message {
                index,
                text,
                logprobs,
            }) => {
                let item_id = output::message_id(&self.id);
                let done_lps: Vec<Json> = logprobs.iter().map(without_bytes).collect();
                self.event(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                           "text": text, "logprobs": done_lps}),
                    out,
                );
                let part = output::text_part(&text, logprobs.clone());
                self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": part}),
                    out,
                );
                let item = output::message_item(&self.id, &text, logprobs, status);
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
            }
            Some(Open::Call { index, n, call }) => {
                let item = output::call_item(&self.id, n, &call, status);
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": item["id"], "output_index": index,
                           "name": item["name"], "arguments": item["arguments"]}),
                    out,
                );
                self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
            }
        }
    }

    /// The events of one parsed delta; `logprobs`: the event's tokens'
    /// logprobs, given with its first text delta.
    fn push(&mut self, d: DeltaEvent, logprobs: &mut Option<Vec<Json>>, out: &mut Vec<Out>) {
        match d {
            DeltaEvent::Reasoning(s) => {
                self.ensure(true, out);
                let Some(Open::Reasoning { index, text }) = &mut self.open else {
                    return;
                };
                text.push_str(&s);
                let (index, item_id) = (*index, output::reasoning_id(&self.id));
                self.event(
                    "response.reasoning_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": s}),
                    out,
                );
            }
            DeltaEvent::Content(s) => {
                self.ensure(false, out);
                let lps = logprobs.take().unwrap_or_default();
                let Some(Open::Message {
                    index,
                    text,
                    logprobs: all,
                }) = &mut self.open
                else {
                    return;
                };
                text.push_str(&s);
                all.extend(lps.iter().cloned());
                let stream_lps: Vec<Json> = lps.iter().map(without_bytes).collect();
                let (index, item_id) = (*index, output::message_id(&self.id));
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                           "delta": s, "logprobs": stream_lps}),
                    out,
                );
            }
            DeltaEvent::ToolCallStart { id, name, .. } => self.open_call(&id, &name, out),
            DeltaEvent::ToolCallArguments { arguments, .. } => self.arguments(&arguments, out),
        }
    }

    /// The served message's items as events (a forced tool call's calls,
    /// or a whole recorded answer).
    fn served_items(&mut self, served: &Json, logprobs: Option<Vec<Json>>, out: &mut Vec<Out>) {
        let p = output::parts(served);
        if let Some(r) = p.reasoning {
            self.push(DeltaEvent::Reasoning(r.to_string()), &mut None, out);
        }
        if let Some(t) = p.text {
            self.push(
                DeltaEvent::Content(t.to_string()),
                &mut logprobs.clone(),
                out,
            );
        }
        for c in p.calls {
            let f = c.get("function").unwrap_or(&Json::Null);
            let id = c.get("id").and_then(Json::as_str).unwrap_or_default();
            let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
            self.open_call(id, name, out);
            let args = f
                .get("arguments")
                .and_then(Json::as_str)
                .unwrap_or_default();
            self.arguments(args, out);
        }
    }

    /// The last events: the open item closed, then the finished response.
    fn finish(&mut self, answer: &Answer, out: &mut Vec<Out>) {
        let o = match outcome_of(
            &self.renderer,
            answer,
            self.shape,
            crate::api::unix_now() as i64,
        ) {
            Ok(o) => o,
            Err(e) => {
                out.extend(self.error(&e));
                return;
            }
        };
        self.close(output::item_status(o.finish_reason), out);
        let response = output::finished(&self.head(), &o);
        let kind = match response.get("status").and_then(Json::as_str) {
            Some("incomplete") => "response.incomplete",
            Some("failed") => "response.failed",
            _ => "response.completed",
        };
        self.event(kind, json!({"response": response}), out);
    }
}

/// A `LogProb` as the stream gives it: without the tokens' bytes.
fn without_bytes(lp: &Json) -> Json {
    let mut lp = lp.clone();
    if let Some(obj) = lp.as_object_mut() {
        obj.remove("bytes");
        if let Some(Json::Array(top)) = obj.get_mut("top_logprobs") {
            for t in top {
                if let Some(t) = t.as_object_mut() {
                    t.remove("bytes");
                }
            }
        }
    }
    lp
}

impl Encoder for ResponsesEncoder {
    fn open(&mut self, id: &str, _prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out> {
        self.id = id.to_string();
        self.deltas.open(n);
        let mut out = Vec::new();
        self.start(&mut out);
        out
    }

    fn delta(&mut self, _id: &str, ev: &ChoiceEvent) -> Vec<Out> {
        let mut logprobs = self
            .shape
            .logprobs
            .then(|| text_logprobs(&self.renderer, &ev.ids, &ev.logprobs, true));
        let mut out = Vec::new();
        for d in self.deltas.of(ev) {
            self.push(d, &mut logprobs, &mut out);
        }
        out
    }

    fn end(&mut self, answer: &Answer) -> Vec<Out> {
        let mut out = Vec::new();
        if self.deltas.forced() {
            if let Some(choice) = answer.choices.first() {
                let served = choice.served.clone();
                let calls = json!({"tool_calls": served.get("tool_calls")});
                self.served_items(&calls, None, &mut out);
            }
        }
        self.finish(answer, &mut out);
        out
    }

    fn replay(&mut self, answer: &Answer) -> Vec<Out> {
        self.id = answer.request_id.clone();
        let mut out = Vec::new();
        self.start(&mut out);
        if let Some(choice) = answer.choices.first() {
            let logprobs = self
                .shape
                .logprobs
                .then(|| text_logprobs(&self.renderer, &choice.ids, &choice.logprobs, true));
            let served = choice.served.clone();
            self.served_items(&served, logprobs, &mut out);
        }
        self.finish(answer, &mut out);
        out
    }

    /// A failure after the stream began: `response.failed`, with the error
    /// as OpenAI codes it.
    fn error(&mut self, e: &ApiError) -> Vec<Out> {
        let code = match e.status.as_u16() {
            429 => "rate_limit_exceeded",
            400..=499 => "invalid_prompt",
            _ => "server_error",
        };
        let response = output::failed(&self.head(), code, &e.message);
        let mut out = Vec::new();
        self.event("response.failed", json!({"response": response}), &mut out);
        out
    }

    fn done(&self) -> Option<Out> {
        None
    }
}
