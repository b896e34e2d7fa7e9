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

use std::cell::RefCell;
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

/// Per-request sampling state: RNG and penalty counts. The rows a step
/// works on belong to the sampling thread (`Scratch`).
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
}

/// One step's working rows, as long as the vocabulary: 12 bytes per entry,
/// up to 20 with top-k and a top-p walk over the whole row (1.8 to 3.0 MB
/// for Qwen3's 151,936 entries). Kept per thread ([`SCRATCH`]) and
/// reused by every sequence that thread samples, rather than per sequence,
/// so a running sequence costs its RNG and penalty counts only.
#[derive(Default)]
struct Scratch {
    /// `z`: the processed logits of the step.
    z: Vec<f32>,
    /// `exp(z - max)` of each entry of `z` before truncation, for a step
    /// that draws (read by the top-p walk, the kept mass and the draw);
    /// empty at temperature 0.
    weights: Vec<f64>,
    /// Top-p's candidates, most likely first.
    order: Vec<u32>,
    /// Top-k's selection.
    values: Vec<f32>,
}

thread_local! {
    /// The [`Scratch`] of the sequences sampled on this thread.
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
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
        }
    }

    /// Records a token the sequence emitted (for penalties).
    pub fn observe(&mut self, token: u32) {
        *self.counts.entry(token).or_insert(0) += 1;
    }

    /// Processed logits `z` for this step, left in `s.z`. Returns whether
    /// `z` may differ from `logits` (a penalty or a temperature other than
    /// 0 and 1 was applied).
    fn process(&self, s: &mut Scratch, logits: &[f32]) -> bool {
        let mut changed = false;
        s.z.clear();
        s.z.extend_from_slice(logits);
        let z = &mut s.z;
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
    /// (the model's own distribution). `None` when no allowed token has a
    /// logit above `-inf` (nothing is allowed, or the model, after the
    /// penalties, gives every allowed token no probability).
    pub fn sample_allowed(&mut self, logits: &[f32], allowed: Option<&[bool]>) -> Option<Sampled> {
        if logits.is_empty() {
            return None;
        }
        SCRATCH.with_borrow_mut(|s| self.sample_in(s, logits, allowed))
    }

    /// [`Sampler::sample_allowed`] with this thread's `s`.
    fn sample_in(
        &mut self,
        s: &mut Scratch,
        logits: &[f32],
        allowed: Option<&[bool]>,
    ) -> Option<Sampled> {
        // Whether `z` is other than `logits` before truncation.
        let mut processed = self.process(s, logits);
        if let Some(allowed) = allowed {
            for (z, ok) in s.z.iter_mut().zip(allowed) {
                if !ok {
                    *z = f32::NEG_INFINITY;
                }
            }
            // Not one allowed token the model gives any probability: the
            // argmax of an all-`-inf` row would be token 0, allowed or not.
            if !s.z.iter().any(|&z| z > f32::NEG_INFINITY) {
                return None;
            }
            processed = true;
        }
        // A draw reads the weights again (a truncation many times): keep
        // them, computed in one vectorised pass. Greedy needs only their sum.
        let (argmax, max, whole) = if self.temperature > 0.0 {
            max_and_weights(&s.z, &mut s.weights)
        } else {
            s.weights.clear();
            max_and_sum_exp(&s.z)
        };
        let mut sum_exp = whole;
        let mut truncated = false;
        let token = if self.temperature == 0.0 {
            argmax as u32
        } else {
            if let Some(kept) = self.truncate(s, max, whole) {
                sum_exp = kept;
                truncated = true;
            }
            self.draw(s, sum_exp, argmax)
        };
        // The distribution the logprobs come from, and its log-sum-exp. An
        // unprocessed `z` was `logits` before truncation: its sum serves raw.
        let (row, lse): (&[f32], f32) = match self.mode {
            LogprobsMode::RawLogprobs if processed => {
                let (_, raw_max, raw_sum) = max_and_sum_exp(logits);
                (logits, raw_max + raw_sum.ln() as f32)
            }
            LogprobsMode::RawLogprobs if truncated => (logits, max + whole.ln() as f32),
            _ => (&s.z, max + sum_exp.ln() as f32),
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
    fn truncate(&self, s: &mut Scratch, max: f32, sum_exp: f64) -> Option<f64> {
        debug_assert!(
            s.weights.len() == s.z.len(),
            "a step that draws keeps its weights"
        );
        let z = &mut s.z;
        let w = &s.weights;
        let mut cut = f32::NEG_INFINITY;
        if self.min_p > 0.0 {
            // p >= min_p * p_max  <=>  z - max >= ln(min_p)
            cut = max + self.min_p.ln();
        }
        if self.top_k > 0 && self.top_k < z.len() {
            // vLLM keeps every value >= the k-th largest (ties included).
            s.values.clear();
            s.values.extend_from_slice(z);
            let (_, kth, _) = s
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
            let mut order = std::mem::take(&mut s.order);
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
            s.order = order;
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
    fn draw(&mut self, s: &Scratch, sum_exp: f64, argmax: usize) -> u32 {
        let target = self.rng.random::<f64>() * sum_exp;
        let weights =
            s.z.iter()
                .zip(&s.weights)
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
#[path = "sampler_tests.rs"]
mod tests;
