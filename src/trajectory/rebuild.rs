//! The hot view rebuilt from the store's calls (after a restart or an
//! eviction), as the live calls built it, and a view another replica's
//! calls left behind brought up to date with only the calls it lacks.
//!
//! A call continues its parent's prompt and request history, so the
//! costly parts are not redone for the parent's share: a prompt's text is
//! its parent's text and the text of its new ids (when the two can be
//! joined, see [`Renderer::decode_joinable`]), and its messages' hash
//! continues its parent's over the messages it adds. Decoding and hashing
//! then grow with the trajectory's tokens and messages; copying each call's
//! whole prompt and normalizing its whole message list (taken out of its
//! stored body, not copied) still grow with the turns times them (`cargo
//! bench --bench trajectory`, the first call after a restart). A catch-up builds only the calls it reads, the first of them
//! decoded and hashed whole.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value as Json;

use super::kept::{HotCall, KeptPrompt, NewCall, Own, WholePrompt};
use super::messages::{self, PrefixHasher};
use super::{extend_segments, hot, normalize, TrajState, Trajectories, TrajectoryError};
use crate::render::Renderer;
use crate::store::{CallRecord, Trajectory, TrajectoryMeta, TrajectoryStatus};
use crate::surface::{self, Api};

/// What the rebuild knows of a call that later calls may continue.
struct Built {
    call: Arc<HotCall>,
    /// Its prompt text then sampled text is the text of its prompt ids then
    /// sampled ids, in a form another joinable text may follow.
    joinable: bool,
    /// The hash of its messages, to continue over a child's.
    hasher: Option<PrefixHasher>,
}

impl Trajectories {
    /// Rebuilds the hot view of `st` from `t`'s stored calls.
    pub(super) fn rebuild(&self, st: &mut TrajState, t: Trajectory) -> Result<(), TrajectoryError> {
        set_meta(st, &t.meta);
        let mut calls = t.calls;
        self.build_calls(st, &mut calls)
    }

    /// Brings a view that another replica's calls left behind up to
    /// `meta`: reads only the calls it has not seen and builds them on the
    /// calls it holds, as [`Trajectories::rebuild`] would have built them.
    /// When the store moved on between reading `meta` and the calls (or the
    /// calls do not continue the view), the view is reloaded whole.
    pub(super) async fn catch_up(
        &self,
        tid: &str,
        st: &mut TrajState,
        meta: &TrajectoryMeta,
    ) -> Result<(), TrajectoryError> {
        let missing = meta.next_call_index.saturating_sub(st.next_call) as usize;
        let mut calls = match missing {
            0 => Vec::new(), // only finished meanwhile
            n => self.store.latest_calls(tid, n).await?,
        };
        if !continues_view(st, &calls, meta, |c| self.other_policy(c)) {
            return self.reload(tid, st).await;
        }
        set_meta(st, meta);
        let built = self.build_calls(st, &mut calls);
        if built.is_err() {
            // Half extended: the next call reloads it whole.
            *st = TrajState::default();
        }
        built
    }

    /// Builds `calls` (sorted by index) on the view, each on its parent:
    /// one built before it, or one the view already holds. Each body's
    /// messages are taken out of it (not copied, where the body is not
    /// shared) and normalized once, for its choices together.
    fn build_calls(
        &self,
        st: &mut TrajState,
        calls: &mut [CallRecord],
    ) -> Result<(), TrajectoryError> {
        let mut built = HashMap::new();
        let mut bodies: HashMap<u32, Option<Arc<Vec<Json>>>> = HashMap::new();
        // The chat requests of calls made through another surface, as they
        // were translated live (their tools and kwargs are the render
        // context), and each stored response's conversation, which a later
        // call's `previous_response_id` continues.
        let mut translated: HashMap<u32, (Json, usize)> = HashMap::new();
        let mut conversations: HashMap<String, Vec<Json>> = HashMap::new();
        for i in 0..calls.len() {
            if self.other_policy(&calls[i]) {
                st.other_policy_calls += 1;
                continue;
            }
            let api = calls[i].api.as_deref().and_then(Api::from_name);
            let messages = match calls[i].request_of {
                Some(first) => bodies.get(&first).cloned().flatten(),
                None => {
                    let m = match api.filter(|a| matches!(a, Api::Responses | Api::Messages)) {
                        Some(a) => {
                            let chat = surface::chat_request(
                                a,
                                &calls[i].request,
                                |id| conversations.get(id).cloned(),
                                self.switches(),
                            );
                            let m = chat
                                .as_ref()
                                .and_then(|(c, _)| self.translated_messages(c, &calls[i].images));
                            if let Some(t) = chat {
                                translated.insert(calls[i].call_index, t);
                            }
                            m
                        }
                        None => {
                            let images = std::mem::take(&mut calls[i].images);
                            let m = self.messages_of(&mut calls[i].request, &images);
                            calls[i].images = images;
                            m
                        }
                    };
                    bodies.insert(calls[i].call_index, m.clone());
                    m
                }
            };
            let rec = &calls[i];
            let first = rec.request_of.unwrap_or(rec.call_index);
            let request = match translated.get(&first) {
                Some((chat, _)) => chat,
                None => crate::store::request_of(calls, rec),
            };
            let instructions = translated.get(&first).map_or(0, |(_, n)| *n);
            self.rebuild_call(st, &mut built, rec, request, messages.clone(), instructions)?;
            if let (Some(id), Some(m)) = (&rec.response_id, &messages) {
                let conversation = surface::responses::continued(m, instructions, &rec.response);
                conversations.insert(id.clone(), conversation);
            }
        }
        Ok(())
    }

    /// A translated chat request's messages, normalized as the live call
    /// normalized them.
    fn translated_messages(
        &self,
        chat: &Json,
        images: &[crate::store::CallImage],
    ) -> Option<Arc<Vec<Json>>> {
        let mut list = chat.get("messages")?.as_array()?.clone();
        normalize::messages(&mut list, self.renderer.content_format());
        normalize::stored_images(&mut list, images);
        Some(Arc::new(list))
    }

    /// The messages of a stored `request`, normalized as the live call
    /// normalized them (so history matches the same messages), taken out
    /// of it; None for a call no later turn continues.
    fn messages_of(
        &self,
        request: &mut Arc<Json>,
        images: &[crate::store::CallImage],
    ) -> Option<Arc<Vec<Json>>> {
        if request.get("continue_final_message") == Some(&Json::Bool(true)) {
            return None;
        }
        let mut list = match Arc::get_mut(request).and_then(|r| r.get_mut("messages")) {
            Some(Json::Array(m)) => std::mem::take(m),
            // Shared with its reader (the memory store): copied.
            _ => request.get("messages")?.as_array()?.clone(),
        };
        normalize::messages(&mut list, self.renderer.content_format());
        normalize::stored_images(&mut list, images);
        Some(Arc::new(list))
    }

    /// Builds `rec` with its `request` (its messages taken out into
    /// `messages`) on its parent.
    fn rebuild_call(
        &self,
        st: &mut TrajState,
        built: &mut HashMap<u32, Built>,
        rec: &CallRecord,
        request: &Json,
        messages: Option<Arc<Vec<Json>>>,
        instructions: usize,
    ) -> Result<(), TrajectoryError> {
        if let Some(p) = rec.parent_call.filter(|p| !built.contains_key(p)) {
            // A call of the view: its text is taken as not joinable and its
            // messages' hash is not kept, so this call's prompt is decoded
            // and its messages hashed whole, once.
            if let Some(call) = held(st, p) {
                let held = Built {
                    call: call.clone(),
                    joinable: false,
                    hasher: None,
                };
                built.insert(p, held);
            }
        }
        let parent = rec.parent_call.and_then(|p| built.get(&p));
        let (prompt_ids, segments, used) = match parent {
            Some(b) => {
                let p = &b.call;
                let mut ids = Vec::with_capacity(p.full_len() + rec.prompt_delta_ids.len());
                p.extend_full_ids(&mut ids);
                ids.extend_from_slice(&rec.prompt_delta_ids);
                let segs = extend_segments(p, rec.prompt_delta_ids.len());
                (ids, segs, p.response_used + rec.prompt_delta_ids.len())
            }
            // A root's one segment is named by its call (HotCall::segments).
            None => (rec.prompt_delta_ids.clone(), Vec::new(), 0),
        };
        if let Some(b) = parent {
            if b.call.sample_index == rec.sample_index {
                st.continued.insert(b.call.call_index);
            }
        }
        let (prompt_text, prompt_joinable) =
            prompt_text(&self.renderer, parent, &prompt_ids, &rec.prompt_delta_ids)?;
        let info = self.inspect_sampled(&rec.response, &rec.sampled_ids)?;
        let joinable = prompt_joinable && info.joinable;
        st.served.insert(rec.call_index, info.served);
        let prompt = KeptPrompt::new(
            parent.map(|b| &*b.call),
            WholePrompt {
                messages: messages.as_ref(),
                ids: &Arc::new(prompt_ids),
                text: &hot::kept_text(prompt_text),
                segments: &segments,
            },
        );
        let hasher = messages_hasher(parent, &prompt, messages.as_deref());
        let call = Arc::new(HotCall::new(NewCall {
            call_index: rec.call_index,
            sample_index: rec.sample_index,
            prompt,
            messages_hash: hasher.as_ref().map_or(0, PrefixHasher::finish),
            context: messages::RenderContext::of_request(request).hash(),
            served: rec.response.clone(),
            response_used: used + rec.sampled_ids.len(),
            sampled_ids: rec.sampled_ids.clone(),
            sampled_text: hot::kept_text(info.text),
            parent: parent.map(|b| b.call.clone()),
            truncated: rec.truncated,
            instructions,
            first_span: rec.versions.first().cloned(),
        }));
        st.push(call.clone());
        built.insert(
            rec.call_index,
            Built {
                call,
                joinable,
                hasher,
            },
        );
        Ok(())
    }
}

/// The view's state that the trajectory's stored row gives.
fn set_meta(st: &mut TrajState, meta: &TrajectoryMeta) {
    st.finished = meta.status == TrajectoryStatus::Finished;
    st.metadata = meta.metadata.clone();
    st.next_call = meta.next_call_index;
    st.next_sample = meta.next_sample_index;
    st.created_at = Some(meta.created_at);
}

/// The view's call `index`, if it holds it (its calls are in index order).
fn held(st: &TrajState, index: u32) -> Option<&Arc<HotCall>> {
    let at = st.calls.binary_search_by_key(&index, |c| c.call_index);
    at.ok().map(|i| &st.calls[i])
}

/// Whether `calls` are exactly the calls the view lacks to reach `meta`:
/// the next indices in order, each built on a call the view holds or on
/// one of them, each request body found among them.
/// (Calls of another policy, which the view skips, are not asked about.)
fn continues_view(
    st: &TrajState,
    calls: &[CallRecord],
    meta: &TrajectoryMeta,
    other_policy: impl Fn(&CallRecord) -> bool,
) -> bool {
    let first = st.next_call;
    let indices_follow = calls
        .iter()
        .zip(first..)
        .all(|(c, want)| c.call_index == want);
    indices_follow
        && first as usize + calls.len() == meta.next_call_index as usize
        && calls.iter().all(|c| {
            if other_policy(c) {
                return true;
            }
            let parent_known = c
                .parent_call
                .is_none_or(|p| p < c.call_index && (p >= first || held(st, p).is_some()));
            let body_known = c.request_of.is_none_or(|r| r >= first && r < c.call_index);
            parent_known && body_known
        })
}

/// The text of a call's prompt ids, and whether it can be joined to: its
/// parent's text then the text of the ids it adds when both can be joined,
/// else the ids decoded whole.
fn prompt_text(
    renderer: &Renderer,
    parent: Option<&Built>,
    prompt_ids: &[u32],
    delta: &[u32],
) -> Result<(String, bool), TrajectoryError> {
    if let Some(b) = parent.filter(|b| b.joinable) {
        let (added, joinable) = renderer.decode_joinable(delta, false)?;
        if joinable {
            let mut text = String::with_capacity(b.call.full_text_len() + added.len());
            b.call.extend_full_text(&mut text);
            text.push_str(&added);
            return Ok((text, true));
        }
    }
    Ok(renderer.decode_joinable(prompt_ids, false)?)
}

/// The hash of a call's messages ([`messages::prefix_hashes`]' last),
/// continued from its parent's when the call keeps its messages after them.
fn messages_hasher(
    parent: Option<&Built>,
    prompt: &KeptPrompt,
    whole: Option<&Vec<Json>>,
) -> Option<PrefixHasher> {
    let whole = whole?;
    let (from, start) = match (&prompt.messages, parent.and_then(|b| b.hasher.as_ref())) {
        (Some(Own::AfterParent(added)), Some(h)) => {
            (h.clone(), whole.len().saturating_sub(added.len()))
        }
        _ => (PrefixHasher::default(), 0),
    };
    let mut h = from;
    for m in &whole[start..] {
        h.push(m);
    }
    Some(h)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::TrajectoryConfig;
    use crate::render::testing::{chatml_renderer, IM_END};
    use crate::trajectory::{testing, ChatInput};

    fn bytes(s: &[u8]) -> Vec<u32> {
        s.iter().map(|&b| u32::from(b)).collect()
    }

    /// Every rebuilt call holds what decoding its ids whole gives (its
    /// prompt's text, its sampled text) and the hash of its whole messages,
    /// whether its text was joined to its parent's or decoded whole: a
    /// reply cut inside a character (the test tokenizer's ids are bytes)
    /// leaves a text that cannot be joined to, and the next prompt may
    /// complete that character; a token-id prompt may end inside one.
    #[tokio::test]
    async fn a_rebuilt_view_holds_what_whole_decodes_and_hashes_give() {
        let renderer = chatml_renderer();
        assert!(renderer.has_fast_decoder(), "the joined path is exercised");
        // SQLite: its reads give bodies of their own, whose messages the
        // rebuild takes out instead of copying (the memory store's are
        // shared, and copied: the other test).
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}", dir.path().join("spans.db").display());
        let store = crate::store::open(&url).expect("store");
        let traj = Trajectories::new(store.clone(), renderer.clone(), TrajectoryConfig::default());
        let euro = "€".as_bytes();
        let replies = [
            [bytes(b"Hello"), vec![IM_END]].concat(),
            // Cut after two of the three bytes of a character.
            bytes(&euro[..2]),
            [bytes("ok € and 🎉".as_bytes()), vec![IM_END]].concat(),
            [bytes(b"done"), vec![IM_END]].concat(),
        ];
        let mut cut = false;
        let mut messages = vec![json!({"role": "system", "content": "You are an agent."})];
        for (turn, sampled) in replies.iter().enumerate() {
            messages.push(json!({"role": "user", "content": format!("turn {turn} ü")}));
            serve(&traj, "t", &mut messages, std::slice::from_ref(sampled)).await;
        }
        // Two choices of one body (the second stores it by reference), and
        // a turn after the first.
        let end = |b: &[u8]| [bytes(b), vec![IM_END]].concat();
        for choices in [vec![end(b"one"), end(b"two")], vec![end(b"three")]] {
            messages.push(json!({"role": "user", "content": "more"}));
            serve(&traj, "t", &mut messages, &choices).await;
        }
        // Token-id prompts. In `c` the second prompt completes, in its own
        // first ids, the character its parent's reply was cut inside; in `d`
        // the first prompt ends inside a character its reply completes.
        let completions = [
            (
                "c",
                bytes("Say €: ".as_bytes()),
                [
                    (
                        bytes(&euro[..1]),
                        [bytes(&euro[1..]), bytes(b" more")].concat(),
                    ),
                    (bytes(b"x"), bytes(b"y")),
                ],
            ),
            (
                "d",
                bytes(&[b"Say ", &euro[..1]].concat()),
                [
                    (bytes(&[&euro[1..], b" ok"].concat()), bytes(b" more")),
                    (bytes(b"x"), bytes(b"y")),
                ],
            ),
        ];
        for (tid, mut prompt, steps) in completions {
            for (sampled, then) in steps {
                complete(&traj, tid, &prompt, &sampled).await;
                prompt = [prompt, sampled, then].concat();
            }
        }

        for tid in ["t", "c", "d"] {
            let stored = store.get_trajectory(tid).await.expect("get").expect(tid);
            assert!(stored.calls.iter().skip(1).all(|c| c.parent_call.is_some()));
            let by_reference = stored.calls.iter().filter(|c| c.request_of.is_some());
            assert_eq!(by_reference.count(), usize::from(tid == "t"));
            let mut st = TrajState::default();
            traj.rebuild(&mut st, stored).expect("rebuild");
            // The messages each call keeps are the ones the live call kept.
            let live = traj.state(tid);
            let live = live.lock().await;
            assert_eq!(live.calls.len(), st.calls.len());
            for (c, l) in st.calls.iter().zip(&live.calls) {
                assert_eq!(c.messages(), l.messages(), "{tid} call {}", c.call_index);
                assert_eq!(c.messages_hash, l.messages_hash);
            }
            for c in &st.calls {
                let ids = c.full_ids();
                let mut text = String::new();
                c.extend_full_text(&mut text);
                let prompt_text = &text[..text.len() - c.sampled_text.len()];
                let whole = renderer
                    .decode(&ids[..c.prompt_len()], false)
                    .expect("decode");
                assert_eq!(prompt_text, whole, "{tid} call {}", c.call_index);
                let sampled = renderer.decode(&c.sampled_ids, false).expect("decode");
                assert_eq!(*c.sampled_text, sampled);
                cut |= sampled.contains('\u{FFFD}');
                let hash = c.messages().map(|m| messages::prefix_hashes(&m)[m.len()]);
                assert_eq!(
                    c.messages_hash,
                    hash.unwrap_or(0),
                    "{tid} call {}",
                    c.call_index
                );
            }
        }
        assert!(cut, "a prompt holds the cut character");
    }

    /// One call of `tid` on `traj`: the chat so far, the ids each choice
    /// sampled (the test tokenizer's ids are bytes); the replies are added
    /// to `messages`, the first choice's as the conversation goes on.
    async fn serve(traj: &Trajectories, tid: &str, messages: &mut Vec<Json>, choices: &[Vec<u32>]) {
        let renderer = chatml_renderer();
        let input = ChatInput {
            messages,
            tools: None,
            kwargs: None,
            add_generation_prompt: true,
        };
        let prepared = traj.prepare_chat(tid, input).await.expect("prepare");
        let texts: Vec<String> = choices
            .iter()
            .map(|ids| renderer.decode(ids, true).expect("decode"))
            .collect();
        let outcomes = choices
            .iter()
            .zip(&texts)
            .map(|(ids, text)| {
                testing::stopped(ids.clone(), json!({"role": "assistant", "content": text}))
            })
            .collect();
        let body = json!({"messages": messages});
        let ctx = testing::context(tid, body, Some(messages.clone()));
        traj.commit(&ctx, &prepared, outcomes, None)
            .await
            .expect("commit");
        messages.push(json!({"role": "assistant", "content": texts[0]}));
    }

    /// One call of `tid` on `traj` with a token-id prompt that sampled
    /// `sampled`.
    async fn complete(traj: &Trajectories, tid: &str, prompt: &[u32], sampled: &[u32]) {
        let prepared = traj
            .prepare_completion(tid, prompt.to_vec())
            .await
            .expect("prepare");
        let ctx = testing::context(tid, json!({"prompt": prompt}), None);
        let outcome = testing::stopped(sampled.to_vec(), json!({"text": ""}));
        traj.commit(&ctx, &prepared, vec![outcome], None)
            .await
            .expect("commit");
    }

    /// Two views hold the same calls, field by field, and the same
    /// trajectory state.
    fn assert_same_view(got: &TrajState, want: &TrajState) {
        assert_eq!(got.calls.len(), want.calls.len());
        for (g, w) in got.calls.iter().zip(&want.calls) {
            let at = format!("call {}", w.call_index);
            assert_eq!(g.call_index, w.call_index);
            assert_eq!(g.sample_index, w.sample_index, "{at}");
            assert_eq!(g.full_ids(), w.full_ids(), "{at}");
            assert_eq!(g.prompt_len(), w.prompt_len(), "{at}");
            let (mut gt, mut wt) = (String::new(), String::new());
            g.extend_full_text(&mut gt);
            w.extend_full_text(&mut wt);
            assert_eq!(gt, wt, "{at}");
            assert_eq!(g.sampled_text, w.sampled_text, "{at}");
            assert_eq!(g.messages(), w.messages(), "{at}");
            assert_eq!(g.messages_hash, w.messages_hash, "{at}");
            assert_eq!(g.context, w.context, "{at}");
            assert_eq!(g.served, w.served, "{at}");
            assert_eq!(g.response_used, w.response_used, "{at}");
            assert_eq!(g.segments(), w.segments(), "{at}");
            assert_eq!(g.truncated, w.truncated, "{at}");
            let parent = |c: &HotCall| c.parent.as_ref().map(|p| p.call_index);
            assert_eq!(parent(g), parent(w), "{at}");
        }
        assert_eq!(got.continued, want.continued);
        assert_eq!(got.served, want.served);
        assert_eq!(
            (got.next_call, got.next_sample, got.finished),
            (want.next_call, want.next_sample, want.finished)
        );
    }

    /// A view left behind by another gateway's calls, brought up to date
    /// from the calls it lacks, holds what a whole rebuild from the store
    /// holds (replies cut inside a character, one completed by the first
    /// call read, a call of two choices whose second records its body by
    /// reference), and keeps the calls it had;
    /// told of fewer calls than the store has by then, it reloads whole.
    #[tokio::test]
    async fn a_view_caught_up_holds_what_a_whole_rebuild_holds() {
        let store = crate::store::open("memory://").expect("store");
        let gateway = || {
            Trajectories::new(
                store.clone(),
                chatml_renderer(),
                TrajectoryConfig::default(),
            )
        };
        let (serving, behind) = (gateway(), gateway());
        let euro = "€".as_bytes();
        let end = |b: &[u8]| [bytes(b), vec![IM_END]].concat();
        let mut messages = vec![json!({"role": "system", "content": "You are an agent."})];
        for (turn, reply) in [end(b"Hello"), bytes(&euro[..2])].iter().enumerate() {
            messages.push(json!({"role": "user", "content": format!("turn {turn} ü")}));
            serve(&serving, "t", &mut messages, std::slice::from_ref(reply)).await;
        }
        let mut view = TrajState::default();
        behind.reload("t", &mut view).await.expect("load");
        let held = view.calls.clone();
        assert_eq!(held.len(), 2);
        let later: [&[Vec<u32>]; 3] = [
            &[end("ok € and 🎉".as_bytes())],
            &[bytes(&euro[1..]), end(b"other")],
            &[end(b"done")],
        ];
        for (turn, choices) in later.into_iter().enumerate() {
            messages.push(json!({"role": "user", "content": format!("later {turn}")}));
            serve(&serving, "t", &mut messages, choices).await;
        }
        let stored = store.get_trajectory("t").await.expect("get").expect("t");
        assert_eq!(stored.calls.len(), 6);
        assert!(stored.calls.iter().any(|c| c.request_of.is_some()));
        let mut whole = TrajState::default();
        behind.rebuild(&mut whole, stored.clone()).expect("rebuild");

        behind
            .catch_up("t", &mut view, &stored.meta)
            .await
            .expect("catch up");
        assert_same_view(&view, &whole);
        for (kept, had) in view.calls.iter().zip(&held) {
            assert!(
                Arc::ptr_eq(kept, had),
                "call {} was rebuilt",
                had.call_index
            );
        }

        // Token-id prompts: the held call's prompt ends inside a character
        // its reply completes, so its prompt text then reply text is not
        // the text of its ids, and the call read cannot be joined to it.
        let prompt = bytes(&[b"Say ", &euro[..1]].concat());
        let reply = bytes(&[&euro[1..], b" ok"].concat());
        let next = [prompt.clone(), reply.clone(), bytes(b" more")].concat();
        complete(&serving, "c", &prompt, &reply).await;
        let mut view = TrajState::default();
        behind.reload("c", &mut view).await.expect("load");
        complete(&serving, "c", &next, &bytes(b"x")).await;
        let c = store.get_trajectory("c").await.expect("get").expect("c");
        behind
            .catch_up("c", &mut view, &c.meta)
            .await
            .expect("catch up");
        let mut whole = TrajState::default();
        behind.rebuild(&mut whole, c).expect("rebuild");
        assert_same_view(&view, &whole);

        // One call behind a view that was loaded whole: the one call read
        // is built on the loaded calls.
        let mut view = TrajState::default();
        behind.reload("t", &mut view).await.expect("load");
        let held = view.calls.clone();
        messages.push(json!({"role": "user", "content": "one more"}));
        serve(&serving, "t", &mut messages, &[end(b"last")]).await;
        let mut told_more = stored.meta.clone();
        told_more.next_call_index += 1;
        behind
            .catch_up("t", &mut view, &told_more)
            .await
            .expect("catch up");
        let stored = store.get_trajectory("t").await.expect("get").expect("t");
        let mut whole = TrajState::default();
        behind.rebuild(&mut whole, stored.clone()).expect("rebuild");
        assert_same_view(&view, &whole);
        assert!(Arc::ptr_eq(&view.calls[0], &held[0]));

        // Told of fewer calls than the store holds by then: the calls read
        // (the store's last) do not follow the view, which is reloaded whole.
        let mut view = TrajState::default();
        behind.reload("t", &mut view).await.expect("load");
        view.next_call -= 2; // as if it had not seen the last two calls
        let (first, dropped) = (view.calls[0].clone(), view.calls.split_off(5));
        assert_eq!(dropped.len(), 2);
        let mut told_less = stored.meta.clone();
        told_less.next_call_index -= 1;
        behind
            .catch_up("t", &mut view, &told_less)
            .await
            .expect("reload");
        assert_same_view(&view, &whole);
        assert!(!Arc::ptr_eq(&view.calls[0], &first), "reloaded whole");
    }
}
