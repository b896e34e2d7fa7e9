//! One choice's assembly from backend events: exact ids and logprobs as the
//! backend sent them, text released incrementally (stop strings applied, see
//! [`crate::render::detok`]), and the finish reason. A backend that overshoots
//! `max_tokens` is cut here; a stop string ends the choice at the token that
//! completed it. A choice that stopped says why as vLLM does ([`StopReason`]).

use std::sync::Arc;

use crate::backend::{FinishReason, GenEvent, SamplingParams, TokenLogprob};
use crate::render::Renderer;

use crate::render::detok::TextAssembler;

/// A delta of one choice, as the endpoint formats it for the client.
#[derive(Debug, Clone, Default)]
pub struct ChoiceEvent {
    /// Global choice index (prompt index × n + choice, for completions).
    pub index: u32,
    pub text: String,
    pub ids: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
}

/// What ended a choice that finished with `stop`, as vLLM's `stop_reason`
/// gives it: the stop string that matched, or the `stop_token_ids` token
/// sampled last. A choice that ended on the model's EOS (or on length, or
/// aborted) has none: `null`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    Text(String),
    Token(u32),
}

/// A whole choice, collected, with what was served for it.
#[derive(Debug, Clone, Default)]
pub struct ChoiceResult {
    pub index: u32,
    pub text: String,
    pub ids: Vec<u32>,
    /// Aligned with `ids`.
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<FinishReason>,
    /// Why it stopped, when it finished with `stop` (see [`StopReason`]).
    pub stop_reason: Option<StopReason>,
    /// Backend name; empty when no backend was called (spent budget).
    pub backend: String,
    pub moved_from: Option<String>,
    /// The weights of that backend when the choice started.
    pub weight_version: Option<String>,
    /// The weights that generated each run of `ids`: one span from 0, and
    /// one more at each seam where a weight update interrupted the choice
    /// and it continued on other weights.
    pub versions: Vec<crate::store::VersionSpan>,
    /// The message (chat) or `{"text": ..}` (completions) returned.
    pub served: std::sync::Arc<serde_json::Value>,
    /// The client-facing finish reason (`tool_calls` when calls were parsed).
    pub finish_reason: &'static str,
    /// Tool-call / reasoning parse outcome, when a parser ran.
    pub parse_outcome: Option<String>,
    /// The backend built a different prompt than the one recorded
    /// ([`crate::backend::GenEvent::PromptDrift`]).
    pub prompt_drift: Option<crate::store::Drift>,
}

impl ChoiceResult {
    /// The OpenAI choice's `stop_reason`: the string, the token id, or null.
    pub fn stop_reason_json(&self) -> serde_json::Value {
        match &self.stop_reason {
            Some(StopReason::Text(s)) => serde_json::Value::from(s.as_str()),
            Some(StopReason::Token(id)) => serde_json::Value::from(*id),
            None => serde_json::Value::Null,
        }
    }

    /// The whole choice as one delta (a recorded answer, streamed again).
    pub fn as_event(&self) -> ChoiceEvent {
        ChoiceEvent {
            index: self.index,
            text: self.text.clone(),
            ids: self.ids.clone(),
            logprobs: self.logprobs.clone(),
            finish: self.finish,
        }
    }
}

/// Turns one choice's backend events into deltas and a result.
pub struct ChoiceAssembly {
    asm: TextAssembler,
    stop_ids: Vec<u32>,
    /// The model's EOS ids when they end the sequence (not `ignore_eos`):
    /// ending on one has no `stop_reason`.
    eos_ids: Vec<u32>,
    max_tokens: usize,
    pub result: ChoiceResult,
}

impl ChoiceAssembly {
    pub fn new(
        renderer: Arc<Renderer>,
        params: &SamplingParams,
        skip_special_tokens: bool,
        index: u32,
    ) -> Self {
        let eos_ids = if params.ignore_eos {
            Vec::new()
        } else {
            renderer.eos_token_ids().to_vec()
        };
        ChoiceAssembly {
            asm: TextAssembler::new(renderer, skip_special_tokens, params.stop.clone()),
            stop_ids: params.stop_token_ids.clone(),
            eos_ids,
            max_tokens: params.max_tokens as usize,
            result: ChoiceResult {
                index,
                ..Default::default()
            },
        }
    }

    /// A choice that generates nothing (its sample's budget is spent).
    pub fn spent(renderer: Arc<Renderer>, index: u32) -> Self {
        let mut a = ChoiceAssembly {
            asm: TextAssembler::new(renderer, true, Vec::new()),
            stop_ids: Vec::new(),
            eos_ids: Vec::new(),
            max_tokens: 0,
            result: ChoiceResult {
                index,
                ..Default::default()
            },
        };
        a.result.finish = Some(FinishReason::Length);
        a
    }

    pub fn done(&self) -> bool {
        self.result.finish.is_some()
    }

    /// Takes one backend event into the result. With `delta`, returns what
    /// it added, for a streaming client. Stop-token ids end the sequence;
    /// they stay in the ids but not the text.
    pub fn push(&mut self, ev: GenEvent, delta: bool) -> Option<ChoiceEvent> {
        if self.done() {
            return None;
        }
        let r = &mut self.result;
        let (text0, ids0) = (r.text.len(), r.ids.len());
        match ev {
            GenEvent::Tokens { ids, logprobs } => {
                let mut logprobs = logprobs.into_iter();
                for id in ids {
                    if !self.stop_ids.contains(&id) {
                        r.text.push_str(&self.asm.push(id));
                    }
                    r.ids.push(id);
                    // Backends send logprobs aligned with ids; a missing one
                    // is recorded as unknown, never as a number.
                    r.logprobs.push(logprobs.next().unwrap_or(TokenLogprob {
                        logprob: None,
                        top: Vec::new(),
                    }));
                    if self.asm.stopped() {
                        r.finish = Some(FinishReason::Stop);
                        break;
                    }
                    if self.max_tokens > 0 && r.ids.len() >= self.max_tokens {
                        // vLLM's order: a stop token or EOS ends the
                        // sequence before the length limit does, so the
                        // sample ended naturally and is not truncated.
                        let ended = self.stop_ids.contains(&id) || self.eos_ids.contains(&id);
                        r.finish = Some(if ended {
                            FinishReason::Stop
                        } else {
                            FinishReason::Length
                        });
                        break;
                    }
                }
            }
            GenEvent::Done { finish_reason } => r.finish = Some(finish_reason),
            // Taken by the call's pump, which knows the versions' numbers
            // and keeps the choice's drift.
            GenEvent::Versions(_) | GenEvent::PromptDrift(_) => {}
        }
        if r.finish.is_some() {
            r.text.push_str(&self.asm.finish());
            self.result.stop_reason = self.stop_reason();
        }
        let r = &self.result;
        let changed = r.finish.is_some() || r.ids.len() > ids0 || r.text.len() > text0;
        (delta && changed).then(|| ChoiceEvent {
            index: r.index,
            text: r.text[text0..].to_string(),
            ids: r.ids[ids0..].to_vec(),
            logprobs: r.logprobs[ids0..].to_vec(),
            finish: r.finish,
        })
    }

    /// vLLM's rule: a stop string that matched, else the last token when
    /// it is a stop token other than EOS, else none.
    fn stop_reason(&self) -> Option<StopReason> {
        if self.result.finish != Some(FinishReason::Stop) {
            return None;
        }
        if let Some(s) = self.asm.stop_string() {
            return Some(StopReason::Text(s.to_string()));
        }
        let last = *self.result.ids.last()?;
        (self.stop_ids.contains(&last) && !self.eos_ids.contains(&last))
            .then_some(StopReason::Token(last))
    }
}
