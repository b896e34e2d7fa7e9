//! Reconstruction of token sequences from stored calls: a call's full prompt,
//! and the samples of a trajectory (root-to-leaf paths over `parent_call`
//! links) with their response ids, masks and logprobs.
//!
//! Pure functions over `&[CallRecord]` sorted by `call_index`; no I/O, no
//! decoding (segment text is the API layer's business).

use serde::Serialize;

use super::types::{CallRecord, Trajectory};
use super::StoreError;

/// What a run of tokens in a sample is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SegmentKind {
    /// The root call's full prompt.
    Prompt,
    /// Ids the model sampled (mask 1).
    Sampled,
    /// Ids appended by tito between calls: tool results, user turns,
    /// template glue (mask 0).
    Observation,
}

/// A run of ids of one kind, from one call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    pub kind: SegmentKind,
    pub call: u32,
    pub ids: Vec<u32>,
}

/// One training sample: the exact tokens of one root-to-leaf path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub trajectory_id: String,
    pub sample: u32,
    /// Call indices on the path, root first.
    pub calls: Vec<u32>,
    pub prompt_ids: Vec<u32>,
    pub response_ids: Vec<u32>,
    pub response_mask: Vec<u8>,
    /// Aligned with `response_ids`: `None` on observation tokens (nothing
    /// was sampled there) and where the backend reported no logprob.
    pub response_logprobs: Vec<Option<f32>>,
    /// Aligned with `response_ids`: the fleet sequence number of the
    /// weights that sampled each token ([`CallRecord::versions`]); `None`
    /// on observation tokens and where unknown.
    pub response_versions: Vec<Option<u64>>,
    pub reward: Option<f64>,
    pub num_turns: u32,
    pub weight_version: Option<String>,
    pub tokenizer_sha256: String,
    pub template_sha256: String,
    pub finish_reason: String,
    pub truncated: bool,
    /// The policy whose tokens the mask marks: the one asked for, else the
    /// one every call of the path shares; `None` when they differ or a call
    /// has none recorded (see [`Policy`]).
    pub model: Option<String>,
    pub adapter: Option<String>,
}

/// A policy of a trajectory's calls: a served model (`adapter: None`, the
/// base model itself) or one of its LoRA adapters. `model: None` matches
/// an adapter of any model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    pub model: Option<String>,
    pub adapter: Option<String>,
}

impl Policy {
    /// Whether `call` was served by this policy. A call recorded without
    /// its model matches no policy.
    pub fn served(&self, call: &CallRecord) -> bool {
        let model_ok = match (&self.model, &call.model) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(want), Some(m)) => want == m,
        };
        model_ok && self.adapter == call.adapter
    }
}

/// Finds a call by index in calls sorted by `call_index`.
pub fn find_call(calls: &[CallRecord], call_index: u32) -> Option<&CallRecord> {
    calls
        .binary_search_by_key(&call_index, |c| c.call_index)
        .ok()
        .and_then(|i| calls.get(i))
}

/// Call indices from the root to `call_index` (inclusive), root first.
pub fn path_to(calls: &[CallRecord], call_index: u32) -> Result<Vec<u32>, StoreError> {
    let mut path = Vec::new();
    let mut cur = Some(call_index);
    while let Some(idx) = cur {
        let call = find_call(calls, idx).ok_or_else(|| broken(calls, idx))?;
        path.push(idx);
        cur = match call.parent_call {
            // Parents are strictly smaller (checked on append), so this ends.
            Some(p) if p < idx => Some(p),
            Some(_) => return Err(broken(calls, idx)),
            None => None,
        };
    }
    path.reverse();
    Ok(path)
}

fn broken(calls: &[CallRecord], idx: u32) -> StoreError {
    let trajectory = calls
        .first()
        .map(|c| c.trajectory_id.clone())
        .unwrap_or_default();
    StoreError::BrokenChain {
        trajectory,
        call: idx,
    }
}

/// The full prompt ids of a call: the root's prompt, then for every later call
/// on the path the previous call's sampled ids and this call's delta.
pub fn full_prompt_ids(calls: &[CallRecord], call_index: u32) -> Result<Vec<u32>, StoreError> {
    let path = path_to(calls, call_index)?;
    let mut ids = Vec::new();
    let mut prev: Option<&CallRecord> = None;
    for idx in path {
        let call = find_call(calls, idx).ok_or_else(|| broken(calls, idx))?;
        if let Some(p) = prev {
            ids.extend_from_slice(&p.sampled_ids);
        }
        ids.extend_from_slice(&call.prompt_delta_ids);
        prev = Some(call);
    }
    Ok(ids)
}

/// `(sample_index, last call_index)` for every sample of the trajectory,
/// ordered by sample index. The last call of a sample is its highest
/// `call_index`.
pub fn sample_leaves(calls: &[CallRecord]) -> Vec<(u32, u32)> {
    let mut leaves = std::collections::BTreeMap::<u32, u32>::new();
    for c in calls {
        let leaf = leaves.entry(c.sample_index).or_insert(c.call_index);
        *leaf = (*leaf).max(c.call_index);
    }
    leaves.into_iter().collect()
}

/// The segments of the path ending at `leaf`: the root prompt, then sampled /
/// observation runs. Empty runs are left out.
pub fn segments(calls: &[CallRecord], leaf: u32) -> Result<Vec<Segment>, StoreError> {
    let path = path_to(calls, leaf)?;
    let mut out = Vec::with_capacity(path.len() * 2);
    for (i, idx) in path.iter().enumerate() {
        let call = find_call(calls, *idx).ok_or_else(|| broken(calls, *idx))?;
        let kind = if i == 0 {
            SegmentKind::Prompt
        } else {
            SegmentKind::Observation
        };
        if !call.prompt_delta_ids.is_empty() {
            out.push(Segment {
                kind,
                call: *idx,
                ids: call.prompt_delta_ids.clone(),
            });
        }
        if !call.sampled_ids.is_empty() {
            out.push(Segment {
                kind: SegmentKind::Sampled,
                call: *idx,
                ids: call.sampled_ids.clone(),
            });
        }
    }
    Ok(out)
}

/// Builds the sample whose path ends at call `leaf`.
pub fn build_sample(trajectory: &Trajectory, sample: u32, leaf: u32) -> Result<Sample, StoreError> {
    let calls = &trajectory.calls;
    let path = path_to(calls, leaf)?;
    let built = build_path(trajectory, sample, path, None)?;
    // Without a policy every path gives a sample.
    built.ok_or_else(|| broken(calls, leaf))
}

/// Builds the sample whose path ends at call `leaf` as `policy` sees it:
/// the mask is 1 only on the tokens its own calls sampled; the tokens
/// other policies sampled are observations (mask 0, no logprob, no
/// version). `None` when no call of the path is the policy's.
pub fn build_sample_for(
    trajectory: &Trajectory,
    sample: u32,
    leaf: u32,
    policy: &Policy,
) -> Result<Option<Sample>, StoreError> {
    let path = path_to(&trajectory.calls, leaf)?;
    build_path(trajectory, sample, path, Some(policy))
}

fn build_path(
    trajectory: &Trajectory,
    sample: u32,
    path: Vec<u32>,
    policy: Option<&Policy>,
) -> Result<Option<Sample>, StoreError> {
    let calls = &trajectory.calls;
    let leaf = path.last().copied().unwrap_or_default();
    let mut own = 0usize;
    let mut own_model = None;
    let mut prompt_ids = Vec::new();
    let mut response_ids = Vec::new();
    let mut response_mask = Vec::new();
    let mut response_logprobs = Vec::new();
    let mut response_versions = Vec::new();
    let mut truncated = false;
    let mut last: Option<&CallRecord> = None;
    for (i, idx) in path.iter().enumerate() {
        let call = find_call(calls, *idx).ok_or_else(|| broken(calls, *idx))?;
        if i == 0 {
            prompt_ids.extend_from_slice(&call.prompt_delta_ids);
        } else {
            response_ids.extend_from_slice(&call.prompt_delta_ids);
            response_mask.resize(response_ids.len(), 0);
            response_logprobs.resize(response_ids.len(), None);
            response_versions.resize(response_ids.len(), None);
        }
        response_ids.extend_from_slice(&call.sampled_ids);
        if policy.is_none_or(|p| p.served(call)) {
            if own == 0 {
                own_model = call.model.clone();
            }
            own += 1;
            response_mask.resize(response_ids.len(), 1);
            response_logprobs.extend_from_slice(&call.logprobs);
            response_versions.extend(call.sampled_versions());
        }
        // Another policy's tokens (and, defensively, logprobs the append
        // check would have refused) are observations here.
        response_mask.resize(response_ids.len(), 0);
        response_logprobs.resize(response_ids.len(), None);
        response_versions.resize(response_ids.len(), None);
        truncated |= call.truncated;
        last = Some(call);
    }
    let last = last.ok_or_else(|| broken(calls, leaf))?;
    if own == 0 {
        return Ok(None);
    }
    let (model, adapter) = match policy {
        Some(p) => (own_model, p.adapter.clone()),
        None => shared_policy(calls, &path),
    };
    Ok(Some(Sample {
        model,
        adapter,
        trajectory_id: trajectory.meta.id.clone(),
        sample,
        num_turns: path.len() as u32,
        calls: path,
        prompt_ids,
        response_ids,
        response_mask,
        response_logprobs,
        response_versions,
        reward: last.reward.or(trajectory.meta.reward),
        weight_version: last.weight_version.clone(),
        tokenizer_sha256: last.tokenizer_sha256.clone(),
        template_sha256: last.template_sha256.clone(),
        finish_reason: last.finish_reason.clone(),
        truncated,
    }))
}

/// The `(model, adapter)` every call of `path` shares; both `None` when
/// they differ or one has no model recorded.
fn shared_policy(calls: &[CallRecord], path: &[u32]) -> (Option<String>, Option<String>) {
    let mut policies = path
        .iter()
        .filter_map(|&i| find_call(calls, i))
        .map(|c| (c.model.as_ref(), c.adapter.as_ref()));
    let Some(first) = policies.next() else {
        return (None, None);
    };
    match first.0.is_some() && policies.all(|p| p == first) {
        true => (first.0.cloned(), first.1.cloned()),
        false => (None, None),
    }
}

/// All samples of a trajectory, ordered by sample index.
pub fn samples(trajectory: &Trajectory) -> Result<Vec<Sample>, StoreError> {
    sample_leaves(&trajectory.calls)
        .into_iter()
        .map(|(s, leaf)| build_sample(trajectory, s, leaf))
        .collect()
}

/// The samples of a trajectory as `policy` sees them (see
/// [`build_sample_for`]): those with at least one of its calls.
pub fn samples_for(trajectory: &Trajectory, policy: &Policy) -> Result<Vec<Sample>, StoreError> {
    let mut out = Vec::new();
    for (s, leaf) in sample_leaves(&trajectory.calls) {
        out.extend(build_sample_for(trajectory, s, leaf, policy)?);
    }
    Ok(out)
}

impl Trajectory {
    pub fn call(&self, call_index: u32) -> Option<&CallRecord> {
        find_call(&self.calls, call_index)
    }

    /// See [`full_prompt_ids`].
    pub fn full_prompt_ids(&self, call_index: u32) -> Result<Vec<u32>, StoreError> {
        full_prompt_ids(&self.calls, call_index)
    }

    /// See [`samples`].
    pub fn samples(&self) -> Result<Vec<Sample>, StoreError> {
        samples(self)
    }

    /// The request body `call` was made with, following its `request_of`
    /// (`Null` when the call holding it is not stored).
    pub fn request_of<'a>(&'a self, call: &'a CallRecord) -> &'a serde_json::Value {
        request_of(&self.calls, call)
    }
}

/// The request body of `call` among `calls` (sorted by index), following
/// its `request_of`.
pub fn request_of<'a>(calls: &'a [CallRecord], call: &'a CallRecord) -> &'a serde_json::Value {
    static NULL: serde_json::Value = serde_json::Value::Null;
    match call.request_of {
        None => &call.request,
        Some(i) => find_call(calls, i).map_or(&NULL, |c| &c.request),
    }
}
