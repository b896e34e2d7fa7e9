//! The one loop that streams a call to its client, for every API surface.
//! A surface supplies an [`Encoder`]: how the call's opening, each backend
//! delta, its recorded end and a failure read as that surface's SSE events.
//! The loop sends them in order and ends the stream only once the call is
//! recorded, so a client never sees the end of an answer that is not in
//! the store. A recorded answer given again (a retry) streams through the
//! same encoder.

use std::sync::Arc;

use serde_json::Value as Json;

use super::sse::{Gone, SseSender};
use crate::call::served::ChoiceStream;
use crate::call::{Answer, CallEvent, ChoiceEvent, ParseSetup, Running};
use crate::error::ApiError;
use crate::parse::DeltaEvent;

/// One SSE event: an optional `event:` name and its `data:` text.
pub struct Out {
    pub event: Option<&'static str>,
    pub data: String,
}

impl Out {
    /// A `data:` line holding `v`.
    pub fn json(v: &Json) -> Out {
        Out {
            event: None,
            data: v.to_string(),
        }
    }

    /// An `event: name` with `v` as its data.
    pub fn named(name: &'static str, v: &Json) -> Out {
        Out {
            event: Some(name),
            data: v.to_string(),
        }
    }

    /// OpenAI's end of stream: `data: [DONE]`.
    pub fn done() -> Out {
        Out {
            event: None,
            data: "[DONE]".into(),
        }
    }
}

/// How one surface writes a call as a stream.
pub trait Encoder: Send + 'static {
    /// Before any delta: `n` choices for each of `prompts`, under the
    /// response id `id`.
    fn open(&mut self, id: &str, prompts: &[Arc<Vec<u32>>], n: u32) -> Vec<Out>;
    /// One delta of one choice.
    fn delta(&mut self, id: &str, ev: &ChoiceEvent) -> Vec<Out>;
    /// The call is recorded: finish events, usage.
    fn end(&mut self, answer: &Answer) -> Vec<Out>;
    /// A recorded answer as a whole stream (open, each choice's whole
    /// delta, end).
    fn replay(&mut self, answer: &Answer) -> Vec<Out>;
    /// The call failed after the stream began: OpenAI's error body.
    fn error(&mut self, e: &ApiError) -> Vec<Out> {
        vec![Out::json(&e.body())]
    }
    /// What closes every stream of this surface.
    fn done(&self) -> Option<Out> {
        Some(Out::done())
    }
}

/// Streams `running` through `enc` to `tx`; `route` and `trajectory` name
/// the call in the log line of a failure.
pub async fn run(
    mut running: Running,
    mut enc: impl Encoder,
    route: &'static str,
    trajectory: String,
    tx: SseSender,
) {
    let opening = enc.open(&running.request_id, &running.prompts, running.n);
    if send_all(&tx, opening).await.is_err() {
        return;
    }
    let id = running.request_id.clone();
    while let Some(ev) = running.next().await {
        let out = match ev {
            CallEvent::Delta(ev) => enc.delta(&id, &ev),
            CallEvent::Done(Ok(answer)) => enc.end(&answer),
            CallEvent::Done(Err(e)) => {
                if e.status.is_server_error() {
                    tracing::error!(route, trajectory = %trajectory, status = %e.status,
                        cause = %e.message, "stream failed");
                }
                let out = enc.error(&e);
                let _ = finish(&tx, out, enc.done()).await;
                return;
            }
        };
        if send_all(&tx, out).await.is_err() {
            return;
        }
    }
    let _ = finish(&tx, Vec::new(), enc.done()).await;
}

/// A recorded answer, streamed again through `enc`.
pub async fn replay(answer: Arc<Answer>, mut enc: impl Encoder, tx: SseSender) {
    let out = enc.replay(&answer);
    let _ = finish(&tx, out, enc.done()).await;
}

async fn send_all(tx: &SseSender, out: Vec<Out>) -> Result<(), Gone> {
    for o in &out {
        tx.send_out(o).await?;
    }
    Ok(())
}

/// Sends `out`, then the surface's closing event, if it has one.
async fn finish(tx: &SseSender, out: Vec<Out>, done: Option<Out>) -> Result<(), Gone> {
    send_all(tx, out).await?;
    match done {
        Some(done) => tx.send_out(&done).await,
        None => Ok(()),
    }
}

/// What each choice's deltas say, as the chat path parses them: through
/// the tool / reasoning parser when one applies, else the text as content
/// (none for a forced tool call, whose constrained JSON is no content).
pub struct Deltas {
    parsing: Option<Arc<ParseSetup>>,
    parsers: Vec<Option<ChoiceStream>>,
    forced: bool,
}

impl Deltas {
    pub fn new(parsing: Option<Arc<ParseSetup>>, forced: bool) -> Self {
        Deltas {
            parsing,
            parsers: Vec::new(),
            forced,
        }
    }

    /// Starts `n` choices.
    pub fn open(&mut self, n: u32) {
        self.parsers = (0..n)
            .map(|i| self.parsing.as_ref().map(|p| p.stream(i)))
            .collect();
    }

    /// The events of one delta (the parser's end with the choice's last).
    pub fn of(&mut self, ev: &ChoiceEvent) -> Vec<DeltaEvent> {
        match self
            .parsers
            .get_mut(ev.index as usize)
            .and_then(Option::as_mut)
        {
            Some(p) => {
                let mut events = p.push(&ev.text, &ev.ids);
                if ev.finish.is_some() {
                    events.extend(p.finish());
                }
                events
            }
            None if !ev.text.is_empty() && !self.forced => {
                vec![DeltaEvent::Content(ev.text.clone())]
            }
            None => Vec::new(),
        }
    }

    pub fn forced(&self) -> bool {
        self.forced
    }
}
