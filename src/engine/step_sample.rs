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
//! Owns: the sampling threads and splitting rows over them. Must not: touch
//! llama.cpp (the grammar masks are computed before, on the engine thread,
//! since llama.cpp's samplers are not thread-safe) or send anything (the
//! worker does, after).

use super::sampler::{Sampled, Sampler};

/// One sequence's sampling this step.
pub struct Row<'a> {
    pub sampler: &'a mut Sampler,
    pub logits: &'a [f32],
    /// The output constraint's mask, if the sequence has one.
    pub allowed: Option<Vec<bool>>,
    /// Set by [`Sampling::run`]: `None` when no allowed token is left
    /// ([`Sampler::sample_allowed`]).
    pub out: Option<Sampled>,
}

impl Row<'_> {
    fn run(&mut self) {
        self.out = self
            .sampler
            .sample_allowed(self.logits, self.allowed.as_deref());
    }
}

/// The threads a step's rows are sampled on, started once with the engine
/// and parked between steps (rayon's pool: work-stealing, so a slow row, a
/// top-p cut on a flat distribution, does not hold back the rest).
pub struct Sampling {
    /// `None` with one thread, or if the system refused to start them: the
    /// calling thread samples every row.
    pool: Option<rayon::ThreadPool>,
}

impl Sampling {
    pub fn new(threads: usize) -> Sampling {
        let pool = (threads > 1)
            .then(|| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("tito-sample-{i}"))
                    .build()
                    .ok()
            })
            .flatten();
        Sampling { pool }
    }

    /// Samples every row: on the pool when there are two or more.
    pub fn run(&self, rows: &mut [Row<'_>]) {
        match &self.pool {
            Some(pool) if rows.len() > 1 => {
                use rayon::iter::{
                    IndexedParallelIterator, IntoParallelRefMutIterator, ParallelIterator,
                };
                pool.install(|| rows.par_iter_mut().with_max_len(1).for_each(Row::run));
            }
            _ => rows.iter_mut().for_each(Row::run),
        }
    }
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
        let sampling = Sampling::new(threads);
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
            sampling.run(&mut rows);
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
        Sampling::new(4).run(&mut rows);
        let none: Vec<bool> = rows.iter().map(|r| r.out.is_none()).collect();
        assert_eq!(none, [false, false, true, false]);
    }
}
