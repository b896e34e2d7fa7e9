//! A call as the hot view keeps it. A call that continues another keeps only
//! what it adds to it: its prompt's ids and text after its parent's prompt
//! and sampled ids, its segments and request messages after its parent's.
//! A trajectory's memory then grows with its tokens, not with its turns
//! times its tokens; a call's whole prompt is put back together from its
//! ancestors when a later turn needs it (a copy the later turn's own prompt
//! needs anyway).

use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;

use super::drift::{first_difference, SegRange};
use super::messages::ContextHash;
use crate::render::Renderer;

/// A part of a call that usually extends the same part of its parent.
#[derive(Debug)]
pub(super) enum Own<T> {
    /// The whole part: the call has no parent, or its part does not start
    /// with the parent's.
    Whole(T),
    /// What follows the parent's part.
    AfterParent(T),
}

impl<T> Own<T> {
    pub(super) fn get(&self) -> &T {
        match self {
            Own::Whole(t) | Own::AfterParent(t) => t,
        }
    }

    fn after_parent(&self) -> bool {
        matches!(self, Own::AfterParent(_))
    }
}

/// A call to keep, with its whole prompt, segments and messages; the view
/// keeps what they add to the parent's.
pub(super) struct NewCall<'a> {
    pub call_index: u32,
    pub sample_index: u32,
    pub messages: Option<&'a Arc<Vec<Json>>>,
    pub messages_hash: u64,
    pub context: ContextHash,
    pub served: Json,
    pub prompt_ids: &'a Arc<Vec<u32>>,
    pub prompt_text: &'a Arc<String>,
    pub segments: &'a Arc<Vec<SegRange>>,
    pub sampled_ids: Vec<u32>,
    pub sampled_text: Arc<String>,
    pub response_used: usize,
    pub parent: Option<Arc<HotCall>>,
    pub truncated: bool,
}

/// The parts a call keeps of what usually extends its parent's: see
/// [`HotCall::kept`].
pub(super) struct KeptParts<'a> {
    pub prompt_ids: &'a Vec<u32>,
    pub prompt_text: &'a String,
    pub segments: &'a Vec<SegRange>,
    pub messages: Option<&'a Arc<Vec<Json>>>,
}

/// A served call as the hot view keeps it.
#[derive(Debug)]
pub struct HotCall {
    pub call_index: u32,
    pub sample_index: u32,
    /// Request messages; None for a call no later turn continues: a
    /// /v1/completions call, or a `continue_final_message` one (its prompt
    /// ends inside the final message, not after a served turn).
    messages: Option<Own<Arc<Vec<Json>>>>,
    /// How many request messages the call had, its parent's included.
    messages_len: usize,
    /// Hash of the normalized messages.
    pub messages_hash: u64,
    /// The tools and template kwargs the call was rendered with.
    pub context: ContextHash,
    /// The assistant message tito returned.
    pub served: Json,
    /// The prompt's ids (after the parent's prompt and sampled ids).
    prompt_ids: Own<Arc<Vec<u32>>>,
    prompt_len: usize,
    /// The decoded text of the prompt (special tokens kept; after the
    /// parent's prompt and sampled texts).
    prompt_text: Own<Arc<String>>,
    prompt_text_len: usize,
    /// Token ranges of the prompt (after the parent's).
    segments: Own<Arc<Vec<SegRange>>>,
    segments_len: usize,
    pub sampled_ids: Arc<Vec<u32>>,
    /// The decoded text of `sampled_ids` (special tokens kept).
    pub sampled_text: Arc<String>,
    /// Response tokens of its sample up to and including this call's sample.
    pub response_used: usize,
    /// The call this one continues (its prompt starts with the parent's
    /// prompt and sampled ids); None for a root.
    pub parent: Option<Arc<HotCall>>,
    /// See [`HotCall::noncanonical_at`]; computed on first use.
    noncanonical: OnceLock<Option<usize>>,
    pub truncated: bool,
}

/// `whole[at..]` as a part of its own, or None when `at` is past its end.
fn tail<T: Clone>(whole: &[T], at: usize) -> Option<Arc<Vec<T>>> {
    whole.get(at..).map(|t| Arc::new(t.to_vec()))
}

impl HotCall {
    pub(super) fn new(c: NewCall<'_>) -> HotCall {
        let p = c.parent.as_deref();
        let prompt_ids = p
            .filter(|p| p.full_ids_prefix_of(c.prompt_ids))
            .and_then(|p| tail(c.prompt_ids, p.full_len()))
            .map_or_else(|| Own::Whole(c.prompt_ids.clone()), Own::AfterParent);
        let prompt_text = p
            .filter(|p| p.full_text_prefix_of(c.prompt_text))
            .and_then(|p| c.prompt_text.get(p.full_text_len()..))
            .map_or_else(
                || Own::Whole(c.prompt_text.clone()),
                |t| Own::AfterParent(Arc::new(t.to_string())),
            );
        let segments = p
            .filter(|p| p.segments_prefix_of(c.segments))
            .and_then(|p| tail(c.segments, p.segments_len))
            .map_or_else(|| Own::Whole(c.segments.clone()), Own::AfterParent);
        let messages = c.messages.map(|m| {
            p.filter(|p| p.messages_prefix_of(m))
                .and_then(|p| tail(m, p.messages_len))
                .map_or_else(|| Own::Whole(m.clone()), Own::AfterParent)
        });
        HotCall {
            call_index: c.call_index,
            sample_index: c.sample_index,
            messages,
            messages_len: c.messages.map_or(0, |m| m.len()),
            messages_hash: c.messages_hash,
            context: c.context,
            served: c.served,
            prompt_ids,
            prompt_len: c.prompt_ids.len(),
            prompt_text,
            prompt_text_len: c.prompt_text.len(),
            segments,
            segments_len: c.segments.len(),
            sampled_ids: Arc::new(c.sampled_ids),
            sampled_text: c.sampled_text,
            response_used: c.response_used,
            parent: c.parent,
            noncanonical: OnceLock::new(),
            truncated: c.truncated,
        }
    }

    /// What the view keeps of the call's prompt ids, prompt text, segments
    /// and messages (for its byte count).
    pub(super) fn kept(&self) -> KeptParts<'_> {
        KeptParts {
            prompt_ids: self.prompt_ids.get(),
            prompt_text: self.prompt_text.get(),
            segments: self.segments.get(),
            messages: self.messages.as_ref().map(Own::get),
        }
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Prompt and sampled ids.
    pub fn full_len(&self) -> usize {
        self.prompt_len + self.sampled_ids.len()
    }

    /// Bytes of the prompt text and the sampled text.
    pub fn full_text_len(&self) -> usize {
        self.prompt_text_len + self.sampled_text.len()
    }

    /// How many request messages the call had; None when no later turn
    /// continues it.
    pub fn messages_len(&self) -> Option<usize> {
        self.messages.as_ref().map(|_| self.messages_len)
    }

    /// `self` and the ancestors whose part it extends (`extends` says
    /// whether a call keeps only what follows its parent's), oldest first.
    fn lineage(&self, extends: impl Fn(&HotCall) -> bool) -> Vec<&HotCall> {
        let mut chain = vec![self];
        let mut c = self;
        while extends(c) {
            let Some(p) = c.parent.as_deref() else { break };
            chain.push(p);
            c = p;
        }
        chain.reverse();
        chain
    }

    /// The pieces of the prompt ids followed by the sampled ids.
    fn id_pieces(&self) -> impl Iterator<Item = &[u32]> {
        self.lineage(|c| c.prompt_ids.after_parent())
            .into_iter()
            .flat_map(|c| [c.prompt_ids.get().as_slice(), c.sampled_ids.as_slice()])
    }

    /// The pieces of the prompt text followed by the sampled text.
    fn text_pieces(&self) -> impl Iterator<Item = &str> {
        self.lineage(|c| c.prompt_text.after_parent())
            .into_iter()
            .flat_map(|c| [c.prompt_text.get().as_str(), c.sampled_text.as_str()])
    }

    /// Appends the prompt ids, then the sampled ids.
    pub fn extend_full_ids(&self, out: &mut Vec<u32>) {
        out.reserve(self.full_len());
        self.id_pieces().for_each(|p| out.extend_from_slice(p));
    }

    /// The prompt ids, then the sampled ids.
    pub fn full_ids(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.full_len());
        self.extend_full_ids(&mut out);
        out
    }

    /// Appends the prompt text, then the sampled text.
    pub fn extend_full_text(&self, out: &mut String) {
        out.reserve(self.full_text_len());
        self.text_pieces().for_each(|p| out.push_str(p));
    }

    /// Whether `ids` starts with the prompt ids and then the sampled ids.
    pub fn full_ids_prefix_of(&self, ids: &[u32]) -> bool {
        ids.len() >= self.full_len() && starts_with_pieces(ids, self.id_pieces())
    }

    fn full_text_prefix_of(&self, text: &str) -> bool {
        text.len() >= self.full_text_len()
            && starts_with_pieces(text.as_bytes(), self.text_pieces().map(str::as_bytes))
    }

    fn segments_prefix_of(&self, segments: &[SegRange]) -> bool {
        let pieces = self.lineage(|c| c.segments.after_parent());
        segments.len() >= self.segments_len
            && starts_with_pieces(
                segments,
                pieces.into_iter().map(|c| c.segments.get().as_slice()),
            )
    }

    fn message_pieces(&self) -> Option<Vec<&[Json]>> {
        self.messages.as_ref()?;
        let chain = self.lineage(|c| c.messages.as_ref().is_some_and(Own::after_parent));
        chain
            .into_iter()
            .map(|c| c.messages.as_ref().map(|m| m.get().as_slice()))
            .collect()
    }

    fn messages_prefix_of(&self, messages: &[Json]) -> bool {
        match self.message_pieces() {
            Some(pieces) => {
                messages.len() >= self.messages_len && starts_with_pieces(messages, pieces)
            }
            None => false,
        }
    }

    /// The call's request messages; None when no later turn continues it.
    pub fn messages(&self) -> Option<Vec<Json>> {
        let pieces = self.message_pieces()?;
        let mut out = Vec::with_capacity(self.messages_len);
        pieces.into_iter().for_each(|p| out.extend_from_slice(p));
        Some(out)
    }

    /// The prompt's token ranges.
    pub fn segments(&self) -> Vec<SegRange> {
        let mut out = Vec::with_capacity(self.segments_len + 2);
        for c in self.lineage(|c| c.segments.after_parent()) {
            out.extend_from_slice(c.segments.get());
        }
        out
    }

    /// First position (in the prompt and sampled ids) of a sampled token of
    /// this call or an ancestor that a fresh tokenization of the text would
    /// not reproduce. Needs a re-encode of the sampled text, so it is only
    /// computed when a later turn asks (most calls are never asked: the last
    /// turn of every trajectory, every single-turn call); ancestors are
    /// resolved oldest first, without recursion.
    pub fn noncanonical_at(&self, renderer: &Renderer) -> Option<usize> {
        if let Some(v) = self.noncanonical.get() {
            return *v;
        }
        let mut pending = Vec::new();
        let mut next = self.parent.clone();
        while let Some(call) = next {
            if call.noncanonical.get().is_some() {
                break;
            }
            next = call.parent.clone();
            pending.push(call);
        }
        for call in pending.iter().rev() {
            call.resolve_noncanonical(renderer);
        }
        self.resolve_noncanonical(renderer)
    }

    /// Assumes the parent is resolved.
    fn resolve_noncanonical(&self, renderer: &Renderer) -> Option<usize> {
        *self.noncanonical.get_or_init(|| {
            let inherited = self
                .parent
                .as_ref()
                .and_then(|p| p.noncanonical.get().copied().flatten());
            inherited.or_else(|| {
                let again = renderer.encode(&self.sampled_text).ok()?;
                first_difference(&self.sampled_ids, &again).map(|o| o + self.prompt_len)
            })
        })
    }
}

/// Whether `whole` starts with `pieces` laid end to end.
fn starts_with_pieces<'a, T: PartialEq + 'a>(
    whole: &[T],
    pieces: impl IntoIterator<Item = &'a [T]>,
) -> bool {
    let mut at = 0;
    for piece in pieces {
        match whole.get(at..at + piece.len()) {
            Some(there) if there == piece => at += piece.len(),
            _ => return false,
        }
    }
    true
}
