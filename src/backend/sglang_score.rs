//! SGLang's answer to a teacher-forced pass (the replay check): the input
//! tokens' logprobs and top-1 alternatives of a non-streamed `/generate`
//! (see `super::sglang`'s module doc for the request).

use serde::Deserialize;
use serde_json::Value as Json;

use super::PositionLogprob;

/// `[logprob, token_id, text|null]` → `(token_id, logprob)`; a null logprob
/// (SGLang writes non-finite floats as null) stays unknown: `None`.
pub(super) fn logprob_entry(v: &Json) -> Option<(u32, Option<f32>)> {
    let arr = v.as_array()?;
    let lp = match arr.first()? {
        Json::Null => None,
        x => Some(x.as_f64()? as f32),
    };
    let id = u32::try_from(arr.get(1)?.as_u64()?).ok()?;
    Some((id, lp))
}

/// A non-streamed `/generate` answer carrying input logprobs.
#[derive(Deserialize)]
pub(super) struct ScoreAnswer {
    #[serde(default)]
    meta_info: Option<ScoreMeta>,
}

#[derive(Deserialize)]
struct ScoreMeta {
    /// `[[logprob|null, id, text|null], ...]`, one per input token; the
    /// first logprob is null.
    #[serde(default)]
    input_token_logprobs: Option<Vec<Json>>,
    /// Per input token: null, or the top alternatives as such triples.
    #[serde(default)]
    input_top_logprobs: Option<Vec<Json>>,
}

/// Reads SGLang's input logprobs for `ids`; a position's token is the argmax
/// when it is the top-1 alternative or its logprob is not below it.
pub(super) fn input_logprobs(
    answer: ScoreAnswer,
    ids: &[u32],
) -> Result<Vec<PositionLogprob>, String> {
    let meta = answer.meta_info.ok_or("answer has no meta_info")?;
    let lps = meta
        .input_token_logprobs
        .ok_or("answer has no input_token_logprobs")?;
    if lps.len() != ids.len() {
        return Err(format!(
            "{} input_token_logprobs for {} input ids",
            lps.len(),
            ids.len()
        ));
    }
    let tops = meta.input_top_logprobs.unwrap_or_default();
    let mut out = Vec::with_capacity(ids.len());
    for (i, (entry, &id)) in lps.iter().zip(ids).enumerate() {
        let (got, logprob) =
            logprob_entry(entry).ok_or_else(|| format!("malformed input_token_logprobs[{i}]"))?;
        if got != id {
            return Err(format!(
                "input_token_logprobs[{i}] is for token {got}, the input has {id}"
            ));
        }
        let logprob = logprob.filter(|_| i > 0);
        let top1 = tops
            .get(i)
            .and_then(Json::as_array)
            .and_then(|a| a.first())
            .and_then(logprob_entry);
        let argmax = match (logprob, top1) {
            (Some(lp), Some((top_id, Some(top_lp)))) => Some(top_id == id || lp >= top_lp),
            _ => None,
        };
        out.push(PositionLogprob { logprob, argmax });
    }
    Ok(out)
}
