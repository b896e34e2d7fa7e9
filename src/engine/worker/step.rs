//! One step of the batching loop ([`Worker::step`]): plan the rows (every
//! decode, then prompt chunks), one `llama_decode`, then score finished
//! scoring jobs, sample every row that ends its sequence's feed, send each
//! token and stop what is done. Counts the step's time in parts
//! ([`super::EngineStats`]).
//!
//! llama.cpp applies a LoRA adapter to a whole decode, so one step runs the
//! sequences of one set of weights: the model alone or one adapter. When
//! the running sequences use several, the steps take them in turn.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::ffi::{Context, DecodeError};
use super::super::sampler::Sampled;
use super::super::score::score_row;
use super::super::step_sample;
use super::{nanos, Reply, Worker};
use crate::backend::{BackendError, FinishReason, GenEvent, TokenLogprob};

impl Worker {
    /// The weights this step runs (see the module doc): the next in turn
    /// among those the running sequences use, in order of first use.
    fn weights_in_turn(&mut self) -> (u64, Option<std::rc::Rc<super::Lora>>) {
        let mut seen: Vec<(u64, Option<&std::rc::Rc<super::Lora>>)> = Vec::new();
        for s in &self.running {
            if !seen.iter().any(|(w, _)| *w == s.weights()) {
                seen.push((s.weights(), s.lora.as_ref()));
            }
        }
        if seen.len() < 2 {
            let first = self.running.first();
            return (
                first.map_or(0, |s| s.weights()),
                first.and_then(|s| s.lora.clone()),
            );
        }
        let (w, lora) = seen[self.turn % seen.len()];
        let lora = lora.cloned();
        self.turn = self.turn.wrapping_add(1);
        (w, lora)
    }

    /// Plans `(running index, tokens to feed)` for this step among the
    /// sequences of `weights`: every one with one token left (decode)
    /// first, then prompt chunks, oldest first, up to `prefill_chunk`
    /// prompt tokens in all.
    fn plan(&self, weights: u64) -> Vec<(usize, usize)> {
        let mut plan = Vec::with_capacity(self.running.len());
        let mine = |s: &&super::Seq| s.weights() == weights;
        for (i, s) in self.running.iter().enumerate().filter(|(_, s)| mine(s)) {
            if s.tokens.len() - s.fed == 1 {
                plan.push((i, 1));
            }
        }
        let mut budget = self.settings.prefill_chunk as usize;
        for (i, s) in self.running.iter().enumerate().filter(|(_, s)| mine(s)) {
            let left = s.tokens.len() - s.fed;
            if left > 1 && budget > 0 {
                let take = left.min(budget);
                budget -= take;
                plan.push((i, take));
            }
        }
        plan
    }

    pub(super) fn step(&mut self, ctx: &mut Context<'_>) {
        let started = Instant::now();
        let n_ctx = self.info.n_ctx as usize;
        let (weights, lora) = self.weights_in_turn();
        let mut plan = self.plan(weights);
        loop {
            let planned: usize = plan.iter().map(|p| p.1).sum();
            let running = self.running_cells();
            if self.cells.in_use(running) + planned <= n_ctx {
                break;
            }
            if self.cells.can_evict() {
                self.cells.evict_oldest(ctx);
                continue;
            }
            if self.cells.can_compact(running) {
                self.compact(ctx);
            } else if !self.preempt_newest(ctx) {
                break;
            }
            plan = self.plan(weights);
        }
        if plan.is_empty() {
            // Preemption took the last sequence of these weights: the next
            // step runs others.
            return;
        }
        self.batch.clear();
        self.rows.clear();
        self.score_rows.clear();
        let mut prefilled = 0u64;
        for &(i, take) in &plan {
            let s = &self.running[i];
            let scoring = s.scoring();
            let end = s.fed + take;
            for (pos, &t) in s.tokens.iter().enumerate().take(end).skip(s.fed) {
                let last = pos + 1 == s.tokens.len();
                if self.batch.add(t, pos, s.slot, last || scoring).is_err() {
                    // Cannot happen: the batch holds prefill_chunk + max_batch.
                    break;
                }
                let row = self.batch.n_tokens() - 1;
                if scoring {
                    self.score_rows.push((i, pos, row));
                } else if last {
                    self.rows.push((i, row));
                }
            }
            if take > 1 || s.fed < s.prompt_len {
                prefilled += take as u64;
            }
        }
        ctx.set_lora(lora.as_ref());
        let decoding = Instant::now();
        match ctx.decode(&self.batch) {
            Ok(()) => {
                // The logits' first read would wait here for the device
                // anyway; waiting now times the model apart.
                ctx.synchronize();
            }
            Err(DecodeError::NoKvCacheSlot) if self.cells.can_compact(self.running_cells()) => {
                // Parked cells fill the cache: free them, recompute, retry.
                self.compact(ctx);
                return;
            }
            Err(DecodeError::NoKvCacheSlot) if self.preempt_newest(ctx) => {
                // Fragmented cache: retry next step with fewer sequences. The
                // preempted sequence lost its cells; survivors' cells from this
                // failed call were never written.
                return;
            }
            Err(e) => {
                self.fail_planned(ctx, &plan, &format!("llama_decode failed: {e}"));
                return;
            }
        }
        let decoded = decoding.elapsed();
        self.cells.appended(self.batch.n_tokens().max(0) as usize);
        let stats = &self.shared.stats;
        stats.steps.fetch_add(1, Ordering::Relaxed);
        // Each part of the step's time is published before the events that
        // part leads to, so a reader woken by a stream's end sees the
        // step's decode and sampling inside its whole.
        stats
            .step_ns
            .fetch_add(nanos(started.elapsed()), Ordering::Relaxed);
        stats.decode_ns.fetch_add(nanos(decoded), Ordering::Relaxed);
        let mut part = Instant::now();
        stats.prefill_tokens.fetch_add(prefilled, Ordering::Relaxed);
        crate::metrics::engine_step(
            &self.settings.name,
            prefilled,
            self.running.len(),
            self.shared.queued.load(Ordering::Relaxed),
        );
        for &(i, take) in &plan {
            self.running[i].fed += take;
        }
        let mut finished = self.finish_scored(ctx);
        let sampling = Instant::now();
        let sampled = self.sample_rows(ctx);
        let now = Instant::now();
        let stats = &self.shared.stats;
        let sampled_in = now.duration_since(sampling);
        stats
            .sample_ns
            .fetch_add(nanos(sampled_in), Ordering::Relaxed);
        let since = now.duration_since(part);
        stats.step_ns.fetch_add(nanos(since), Ordering::Relaxed);
        part = now;
        for (i, out) in sampled {
            match self.took(i, out) {
                Ok(None) => {}
                Ok(Some(reason)) => {
                    self.running[i].tx.event(GenEvent::Done {
                        finish_reason: reason,
                    });
                    finished.push(i);
                }
                Err(e) => {
                    self.running[i].tx.fail(e);
                    finished.push(i);
                }
            }
        }
        finished.sort_unstable();
        for i in finished.into_iter().rev() {
            let seq = self.running.remove(i);
            self.release(ctx, &seq);
        }
        self.shared
            .stats
            .step_ns
            .fetch_add(nanos(part.elapsed()), Ordering::Relaxed);
    }

    /// Scores this step's rows of scoring jobs (row `p` gives the logprob of
    /// token `p + 1`), sends the scores of every job now fed to its end, and
    /// returns those jobs' indices into `running`.
    fn finish_scored(&mut self, ctx: &Context<'_>) -> Vec<usize> {
        for &(i, pos, row) in &self.score_rows {
            let s = &mut self.running[i];
            if let Some(&next) = s.tokens.get(pos + 1) {
                if let Some(slot) = s.scores.get_mut(pos + 1) {
                    *slot = score_row(ctx.logits(row), next);
                }
            }
        }
        let mut done = Vec::new();
        for (i, s) in self.running.iter_mut().enumerate() {
            if let Reply::Score(tx) = &s.tx {
                if s.fed == s.tokens.len() {
                    let _ = tx.send(Ok(std::mem::take(&mut s.scores)));
                    done.push(i);
                }
            }
        }
        done
    }

    /// Samples the next token of every sequence with a row this step, in
    /// parallel ([`step_sample`]): `(index into running, what it drew)`.
    /// The grammar masks are computed here first, on this thread.
    fn sample_rows(&mut self, ctx: &Context<'_>) -> Vec<(usize, Option<Sampled>)> {
        let mut row_of: Vec<Option<i32>> = vec![None; self.running.len()];
        for &(i, row) in &self.rows {
            row_of[i] = Some(row);
        }
        let (mut index, mut rows) = (Vec::new(), Vec::new());
        for (i, s) in self.running.iter_mut().enumerate() {
            let Some(row) = row_of[i] else { continue };
            let logits = ctx.logits(row);
            let allowed = s.grammar.as_mut().map(|g| g.allowed(logits));
            index.push(i);
            rows.push(step_sample::Row {
                sampler: &mut s.sampler,
                logits,
                allowed,
                out: None,
            });
        }
        self.sampling.run(&mut rows);
        index
            .into_iter()
            .zip(rows.into_iter().map(|r| r.out))
            .collect()
    }

    /// Takes the token `running[i]` drew (`None`: its output constraint
    /// allowed none), sends it, and returns the finish reason if the
    /// sequence is done. An output constraint that allows no token is the
    /// request's dead end, not an abort (which a client would retry into
    /// the same dead end).
    fn took(
        &mut self,
        i: usize,
        out: Option<Sampled>,
    ) -> Result<Option<FinishReason>, BackendError> {
        let max_seq_len = self.info.max_seq_len as usize;
        let s = &mut self.running[i];
        let Some(out) = out else {
            return Err(BackendError::Rejected {
                backend: self.settings.name.clone(),
                message: "the output constraint (response_format or a forced tool call) \
                          allows no next token"
                    .into(),
            });
        };
        if let Some(g) = s.grammar.as_mut() {
            g.accept(out.token);
        }
        self.shared
            .stats
            .sampled_tokens
            .fetch_add(1, Ordering::Relaxed);
        s.sampler.observe(out.token);
        s.tokens.push(out.token);
        // Always the sampled token's logprob (every call records it); the
        // top alternatives only when the request asked for k > 0.
        let logprobs = vec![TokenLogprob {
            logprob: Some(out.logprob),
            top: out.top,
        }];
        let sent = s.tx.event(GenEvent::Tokens {
            ids: vec![out.token],
            logprobs,
        });
        if !sent {
            return Ok(Some(FinishReason::Abort));
        }
        let p = &s.params;
        if p.stop_token_ids.contains(&out.token)
            || (!p.ignore_eos && self.info.eog_ids.binary_search(&out.token).is_ok())
        {
            return Ok(Some(FinishReason::Stop));
        }
        if s.generated() >= p.max_tokens as usize || s.tokens.len() >= max_seq_len {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }

    fn fail_planned(&mut self, ctx: &mut Context<'_>, plan: &[(usize, usize)], message: &str) {
        let mut idx: Vec<usize> = plan.iter().map(|p| p.0).collect();
        idx.sort_unstable();
        idx.dedup();
        for i in idx.into_iter().rev() {
            let seq = self.running.remove(i);
            seq.tx.fail(BackendError::Status {
                backend: self.settings.name.clone(),
                status: 500,
                message: message.to_string(),
            });
            self.release(ctx, &seq);
        }
    }
}
