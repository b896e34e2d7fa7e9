//! Building a call's prompt ids from the trajectory's history.
//!
//! Exact mode: find the earlier call whose messages, followed by the
//! assistant message tito served, are a prefix of the new messages; then the
//! prompt is that call's prompt ids + its sampled ids verbatim + the tokens
//! of the template's rendering of the new messages. That rendering is taken
//! from a render of the conversation where the served message's content is a
//! sentinel: everything after the first end-of-turn text that follows the
//! sentinel. When the model stopped without emitting end-of-turn (length,
//! stop string), the end-of-turn text is prepended as glue.
//!
//! Drift is diagnosed by comparing texts first (cheap); only when the fresh
//! render's text differs from the exact prompt's text is the whole fresh
//! render tokenized to find the first differing token.

use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::drift::{diagnose, first_difference, SegRange, Served};
use super::messages::{is_served_message, prefix_hashes, render_bytes, ContextHash, RenderContext};
use super::{extend_segments, hot, HotCall, Trajectories, TrajectoryError};
use crate::config::HistoryMode;
use crate::metrics::PHASE;
use crate::render::{run_render_work, RenderInput};
use crate::store::Drift;

/// What a chat call renders.
#[derive(Debug, Clone, Copy)]
pub struct ChatInput<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
    pub add_generation_prompt: bool,
}

/// A call's prompt and lineage, before generation.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub prompt_ids: Arc<Vec<u32>>,
    pub prompt_text: Arc<String>,
    /// `prompt_ids[delta_start..]` is what this call adds to its parent.
    pub delta_start: usize,
    pub parent: Option<Arc<HotCall>>,
    /// Token ranges of `prompt_ids`; none for a root, whose one prompt
    /// segment is named by its call once recorded ([`HotCall::segments`]).
    pub segments: Arc<Vec<SegRange>>,
    pub drift: Option<Drift>,
    /// Response tokens of the sample before this call generates.
    pub response_used: usize,
    /// The sample's response budget is already spent.
    pub truncated: bool,
    /// Hash of the call's normalized messages (0 for completions calls).
    pub messages_hash: u64,
    /// The tools and template kwargs it renders with.
    pub context: ContextHash,
    /// The trajectory's hot state this call was prepared against, held
    /// until the call is recorded: a held trajectory is never evicted, so
    /// the commit appends to the history the prompt was built from.
    pub(super) held: Option<Held>,
}

/// A trajectory's hot state, held by a call in flight.
#[derive(Clone)]
pub(super) struct Held(pub(super) super::hot::Shared);

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

impl Prepared {
    /// The weights of the sample's first sampled token, when the call
    /// continues a sample whose versions are known.
    pub fn first_version(&self) -> Option<&crate::store::VersionSpan> {
        self.parent.as_ref().and_then(|p| p.first_version.as_ref())
    }

    /// Tokens this call may still generate under `response_length` (0 = no budget).
    pub fn budget_left(&self, response_length: u32) -> Option<u32> {
        (response_length > 0)
            .then(|| (response_length as usize).saturating_sub(self.response_used) as u32)
    }
}

const SENTINEL: &str = "\u{2063}tito-sentinel-5f0c2a\u{2063}";

impl Trajectories {
    /// Prepares a chat call of trajectory `tid`.
    pub async fn prepare_chat(
        &self,
        tid: &str,
        input: ChatInput<'_>,
    ) -> Result<Prepared, TrajectoryError> {
        let state = self.loaded(tid).await?;
        let (calls, served, created_at) = {
            let mut st = state.lock().await;
            let created_at = *st.created_at.get_or_insert_with(crate::store::now_ms);
            (
                st.calls.clone(),
                st.served.clone(),
                (created_at, st.other_policy_calls),
            )
        };
        let (created_at, others) = created_at;
        let served = |c: u32| served.get(&c).copied().unwrap_or_default();
        // Harmony's system message names a date: the trajectory's first
        // day unless the request gives one, so every turn renders alike.
        let dated = self
            .renderer
            .harmony()
            .map(|_| crate::render::harmony::with_start_date(input.kwargs, &day_of(created_at)));
        let input = ChatInput {
            kwargs: dated.as_ref().or(input.kwargs),
            ..input
        };
        let render = tracing::info_span!(target: PHASE, "render");
        let mut prepared = render.in_scope(|| {
            run_render_work(render_bytes(input.messages, input.tools), || {
                self.prepare_chat_sync(&calls, &served, input, others)
            })
        })?;
        drop(render);
        prepared.held = Some(Held(state));
        Ok(prepared)
    }

    fn prepare_chat_sync(
        &self,
        calls: &[Arc<HotCall>],
        served: &dyn Fn(u32) -> Served,
        input: ChatInput<'_>,
        others: u32,
    ) -> Result<Prepared, TrajectoryError> {
        let context = RenderContext {
            tools: input.tools,
            functions: None,
            kwargs: input.kwargs,
        };
        let hashes = prefix_hashes(input.messages);
        let context = context.hash();
        let mut prepared =
            self.prepare_chat_hashed(calls, served, input, &hashes, context, others)?;
        prepared.messages_hash = hashes.last().copied().unwrap_or(0);
        prepared.context = context;
        Ok(prepared)
    }

    fn prepare_chat_hashed(
        &self,
        calls: &[Arc<HotCall>],
        served: &dyn Fn(u32) -> Served,
        input: ChatInput<'_>,
        hashes: &[u64],
        context: ContextHash,
        others: u32,
    ) -> Result<Prepared, TrajectoryError> {
        let messages = input.messages;
        let mut best: Option<(&Arc<HotCall>, usize)> = None;
        // The latest call whose served message the history edits, and the
        // latest it continues in another context (tools, kwargs).
        let mut edited: Option<&Arc<HotCall>> = None;
        let mut recontexted: Option<&Arc<HotCall>> = None;
        for c in calls.iter().rev() {
            let Some(k) = c.messages_len() else { continue };
            if k + 1 >= messages.len() || hashes.get(k) != Some(&c.messages_hash) {
                continue;
            }
            if !is_served_message(&messages[k], &c.served) {
                edited = edited.or(Some(c));
            } else if c.context != context {
                recontexted = recontexted.or(Some(c));
            } else if best.is_none_or(|(_, bk)| bk < k) {
                best = Some((c, k));
            }
        }
        let render_input = RenderInput {
            messages,
            tools: input.tools,
            add_generation_prompt: input.add_generation_prompt,
            kwargs: input.kwargs,
        };
        let fresh_text = self.renderer.render(&render_input)?;
        let render_fresh = || self.renderer.rendered_ids(&fresh_text, &render_input);
        let continuation = match best {
            Some((c, k)) => self.continuation(c, k, input)?.map(|t| (c, t)),
            None => None,
        };
        let Some((parent, (delta_text, delta_ids))) = continuation else {
            // A new sample: the first call, a new conversation, or an edit.
            let ids = render_fresh()?;
            let since = |c: &HotCall| first_difference(&c.full_ids(), &ids).map(|p| p as u32);
            let drift = match (edited, recontexted) {
                (Some(c), _) => since(c).map(|position| Drift {
                    position,
                    cause: "client_edit".into(),
                    details: json!({"edited_call": c.call_index,
                        "reason": "the history does not continue any served call; new sample started"}),
                }),
                (None, Some(c)) => since(c).map(|position| Drift {
                    position,
                    cause: "context_change".into(),
                    details: json!({"previous_call": c.call_index,
                        "changed": c.context.changed(context),
                        "reason": "the history continues this call, rendered with other tools or template kwargs; new sample started"}),
                }),
                // The turns before this one were sampled by a model that
                // tokenizes differently: its ids cannot be this prompt's.
                (None, None) if others > 0 && messages.iter().any(|m| m["role"] == "assistant") => {
                    Some(Drift {
                        position: 0,
                        cause: "other_policy".into(),
                        details: json!({"other_policy_calls": others,
                            "reason": "earlier calls of this trajectory were served by a model with another tokenizer or template; this call's history is rendered fresh as a new sample"}),
                    })
                }
                (None, None) => None,
            };
            return Ok(self.root(ids, fresh_text, drift));
        };
        let mut exact = Vec::with_capacity(parent.full_len() + delta_ids.len());
        parent.extend_full_ids(&mut exact);
        exact.extend_from_slice(&delta_ids);
        let mut exact_text = String::with_capacity(parent.full_text_len() + delta_text.len());
        parent.extend_full_text(&mut exact_text);
        exact_text.push_str(&delta_text);
        let segments = extend_segments(parent, delta_ids.len());
        let eot = self.end_of_turn_ids();
        let (fresh_ids, drift) = if fresh_text == exact_text {
            let drift = parent.noncanonical_at(&self.renderer).map(|p| Drift {
                position: p as u32,
                cause: "bpe_retokenization".into(),
                details: json!({"note": "same text, but a fresh tokenization splits the sampled tokens differently",
                    "exact_ids": exact.get(p..(p + 8).min(exact.len())).unwrap_or_default()}),
            });
            (None, drift)
        } else {
            let fresh = render_fresh()?;
            let drift = diagnose(&self.renderer, &exact, &fresh, &segments, served, &eot);
            (Some(fresh), drift)
        };
        let response_used = parent.response_used + delta_ids.len();
        let mut prepared = Prepared {
            delta_start: parent.full_len(),
            truncated: self.config.response_length > 0
                && response_used >= self.config.response_length as usize,
            prompt_ids: Arc::new(exact),
            prompt_text: Arc::new(exact_text),
            parent: Some(parent.clone()),
            segments: Arc::new(segments),
            drift,
            response_used,
            messages_hash: 0,
            context: ContextHash::default(),
            held: None,
        };
        if self.config.history == HistoryMode::Template {
            let fresh = match fresh_ids {
                Some(f) => f,
                None => render_fresh()?,
            };
            let full = parent.full_len();
            let extends = fresh.len() > full && parent.full_ids_prefix_of(&fresh);
            if !extends {
                let drift = prepared.drift.take();
                return Ok(self.root(fresh, fresh_text, drift));
            }
            let delta = fresh.len() - full;
            prepared.segments = Arc::new(extend_segments(parent, delta));
            prepared.response_used = parent.response_used + delta;
            // The sample's tokens are the fresh render's: so is its budget.
            prepared.truncated = self.config.response_length > 0
                && prepared.response_used >= self.config.response_length as usize;
            prepared.prompt_ids = hot::kept_ids(fresh);
            prepared.prompt_text = hot::kept_text(fresh_text);
        }
        Ok(prepared)
    }

    /// A call of trajectory `tid` that starts a new sample from given
    /// prompt ids.
    pub async fn prepare_root(
        &self,
        tid: &str,
        ids: Vec<u32>,
    ) -> Result<Prepared, TrajectoryError> {
        let state = self.loaded(tid).await?;
        let text = self.renderer.decode(&ids, false)?;
        let mut prepared = self.root(ids, text, None);
        prepared.held = Some(Held(state));
        Ok(prepared)
    }

    fn root(&self, ids: Vec<u32>, text: String, drift: Option<Drift>) -> Prepared {
        Prepared {
            prompt_ids: hot::kept_ids(ids),
            prompt_text: hot::kept_text(text),
            delta_start: 0,
            parent: None,
            segments: Arc::default(),
            drift,
            response_used: 0,
            truncated: false,
            messages_hash: 0,
            context: ContextHash::default(),
            held: None,
        }
    }

    /// The text and ids that follow the served message of `parent` (at
    /// index `k` of the new messages): from the chat template (see
    /// [`Trajectories::continuation_text`]), or for Harmony the crate's
    /// rendering of the new messages, message by message.
    fn continuation(
        &self,
        parent: &HotCall,
        k: usize,
        input: ChatInput<'_>,
    ) -> Result<Option<(String, Vec<u32>)>, TrajectoryError> {
        if let Some(h) = self.renderer.harmony() {
            let ended = parent
                .sampled_ids
                .last()
                .is_some_and(|id| h.stop_ids().contains(id));
            let ids =
                h.continuation_ids(input.messages, k + 1, ended, input.add_generation_prompt)?;
            let text = self.renderer.decode(&ids, false)?;
            return Ok(Some((text, ids)));
        }
        let Some(text) = self.continuation_text(parent, k, input)? else {
            return Ok(None);
        };
        let ids = self.renderer.encode(&text)?;
        Ok(Some((text, ids)))
    }

    /// The text the template puts after the served message of `parent`
    /// (which sits at index `k` of the new messages): glue + new messages.
    /// None when the template gives no end-of-turn after the message.
    fn continuation_text(
        &self,
        parent: &HotCall,
        k: usize,
        input: ChatInput<'_>,
    ) -> Result<Option<String>, TrajectoryError> {
        let Some(mut msgs) = parent.messages() else {
            return Ok(None);
        };
        let history = msgs.len();
        let mut sentinel = json!({"role": "assistant", "content": SENTINEL});
        if let Some(calls) = parent.served.get("tool_calls").filter(|c| !c.is_null()) {
            sentinel["tool_calls"] = calls.clone();
        }
        msgs.reserve(input.messages.len().saturating_sub(history));
        msgs.push(sentinel);
        msgs.extend(input.messages[k + 1..].iter().cloned());
        let render = |msgs: &[Json]| {
            self.renderer.render(&RenderInput {
                messages: msgs,
                tools: input.tools,
                add_generation_prompt: input.add_generation_prompt,
                kwargs: input.kwargs,
            })
        };
        let mut text = render(&msgs)?;
        // A template that prints no content on a tool-call turn (Llama
        // 3.1's prints only the first call): mark that call's arguments.
        let first_call_args = msgs
            .get_mut(history)
            .and_then(|m| m.get_mut("tool_calls"))
            .and_then(|c| c.get_mut(0))
            .and_then(|c| c.get_mut("function"))
            .and_then(|f| f.as_object_mut());
        if let Some(function) = first_call_args.filter(|_| !text.contains(SENTINEL)) {
            let args = json!({ "tito": SENTINEL }).to_string();
            function.insert("arguments".into(), json!(args));
            text = match render(&msgs) {
                Ok(t) => t,
                // A template that cannot render the marked arguments gives
                // no continuation, as one without a marker does.
                Err(_) => return Ok(None),
            };
        }
        let Some(pos) = text.find(SENTINEL).map(|p| p + SENTINEL.len()) else {
            return Ok(None);
        };
        let after = &text[pos..];
        let Some((at, eot_text)) = self
            .end_of_turn
            .iter()
            .filter_map(|(_, t)| after.find(t.as_str()).map(|i| (i, t)))
            .min_by_key(|(i, _)| *i)
        else {
            return Ok(None);
        };
        let suffix = &after[at + eot_text.len()..];
        let ended = parent
            .sampled_ids
            .last()
            .is_some_and(|id| self.end_of_turn.iter().any(|(e, _)| e == id));
        let mut out = String::with_capacity(eot_text.len() + suffix.len());
        if !ended {
            out.push_str(eot_text);
        }
        out.push_str(suffix);
        Ok(Some(out))
    }

    /// Prepares a `/v1/completions` call: a token-id prompt continues an
    /// earlier call when it starts with that call's prompt + sampled ids.
    pub async fn prepare_completion(
        &self,
        tid: &str,
        prompt: Vec<u32>,
    ) -> Result<Prepared, TrajectoryError> {
        let state = self.loaded(tid).await?;
        let calls = state.lock().await.calls.clone();
        let parent = calls
            .iter()
            .filter(|c| c.full_len() < prompt.len() && c.full_ids_prefix_of(&prompt))
            .max_by_key(|c| (c.full_len(), c.call_index));
        let text = self.renderer.decode(&prompt, false)?;
        let held = Some(Held(state.clone()));
        let Some(parent) = parent else {
            let mut prepared = self.root(prompt, text, None);
            prepared.held = held;
            return Ok(prepared);
        };
        let delta = prompt.len() - parent.full_len();
        let response_used = parent.response_used + delta;
        Ok(Prepared {
            delta_start: parent.full_len(),
            truncated: self.config.response_length > 0
                && response_used >= self.config.response_length as usize,
            segments: Arc::new(extend_segments(parent, delta)),
            prompt_ids: hot::kept_ids(prompt),
            prompt_text: hot::kept_text(text),
            parent: Some(parent.clone()),
            drift: None,
            response_used,
            messages_hash: 0,
            context: ContextHash::default(),
            held,
        })
    }
}

/// `YYYY-MM-DD` (UTC) of unix milliseconds `ms`.
fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d")
        .to_string()
}
