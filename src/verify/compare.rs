//! The comparison of one sample's recorded logprobs with a replay of them:
//! pure arithmetic over the sample and the backend's per-position answer.
//!
//! A response position `r` is compared when the model sampled it
//! (`response_mask[r] == 1`) and both numbers exist: the recorded
//! `response_logprobs[r]` and the replayed logprob at sequence position
//! `prompt_len + r`. Observation tokens (tool results, user turns, template
//! glue) are replayed too (they are part of the prefix) but never compared.
//! The same numbers are kept per weight version that sampled the compared
//! tokens (`response_versions[r]`), so a trajectory whose calls ran on
//! several versions shows which of them differs from the replaying backend.

use std::collections::BTreeMap;

use crate::backend::PositionLogprob;
use crate::store::{ReplayPosition, Sample, SampleReplay, VersionReplay};

/// One sample's comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// What is stored with the sample and reported.
    pub replay: SampleReplay,
    /// Positions whose |Δ| is above the threshold, all of them (the replay
    /// lists at most [`SampleReplay::MAX_POSITIONS`]).
    pub above_threshold: u32,
    /// Every compared |Δ|, in response order (for the histogram).
    pub abs_diffs: Vec<f64>,
    /// The tallies behind `replay.by_version`, by version sequence number
    /// (`None`: unknown), for totals over several samples.
    pub tallies: BTreeMap<Option<u64>, Tally>,
}

/// What the comparison of a set of tokens adds up.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Tally {
    pub compared: u32,
    sum: f64,
    max: Option<f64>,
    /// Compared tokens the backend ranked, and those not its argmax.
    ranked: u32,
    not_argmax: u32,
}

impl Tally {
    fn add(&mut self, d: f64, argmax: Option<bool>) {
        self.compared += 1;
        self.sum += d;
        self.max = Some(self.max.map_or(d, |m| m.max(d)));
        if let Some(is_max) = argmax {
            self.ranked += 1;
            self.not_argmax += u32::from(!is_max);
        }
    }

    /// Adds another tally's tokens to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.compared += other.compared;
        self.sum += other.sum;
        self.max = match (self.max, other.max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        self.ranked += other.ranked;
        self.not_argmax += other.not_argmax;
    }

    pub fn max_abs_diff(&self) -> Option<f64> {
        self.max
    }

    pub fn mean_abs_diff(&self) -> Option<f64> {
        (self.compared > 0).then(|| self.sum / f64::from(self.compared))
    }

    /// Over the compared tokens the backend ranked; none ranked: unknown.
    pub fn argmax_mismatch_share(&self) -> Option<f64> {
        (self.ranked > 0).then(|| f64::from(self.not_argmax) / f64::from(self.ranked))
    }

    /// The tally as reported for version `seq`, labelled `version`.
    pub fn report(&self, seq: Option<u64>, version: Option<String>) -> VersionReplay {
        VersionReplay {
            seq,
            version,
            compared: self.compared,
            max_abs_diff: self.max_abs_diff(),
            mean_abs_diff: self.mean_abs_diff(),
            argmax_mismatch_share: self.argmax_mismatch_share(),
        }
    }
}

/// Per-version reports of `tallies`: ascending by sequence number, the
/// unknown version last, each labelled from `labels` (sequence number →
/// label; unlabelled: `None`).
pub fn by_version(
    tallies: &BTreeMap<Option<u64>, Tally>,
    labels: &BTreeMap<u64, String>,
) -> Vec<VersionReplay> {
    let known = tallies.iter().filter(|(seq, _)| seq.is_some());
    let unknown = tallies.iter().filter(|(seq, _)| seq.is_none());
    known
        .chain(unknown)
        .map(|(seq, t)| t.report(*seq, seq.and_then(|s| labels.get(&s).cloned())))
        .collect()
}

/// The sequence a sample is replayed as: its prompt, then its response.
pub fn sequence(sample: &Sample) -> Vec<u32> {
    let mut ids = Vec::with_capacity(sample.prompt_ids.len() + sample.response_ids.len());
    ids.extend_from_slice(&sample.prompt_ids);
    ids.extend_from_slice(&sample.response_ids);
    ids
}

/// True when the sample has a sampled token with a recorded logprob, i.e.
/// something a replay can be compared with.
pub fn has_comparable(sample: &Sample) -> bool {
    sample
        .response_mask
        .iter()
        .zip(&sample.response_logprobs)
        .any(|(&m, lp)| m == 1 && lp.is_some())
}

/// |recorded − replayed| in nats: 0 where both are the same (-inf and -inf
/// included), +inf where one of them is -inf and the other is not.
fn gap(recorded: f32, replayed: f32) -> f64 {
    if recorded == replayed {
        0.0
    } else {
        (f64::from(recorded) - f64::from(replayed)).abs()
    }
}

/// Compares `sample` with `replayed` (one entry per id of
/// [`sequence(sample)`](sequence); a shorter answer leaves the positions it
/// does not cover uncompared). `threshold` is in nats; `checked_at` in unix
/// milliseconds. `labels` names the versions of `replay.by_version`
/// (sequence number → label).
pub fn compare(
    sample: &Sample,
    replayed: &[PositionLogprob],
    threshold: f64,
    backend: &str,
    checked_at: i64,
    labels: &BTreeMap<u64, String>,
) -> Comparison {
    let offset = sample.prompt_ids.len();
    let mut abs_diffs = Vec::new();
    let mut above: Vec<ReplayPosition> = Vec::new();
    let mut all = Tally::default();
    let mut tallies: BTreeMap<Option<u64>, Tally> = BTreeMap::new();
    let sampled = sample
        .response_mask
        .iter()
        .zip(&sample.response_logprobs)
        .enumerate()
        .filter(|(_, (&m, _))| m == 1);
    for (r, (_, recorded)) in sampled {
        let Some(recorded) = *recorded else {
            continue;
        };
        let Some(replay) = replayed.get(offset + r) else {
            continue;
        };
        let Some(value) = replay.logprob else {
            continue;
        };
        let d = gap(recorded, value);
        abs_diffs.push(d);
        all.add(d, replay.argmax);
        let seq = sample.response_versions.get(r).copied().flatten();
        tallies.entry(seq).or_default().add(d, replay.argmax);
        if d > threshold {
            above.push(ReplayPosition {
                position: r as u32,
                token_id: sample.response_ids.get(r).copied().unwrap_or_default(),
                recorded,
                replayed: value,
            });
        }
    }
    let above_threshold = above.len() as u32;
    // Largest |Δ| first; equal ones in position order.
    let of = |p: &ReplayPosition| gap(p.recorded, p.replayed);
    above.sort_by(|a, b| of(b).total_cmp(&of(a)).then(a.position.cmp(&b.position)));
    above.truncate(SampleReplay::MAX_POSITIONS);
    let replay = SampleReplay {
        sample: sample.sample,
        backend: backend.to_string(),
        checked_at,
        compared: all.compared,
        max_abs_diff: all.max_abs_diff(),
        mean_abs_diff: all.mean_abs_diff(),
        threshold,
        positions: above,
        argmax_mismatch_share: all.argmax_mismatch_share(),
        by_version: by_version(&tallies, labels),
        model: sample.model.clone(),
        adapter: sample.adapter.clone(),
    };
    Comparison {
        replay,
        above_threshold,
        abs_diffs,
        tallies,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prompt [1, 2]; response [10, 11, 12, 13] with 12 an observation.
    fn sample(recorded: [Option<f32>; 4]) -> Sample {
        Sample {
            trajectory_id: "t".into(),
            sample: 3,
            calls: vec![0, 1],
            prompt_ids: vec![1, 2],
            response_ids: vec![10, 11, 12, 13],
            response_mask: vec![1, 1, 0, 1],
            response_logprobs: recorded.to_vec(),
            response_versions: vec![None; 4],
            reward: None,
            num_turns: 2,
            weight_version: None,
            tokenizer_sha256: String::new(),
            template_sha256: String::new(),
            finish_reason: "stop".into(),
            truncated: false,
            model: None,
            adapter: None,
        }
    }

    fn at(logprob: Option<f32>, argmax: Option<bool>) -> PositionLogprob {
        PositionLogprob { logprob, argmax }
    }

    #[test]
    fn minus_infinity_on_both_sides_is_no_gap() {
        let inf = f32::NEG_INFINITY;
        let s = sample([Some(inf), Some(-1.0), None, Some(-2.0)]);
        let replayed = [
            at(None, None),
            at(Some(-3.0), None),
            at(Some(inf), None),
            at(Some(inf), None),
            at(Some(-9.0), None),
            at(Some(-2.0), None),
        ];
        let c = compare(&s, &replayed, 0.1, "b", 7, &BTreeMap::new());
        assert_eq!(c.replay.compared, 3);
        assert_eq!(c.abs_diffs, [0.0, f64::INFINITY, 0.0]);
        assert_eq!(c.above_threshold, 1);
        assert_eq!(c.replay.positions[0].position, 1);
    }

    #[test]
    fn equal_logprobs_give_zero_and_observations_are_skipped() {
        let s = sample([Some(-0.5), Some(-1.0), None, Some(-2.0)]);
        let replayed = [
            at(None, None),
            at(Some(-3.0), Some(false)),
            at(Some(-0.5), Some(true)),
            at(Some(-1.0), Some(true)),
            // The observation: a different number, never compared.
            at(Some(-9.0), Some(false)),
            at(Some(-2.0), Some(false)),
        ];
        let c = compare(&s, &replayed, 0.1, "b", 7, &BTreeMap::new());
        assert_eq!(c.replay.compared, 3);
        assert_eq!(c.replay.max_abs_diff, Some(0.0));
        assert_eq!(c.replay.mean_abs_diff, Some(0.0));
        assert!(c.replay.positions.is_empty());
        assert_eq!(c.above_threshold, 0);
        assert_eq!(c.replay.argmax_mismatch_share, Some(1.0 / 3.0));
        assert_eq!(c.replay.sample, 3);
        assert_eq!(c.replay.backend, "b");
        assert_eq!(c.replay.checked_at, 7);
        assert_eq!(c.abs_diffs, vec![0.0; 3]);
    }

    #[test]
    fn positions_above_the_threshold_are_named_largest_first() {
        let s = sample([Some(-0.5), Some(-1.0), None, Some(-2.0)]);
        let replayed = [
            at(None, None),
            at(None, None),
            at(Some(-0.25), None),
            at(Some(-1.05), None),
            at(None, None),
            at(Some(-3.0), None),
        ];
        let c = compare(&s, &replayed, 0.1, "b", 0, &BTreeMap::new());
        assert_eq!(c.replay.compared, 3);
        let named: Vec<(u32, u32)> = c
            .replay
            .positions
            .iter()
            .map(|p| (p.position, p.token_id))
            .collect();
        assert_eq!(named, vec![(3, 13), (0, 10)], "|Δ| 1.0 then 0.25");
        assert_eq!(c.replay.positions[0].recorded, -2.0);
        assert_eq!(c.replay.positions[0].replayed, -3.0);
        assert_eq!(c.replay.max_abs_diff, Some(1.0));
        let mean = (0.25 + 0.05 + 1.0) / 3.0;
        let got = c.replay.mean_abs_diff.expect("compared");
        assert!((got - mean).abs() < 1e-6, "{got} vs {mean}");
        assert_eq!(c.replay.argmax_mismatch_share, None, "no ranks given");
    }

    #[test]
    fn missing_numbers_on_either_side_are_not_compared() {
        let s = sample([None, Some(-1.0), None, Some(-2.0)]);
        // The answer stops before the replay of response position 1.
        let replayed = [at(None, None), at(None, None), at(Some(-0.5), None)];
        let c = compare(&s, &replayed, 0.1, "b", 0, &BTreeMap::new());
        assert_eq!(c.replay.compared, 0);
        assert_eq!(c.replay.max_abs_diff, None);
        assert_eq!(c.replay.mean_abs_diff, None);
        assert_eq!(c.replay.argmax_mismatch_share, None);
        assert!(has_comparable(&s));
        assert!(!has_comparable(&sample([None; 4])));
    }

    #[test]
    fn positions_are_capped_and_the_count_is_kept() {
        let n = SampleReplay::MAX_POSITIONS + 10;
        let mut s = sample([None; 4]);
        s.response_ids = (0..n as u32).collect();
        s.response_mask = vec![1; n];
        s.response_logprobs = vec![Some(-1.0); n];
        let replayed: Vec<PositionLogprob> = (0..n + 2)
            .map(|i| at(Some(-1.0 - i as f32 / 1000.0 - 0.5), Some(true)))
            .collect();
        let c = compare(&s, &replayed, 0.1, "b", 0, &BTreeMap::new());
        assert_eq!(c.above_threshold as usize, n);
        assert_eq!(c.replay.positions.len(), SampleReplay::MAX_POSITIONS);
        assert_eq!(
            c.replay.positions[0].position as usize,
            n - 1,
            "largest first"
        );
        assert_eq!(c.replay.argmax_mismatch_share, Some(0.0));
        assert_eq!(sequence(&s).len(), 2 + n);
    }
}
