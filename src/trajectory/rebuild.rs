//! The hot view rebuilt from the store's calls (after a restart or an
//! eviction), as the live calls built it.
//!
//! A call continues its parent's prompt and request history, so the
//! costly parts are not redone for the parent's share: a prompt's text is
//! its parent's text and the text of its new ids (when the two can be
//! joined, see [`Renderer::decode_joinable`]), and its messages' hash
//! continues its parent's over the messages it adds. Decoding and hashing
//! then grow with the trajectory's tokens and messages; copying each call's
//! whole prompt and normalizing its whole message list still grow with the
//! turns times them (`cargo bench --bench trajectory`, the first call after
//! a restart).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value as Json;

use super::kept::{HotCall, KeptPrompt, NewCall, Own, WholePrompt};
use super::messages::{self, PrefixHasher};
use super::{extend_segments, hot, normalize, TrajState, Trajectories, TrajectoryError};
use crate::render::Renderer;
use crate::store::{Trajectory, TrajectoryStatus};

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
        st.finished = t.meta.status == TrajectoryStatus::Finished;
        st.metadata = t.meta.metadata.clone();
        st.next_call = t.meta.next_call_index;
        st.next_sample = t.meta.next_sample_index;
        let mut built: HashMap<u32, Built> = HashMap::new();
        for rec in &t.calls {
            let parent = rec.parent_call.and_then(|p| built.get(&p));
            // The stored request is as received: normalize it as the live
            // call was, so history matches the same messages.
            let request = crate::store::request_of(&t.calls, rec);
            let continues_final = request.get("continue_final_message") == Some(&Json::Bool(true));
            let messages = request.get("messages").and_then(Json::as_array);
            let messages = messages.filter(|_| !continues_final).map(|m| {
                let mut m = m.clone();
                normalize::messages(&mut m, self.renderer.content_format());
                Arc::new(m)
            });
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
        }
        Ok(())
    }
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
        let store = crate::store::open("memory://").expect("store");
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
            let input = ChatInput {
                messages: &messages,
                tools: None,
                kwargs: None,
                add_generation_prompt: true,
            };
            let prepared = traj.prepare_chat("t", input).await.expect("prepare");
            let text = renderer.decode(sampled, true).expect("decode");
            let body = json!({"messages": messages});
            let ctx = testing::context("t", body, Some(messages.clone()));
            let served = json!({"role": "assistant", "content": text});
            let outcome = testing::stopped(sampled.clone(), served);
            traj.commit(&ctx, &prepared, vec![outcome], None)
                .await
                .expect("commit");
            messages.push(json!({"role": "assistant", "content": text}));
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
                let prepared = traj
                    .prepare_completion(tid, prompt.clone())
                    .await
                    .expect("prepare");
                let ctx = testing::context(tid, json!({"prompt": prompt}), None);
                let outcome = testing::stopped(sampled.clone(), json!({"text": ""}));
                traj.commit(&ctx, &prepared, vec![outcome], None)
                    .await
                    .expect("commit");
                prompt = [prompt, sampled, then].concat();
            }
        }

        for tid in ["t", "c", "d"] {
            let stored = store.get_trajectory(tid).await.expect("get").expect(tid);
            assert!(stored.calls.iter().skip(1).all(|c| c.parent_call.is_some()));
            let mut st = TrajState::default();
            traj.rebuild(&mut st, stored).expect("rebuild");
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
}
