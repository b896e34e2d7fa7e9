//! Turning one trajectory into export rows for a layout: `trajectory` (one row
//! per sample), `per_call` (one row per call), `verl` (padded, with
//! `input_ids`, `attention_mask`, `position_ids`, `rm_scores`).
//!
//! Length limits (`prompt_length`, `response_length`) apply to every layout:
//! a row whose prompt is longer than `prompt_length` is skipped and counted
//! (as verl's own dataset filtering drops over-long prompts; cutting a prompt
//! would change what the logprobs were conditioned on); a response longer than
//! `response_length` is cut to it on the right and the row gets
//! `truncated: true` (the kept tokens, masks and logprobs stay exact).

use serde::Serialize;

use super::{ExportError, ExportOptions, ExportStats, Layout};
use crate::store::{full_prompt_ids, path_to, samples, Trajectory};

/// One exported row. Serialized as one JSONL line; the same columns go to
/// Parquet.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExportRow {
    pub trajectory_id: String,
    pub sample: u32,
    /// Only in the `per_call` layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub call: Option<u32>,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub response_mask: Vec<u8>,
    pub response_logprobs: Vec<Option<f32>>,
    pub reward: Option<f64>,
    pub num_turns: u32,
    pub weight_version: Option<String>,
    pub tokenizer_sha256: String,
    pub template_sha256: String,
    pub finish_reason: String,
    pub truncated: bool,
    /// The trajectory may miss calls answered just before a crash of a
    /// gateway running with `[store] ack = "queued"`.
    pub incomplete: bool,
    /// Only in the `verl` layout.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub verl: Option<VerlColumns>,
}

/// Extra columns of the `verl` layout. With `P = prompt_length`,
/// `R = response_length`: `prompt_ids` has `P` ids (left-padded),
/// `response_ids`, `response_mask`, `response_logprobs`, `rm_scores` have `R`
/// (right-padded), `input_ids`, `attention_mask`, `position_ids` have `P + R`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerlColumns {
    pub input_ids: Vec<u32>,
    pub attention_mask: Vec<u8>,
    /// `max(cumsum(attention_mask) - 1, 0)`, as verl computes them.
    pub position_ids: Vec<u32>,
    /// The reward on the last valid response token, 0 elsewhere (all 0 when
    /// the reward is unset).
    pub rm_scores: Vec<f32>,
}

/// Appends the rows of `trajectory` for the layout to `out`.
pub fn rows_of(
    trajectory: &Trajectory,
    opts: &ExportOptions,
    stats: &mut ExportStats,
    out: &mut Vec<ExportRow>,
) -> Result<(), ExportError> {
    match opts.layout {
        Layout::Trajectory | Layout::Verl => {
            for s in samples(trajectory)? {
                let row = ExportRow {
                    trajectory_id: s.trajectory_id,
                    sample: s.sample,
                    call: None,
                    prompt_ids: s.prompt_ids,
                    response_ids: s.response_ids,
                    response_mask: s.response_mask,
                    response_logprobs: s.response_logprobs,
                    reward: s.reward,
                    num_turns: s.num_turns,
                    weight_version: s.weight_version,
                    tokenizer_sha256: s.tokenizer_sha256,
                    template_sha256: s.template_sha256,
                    finish_reason: s.finish_reason,
                    truncated: s.truncated,
                    incomplete: trajectory.meta.incomplete,
                    verl: None,
                };
                push(row, opts, stats, out);
            }
        }
        Layout::PerCall => {
            for call in &trajectory.calls {
                let n = call.sampled_ids.len();
                let row = ExportRow {
                    trajectory_id: trajectory.meta.id.clone(),
                    sample: call.sample_index,
                    call: Some(call.call_index),
                    prompt_ids: full_prompt_ids(&trajectory.calls, call.call_index)?,
                    response_ids: call.sampled_ids.clone(),
                    response_mask: vec![1; n],
                    response_logprobs: call.logprobs.clone(),
                    reward: call.reward.or(trajectory.meta.reward),
                    num_turns: path_to(&trajectory.calls, call.call_index)?.len() as u32,
                    weight_version: call.weight_version.clone(),
                    tokenizer_sha256: call.tokenizer_sha256.clone(),
                    template_sha256: call.template_sha256.clone(),
                    finish_reason: call.finish_reason.clone(),
                    truncated: call.truncated,
                    incomplete: trajectory.meta.incomplete,
                    verl: None,
                };
                push(row, opts, stats, out);
            }
        }
    }
    Ok(())
}

/// Applies length limits (and verl padding) and keeps or skips the row.
fn push(
    mut row: ExportRow,
    opts: &ExportOptions,
    stats: &mut ExportStats,
    out: &mut Vec<ExportRow>,
) {
    if let Some(p) = opts.prompt_length {
        if row.prompt_ids.len() > p {
            stats.skipped_long_prompt += 1;
            return;
        }
    }
    if let Some(r) = opts.response_length {
        if row.response_ids.len() > r {
            row.response_ids.truncate(r);
            row.response_mask.truncate(r);
            row.response_logprobs.truncate(r);
            row.truncated = true;
            stats.truncated_responses += 1;
        }
    }
    if opts.layout == Layout::Verl {
        // Both lengths are checked present by ExportOptions::validate.
        let p = opts.prompt_length.unwrap_or(row.prompt_ids.len());
        let r = opts.response_length.unwrap_or(row.response_ids.len());
        pad_verl(&mut row, p, r, opts.pad_id);
    }
    stats.rows += 1;
    stats.tokens += (row.prompt_ids.len() + row.response_ids.len()) as u64;
    out.push(row);
}

/// Pads a row that already fits `p` / `r` and fills the verl columns.
fn pad_verl(row: &mut ExportRow, p: usize, r: usize, pad: u32) {
    let n = row.prompt_ids.len();
    let m = row.response_ids.len();
    let mut prompt = vec![pad; p.saturating_sub(n)];
    prompt.extend_from_slice(&row.prompt_ids);
    row.prompt_ids = prompt;
    row.response_ids.resize(r, pad);
    row.response_mask.resize(r, 0);
    row.response_logprobs.resize(r, None);

    let mut attention_mask = vec![0u8; p.saturating_sub(n)];
    attention_mask.resize(p + m, 1);
    attention_mask.resize(p + r, 0);
    let mut position_ids = Vec::with_capacity(p + r);
    let mut seen: u32 = 0;
    for a in &attention_mask {
        seen += u32::from(*a);
        position_ids.push(seen.saturating_sub(1));
    }
    let mut rm_scores = vec![0.0f32; r];
    if let (Some(reward), Some(last)) = (row.reward, m.checked_sub(1)) {
        if let Some(slot) = rm_scores.get_mut(last) {
            *slot = reward as f32;
        }
    }
    let mut input_ids = row.prompt_ids.clone();
    input_ids.extend_from_slice(&row.response_ids);
    row.verl = Some(VerlColumns {
        input_ids,
        attention_mask,
        position_ids,
        rm_scores,
    });
}
