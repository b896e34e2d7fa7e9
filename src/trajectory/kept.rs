//! A call as the hot view keeps it. A call that continues another keeps,
//! where they extend its parent's, only what it adds: its prompt's ids and
//! text after its parent's prompt and sampled ids, its segments and request
//! messages after its parent's. A trajectory's memory then grows with its
//! tokens, not with its turns times its tokens; a call's whole prompt is put
//! back together from its ancestors when a later turn needs it (a copy that
//! turn's own prompt needs anyway). A part that does not extend the
//! parent's (an edited message, a text decoded otherwise) is kept whole.

use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;

use super::drift::{first_difference, SegRange};
use super::messages::ContextHash;
use crate::render::Renderer;
use crate::store::{SegmentKind, VersionSpan};

/// A part of a call that usually extends the same part of its parent.
#[derive(Debug, Clone)]
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

/// A call's whole prompt, as prepared.
pub(super) struct WholePrompt<'a> {
    /// None for a call no later turn continues.
    pub messages: Option<&'a Arc<Vec<Json>>>,
    /// A continuation's start with its parent's prompt and sampled ids (see
    /// [`super::Prepared::delta_start`]).
    pub ids: &'a Arc<Vec<u32>>,
    pub text: &'a Arc<String>,
    /// A continuation's start with its parent's segments; a root's are not
    /// read (see [`HotCall::segments`]).
    pub segments: &'a [SegRange],
}

/// What the view keeps of a prompt, with the whole parts' lengths. Built
/// once per request: the choices of a request share it.
#[derive(Debug, Clone)]
pub(super) struct KeptPrompt {
    /// Request messages; None for a call no later turn continues: a
    /// /v1/completions call, or a `continue_final_message` one (its prompt
    /// ends inside the final message, not after a served turn).
    pub(super) messages: Option<Own<Arc<Vec<Json>>>>,
    messages_len: usize,
    /// The prompt's ids after the parent's prompt and sampled ids (all of
    /// them for a root): a continuation's prompt always starts with those.
    pub(super) ids: Arc<Vec<u32>>,
    ids_len: usize,
    /// The decoded text of the ids (special tokens kept).
    pub(super) text: Own<Arc<String>>,
    text_len: usize,
    /// Token ranges of the ids after the parent's; none for a root, whose
    /// one prompt segment names its call ([`HotCall::segments`]).
    pub(super) segments: Arc<Vec<SegRange>>,
    segments_len: usize,
}

/// `whole[at..]` as a part of its own (empty when `at` is past its end).
fn tail<T: Clone>(whole: &[T], at: usize) -> Arc<Vec<T>> {
    Arc::new(whole.get(at..).unwrap_or_default().to_vec())
}

impl KeptPrompt {
    /// What a call continuing `parent` (if any) keeps of `whole`.
    pub(super) fn new(parent: Option<&HotCall>, whole: WholePrompt<'_>) -> KeptPrompt {
        let Some(p) = parent else {
            return KeptPrompt {
                messages: whole.messages.map(|m| Own::Whole(m.clone())),
                messages_len: whole.messages.map_or(0, |m| m.len()),
                ids: whole.ids.clone(),
                ids_len: whole.ids.len(),
                text: Own::Whole(whole.text.clone()),
                text_len: whole.text.len(),
                segments: Arc::default(),
                segments_len: 1,
            };
        };
        // Prepared so: the exact prompt is built on them, a fresh render
        // or a completions prompt continues only when it starts with them.
        debug_assert!(p.full_ids_prefix_of(whole.ids));
        let text = match whole.text.get(p.full_text_len()..) {
            Some(t) if p.full_text_prefix_of(whole.text) => Own::AfterParent(Arc::new(t.into())),
            _ => Own::Whole(whole.text.clone()),
        };
        let messages = whole.messages.map(|m| {
            if p.messages_prefix_of(m) {
                Own::AfterParent(tail(m, p.prompt.messages_len))
            } else {
                Own::Whole(m.clone())
            }
        });
        KeptPrompt {
            messages,
            messages_len: whole.messages.map_or(0, |m| m.len()),
            ids: tail(whole.ids, p.full_len()),
            ids_len: whole.ids.len(),
            text,
            text_len: whole.text.len(),
            segments: tail(whole.segments, p.prompt.segments_len),
            segments_len: whole.segments.len(),
        }
    }
}

/// A call to keep.
pub(super) struct NewCall {
    pub call_index: u32,
    pub sample_index: u32,
    pub prompt: KeptPrompt,
    pub messages_hash: u64,
    pub context: ContextHash,
    pub served: Arc<Json>,
    pub sampled_ids: Vec<u32>,
    pub sampled_text: Arc<String>,
    pub response_used: usize,
    pub parent: Option<Arc<HotCall>>,
    pub truncated: bool,
    pub instructions: usize,
    /// The weights of its first sampled token, when known.
    pub first_span: Option<VersionSpan>,
}

/// A served call as the hot view keeps it.
#[derive(Debug)]
pub struct HotCall {
    pub call_index: u32,
    pub sample_index: u32,
    /// Its prompt: ids, text, segments and request messages, each whole or
    /// after its parent's.
    prompt: KeptPrompt,
    /// Hash of the normalized messages.
    pub messages_hash: u64,
    /// The tools and template kwargs the call was rendered with.
    pub context: ContextHash,
    /// The assistant message tito returned (shared with its record).
    pub served: Arc<Json>,
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
    /// Leading request messages from the request's own instructions (see
    /// `CallContext::instructions`).
    pub instructions: usize,
    /// The weights of its sample's first sampled token (the root call's),
    /// when known: how stale the sample is.
    pub first_version: Option<VersionSpan>,
}

/// Drops a call's line of ancestors one by one: the default drop would
/// recurse once per ancestor, and a long trajectory's last call is the only
/// holder of its whole line.
impl Drop for HotCall {
    fn drop(&mut self) {
        let mut next = self.parent.take();
        while let Some(call) = next {
            next = match Arc::try_unwrap(call) {
                Ok(mut alone) => alone.parent.take(),
                // Held elsewhere (the trajectory's list, a call in flight):
                // its holder drops it later.
                Err(_) => None,
            };
        }
    }
}

/// Whether `whole[..end]` ends with `piece`.
fn ends_at<T: PartialEq>(whole: &[T], end: usize, piece: &[T]) -> bool {
    end.checked_sub(piece.len())
        .and_then(|start| whole.get(start..end))
        .is_some_and(|there| there == piece)
}

impl HotCall {
    pub(super) fn new(c: NewCall) -> HotCall {
        let first_version = match &c.parent {
            Some(p) => p.first_version.clone(),
            None => c.first_span,
        };
        HotCall {
            call_index: c.call_index,
            sample_index: c.sample_index,
            prompt: c.prompt,
            messages_hash: c.messages_hash,
            context: c.context,
            served: c.served,
            sampled_ids: Arc::new(c.sampled_ids),
            sampled_text: c.sampled_text,
            response_used: c.response_used,
            parent: c.parent,
            noncanonical: OnceLock::new(),
            truncated: c.truncated,
            instructions: c.instructions,
            first_version,
        }
    }

    /// What the view keeps of the call's prompt (for its byte count).
    pub(super) fn kept(&self) -> &KeptPrompt {
        &self.prompt
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt.ids_len
    }

    /// Prompt and sampled ids.
    pub fn full_len(&self) -> usize {
        self.prompt.ids_len + self.sampled_ids.len()
    }

    /// Bytes of the prompt text and the sampled text.
    pub fn full_text_len(&self) -> usize {
        self.prompt.text_len + self.sampled_text.len()
    }

    /// How many request messages the call had; None when no later turn
    /// continues it.
    pub fn messages_len(&self) -> Option<usize> {
        self.prompt
            .messages
            .as_ref()
            .map(|_| self.prompt.messages_len)
    }

    /// `self`, then each ancestor whose part `self`'s extends (`extends`
    /// says whether a call keeps its part after its parent's), nearest
    /// first; the last keeps its part whole.
    fn ancestry(&self, extends: fn(&KeptPrompt) -> bool) -> impl Iterator<Item = &HotCall> {
        let mut next = Some(self);
        std::iter::from_fn(move || {
            let c = next?;
            next = if extends(&c.prompt) {
                c.parent.as_deref()
            } else {
                None
            };
            Some(c)
        })
    }

    /// As [`HotCall::ancestry`], oldest first.
    fn lineage(&self, extends: fn(&KeptPrompt) -> bool) -> Vec<&HotCall> {
        let mut chain: Vec<&HotCall> = self.ancestry(extends).collect();
        chain.reverse();
        chain
    }

    /// Appends the prompt ids, then the sampled ids.
    pub fn extend_full_ids(&self, out: &mut Vec<u32>) {
        out.reserve(self.full_len());
        for c in self.lineage(|_| true) {
            out.extend_from_slice(&c.prompt.ids);
            out.extend_from_slice(&c.sampled_ids);
        }
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
        for c in self.lineage(|p| p.text.after_parent()) {
            out.push_str(c.prompt.text.get());
            out.push_str(&c.sampled_text);
        }
    }

    /// Whether `ids` starts with the prompt ids and then the sampled ids.
    /// Compares from the end back, without copying: a call on another
    /// branch differs in its last pieces.
    pub fn full_ids_prefix_of(&self, ids: &[u32]) -> bool {
        ids.len() >= self.full_len()
            && self.ancestry(|_| true).all(|c| {
                let at = c.prompt.ids_len;
                ends_at(ids, c.full_len(), &c.sampled_ids) && ends_at(ids, at, &c.prompt.ids)
            })
    }

    fn full_text_prefix_of(&self, text: &str) -> bool {
        let text = text.as_bytes();
        text.len() >= self.full_text_len()
            && self.ancestry(|p| p.text.after_parent()).all(|c| {
                let at = c.prompt.text_len;
                ends_at(text, c.full_text_len(), c.sampled_text.as_bytes())
                    && ends_at(text, at, c.prompt.text.get().as_bytes())
            })
    }

    fn messages_prefix_of(&self, messages: &[Json]) -> bool {
        let keeps: fn(&KeptPrompt) -> bool = |p| p.messages.as_ref().is_some_and(Own::after_parent);
        self.prompt.messages.is_some()
            && messages.len() >= self.prompt.messages_len
            && self.ancestry(keeps).all(|c| match &c.prompt.messages {
                Some(own) => ends_at(messages, c.prompt.messages_len, own.get()),
                None => false,
            })
    }

    /// The call's request messages; None when no later turn continues it.
    pub fn messages(&self) -> Option<Vec<Json>> {
        self.prompt.messages.as_ref()?;
        let keeps: fn(&KeptPrompt) -> bool = |p| p.messages.as_ref().is_some_and(Own::after_parent);
        let mut out = Vec::with_capacity(self.prompt.messages_len);
        for c in self.lineage(keeps) {
            out.extend_from_slice(c.prompt.messages.as_ref()?.get());
        }
        Some(out)
    }

    /// The prompt's token ranges: a root's prompt, named by its call, then
    /// what each continuation added.
    pub fn segments(&self) -> Vec<SegRange> {
        let mut out = Vec::with_capacity(self.prompt.segments_len);
        for c in self.lineage(|_| true) {
            if c.parent.is_none() {
                out.push(SegRange {
                    kind: SegmentKind::Prompt,
                    call: c.call_index,
                    start: 0,
                    end: c.prompt.ids_len,
                });
            }
            out.extend_from_slice(&c.prompt.segments);
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
                first_difference(&self.sampled_ids, &again).map(|o| o + self.prompt.ids_len)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Whole {
        ids: Arc<Vec<u32>>,
        text: Arc<String>,
        segments: Vec<SegRange>,
        messages: Arc<Vec<Json>>,
    }

    fn whole(ids: &[u32], text: &str, segments: Vec<SegRange>, messages: Vec<Json>) -> Whole {
        Whole {
            ids: Arc::new(ids.to_vec()),
            text: Arc::new(text.to_string()),
            segments,
            messages: Arc::new(messages),
        }
    }

    fn seg(kind: SegmentKind, start: usize, end: usize) -> SegRange {
        SegRange {
            kind,
            call: 0,
            start,
            end,
        }
    }

    fn keep(
        w: &Whole,
        messages: Option<&Arc<Vec<Json>>>,
        sampled: &[u32],
        sampled_text: &str,
        parent: Option<&Arc<HotCall>>,
    ) -> Arc<HotCall> {
        let whole = WholePrompt {
            messages,
            ids: &w.ids,
            text: &w.text,
            segments: &w.segments,
        };
        let prompt = KeptPrompt::new(parent.map(|p| p.as_ref()), whole);
        Arc::new(HotCall::new(new_call(
            prompt,
            sampled,
            sampled_text,
            parent,
        )))
    }

    fn new_call(
        prompt: KeptPrompt,
        sampled: &[u32],
        sampled_text: &str,
        parent: Option<&Arc<HotCall>>,
    ) -> NewCall {
        NewCall {
            call_index: 0,
            sample_index: 0,
            prompt,
            messages_hash: 0,
            context: ContextHash::default(),
            served: json!({"role": "assistant", "content": sampled_text}).into(),
            sampled_ids: sampled.to_vec(),
            sampled_text: Arc::new(sampled_text.to_string()),
            response_used: 0,
            parent: parent.cloned(),
            truncated: false,
            instructions: 0,
            first_span: None,
        }
    }

    /// A call on `w` with its messages.
    fn keep_chat(
        w: &Whole,
        sampled: &[u32],
        sampled_text: &str,
        parent: Option<&Arc<HotCall>>,
    ) -> Arc<HotCall> {
        keep(w, Some(&w.messages), sampled, sampled_text, parent)
    }

    /// What a call gives back is what it was built from, whether it keeps
    /// a part whole or after its parent's.
    fn gives_back(c: &HotCall, w: &Whole, sampled: &[u32], sampled_text: &str) {
        let mut ids = w.ids.to_vec();
        ids.extend_from_slice(sampled);
        assert_eq!(c.full_ids(), ids);
        assert!(c.full_ids_prefix_of(&[ids.as_slice(), &[7]].concat()));
        assert!(!c.full_ids_prefix_of(&ids[..ids.len() - 1]));
        let mut text = String::new();
        c.extend_full_text(&mut text);
        assert_eq!(text, format!("{}{sampled_text}", w.text));
        assert_eq!(c.full_text_len(), text.len());
        assert_eq!(c.segments(), w.segments);
        assert_eq!(c.messages().as_deref(), Some(w.messages.as_slice()));
        assert_eq!(c.messages_len(), Some(w.messages.len()));
        assert_eq!(c.prompt_len(), w.ids.len());
    }

    fn user(text: &str) -> Json {
        json!({"role": "user", "content": text})
    }

    fn assistant(text: &str) -> Json {
        json!({"role": "assistant", "content": text})
    }

    fn messages_kept(c: &HotCall) -> Option<usize> {
        c.kept().messages.as_ref().map(|m| m.get().len())
    }

    #[test]
    fn a_continuation_keeps_what_it_adds_and_gives_back_the_whole() {
        use SegmentKind::{Observation, Prompt, Sampled};
        let root = whole(&[1, 2, 3], "abc", vec![seg(Prompt, 0, 3)], vec![user("a")]);
        let r = keep_chat(&root, &[4, 5], "de", None);
        gives_back(&r, &root, &[4, 5], "de");
        assert_eq!(r.kept().ids.as_slice(), &[1, 2, 3]);

        let child = whole(
            &[1, 2, 3, 4, 5, 6],
            "abcdef",
            vec![
                seg(Prompt, 0, 3),
                seg(Sampled, 3, 5),
                seg(Observation, 5, 6),
            ],
            vec![user("a"), assistant("de"), user("f")],
        );
        let c = keep_chat(&child, &[8], "h", Some(&r));
        gives_back(&c, &child, &[8], "h");
        assert_eq!(c.kept().ids.as_slice(), &[6]);
        assert_eq!(c.kept().text.get().as_str(), "f");
        assert_eq!(c.kept().segments.len(), 2);
        assert_eq!(messages_kept(&c), Some(2));

        // A grandchild whose text and messages do not extend its parent's
        // (a fresh render decoded otherwise, an edited message) keeps them
        // whole; its ids still extend.
        let grandchild = whole(
            &[1, 2, 3, 4, 5, 6, 8, 9],
            "ABCdefhi",
            [
                &child.segments[..],
                &[seg(Sampled, 6, 7), seg(Observation, 7, 8)],
            ]
            .concat(),
            vec![user("edited"), assistant("de"), user("f"), user("i")],
        );
        let g = keep_chat(&grandchild, &[10], "j", Some(&c));
        gives_back(&g, &grandchild, &[10], "j");
        assert_eq!(g.kept().ids.as_slice(), &[9]);
        assert!(matches!(g.prompt.text, Own::Whole(_)));
        assert!(matches!(g.prompt.messages, Some(Own::Whole(_))));

        // Its child extends it again: the walk stops at the whole text.
        let great = whole(
            &[&grandchild.ids[..], &[10, 11]].concat(),
            "ABCdefhijk",
            [
                &grandchild.segments[..],
                &[seg(Sampled, 8, 9), seg(Observation, 9, 10)],
            ]
            .concat(),
            [&grandchild.messages[..], &[assistant("j"), user("k")]].concat(),
        );
        let gg = keep_chat(&great, &[12], "l", Some(&g));
        gives_back(&gg, &great, &[12], "l");
        assert_eq!(gg.kept().text.get().as_str(), "k");
        assert_eq!(messages_kept(&gg), Some(2));
    }

    /// A call asked with messages after one without (a completions call)
    /// keeps its messages whole.
    #[test]
    fn messages_after_a_call_without_are_kept_whole() {
        use SegmentKind::{Observation, Prompt, Sampled};
        let root = whole(&[1], "a", vec![seg(Prompt, 0, 1)], Vec::new());
        let r = keep(&root, None, &[2], "b", None);
        assert_eq!(r.messages(), None);
        assert_eq!(r.messages_len(), None);
        let child = whole(
            &[1, 2, 3],
            "abc",
            vec![
                seg(Prompt, 0, 1),
                seg(Sampled, 1, 2),
                seg(Observation, 2, 3),
            ],
            vec![user("a"), user("c")],
        );
        let c = keep_chat(&child, &[4], "d", Some(&r));
        gives_back(&c, &child, &[4], "d");
        assert!(matches!(c.prompt.messages, Some(Own::Whole(_))));
        assert!(matches!(c.prompt.text, Own::AfterParent(_)));
    }

    /// A line of 100,000 calls is dropped within a 256 KiB stack (the
    /// default drop recursed once per call and overflowed it).
    #[test]
    fn a_long_line_of_calls_drops_without_recursing() {
        let dropped = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(|| {
                let mut last: Option<Arc<HotCall>> = None;
                for i in 0..100_000u32 {
                    // One id each, kept as given: building the line walks
                    // no ancestors.
                    let prompt = KeptPrompt {
                        messages: None,
                        messages_len: 0,
                        ids: Arc::new(vec![i]),
                        ids_len: i as usize + 1,
                        text: Own::Whole(Arc::default()),
                        text_len: 0,
                        segments: Arc::default(),
                        segments_len: 0,
                    };
                    last = Some(Arc::new(HotCall::new(new_call(
                        prompt,
                        &[],
                        "",
                        last.as_ref(),
                    ))));
                }
                drop(last);
            })
            .expect("spawn")
            .join();
        assert!(dropped.is_ok());
    }
}
