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
//!
//! Column names per layout and format encoding live in [`super::columns`].

use std::cmp::Ordering;

use super::{ExportError, ExportOptions, ExportStats, Layout};
use crate::store::{
    find_call, full_prompt_ids, path_to, samples, samples_for, CallRecord, Trajectory,
};

/// One exported row, before it is encoded (the same values go to JSONL and
/// Parquet, under the column names of [`super::columns`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRow {
    pub trajectory_id: String,
    pub sample: u32,
    /// Only in the `per_call` layout.
    pub call: Option<u32>,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub response_mask: Vec<u8>,
    pub response_logprobs: Vec<Option<f32>>,
    /// Aligned with `response_ids`: the sequence number of the weight
    /// version that sampled each token; `None` on observation tokens and
    /// where unknown.
    pub response_versions: Vec<Option<u64>>,
    pub reward: Option<f64>,
    pub reward_extra_info: Option<serde_json::Value>,
    pub num_turns: u32,
    /// The last call's weight version.
    pub weight_version: Option<String>,
    /// One per call of the row, root first; `None` = the initial weights
    /// (no `POST /admin/weights` yet).
    pub weight_versions: Vec<Option<String>>,
    /// Where each call's sampled ids start in `response_ids` (aligned with
    /// `weight_versions`; the root call's start at 0).
    pub call_offsets: Vec<u32>,
    /// Oldest and newest of `weight_versions` in version order (see
    /// [`version_cmp`]); the initial weights are older than any version.
    pub min_weight_version: Option<String>,
    pub max_weight_version: Option<String>,
    /// Smallest and largest of the known `response_versions`; `None` when
    /// no token's version is known.
    pub min_version: Option<u64>,
    pub max_version: Option<u64>,
    pub group: Option<String>,
    pub data_source: Option<String>,
    pub index: Option<i64>,
    pub extra_info: Option<serde_json::Value>,
    pub tokenizer_sha256: String,
    pub template_sha256: String,
    pub finish_reason: String,
    pub truncated: bool,
    /// The trajectory may miss calls answered just before a crash of a
    /// gateway running with `[store] ack = "queued"`.
    pub incomplete: bool,
    /// From the sample's replay check, when one ran.
    pub replay_max_abs_diff: Option<f64>,
    pub replay_mean_abs_diff: Option<f64>,
    /// Only in the `verl` layout.
    pub verl: Option<VerlColumns>,
    /// The images of the row's prompt and response, in the order of their
    /// placeholder runs.
    pub images: Vec<RowImage>,
    /// With `pixel_values=true`: the images' patches, filled in by the
    /// export driver (`None` until then, or when they cannot be computed).
    pub pixel_values: Option<PixelValues>,
    /// The policy whose tokens the mask marks (see
    /// [`crate::store::Sample::model`]); `adapter: None` is the model itself.
    pub model: Option<String>,
    pub adapter: Option<String>,
}

/// The `pixel_values` of a row's images, concatenated in order: a
/// `[patches, dim]` f32 matrix as little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct PixelValues {
    pub bytes: Vec<u8>,
    /// `[patches, dim]`.
    pub shape: [u32; 2],
}

/// An image of a row: what the call recorded, and its bytes once read
/// from the store (`None` when exported by reference).
#[derive(Debug, Clone, PartialEq)]
pub struct RowImage {
    pub sha256: String,
    pub mime: String,
    /// `[width, height]`.
    pub size: [u32; 2],
    pub grid_thw: [u32; 3],
    /// Where its pad run starts in `prompt_ids` + `response_ids`, and its
    /// length.
    pub offset: u32,
    pub tokens: u32,
    pub bytes: Option<std::sync::Arc<Vec<u8>>>,
}

impl RowImage {
    fn of(calls: &[CallRecord], call_index: u32) -> Vec<RowImage> {
        let Some(call) = find_call(calls, call_index) else {
            return Vec::new();
        };
        call.images
            .iter()
            .map(|im| RowImage {
                sha256: im.sha256.clone(),
                mime: im.mime.clone(),
                size: [im.width, im.height],
                grid_thw: im.grid_thw,
                offset: im.offset,
                tokens: im.tokens,
                bytes: None,
            })
            .collect()
    }
}

impl ExportRow {
    /// verl's `uid`: the group, else the trajectory (a group of one).
    pub fn uid(&self) -> &str {
        self.group.as_deref().unwrap_or(&self.trajectory_id)
    }
}

/// Extra columns of the `verl` layout. With `P = prompt_length`,
/// `R = response_length`: `prompts` has `P` ids (left-padded),
/// `responses`, `response_mask`, `rollout_log_probs`, `rollout_versions`,
/// `rm_scores` have `R` (right-padded), `input_ids`, `attention_mask`,
/// `position_ids` have `P + R`.
#[derive(Debug, Clone, PartialEq)]
pub struct VerlColumns {
    pub input_ids: Vec<u32>,
    pub attention_mask: Vec<u8>,
    /// `max(cumsum(attention_mask) - 1, 0)`, as verl computes them.
    pub position_ids: Vec<u32>,
    /// The reward on the last valid response token, 0 elsewhere (all 0 when
    /// the reward is unset).
    pub rm_scores: Vec<f32>,
    /// `response_versions` as a tensor: [`NO_VERSION`] on observation
    /// tokens, where the version is unknown, and on padding.
    pub rollout_versions: Vec<i64>,
}

/// `rollout_versions` where a token has no version (observation, unknown,
/// padding): sequence numbers start at 1, so it is never one.
pub const NO_VERSION: i64 = -1;

/// Weight versions in "natural" order: runs of digits compare as numbers,
/// so `step-9` < `step-12`; `None` (the initial weights) first.
pub fn version_cmp(a: &Option<String>, b: &Option<String>) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(a), Some(b)) => natural_cmp(a, b),
    }
}

fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(p), Some(q)) if p.is_ascii_digit() && q.is_ascii_digit() => {
                let dx = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let dy = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (nx, ny) = (trim_zeros(&x[..dx]), trim_zeros(&y[..dy]));
                let ord = nx.len().cmp(&ny.len()).then_with(|| nx.cmp(ny));
                if ord != Ordering::Equal {
                    return ord;
                }
                x = &x[dx..];
                y = &y[dy..];
            }
            (Some(p), Some(q)) => {
                if p != q {
                    return p.cmp(q);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|c| **c == b'0').count();
    &digits[zeros.min(digits.len().saturating_sub(1))..]
}

/// Per-call weight versions and where each call's sampled ids start in the
/// response, for the calls of `path` (root first).
fn staleness(
    calls: &[CallRecord],
    path: &[u32],
    per_call: bool,
) -> (Vec<Option<String>>, Vec<u32>) {
    let mut versions = Vec::with_capacity(path.len());
    let mut offsets = Vec::with_capacity(path.len());
    let mut at = 0usize;
    for (i, idx) in path.iter().enumerate() {
        let Some(c) = find_call(calls, *idx) else {
            continue;
        };
        if i > 0 {
            at += c.prompt_delta_ids.len();
        }
        versions.push(c.weight_version.clone());
        offsets.push(at as u32);
        at += c.sampled_ids.len();
    }
    if per_call {
        // A per-call row holds only its own call's sampled ids.
        versions.drain(..versions.len().saturating_sub(1));
        offsets = vec![0; versions.len()];
    }
    (versions, offsets)
}

fn min_max(versions: &[Option<String>]) -> (Option<String>, Option<String>) {
    let min = versions.iter().min_by(|a, b| version_cmp(a, b)).cloned();
    let max = versions.iter().max_by(|a, b| version_cmp(a, b)).cloned();
    (min.flatten(), max.flatten())
}

/// The smallest and largest known sequence number of `versions`.
fn seq_range(versions: &[Option<u64>]) -> (Option<u64>, Option<u64>) {
    let known = || versions.iter().flatten().copied();
    (known().min(), known().max())
}

/// The replay check's max and mean |Δ| over what row `s` marks: the check
/// of its policy, else (a row of several policies, or checks stored without
/// one) every check of the sample, the mean weighted by compared tokens.
fn replay_numbers(
    replays: &[crate::store::SampleReplay],
    s: &crate::store::Sample,
) -> (Option<f64>, Option<f64>) {
    let of_sample = || replays.iter().filter(|r| r.sample == s.sample);
    let own: Vec<_> = of_sample()
        .filter(|r| r.model.is_some() && r.model == s.model && r.adapter == s.adapter)
        .collect();
    let checks: Vec<_> = if !own.is_empty() {
        own
    } else if s.model.is_none() || of_sample().all(|r| r.model.is_none()) {
        of_sample().collect()
    } else {
        Vec::new()
    };
    let max = checks
        .iter()
        .filter_map(|r| r.max_abs_diff)
        .reduce(f64::max);
    let compared: u32 = checks
        .iter()
        .filter(|r| r.mean_abs_diff.is_some())
        .map(|r| r.compared)
        .sum();
    let sum: f64 = checks
        .iter()
        .filter_map(|r| Some(r.mean_abs_diff? * f64::from(r.compared)))
        .sum();
    let mean = (compared > 0).then(|| sum / f64::from(compared));
    (max, mean)
}

/// Appends the rows of `trajectory` for the layout to `out`.
pub fn rows_of(
    trajectory: &Trajectory,
    opts: &ExportOptions,
    stats: &mut ExportStats,
    out: &mut Vec<ExportRow>,
) -> Result<(), ExportError> {
    let meta = &trajectory.meta;
    let base = |trajectory_id: String, sample: u32| ExportRow {
        trajectory_id,
        sample,
        call: None,
        prompt_ids: Vec::new(),
        response_ids: Vec::new(),
        response_mask: Vec::new(),
        response_logprobs: Vec::new(),
        response_versions: Vec::new(),
        reward: None,
        reward_extra_info: meta.reward_extra.clone(),
        num_turns: 0,
        weight_version: None,
        weight_versions: Vec::new(),
        call_offsets: Vec::new(),
        min_weight_version: None,
        max_weight_version: None,
        min_version: None,
        max_version: None,
        group: meta.metadata.group.clone(),
        data_source: meta.metadata.data_source.clone(),
        index: meta.metadata.index,
        extra_info: meta.metadata.extra_info.clone(),
        tokenizer_sha256: String::new(),
        template_sha256: String::new(),
        finish_reason: String::new(),
        truncated: false,
        incomplete: meta.incomplete,
        replay_max_abs_diff: None,
        replay_mean_abs_diff: None,
        verl: None,
        images: Vec::new(),
        pixel_values: None,
        model: None,
        adapter: None,
    };
    match opts.layout {
        Layout::Trajectory | Layout::Verl => {
            let samples = match &opts.policy {
                None => samples(trajectory)?,
                Some(p) => samples_for(trajectory, p)?,
            };
            for s in samples {
                let (replay_max_abs_diff, replay_mean_abs_diff) =
                    replay_numbers(&trajectory.replays, &s);
                let (weight_versions, call_offsets) = staleness(&trajectory.calls, &s.calls, false);
                let (min_weight_version, max_weight_version) = min_max(&weight_versions);
                let (min_version, max_version) = seq_range(&s.response_versions);
                // The last call's prompt holds every image of the sample.
                let images = s
                    .calls
                    .last()
                    .map(|&c| RowImage::of(&trajectory.calls, c))
                    .unwrap_or_default();
                let row = ExportRow {
                    images,
                    prompt_ids: s.prompt_ids,
                    response_ids: s.response_ids,
                    response_mask: s.response_mask,
                    response_logprobs: s.response_logprobs,
                    response_versions: s.response_versions,
                    reward: s.reward,
                    num_turns: s.num_turns,
                    weight_version: s.weight_version,
                    weight_versions,
                    call_offsets,
                    min_weight_version,
                    max_weight_version,
                    min_version,
                    max_version,
                    tokenizer_sha256: s.tokenizer_sha256,
                    template_sha256: s.template_sha256,
                    finish_reason: s.finish_reason,
                    truncated: s.truncated,
                    replay_max_abs_diff,
                    replay_mean_abs_diff,
                    model: s.model,
                    adapter: s.adapter,
                    ..base(s.trajectory_id, s.sample)
                };
                push(row, opts, stats, out);
            }
        }
        Layout::PerCall => {
            let calls = trajectory
                .calls
                .iter()
                .filter(|c| opts.policy.as_ref().is_none_or(|p| p.served(c)));
            for call in calls {
                let n = call.sampled_ids.len();
                let path = path_to(&trajectory.calls, call.call_index)?;
                let (weight_versions, call_offsets) = staleness(&trajectory.calls, &path, true);
                let (min_weight_version, max_weight_version) = min_max(&weight_versions);
                let response_versions = call.sampled_versions();
                let (min_version, max_version) = seq_range(&response_versions);
                let row = ExportRow {
                    images: RowImage::of(&trajectory.calls, call.call_index),
                    call: Some(call.call_index),
                    prompt_ids: full_prompt_ids(&trajectory.calls, call.call_index)?,
                    response_ids: call.sampled_ids.clone(),
                    response_mask: vec![1; n],
                    response_logprobs: call.logprobs.clone(),
                    response_versions,
                    reward: call.reward.or(meta.reward),
                    num_turns: path.len() as u32,
                    weight_version: call.weight_version.clone(),
                    weight_versions,
                    call_offsets,
                    min_weight_version,
                    max_weight_version,
                    min_version,
                    max_version,
                    tokenizer_sha256: call.tokenizer_sha256.clone(),
                    template_sha256: call.template_sha256.clone(),
                    finish_reason: call.finish_reason.clone(),
                    truncated: call.truncated,
                    // A replay checks whole samples, not calls.
                    replay_max_abs_diff: None,
                    replay_mean_abs_diff: None,
                    model: call.model.clone(),
                    adapter: call.adapter.clone(),
                    ..base(meta.id.clone(), call.sample_index)
                };
                push(row, opts, stats, out);
            }
        }
    }
    Ok(())
}

/// Applies length limits, the version filter (and verl padding) and keeps
/// or skips the row.
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
    let cut = opts
        .response_length
        .is_some_and(|r| row.response_ids.len() > r);
    if let (true, Some(r)) = (cut, opts.response_length) {
        // An image's run is kept whole or not at all: a cut inside one
        // moves to where it starts, and the images past the cut go.
        let p = row.prompt_ids.len();
        let r = row
            .images
            .iter()
            .map(|im| (im.offset as usize, im.offset as usize + im.tokens as usize))
            .find(|&(start, end)| start < p + r && end > p + r)
            .map_or(r, |(start, _)| start.saturating_sub(p));
        row.images
            .retain(|im| im.offset as usize + im.tokens as usize <= p + r);
        row.response_ids.truncate(r);
        row.response_mask.truncate(r);
        row.response_logprobs.truncate(r);
        row.response_versions.truncate(r);
        (row.min_version, row.max_version) = seq_range(&row.response_versions);
        // Calls whose sampled ids start past the cut are gone.
        let kept = row
            .call_offsets
            .iter()
            .filter(|o| (**o as usize) < r)
            .count();
        row.call_offsets.truncate(kept.max(1));
        row.weight_versions.truncate(kept.max(1));
        let (min, max) = min_max(&row.weight_versions);
        row.min_weight_version = min;
        row.max_weight_version = max;
        // The row now ends in its last kept call, cut by the length.
        row.weight_version = row.weight_versions.last().cloned().flatten();
        row.finish_reason = "length".into();
        row.truncated = true;
    }
    // On the tokens the row keeps.
    if !opts.versions.keeps(row.min_version) {
        stats.skipped_version += 1;
        return;
    }
    if cut {
        stats.truncated_responses += 1;
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
    let mut rollout_versions: Vec<i64> = row
        .response_versions
        .iter()
        .map(|v| v.and_then(|s| i64::try_from(s).ok()).unwrap_or(NO_VERSION))
        .collect();
    rollout_versions.resize(r, NO_VERSION);
    row.response_versions.resize(r, None);

    let mut attention_mask = vec![0u8; p.saturating_sub(n)];
    attention_mask.resize(p + m, 1);
    attention_mask.resize(p + r, 0);
    let mut position_ids = Vec::with_capacity(p + r);
    let mut seen: u32 = 0;
    for a in &attention_mask {
        seen += u32::from(*a);
        position_ids.push(seen.saturating_sub(1));
    }
    // The reward goes on the last sampled token (mask 1): a row can end in
    // observation tokens (a tool result that spent the budget, a cut), and
    // verl's GAE and REINFORCE++ returns skip mask-0 positions, which would
    // drop a reward placed there. Without a sampled token, the last one.
    let mut rm_scores = vec![0.0f32; r];
    let last_sampled = row.response_mask[..m].iter().rposition(|&x| x == 1);
    if let (Some(reward), Some(last)) = (row.reward, last_sampled.or(m.checked_sub(1))) {
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
        rollout_versions,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn versions_sort_naturally_with_the_initial_weights_first() {
        let mut xs = vec![
            v("step-12"),
            None,
            v("step-9"),
            v("step-100"),
            v("step-012a"),
        ];
        xs.sort_by(version_cmp);
        assert_eq!(
            xs,
            vec![
                None,
                v("step-9"),
                v("step-12"),
                v("step-012a"),
                v("step-100")
            ]
        );
        assert_eq!(min_max(&[v("b"), v("a")]), (v("a"), v("b")));
        assert_eq!(min_max(&[None, v("a")]), (None, v("a")));
    }
}
