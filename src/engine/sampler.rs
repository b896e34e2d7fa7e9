//! Token sampling over one row of logits, in Rust, with the logprob of the
//! sampled token in the quantity `[engine] logprobs_mode` names.
//!
//! Owns: penalties, temperature, top-k / top-p / min-p truncation, the
//! per-request RNG, and logprobs. Must not: touch llama.cpp or decide when a
//! sequence stops (the worker does).
//!
//! Order of operations on a step's logits `l` (one row, `n_vocab` floats):
//! 1. repetition penalty over prompt + output tokens (`l > 0 ? l / r : l * r`);
//! 2. frequency / presence penalties over output tokens
//!    (`l -= frequency * count + presence`);
//! 3. temperature: `z = l / T` (greedy when `T == 0`, and then `z = l`);
//!    with an output constraint (a JSON grammar), `z = -inf` on the tokens
//!    it does not allow ([`Sampler::sample_allowed`]);
//! 4. logprobs, with vLLM's `--logprobs-mode` meanings, before truncation:
//!    - `raw_logprobs` (the default): **`log_softmax(l)`** of the model's
//!      unmodified row (before steps 1-3);
//!    - `processed_logprobs`: **`log_softmax(z)`**, after penalties,
//!      temperature and the constraint.
//!
//!    The sampled token's logprob and the top-k alternatives (chosen by, and
//!    reported under, that same distribution) come from it. When steps 1-3
//!    leave the row unchanged (`T` is 0 or 1 and no penalty applies) the two
//!    are the same and one log-sum-exp serves both; otherwise raw mode costs
//!    one more log-sum-exp over the raw row;
//! 5. truncation for drawing (always from `z`, whatever the mode): top-k,
//!    then top-p over the mass kept by top-k, then min-p relative to the most
//!    likely token; one draw from the renormalised remainder with the
//!    request's RNG.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::SamplingParams;
use crate::config::LogprobsMode;

/// Candidates examined before falling back to a full sort for top-p.
const TOP_P_FAST_PATH: usize = 256;

/// The result of one sampling step.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// `log_softmax(l)[token]` in raw mode, `log_softmax(z)[token]` in
    /// processed mode (see the module docs for `l` and `z`).
    pub logprob: f32,
    /// The `k` most likely tokens under the same distribution, most likely
    /// first (empty unless the request asked for `k > 0` alternatives).
    pub top: Vec<(u32, f32)>,
}

/// Per-request sampling state: RNG, penalty counts, a scratch row.
pub struct Sampler {
    rng: StdRng,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition: f32,
    presence: f32,
    frequency: f32,
    top_logprobs: Option<usize>,
    mode: LogprobsMode,
    /// Output-token counts (frequency / presence penalties).
    counts: HashMap<u32, u32>,
    /// Prompt tokens (repetition penalty), only kept when that penalty is on.
    prompt_seen: Vec<u32>,
    scratch: Vec<f32>,
    order: Vec<u32>,
}

impl Sampler {
    /// `seed = None` draws a fresh seed from the OS; `mode` picks the
    /// logprob quantity (see the module docs).
    pub fn new(params: &SamplingParams, prompt: &[u32], mode: LogprobsMode) -> Sampler {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        let repetition = params.repetition_penalty.unwrap_or(1.0);
        let mut prompt_seen = Vec::new();
        if repetition != 1.0 {
            prompt_seen = prompt.to_vec();
            prompt_seen.sort_unstable();
            prompt_seen.dedup();
        }
        Sampler {
            rng,
            temperature: params.temperature.unwrap_or(1.0).max(0.0),
            top_k: params.top_k.filter(|k| *k > 0).map_or(0, |k| k as usize),
            top_p: params.top_p.unwrap_or(1.0).clamp(0.0, 1.0),
            min_p: params.min_p.unwrap_or(0.0).clamp(0.0, 1.0),
            repetition,
            presence: params.presence_penalty.unwrap_or(0.0),
            frequency: params.frequency_penalty.unwrap_or(0.0),
            top_logprobs: params.logprobs.map(|k| k as usize),
            mode,
            counts: HashMap::new(),
            prompt_seen,
            scratch: Vec::new(),
            order: Vec::new(),
        }
    }

    /// Records a token the sequence emitted (for penalties).
    pub fn observe(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Processed logits `z` for this step, left in `self.scratch`. Returns
    /// whether `z` may differ from `logits` (a penalty or a temperature other
    /// than 0 and 1 was applied).
    fn process(&mut self, logits: &[f32]) -> bool {
        let mut changed = false;
        self.scratch.clear();
        self.scratch.extend_from_slice(logits);
        let z = &mut self.scratch;
        if self.repetition != 1.0 {
            let r = self.repetition;
            let seen = self.prompt_seen.iter().chain(self.counts.keys());
            let mut done: Vec<u32> = seen.copied().collect();
            done.sort_unstable();
            done.dedup();
            for t in done {
                if let Some(l) = z.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / r } else { *l * r };
                    changed = true;
                }
            }
        }
        if self.presence != 0.0 || self.frequency != 0.0 {
            for (&t, &c) in &self.counts {
                if let Some(l) = z.get_mut(t as usize) {
                    *l -= self.frequency * c as f32 + self.presence;
                    changed = true;
                }
            }
        }
        if self.temperature > 0.0 && self.temperature != 1.0 {
            let inv = 1.0 / self.temperature;
            for l in z.iter_mut() {
                *l *= inv;
            }
            changed = true;
        }
        changed
    }

    /// Samples one token from a row of logits. Returns `None` only for an
    /// empty row.
    pub fn sample(&mut self, logits: &[f32]) -> Option<Sampled> {
        self.sample_allowed(logits, None)
    }

    /// [`Sampler::sample`] where only tokens with `allowed[id]` may be drawn
    /// (an output constraint). The mask is part of the processing: the
    /// processed logprobs are over the allowed tokens, the raw ones over all
    /// (the model's own distribution). `None` when nothing is allowed.
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<&[bool]>) -> Option<Sampled> {
        if logits.is_empty() {
            return None;
        }
        let mut changed = self.process(logits);
        if let Some(allowed) = allowed {
            if !allowed.iter().any(|a| *a) {
                return None;
            }
            for (z, ok) in self.scratch.iter_mut().zip(allowed) {
                if !ok {
                    *z = f32::NEG_INFINITY;
                }
            }
            changed = true;
        }
        let (argmax, max, sum_exp) = max_and_sum_exp(&self.scratch);
        let token = if self.temperature == 0.0 {
            argmax as u32
        } else {
            self.draw(max, sum_exp, argmax)
        };
        // The distribution the logprobs come from, and its log-sum-exp.
        let (row, lse): (&[f32], f32) = match self.mode {
            LogprobsMode::RawLogprobs if changed => {
                let (_, raw_max, raw_sum) = max_and_sum_exp(logits);
                (logits, raw_max + raw_sum.ln() as f32)
            }
            _ => (&self.scratch, max + sum_exp.ln() as f32),
        };
        let logprob = row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| v - lse);
        let top = match self.top_logprobs {
            Some(k) if k > 0 => top_k_of(row, k)
                .into_iter()
                .map(|i| (i, row[i as usize] - lse))
                .collect(),
            _ => Vec::new(),
        };
        Some(Sampled {
            token,
            logprob,
            top,
        })
    }

    /// One draw from the truncated distribution `exp(z - max)`.
    fn draw(&mut self, max: f32, sum_exp: f64, argmax: usize) -> u32 {
        let z = &self.scratch;
        let truncating = self.top_k > 0 || self.top_p < 1.0 || self.min_p > 0.0;
        if !truncating {
            let target = self.rng.random::<f64>() * sum_exp;
            let mut acc = 0.0f64;
            for (i, &v) in z.iter().enumerate() {
                acc += f64::from(v - max).exp();
                if acc > target {
                    return i as u32;
                }
            }
            return argmax as u32;
        }
        // Candidates, most likely first.
        let mut order = std::mem::take(&mut self.order);
        order.clear();
        let want = if self.top_k > 0 {
            self.top_k.min(z.len())
        } else if self.top_p < 1.0 {
            TOP_P_FAST_PATH.min(z.len())
        } else {
            z.len()
        };
        order.extend(top_k_of(z, want));
        let weight = |i: u32| f64::from(z[i as usize] - max).exp();
        if self.top_k == 0 && self.top_p < 1.0 && want < z.len() {
            let kept: f64 = order.iter().map(|&i| weight(i)).sum();
            if kept < f64::from(self.top_p) * sum_exp {
                order.clear();
                order.extend(top_k_of(z, z.len()));
            }
        }
        if self.top_p < 1.0 {
            let total: f64 = order.iter().map(|&i| weight(i)).sum();
            let mut acc = 0.0;
            let mut keep = order.len();
            for (n, &i) in order.iter().enumerate() {
                acc += weight(i);
                if acc >= f64::from(self.top_p) * total {
                    keep = n + 1;
                    break;
                }
            }
            order.truncate(keep.max(1));
        }
        if self.min_p > 0.0 {
            let floor = f64::from(self.min_p); // weight of the max token is 1
            let first = order.first().copied();
            order.retain(|&i| weight(i) >= floor);
            if order.is_empty() {
                order.extend(first);
            }
        }
        let total: f64 = order.iter().map(|&i| weight(i)).sum();
        let target = self.rng.random::<f64>() * total;
        let mut acc = 0.0;
        let mut chosen = order.first().copied().unwrap_or(argmax as u32);
        for &i in &order {
            acc += weight(i);
            if acc > target {
                chosen = i;
                break;
            }
        }
        self.order = order;
        chosen
    }
}

/// `(argmax, max, sum(exp(v - max)))` of a non-empty row; the log-sum-exp
/// is `max + ln(sum)`.
pub(crate) fn max_and_sum_exp(row: &[f32]) -> (usize, f32, f64) {
    let (argmax, max) =
        row.iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 {
                    (i, v)
                } else {
                    best
                }
            });
    let sum_exp: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    (argmax, max, sum_exp)
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
fn top_k_of(z: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(z.len());
    let mut idx: Vec<u32> = (0..z.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
    }
    idx.sort_unstable_by(cmp);
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: LogprobsMode = LogprobsMode::RawLogprobs;
    const PROCESSED: LogprobsMode = LogprobsMode::ProcessedLogprobs;

    /// `log_softmax(row)` in f64, as a reference.
    fn log_softmax(row: &[f32]) -> Vec<f32> {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = f64::from(max)
            + row
                .iter()
                .map(|&v| f64::from(v - max).exp())
                .sum::<f64>()
                .ln();
        row.iter().map(|&v| (f64::from(v) - lse) as f32).collect()
    }

    /// Raw-mode and processed-mode samples of the same steps (same seed).
    fn both(p: &SamplingParams, prompt: &[u32], logits: &[f32]) -> (Sampled, Sampled) {
        let raw = Sampler::new(p, prompt, RAW).sample(logits).expect("row");
        let processed = Sampler::new(p, prompt, PROCESSED)
            .sample(logits)
            .expect("row");
        (raw, processed)
    }

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            max_tokens: 8,
            temperature: Some(temperature),
            seed: Some(7),
            logprobs: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_argmax_and_logprob_is_log_softmax() {
        let logits = [0.5f32, 2.0, -1.0, 1.0];
        let mut s = Sampler::new(&params(0.0), &[], RAW);
        let out = s.sample(&logits).expect("non-empty");
        assert_eq!(out.token, 1);
        let lse = logits.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln() as f32;
        assert!((out.logprob - (2.0 - lse)).abs() < 1e-6);
        assert_eq!(out.top.len(), 2);
        assert_eq!(out.top[0].0, 1);
        assert_eq!(out.top[1].0, 3);
    }

    #[test]
    fn same_seed_same_draws_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 * 0.1).collect();
        let run = |p: &SamplingParams| {
            let mut s = Sampler::new(p, &[], RAW);
            (0..20)
                .map(|_| s.sample(&logits).expect("row").token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(&params(1.0)), run(&params(1.0)));
        let mut k1 = params(1.0);
        k1.top_k = Some(1);
        let greedy = run(&params(0.0));
        assert_eq!(run(&k1), greedy);
        let mut p_small = params(1.0);
        p_small.top_p = Some(1e-6);
        assert_eq!(run(&p_small), greedy);
        let mut m = params(1.0);
        m.min_p = Some(1.0);
        assert_eq!(run(&m), greedy);
    }

    #[test]
    fn penalties_change_the_distribution() {
        let logits = [1.0f32, 1.0, 0.0];
        let mut p = params(0.0);
        p.frequency_penalty = Some(2.0);
        let mut s = Sampler::new(&p, &[], PROCESSED);
        s.observe(0);
        assert_eq!(s.sample(&logits).expect("row").token, 1);
        let mut p = params(0.0);
        p.repetition_penalty = Some(4.0);
        let mut s = Sampler::new(&p, &[1], PROCESSED);
        assert_eq!(s.sample(&logits).expect("row").token, 0);
    }

    #[test]
    fn raw_and_processed_differ_under_temperature() {
        let logits = [0.5f32, 2.0, -1.0, 1.0, 1.5];
        let (raw, processed) = both(&params(0.5), &[], &logits);
        assert_eq!(
            raw.token, processed.token,
            "the draw never depends on the mode"
        );
        let t = raw.token as usize;
        assert!((raw.logprob - log_softmax(&logits)[t]).abs() < 1e-6);
        let z: Vec<f32> = logits.iter().map(|l| l / 0.5).collect();
        assert!((processed.logprob - log_softmax(&z)[t]).abs() < 1e-6);
        assert!((raw.logprob - processed.logprob).abs() > 1e-3);
        assert_ne!(raw.top[0].1, processed.top[0].1);
    }

    #[test]
    fn raw_and_processed_differ_under_a_repetition_penalty() {
        let logits = [1.0f32, 1.2, 0.0];
        let mut p = params(0.0);
        p.repetition_penalty = Some(4.0);
        // Token 1 is in the prompt: 1.2 / 4 = 0.3, so greedy picks token 0.
        let (raw, processed) = both(&p, &[1], &logits);
        assert_eq!((raw.token, processed.token), (0, 0));
        assert!((raw.logprob - log_softmax(&logits)[0]).abs() < 1e-6);
        assert!((processed.logprob - log_softmax(&[1.0, 0.3, 0.0])[0]).abs() < 1e-6);
        assert!((raw.logprob - processed.logprob).abs() > 1e-3);
        // Top alternatives are chosen by the distribution that reports them.
        assert_eq!(raw.top[0].0, 1);
        assert_eq!(processed.top[0].0, 0);
    }

    #[test]
    fn raw_equals_processed_at_temperature_one_without_penalties() {
        let logits: Vec<f32> = (0..64).map(|i| ((i * 29) % 64) as f32 * 0.07).collect();
        let mut raw = Sampler::new(&params(1.0), &[], RAW);
        let mut processed = Sampler::new(&params(1.0), &[], PROCESSED);
        for _ in 0..20 {
            let a = raw.sample(&logits).expect("row");
            let b = processed.sample(&logits).expect("row");
            assert_eq!(a, b);
            raw.observe(a.token);
            processed.observe(b.token);
        }
        // Greedy (temperature 0) leaves the row unchanged too.
        assert_eq!(
            both(&params(0.0), &[], &logits).0,
            both(&params(0.0), &[], &logits).1
        );
    }

    #[test]
    fn raw_is_log_softmax_of_the_logits_under_every_processing() {
        let logits: Vec<f32> = (0..200)
            .map(|i| ((i * 71) % 200) as f32 * 0.05 - 4.0)
            .collect();
        let want = log_softmax(&logits);
        let mut p = params(0.7);
        p.logprobs = Some(5);
        p.repetition_penalty = Some(1.3);
        p.frequency_penalty = Some(0.5);
        p.presence_penalty = Some(0.2);
        p.top_k = Some(40);
        p.top_p = Some(0.9);
        let mut s = Sampler::new(&p, &[3, 17, 199], RAW);
        let mut sorted: Vec<(u32, f32)> = want
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for _ in 0..30 {
            let out = s.sample(&logits).expect("row");
            let t = out.token as usize;
            assert!(
                (out.logprob - want[t]).abs() < 1e-6,
                "{} vs {}",
                out.logprob,
                want[t]
            );
            assert_eq!(out.top.len(), 5);
            for ((id, l), (wid, wl)) in out.top.iter().zip(&sorted) {
                assert_eq!(id, wid);
                assert!((l - wl).abs() < 1e-6);
            }
            s.observe(out.token);
        }
    }
}
