//! Token sampling over one row of logits, in Rust, with the logprob of the
//! sampled token in the quantity `[engine] logprobs_mode` names.
//!
//! Owns: penalties, temperature, top-k / top-p / min-p truncation, the
//! per-request RNG, and logprobs. Must not: touch llama.cpp or decide when a
//! sequence stops (the worker does).
//!
//! Order of operations on a step's logits `l` (one row, `n_vocab` floats),
//! vLLM's (`vllm/v1/sample/sampler.py`):
//! 1. repetition penalty over prompt + output tokens (`l > 0 ? l / r : l * r`);
//! 2. frequency / presence penalties over output tokens
//!    (`l -= frequency * count + presence`);
//! 3. with an output constraint (a JSON grammar), `-inf` on the tokens it
//!    does not allow ([`Sampler::sample_allowed`]);
//! 4. greedy when `T == 0`: the argmax, and `z` is the row so far;
//! 5. otherwise temperature, `z = l / T` (a `T` below 0.01 counts as 0.01,
//!    as vLLM clamps it), then truncation: min-p relative to the most
//!    likely token, top-k, then top-p over the mass that is left. Excluded
//!    tokens become `-inf` in `z`; ties at a cut are kept. One draw from
//!    `softmax(z)` with the request's RNG;
//! 6. logprobs, with vLLM's `--logprobs-mode` meanings:
//!    - `raw_logprobs` (the default): **`log_softmax(l)`** of the model's
//!      unmodified row (before steps 1-5);
//!    - `processed_logprobs`: **`log_softmax(z)`**: after penalties, the
//!      constraint, temperature and truncation, i.e. the distribution the
//!      token was drawn from.
//!
//!    The sampled token's logprob and the top-k alternatives (chosen by, and
//!    reported under, that same distribution; a token truncation excluded is
//!    never reported) come from it. When steps 1-5 leave the row unchanged
//!    the two are the same and one log-sum-exp serves both; otherwise raw
//!    mode costs one more log-sum-exp over the raw row.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::exp::{exp_into, sum_exp, sum_weights};
use super::rank::{argmax, top_k_of};
use crate::backend::SamplingParams;
use crate::config::LogprobsMode;

/// How many of the most likely candidates top-p examines, stage after
/// stage, before it sorts the whole row: each stage is a selection over the
/// row plus a sort of that many. A peaked row is cut within the first stage;
/// a flat one (a random prompt's next token) may need thousands of tokens,
/// where a sort of all 49,152 cost 2.8 ms a step (`cargo bench --bench engine`).
const TOP_P_STAGES: [usize; 2] = [256, 4096];

/// vLLM's floor on a sampling temperature (`_MAX_TEMP`): a smaller positive
/// `T` would overflow `l / T`.
const MIN_TEMPERATURE: f32 = 0.01;

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
    /// `exp(z - max)` of each entry of `scratch` before truncation, for a
    /// step that draws (read by the top-p walk, the kept mass and the
    /// draw); empty at temperature 0.
    weights: Vec<f64>,
    order: Vec<u32>,
    values: Vec<f32>,
}

impl Sampler {
    /// `seed = None` draws a fresh seed from the OS; `mode` picks the
    /// logprob quantity (see the module docs).
    pub fn new(params: &SamplingParams, prompt: &[u32], mode: LogprobsMode) -> Sampler {
        let rng = match params.seed {
            // A negative seed is its two's-complement bits.
            Some(seed) => StdRng::seed_from_u64(seed as u64),
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
            temperature: match params.temperature.unwrap_or(1.0) {
                t if t > 0.0 => t.max(MIN_TEMPERATURE),
                _ => 0.0,
            },
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
            weights: Vec::new(),
            order: Vec::new(),
            values: Vec::new(),
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
        // Whether `z` is other than `logits` before truncation.
        let mut processed = self.process(logits);
        if let Some(allowed) = allowed {
            if !allowed.iter().any(|a| *a) {
                return None;
            }
            for (z, ok) in self.scratch.iter_mut().zip(allowed) {
                if !ok {
                    *z = f32::NEG_INFINITY;
                }
            }
            processed = true;
        }
        // A draw reads the weights again (a truncation many times): keep
        // them, computed in one vectorised pass. Greedy needs only their sum.
        let (argmax, max, whole) = if self.temperature > 0.0 {
            max_and_weights(&self.scratch, &mut self.weights)
        } else {
            self.weights.clear();
            max_and_sum_exp(&self.scratch)
        };
        let mut sum_exp = whole;
        let mut truncated = false;
        let token = if self.temperature == 0.0 {
            argmax as u32
        } else {
            if let Some(kept) = self.truncate(max, whole) {
                sum_exp = kept;
                truncated = true;
            }
            self.draw(sum_exp, argmax)
        };
        // The distribution the logprobs come from, and its log-sum-exp. An
        // unprocessed `z` was `logits` before truncation: its sum serves raw.
        let (row, lse): (&[f32], f32) = match self.mode {
            LogprobsMode::RawLogprobs if processed => {
                let (_, raw_max, raw_sum) = max_and_sum_exp(logits);
                (logits, raw_max + raw_sum.ln() as f32)
            }
            LogprobsMode::RawLogprobs if truncated => (logits, max + whole.ln() as f32),
            _ => (&self.scratch, max + sum_exp.ln() as f32),
        };
        let logprob = row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&v| v - lse);
        let top = match self.top_logprobs {
            Some(k) if k > 0 => top_k_of(row, k)
                .into_iter()
                .map(|i| (i, row[i as usize] - lse))
                .filter(|(_, l)| l.is_finite())
                .collect(),
            _ => Vec::new(),
        };
        Some(Sampled {
            token,
            logprob,
            top,
        })
    }

    /// min-p, top-k, then top-p on `z` (vLLM's order), each over what the
    /// previous left: excluded tokens become `-inf`. Returns the mass kept,
    /// `sum(exp(z - max))`, or `None` when nothing was excluded. The most
    /// likely token is always kept, so `max` stays the row's maximum.
    fn truncate(&mut self, max: f32, sum_exp: f64) -> Option<f64> {
        debug_assert!(
            self.weights.len() == self.scratch.len(),
            "a step that draws keeps its weights"
        );
        let z = &mut self.scratch;
        let w = &self.weights;
        let mut cut = f32::NEG_INFINITY;
        if self.min_p > 0.0 {
            // p >= min_p * p_max  <=>  z - max >= ln(min_p)
            cut = max + self.min_p.ln();
        }
        if self.top_k > 0 && self.top_k < z.len() {
            // vLLM keeps every value >= the k-th largest (ties included).
            self.values.clear();
            self.values.extend_from_slice(z);
            let (_, kth, _) = self
                .values
                .select_nth_unstable_by(self.top_k - 1, |a, b| b.total_cmp(a));
            cut = cut.max(*kth);
        }
        // The mass of the entries at or above `cut`, in row order.
        let mass_from = |z: &[f32], cut: f32| -> f64 {
            z.iter()
                .zip(w)
                .filter(|(&v, _)| v >= cut)
                .map(|(_, &w)| w)
                .sum()
        };
        let mut kept = if cut == f32::NEG_INFINITY {
            sum_exp
        } else {
            mass_from(z, cut)
        };
        if self.top_p < 1.0 {
            // A token is kept while the mass ranked above it is below
            // top_p of what is left (vLLM's `cumsum <= 1 - p` mask).
            let limit = f64::from(self.top_p) * kept;
            let candidates = |n: usize, order: &mut Vec<u32>| {
                order.clear();
                order.extend(
                    top_k_of(z, n)
                        .into_iter()
                        .filter(|&i| z[i as usize] >= cut && z[i as usize] > f32::NEG_INFINITY),
                );
            };
            let mut order = std::mem::take(&mut self.order);
            // The value of the last token kept, when the walk excluded one;
            // otherwise the mass it walked over.
            let walk = |order: &[u32]| -> Result<f32, f64> {
                let mut above = 0.0;
                let mut last = None;
                for &i in order {
                    // The most likely token is kept even at top_p = 0.
                    if let Some(last) = last.filter(|_| above >= limit) {
                        return Ok(last);
                    }
                    above += w[i as usize];
                    last = Some(z[i as usize]);
                }
                Err(above)
            };
            // A walk that ends without a cut over a stage's whole prefix
            // needs a longer one; with every candidate it is final. The
            // `n` most likely hold at most `n / m` times the mass of the
            // `m` most likely, so a stage that cannot reach the limit is
            // skipped (a skip only costs time: the longer walk gives the
            // same cut).
            let mut last_kept = None;
            let mut stages = TOP_P_STAGES.into_iter().chain([z.len()]).peekable();
            while let Some(n) = stages.next() {
                candidates(n, &mut order);
                match walk(&order) {
                    Ok(v) => {
                        last_kept = Some(v);
                        break;
                    }
                    Err(_) if order.len() < n || n >= z.len() => break,
                    Err(mass) => {
                        while let Some(&next) = stages.peek() {
                            if next >= z.len() || mass * (next as f64 / n as f64) >= limit {
                                break;
                            }
                            stages.next();
                        }
                    }
                }
            }
            if let Some(v) = last_kept {
                cut = cut.max(v);
                kept = mass_from(z, cut);
            }
            self.order = order;
        }
        if cut == f32::NEG_INFINITY {
            return None;
        }
        let mut excluded = false;
        for v in z.iter_mut().filter(|v| **v < cut) {
            excluded |= *v > f32::NEG_INFINITY;
            *v = f32::NEG_INFINITY;
        }
        excluded.then_some(kept)
    }

    /// One draw from `softmax(z)`, whose mass is `sum_exp`, by the weights
    /// kept for this step (`exp(z - max)`; those of tokens a truncation
    /// excluded are skipped). The walk adds them in row order; `sum_exp` of
    /// a whole row is summed in lanes ([`sum_weights`]), another rounding
    /// of the same sum, so a target in the last ulps above the walk's total
    /// takes the last token with weight, as the walk would with its own.
    fn draw(&mut self, sum_exp: f64, argmax: usize) -> u32 {
        let target = self.rng.random::<f64>() * sum_exp;
        let weights = self
            .scratch
            .iter()
            .zip(&self.weights)
            .enumerate()
            .filter(|(_, (&v, _))| v != f32::NEG_INFINITY)
            .map(|(i, (_, &w))| (i, w));
        walk_to(target, weights).unwrap_or(argmax) as u32
    }
}

/// The first index where the running sum of `weights` passes `target`; past
/// the end, the last index with weight (`None` if none has any, or if a
/// weight was NaN: the caller then takes the argmax, as it always did).
fn walk_to(target: f64, weights: impl Iterator<Item = (usize, f64)>) -> Option<usize> {
    let mut acc = 0.0f64;
    let mut last = None;
    for (i, w) in weights {
        if w > 0.0 {
            last = Some(i);
        }
        acc += w;
        if acc > target {
            return Some(i);
        }
    }
    if acc.is_nan() {
        return None;
    }
    last
}

/// [`max_and_sum_exp`] that leaves each `exp(v - max)` in `weights`; the sum
/// is [`sum_weights`] of them, so the same number.
fn max_and_weights(row: &[f32], weights: &mut Vec<f64>) -> (usize, f32, f64) {
    let (argmax, max) = argmax(row);
    weights.clear();
    weights.resize(row.len(), 0.0);
    exp_into(row, max, weights);
    (argmax, max, sum_weights(weights))
}

/// `(argmax, max, sum(exp(v - max)))` of a non-empty row; the log-sum-exp
/// is `max + ln(sum)`.
pub(crate) fn max_and_sum_exp(row: &[f32]) -> (usize, f32, f64) {
    let (argmax, max) = argmax(row);
    (argmax, max, sum_exp(row, max))
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

    /// The vectorised `exp` and the sums in lanes are another rounding of
    /// the same log-sum-exp: against the sampler's formula before them (the
    /// standard library's `exp`, summed in row order), a logprob (an f32) is
    /// the same bits or one ulp away.
    #[test]
    fn logprobs_match_a_row_order_std_exp_reference_within_one_f32_ulp() {
        let log_softmax = |row: &[f32]| -> Vec<f32> {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
            let lse = max + sum.ln() as f32;
            row.iter().map(|&v| v - lse).collect()
        };
        let mut x = 0x0123_4567_89ab_cdefu64;
        let (mut same, mut one_ulp, mut worst) = (0usize, 0usize, 0u32);
        for case in 0..60 {
            // Flat rows (a random prompt) and peaked ones (text), at the
            // vocabulary widths of SmolLM2 and Qwen3.
            let n = if case % 2 == 0 { 49_152 } else { 151_936 };
            let spread = [2.0f32, 8.0, 30.0][case % 3];
            let logits: Vec<f32> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                    spread * u * u * u - 5.0
                })
                .collect();
            let want = log_softmax(&logits);
            let mut p = params(0.0);
            p.logprobs = Some(20);
            let out = Sampler::new(&p, &[], RAW).sample(&logits).expect("row");
            let got = std::iter::once((out.token, out.logprob)).chain(out.top);
            for (id, l) in got {
                let d = l.to_bits().abs_diff(want[id as usize].to_bits());
                worst = worst.max(d);
                same += usize::from(d == 0);
                one_ulp += usize::from(d == 1);
            }
        }
        eprintln!("{same} logprobs the same bits, {one_ulp} one ulp away, worst {worst} ulps");
        assert!(worst <= 1, "{worst} ulps");
    }

    #[test]
    fn a_draw_past_the_walks_total_takes_the_last_token_with_weight() {
        let w = [(0, 0.25), (2, 0.5), (3, 0.25), (5, 0.0)];
        assert_eq!(walk_to(0.1, w.into_iter()), Some(0));
        assert_eq!(walk_to(0.25, w.into_iter()), Some(2));
        assert_eq!(walk_to(0.9, w.into_iter()), Some(3));
        // A total summed in another order may exceed the walk's by an ulp.
        assert_eq!(walk_to(1.0, w.into_iter()), Some(3));
        assert_eq!(walk_to(0.5, [(1, 0.0), (4, 0.0)].into_iter()), None);
        // A NaN weight (a NaN logit) never passes: the argmax, as before.
        let nan = [(0, 1.0), (1, f64::NAN), (2, 0.5)];
        assert_eq!(walk_to(0.7, nan.into_iter()), Some(0));
        assert_eq!(walk_to(1.2, nan.into_iter()), None);
    }

    #[test]
    fn a_nan_logit_draws_the_argmax_as_it_did() {
        let mut logits = vec![-20.0f32; 100];
        logits[0] = 5.0;
        logits[1] = f32::NAN;
        for seed in 0..20 {
            let mut p = params(1.0);
            p.seed = Some(seed);
            let out = Sampler::new(&p, &[], RAW).sample(&logits).expect("row");
            assert_eq!(out.token, 0, "seed {seed}");
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

    /// The tokens a truncated step may draw: the finite entries of `z`.
    fn kept_after(p: &SamplingParams, logits: &[f32]) -> Vec<u32> {
        let mut s = Sampler::new(p, &[], PROCESSED);
        s.process(logits);
        let (_, max, sum) = max_and_weights(&s.scratch, &mut s.weights);
        s.truncate(max, sum);
        (0..logits.len() as u32)
            .filter(|&i| s.scratch[i as usize].is_finite())
            .collect()
    }

    /// vLLM's top-p by full sort: kept while the mass above is < p.
    fn top_p_reference(logits: &[f32], p: f64) -> usize {
        let mut w: Vec<f64> = logits.iter().map(|&v| f64::from(v).exp()).collect();
        w.sort_by(|a, b| b.total_cmp(a));
        let total: f64 = w.iter().sum();
        let mut above = 0.0;
        w.iter()
            .take_while(|&&x| {
                let keep = above < p * total;
                above += x;
                keep
            })
            .count()
    }

    #[test]
    fn top_p_cuts_at_p_of_the_whole_mass_even_when_the_fast_path_holds_it() {
        // 300 close tokens: the top 256 hold more than 80% of the mass, so
        // the cut falls inside the fast path's candidates.
        let logits: Vec<f32> = (0..1000)
            .map(|i| if i < 300 { -0.001 * i as f32 } else { -1e4 })
            .collect();
        let mut p = params(1.0);
        p.top_p = Some(0.8);
        let want = top_p_reference(&logits, 0.8);
        assert_eq!(want, 233);
        assert_eq!(
            kept_after(&p, &logits),
            (0..want as u32).collect::<Vec<_>>()
        );
        // Past the first stage: the full sort gives the same rule.
        p.top_p = Some(0.95);
        let want = top_p_reference(&logits, 0.95);
        assert!(want > TOP_P_STAGES[0]);
        assert_eq!(kept_after(&p, &logits).len(), want);
    }

    #[test]
    fn top_p_cuts_the_same_in_every_stage_and_after_the_whole_sort() {
        // 6,000 close tokens: top-p 0.03 cuts in the first stage, 0.5 in
        // the second, 0.9 only once the whole row is sorted.
        let logits: Vec<f32> = (0..8000)
            .map(|i| if i < 6000 { -1e-5 * i as f32 } else { -1e4 })
            .collect();
        let bounds = [0, TOP_P_STAGES[0], TOP_P_STAGES[1], logits.len()];
        for (stage, top_p) in [0.03f32, 0.5, 0.9].into_iter().enumerate() {
            let mut p = params(1.0);
            p.top_p = Some(top_p);
            let want = top_p_reference(&logits, f64::from(top_p));
            assert!(
                want > bounds[stage] && want <= bounds[stage + 1],
                "top-p {top_p}: {want} kept, not in stage {stage}"
            );
            assert_eq!(
                kept_after(&p, &logits),
                (0..want as u32).collect::<Vec<_>>(),
                "top-p {top_p}"
            );
        }
    }

    #[test]
    fn processed_logprobs_are_of_the_truncated_distribution() {
        let logits = [2.0f32, 1.0, 0.0, -1.0];
        let mut p = params(1.0);
        p.top_k = Some(2);
        p.logprobs = Some(4);
        for seed in 0..20 {
            p.seed = Some(seed);
            let (raw, processed) = both(&p, &[], &logits);
            let t = processed.token as usize;
            assert!(t < 2, "top-k 2 draws one of the two most likely");
            assert!((processed.logprob - log_softmax(&[2.0, 1.0])[t]).abs() < 1e-6);
            assert_eq!(
                processed.top.len(),
                2,
                "excluded tokens are not alternatives"
            );
            assert!((raw.logprob - log_softmax(&logits)[t]).abs() < 1e-6);
            assert_eq!(raw.top.len(), 4);
        }
    }

    #[test]
    fn min_p_cuts_before_top_p_and_top_k_keeps_ties() {
        // p = 0.45, 0.30 and 25 x 0.01: min-p 0.1 leaves the first two,
        // and top-p 0.55 of their 0.75 keeps only the first.
        let mut logits = vec![0.45f32.ln(), 0.30f32.ln()];
        logits.extend([0.01f32.ln(); 25]);
        let mut p = params(1.0);
        p.min_p = Some(0.1);
        p.top_p = Some(0.55);
        assert_eq!(kept_after(&p, &logits), vec![0]);
        let mut p = params(1.0);
        p.top_k = Some(2);
        assert_eq!(kept_after(&p, &[1.0, 1.0, 1.0, 0.0]), vec![0, 1, 2]);
        // top_p = 0 keeps the most likely token (and its ties), not all.
        let mut p = params(1.0);
        p.top_p = Some(0.0);
        assert_eq!(kept_after(&p, &[0.5, 2.0, 1.0]), vec![1]);
    }

    #[test]
    fn a_tiny_temperature_is_clamped_not_overflowed() {
        let logits = [0.0f32, 1.0, 0.5];
        for t in [1e-39f32, 1e-6] {
            let (raw, processed) = both(&params(t), &[], &logits);
            assert_eq!(processed.token, 1);
            assert!(processed.logprob.is_finite(), "T = {t}: {processed:?}");
            let z: Vec<f32> = logits.iter().map(|l| l / MIN_TEMPERATURE).collect();
            assert!((processed.logprob - log_softmax(&z)[1]).abs() < 1e-5);
            assert!((raw.logprob - log_softmax(&logits)[1]).abs() < 1e-6);
        }
    }
}
