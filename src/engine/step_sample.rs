//! A step's sampling, spread over threads.
//!
//! Every running sequence draws its next token from its own row of the
//! step's logits with its own [`Sampler`] (its own RNG and penalty counts),
//! so the rows are independent: which thread samples a row, and in what
//! order, cannot change a token or a logprob. One after another on the
//! engine thread they cost about 0.13 ms each on a 49,152-token vocabulary
//! (`cargo bench --bench engine`, the `sampler` line; 0.3 ms before the
//! vectorised `exp`), a few ms a step on a GPU once a dozen sequences run.
//!
//! Owns: splitting rows over scoped threads. Must not: touch llama.cpp (the
//! grammar masks are computed before, on the engine thread, since llama.cpp's
//! samplers are not thread-safe) or send anything (the worker does, after).

use std::sync::{Mutex, PoisonError};

use super::sampler::{Sampled, Sampler};

/// One sequence's sampling this step.
pub struct Row<'a> {
    pub sampler: &'a mut Sampler,
    pub logits: &'a [f32],
    /// The output constraint's mask, if the sequence has one.
    pub allowed: Option<Vec<bool>>,
    /// Set by [`sample_rows`]: `None` when the constraint allows no token.
    pub out: Option<Sampled>,
}

impl Row<'_> {
    fn run(&mut self) {
        self.out = self
            .sampler
            .sample_allowed(self.logits, self.allowed.as_deref());
    }
}

/// Rows a thread is started for: starting one costs about 30 µs (and is
/// paid one after another on the calling thread), a row about 130 µs.
const ROWS_PER_THREAD: usize = 4;

/// Samples every row, on up to `threads` threads (the calling one among
/// them), one per [`ROWS_PER_THREAD`] rows. Threads take the next unsampled
/// row as they finish one, so a slow row (a top-p cut on a flat
/// distribution) does not hold back the rest. A thread the system refuses
/// to start is done without: the others, the calling one included, sample
/// its share.
pub fn sample_rows(rows: &mut [Row<'_>], threads: usize) {
    let helpers = threads
        .min(rows.len().div_ceil(ROWS_PER_THREAD))
        .saturating_sub(1);
    if helpers == 0 {
        rows.iter_mut().for_each(Row::run);
        return;
    }
    let next = Mutex::new(rows.iter_mut());
    let work = || loop {
        // The guard is dropped at the end of this statement, before the row
        // is sampled.
        let Some(row) = next.lock().unwrap_or_else(PoisonError::into_inner).next() else {
            break;
        };
        row.run();
    };
    std::thread::scope(|s| {
        for _ in 0..helpers {
            if std::thread::Builder::new()
                .name("tito-sample".into())
                .spawn_scoped(s, work)
                .is_err()
            {
                break;
            }
        }
        work();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::SamplingParams;
    use crate::config::LogprobsMode;

    /// A deterministic row of `n` logits, different per `salt`.
    fn logits(n: usize, salt: u64) -> Vec<f32> {
        let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 20_000) as f32 / 1000.0 - 10.0
            })
            .collect()
    }

    fn samplers(n: usize) -> Vec<Sampler> {
        (0..n)
            .map(|i| {
                let params = SamplingParams {
                    temperature: Some(if i % 3 == 0 { 0.0 } else { 1.0 }),
                    top_p: Some(if i % 2 == 0 { 0.9 } else { 1.0 }),
                    top_k: Some(if i % 5 == 0 { 40 } else { 0 }),
                    seed: Some(i as i64),
                    logprobs: Some(if i % 4 == 0 { 3 } else { 0 }),
                    ..Default::default()
                };
                Sampler::new(&params, &[], LogprobsMode::RawLogprobs)
            })
            .collect()
    }

    /// Ten steps of `n` sequences sampled on `threads` threads: each step's
    /// tokens and logprobs, observed as the worker does between steps.
    fn run(n: usize, threads: usize) -> Vec<Vec<Option<Sampled>>> {
        let mut samplers = samplers(n);
        let mut steps = Vec::new();
        for step in 0..10u64 {
            let rows_logits: Vec<Vec<f32>> = (0..n as u64)
                .map(|i| logits(2000, 100 * step + i))
                .collect();
            let mut rows: Vec<Row<'_>> = samplers
                .iter_mut()
                .zip(&rows_logits)
                .enumerate()
                .map(|(i, (sampler, logits))| Row {
                    sampler,
                    logits,
                    // Every seventh sequence is constrained to even ids.
                    allowed: (i % 7 == 6).then(|| (0..2000).map(|t| t % 2 == 0).collect()),
                    out: None,
                })
                .collect();
            sample_rows(&mut rows, threads);
            let outs: Vec<Option<Sampled>> = rows.into_iter().map(|r| r.out).collect();
            for (s, out) in samplers.iter_mut().zip(&outs) {
                if let Some(o) = out {
                    s.observe(o.token);
                }
            }
            steps.push(outs);
        }
        steps
    }

    #[test]
    fn rows_sampled_on_many_threads_equal_rows_sampled_on_one() {
        let one = run(16, 1);
        assert!(one.iter().flatten().all(Option::is_some));
        // Constrained rows drew even ids.
        for step in &one {
            for (i, out) in step.iter().enumerate() {
                if i % 7 == 6 {
                    assert_eq!(out.as_ref().map(|o| o.token % 2), Some(0));
                }
            }
        }
        for threads in [2, 3, 8, 32] {
            assert_eq!(run(16, threads), one, "{threads} threads");
        }
        // Enough rows for many threads; fewer rows than threads; one row.
        assert_eq!(run(40, 32), run(40, 1));
        assert_eq!(run(3, 8), run(3, 1));
        assert_eq!(run(1, 8), run(1, 1));
    }

    #[test]
    fn a_row_the_constraint_closes_is_none_and_the_others_are_sampled() {
        let mut samplers = samplers(4);
        let l = logits(100, 1);
        let mut rows: Vec<Row<'_>> = samplers
            .iter_mut()
            .enumerate()
            .map(|(i, sampler)| Row {
                sampler,
                logits: &l,
                allowed: (i == 2).then(|| vec![false; 100]),
                out: None,
            })
            .collect();
        sample_rows(&mut rows, 4);
        let none: Vec<bool> = rows.iter().map(|r| r.out.is_none()).collect();
        assert_eq!(none, [false, false, true, false]);
    }
}
