//! What a check reports outside the store: one sample as JSON, and the
//! totals over many trajectories (`tito verify`'s last line).

use serde_json::{json, Value};

use super::{Comparison, Report};

/// One sample's result as reported: the stored fields plus
/// `above_threshold` (every position above it, where `positions` lists at
/// most [`SampleReplay::MAX_POSITIONS`](crate::store::SampleReplay)).
pub fn sample_json(c: &Comparison) -> Value {
    let mut v = serde_json::to_value(&c.replay).unwrap_or_else(|_| json!({}));
    v["above_threshold"] = json!(c.above_threshold);
    v
}

/// Totals over checked trajectories. Means are over compared tokens (a
/// long sample weighs more than a short one).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    pub trajectories: u64,
    pub failed: u64,
    pub samples: u64,
    pub compared: u64,
    pub above_threshold: u64,
    pub max_abs_diff: Option<f64>,
    sum_abs_diff: f64,
    ranked: u64,
    not_argmax: f64,
}

impl Summary {
    pub fn add(&mut self, report: &Report) {
        self.trajectories += 1;
        for c in &report.samples {
            let r = &c.replay;
            self.samples += 1;
            self.compared += u64::from(r.compared);
            self.above_threshold += u64::from(c.above_threshold);
            if let Some(m) = r.max_abs_diff {
                self.max_abs_diff = Some(self.max_abs_diff.map_or(m, |x: f64| x.max(m)));
            }
            self.sum_abs_diff += r.mean_abs_diff.unwrap_or(0.0) * f64::from(r.compared);
            if let Some(share) = r.argmax_mismatch_share {
                self.ranked += u64::from(r.compared);
                self.not_argmax += share * f64::from(r.compared);
            }
        }
    }

    pub fn mean_abs_diff(&self) -> Option<f64> {
        (self.compared > 0).then(|| self.sum_abs_diff / self.compared as f64)
    }

    pub fn argmax_mismatch_share(&self) -> Option<f64> {
        (self.ranked > 0).then(|| self.not_argmax / self.ranked as f64)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "object": "trajectory.verify.summary",
            "trajectories": self.trajectories,
            "failed": self.failed,
            "samples": self.samples,
            "compared": self.compared,
            "above_threshold": self.above_threshold,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff(),
            "argmax_mismatch_share": self.argmax_mismatch_share(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SampleReplay;

    fn comparison(compared: u32, max: f64, mean: f64, share: Option<f64>) -> Comparison {
        Comparison {
            replay: SampleReplay {
                sample: 0,
                backend: "b".into(),
                checked_at: 0,
                compared,
                max_abs_diff: Some(max),
                mean_abs_diff: Some(mean),
                threshold: 0.1,
                positions: Vec::new(),
                argmax_mismatch_share: share,
                by_version: Vec::new(),
                model: None,
                adapter: None,
            },
            above_threshold: 1,
            abs_diffs: Vec::new(),
            tallies: Default::default(),
        }
    }

    #[test]
    fn totals_weigh_samples_by_compared_tokens() {
        let mut s = Summary::default();
        s.add(&Report {
            trajectory_id: "a".into(),
            backend: Some("b".into()),
            samples: vec![
                comparison(1, 0.5, 0.5, Some(1.0)),
                comparison(3, 0.2, 0.1, None),
            ],
            by_version: Vec::new(),
        });
        assert_eq!((s.trajectories, s.samples, s.compared), (1, 2, 4));
        assert_eq!(s.max_abs_diff, Some(0.5));
        let mean = s.mean_abs_diff().expect("compared");
        assert!((mean - 0.8 / 4.0).abs() < 1e-12, "{mean}");
        assert_eq!(s.argmax_mismatch_share(), Some(1.0), "only ranked samples");
        let v = s.to_json();
        assert_eq!(v["above_threshold"], 2);
        assert_eq!(
            sample_json(&comparison(1, 0.0, 0.0, None))["above_threshold"],
            1
        );
    }
}
