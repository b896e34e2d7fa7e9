//! The streaming driver shared by chat and completions: merges the choices'
//! event streams, turns each event into OpenAI chunks with an endpoint
//! specific formatter, and at the end (after the call is recorded) emits the
//! held-back finish chunks, the usage chunk and `data: [DONE]`.
//!
//! Finish chunks are held until every choice is done and the call has been
//! handed to the recorder, so a client never sees the end of a response whose
//! span is not committed. Dropping the response (client disconnect) drops the
//! backend streams, which cancels them.

use std::convert::Infallible;
use std::pin::Pin;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use serde_json::Value as Json;

use super::generate::{ChoiceEvent, ChoiceResult};
use crate::error::ApiError;

pub type EventStream = Pin<Box<dyn Stream<Item = Result<ChoiceEvent, ApiError>> + Send>>;

/// A choice's events plus where it runs (backend name, sticky move).
pub struct ChoiceStream {
    pub events: EventStream,
    pub backend: String,
    pub moved_from: Option<String>,
}

impl ChoiceStream {
    pub fn new(
        renderer: std::sync::Arc<crate::render::Renderer>,
        started: super::generate::Started,
        plan: &super::generate::CallPlan,
    ) -> Self {
        let (backend, moved_from) = (started.backend.clone(), started.moved_from.clone());
        ChoiceStream {
            events: Box::pin(super::generate::choice_events(renderer, started, plan)),
            backend,
            moved_from,
        }
    }
}

/// Formats one event into zero or more chunks (finish reason excluded: the
/// driver holds finish events and formats them with `finish`).
pub type DeltaFormatter = Box<dyn FnMut(&ChoiceEvent) -> Vec<Json> + Send>;

/// Runs once every choice finished: records the call, returns the final chunks.
pub type Finalizer =
    Box<dyn FnOnce(Vec<ChoiceResult>) -> BoxFuture<'static, Result<Vec<Json>, ApiError>> + Send>;

pub struct StreamSpec {
    /// Chunks sent before any generated token (role deltas, prompt ids).
    pub initial: Vec<Json>,
    pub choices: Vec<ChoiceStream>,
    pub delta: DeltaFormatter,
    pub finalize: Finalizer,
    /// `stream_options.include_usage`: an empty-choices chunk to fill with
    /// `usage`, and the prompt tokens of the call.
    pub usage: Option<(Json, usize)>,
}

/// OpenAI `usage` object.
pub(super) fn usage(prompt: usize, completion: usize) -> Json {
    serde_json::json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn data(v: &Json) -> Event {
    Event::default().data(v.to_string())
}

pub fn sse_response(spec: StreamSpec, headers: axum::http::HeaderMap) -> Response {
    let StreamSpec {
        initial,
        choices,
        mut delta,
        finalize,
        usage: usage_chunk,
    } = spec;
    let mut results: Vec<ChoiceResult> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| ChoiceResult {
            index: i as u32,
            backend: c.backend.clone(),
            moved_from: c.moved_from.clone(),
            ..Default::default()
        })
        .collect();
    let merged = futures::stream::select_all(choices.into_iter().map(|c| c.events));
    let body = async_stream(move |tx| async move {
        for chunk in &initial {
            if tx.send(data(chunk)).await.is_err() {
                return;
            }
        }
        let mut merged = merged;
        while let Some(ev) = merged.next().await {
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    let _ = tx.send(data(&e.body())).await;
                    let _ = tx.send(Event::default().data("[DONE]")).await;
                    return;
                }
            };
            if let Some(r) = results.get_mut(ev.index as usize) {
                r.text.push_str(&ev.text);
                r.ids.extend_from_slice(&ev.ids);
                r.logprobs.extend_from_slice(&ev.logprobs);
                if ev.finish.is_some() {
                    r.finish = ev.finish;
                }
            }
            for chunk in delta(&ev) {
                if tx.send(data(&chunk)).await.is_err() {
                    return; // client gone: dropping `merged` cancels the backends
                }
            }
        }
        drop(merged);
        let completion: usize = results.iter().map(|r| r.ids.len()).sum();
        match finalize(results).await {
            Ok(mut chunks) => {
                if let Some((mut u, prompt)) = usage_chunk {
                    u["usage"] = usage(prompt, completion);
                    chunks.push(u);
                }
                for chunk in &chunks {
                    if tx.send(data(chunk)).await.is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(data(&e.body())).await;
            }
        }
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    let mut resp = Sse::new(body.map(Ok::<_, Infallible>))
        .keep_alive(KeepAlive::default())
        .into_response();
    resp.headers_mut().extend(headers);
    resp
}

/// A stream fed by a task; dropping the stream aborts the task.
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Event> + Send
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(32);
    let task = tokio::spawn(f(tx));
    crate::backend::AbortOnDrop::new(tokio_stream::wrappers::ReceiverStream::new(rx), task)
}
