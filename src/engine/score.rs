//! Teacher-forced scoring: the logprob of every token of a sequence given
//! its prefix, as the replay check asks of a backend, and the two wire forms
//! the `tito engine` server answers it in (vLLM's `prompt_logprobs`, SGLang's
//! `input_token_logprobs` / `input_top_logprobs`).
//!
//! The number is `log_softmax(l)[token]` of the model's unmodified logits
//! row `l`, computed as the sampler computes a raw logprob (same
//! log-sum-exp), whatever `[engine] logprobs_mode` says: a replay has no
//! temperature and no penalties, and there `processed_logprobs` equals
//! `raw_logprobs`. A sample recorded in processed mode at a temperature other
//! than 1, or with penalties, differs from its replay by that processing.
//!
//! Owns: one row's score ([`score_row`]) and the JSON shapes. Must not: touch
//! llama.cpp (the worker feeds the rows).

use serde_json::{json, Map, Value as Json};

use super::sampler::max_and_sum_exp;

/// One position of a scored sequence: how the model rates the token that
/// actually comes next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PositionScore {
    /// `log_softmax(l)[token]`.
    pub logprob: f32,
    /// 1 + the number of tokens with a strictly larger logit (vLLM's rank:
    /// 1 is the most likely, ties share the better rank).
    pub rank: u32,
    /// The most likely token (lowest id among ties) and its logprob.
    pub top: (u32, f32),
}

/// Scores `token` against one row of logits; `None` when the token is not
/// in the row (out of the vocabulary).
pub fn score_row(row: &[f32], token: u32) -> Option<PositionScore> {
    let &own = row.get(token as usize)?;
    let (argmax, max, sum_exp) = max_and_sum_exp(row);
    let lse = max + sum_exp.ln() as f32;
    let above = row.iter().filter(|&&v| v > own).count();
    Some(PositionScore {
        logprob: own - lse,
        rank: u32::try_from(above).map_or(u32::MAX, |n| n.saturating_add(1)),
        top: (argmax as u32, max - lse),
    })
}

/// vLLM's `choices[0].prompt_logprobs`: `null` at position 0, then per
/// position `{"<id>": {"logprob", "rank", "decoded_token"}}` for the
/// position's own token, plus the most likely one when `k >= 1` and it
/// differs. `decode` gives a token's text.
pub fn vllm_prompt_logprobs(
    ids: &[u32],
    scores: &[Option<PositionScore>],
    k: u32,
    decode: impl Fn(u32) -> String,
) -> Json {
    let entry = |lp: f32, rank: u32, id: u32| json!({"logprob": finite(lp), "rank": rank, "decoded_token": decode(id)});
    let list: Vec<Json> = ids
        .iter()
        .zip(scores)
        .map(|(&id, score)| {
            let Some(s) = score else {
                return Json::Null;
            };
            let mut m = Map::new();
            m.insert(id.to_string(), entry(s.logprob, s.rank, id));
            if k >= 1 && s.top.0 != id {
                m.insert(s.top.0.to_string(), entry(s.top.1, 1, s.top.0));
            }
            Json::Object(m)
        })
        .collect();
    Json::Array(list)
}

/// SGLang's `meta_info.input_token_logprobs` and `input_top_logprobs` from
/// position `start` on: `[logprob|null, id, null]` per token, and per
/// position `null` or `[[top_logprob, top_id, null]]` (top-1 only, given
/// when `top` is true).
pub fn sglang_input_logprobs(
    ids: &[u32],
    scores: &[Option<PositionScore>],
    start: usize,
    top: bool,
) -> (Json, Json) {
    let mut tokens = Vec::with_capacity(ids.len().saturating_sub(start));
    let mut tops = Vec::with_capacity(tokens.capacity());
    for (&id, score) in ids.iter().zip(scores).skip(start) {
        tokens.push(json!([score.map(|s| finite(s.logprob)), id, null]));
        tops.push(match score {
            Some(s) if top => json!([[finite(s.top.1), s.top.0, null]]),
            _ => Json::Null,
        });
    }
    (Json::Array(tokens), Json::Array(tops))
}

/// JSON has no infinities: -inf is written as vLLM writes it, -9999.0.
fn finite(v: f32) -> f32 {
    if v.is_finite() {
        v
    } else {
        -9999.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_scores_as_log_softmax_with_rank_and_top() {
        let row = [1.0f32, 3.0, 2.0, 3.0];
        let lse = row.iter().map(|v| f64::from(*v).exp()).sum::<f64>().ln() as f32;
        let s = score_row(&row, 2).expect("in the row");
        assert!((s.logprob - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(s.rank, 3, "two tokens have a larger logit");
        assert_eq!(s.top.0, 1, "lowest id among the tied maxima");
        assert!((s.top.1 - (3.0 - lse)).abs() < 1e-6);
        let tied = score_row(&row, 3).expect("in the row");
        assert_eq!(tied.rank, 1, "a tie with the maximum is rank 1");
        assert!(score_row(&row, 4).is_none());
    }

    #[test]
    fn wire_forms_follow_vllm_and_sglang() {
        let ids = [5u32, 6, 7];
        let s = |lp: f32, rank: u32, top: u32| {
            Some(PositionScore {
                logprob: lp,
                rank,
                top: (top, -0.1),
            })
        };
        let scores = [None, s(-0.5, 1, 6), s(f32::NEG_INFINITY, 4, 9)];
        let v = vllm_prompt_logprobs(&ids, &scores, 0, |id| format!("t{id}"));
        assert_eq!(v[0], Json::Null);
        assert_eq!(v[1]["6"]["rank"], 1);
        assert_eq!(v[1]["6"]["decoded_token"], "t6");
        assert_eq!(v[2]["7"]["logprob"], -9999.0);
        assert!(v[2].get("9").is_none(), "k = 0: the own token only");
        let v1 = vllm_prompt_logprobs(&ids, &scores, 1, |id| format!("t{id}"));
        assert_eq!(v1[2]["9"]["rank"], 1);
        let (tok, top) = sglang_input_logprobs(&ids, &scores, 0, true);
        assert_eq!(tok[0], json!([null, 5, null]));
        assert_eq!(tok[1], json!([-0.5, 6, null]));
        assert_eq!(top[0], Json::Null);
        assert_eq!(top[2][0][1], 9);
        let (tok, _) = sglang_input_logprobs(&ids, &scores, 2, false);
        assert_eq!(tok.as_array().map(Vec::len), Some(1));
    }
}
