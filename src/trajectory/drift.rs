//! Drift diagnosis: where and why the exact prompt of a continued call
//! differs from a fresh template render of the same messages.
//!
//! The position is the first differing token index; the cause is read off
//! the segment (prompt, sampled, observation) that position falls in and
//! what tito served in that call.

use serde::Serialize;
use serde_json::json;

use crate::render::Renderer;
use crate::store::{Drift, SegmentKind};

/// A run of tokens in a call's exact prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SegRange {
    pub kind: SegmentKind,
    pub call: u32,
    pub start: usize,
    pub end: usize,
}

/// What tito served in a call, as far as drift causes go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    pub reasoning: bool,
    pub tool_calls: bool,
}

pub const CAUSES: [&str; 9] = [
    "bpe_retokenization",
    "tool_call_rerender",
    "reasoning_stripped",
    "boundary_token",
    "bos",
    "client_edit",
    "context_change",
    "other_policy",
    "other",
];

pub fn first_difference(a: &[u32], b: &[u32]) -> Option<usize> {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    (common < a.len().max(b.len())).then_some(common)
}

/// Diagnoses drift between `exact` and `fresh`; None when they are equal.
pub fn diagnose(
    renderer: &Renderer,
    exact: &[u32],
    fresh: &[u32],
    segments: &[SegRange],
    served: impl Fn(u32) -> Served,
    end_of_turn: &[u32],
) -> Option<Drift> {
    let p = first_difference(exact, fresh)?;
    let window = |ids: &[u32], from: usize, n: usize| -> Vec<u32> {
        ids.get(from..(from + n).min(ids.len()))
            .unwrap_or_default()
            .to_vec()
    };
    let decode = |ids: &[u32]| renderer.decode(ids, false).unwrap_or_default();
    let seg = segments
        .iter()
        .find(|s| s.start <= p && p < s.end)
        .or(segments.last())
        .copied();
    let bos = renderer.bos_token().and_then(|t| renderer.token_to_id(t));
    let double_bos =
        |ids: &[u32]| bos.is_some() && ids.len() > 1 && ids[0] == ids[1] && Some(ids[0]) == bos;
    let cause = if p == 0 || double_bos(exact) || double_bos(fresh) {
        "bos"
    } else {
        match seg {
            Some(s) if s.kind == SegmentKind::Sampled => {
                let info = served(s.call);
                let exact_rest = decode(&exact[p..s.end.min(exact.len())]);
                let fresh_rest = decode(&window(fresh, p, 2 * (s.end - p) + 8));
                if info.reasoning
                    && exact_rest.contains("<think>") != fresh_rest.contains("<think>")
                    || info.reasoning
                        && !fresh_rest.contains("</think>")
                        && exact_rest.contains("</think>")
                {
                    "reasoning_stripped"
                } else if info.tool_calls {
                    "tool_call_rerender"
                } else if !exact_rest.is_empty() && fresh_rest.starts_with(&exact_rest) {
                    "bpe_retokenization"
                } else if exact.get(p).is_some_and(|t| end_of_turn.contains(t))
                    || fresh.get(p).is_some_and(|t| end_of_turn.contains(t))
                {
                    "boundary_token"
                } else if info.reasoning {
                    "reasoning_stripped"
                } else {
                    "other"
                }
            }
            Some(s) if s.kind == SegmentKind::Observation && p == s.start => "boundary_token",
            _ => "other",
        }
    };
    Some(Drift {
        position: p as u32,
        cause: cause.to_string(),
        details: json!({
            "segment": seg.map(|s| s.kind),
            "call": seg.map(|s| s.call),
            "exact_ids": window(exact, p, 8),
            "fresh_ids": window(fresh, p, 8),
            "exact_text": decode(&window(exact, p, 8)),
            "fresh_text": decode(&window(fresh, p, 8)),
            "exact_len": exact.len(),
            "fresh_len": fresh.len(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::testing::{chatml_renderer, IM_END};

    #[test]
    fn classifies_retokenization_and_boundaries() {
        let r = chatml_renderer();
        let prompt = r
            .encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
            .expect("enc");
        // The model sampled "Hello" as single bytes; a fresh render merges them.
        let sampled: Vec<u32> = "Hello".bytes().map(u32::from).chain([IM_END]).collect();
        let obs = r
            .encode("\n<|im_start|>user\nmore<|im_end|>\n")
            .expect("enc");
        let exact = [prompt.clone(), sampled.clone(), obs.clone()].concat();
        let fresh = r
            .encode(&format!(
                "{}Hello<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n",
                r.decode(&prompt, false).expect("dec")
            ))
            .expect("enc");
        let segs = [
            SegRange {
                kind: SegmentKind::Prompt,
                call: 0,
                start: 0,
                end: prompt.len(),
            },
            SegRange {
                kind: SegmentKind::Sampled,
                call: 0,
                start: prompt.len(),
                end: prompt.len() + sampled.len(),
            },
            SegRange {
                kind: SegmentKind::Observation,
                call: 1,
                start: prompt.len() + sampled.len(),
                end: exact.len(),
            },
        ];
        let d =
            diagnose(&r, &exact, &fresh, &segs, |_| Served::default(), &[IM_END]).expect("drift");
        assert_eq!(d.cause, "bpe_retokenization");
        assert_eq!(d.position as usize, prompt.len());
        assert!(diagnose(&r, &exact, &exact, &segs, |_| Served::default(), &[IM_END]).is_none());
        // A model that stopped on length: the fresh render closes the turn.
        let cut: Vec<u32> = sampled[..5].to_vec();
        let exact2 = [prompt.clone(), cut.clone(), vec![IM_END], obs.clone()].concat();
        let mut fresh2 = [prompt.clone(), cut.clone()].concat();
        fresh2.extend(
            r.encode("\n<|im_start|>user\nmore<|im_end|>\n")
                .expect("enc"),
        );
        let segs2 = [
            SegRange {
                kind: SegmentKind::Prompt,
                call: 0,
                start: 0,
                end: prompt.len(),
            },
            SegRange {
                kind: SegmentKind::Sampled,
                call: 0,
                start: prompt.len(),
                end: prompt.len() + 5,
            },
            SegRange {
                kind: SegmentKind::Observation,
                call: 1,
                start: prompt.len() + 5,
                end: exact2.len(),
            },
        ];
        let d = diagnose(
            &r,
            &exact2,
            &fresh2,
            &segs2,
            |_| Served::default(),
            &[IM_END],
        )
        .expect("drift");
        assert_eq!(d.cause, "boundary_token");
    }
}
