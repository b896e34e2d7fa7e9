//! KV-cell bookkeeping of the engine thread: which llama.cpp sequence ids
//! are free, which finished sequences keep their cells so that a later
//! prompt starting with the same tokens skips their prefill, and how many
//! cells are in use.
//!
//! Prefix reuse: a kept (finished) or running sequence whose cached tokens
//! start the new prompt shares those cells with it (`llama_memory_seq_cp` in
//! the unified cache marks the same cells with the new id; nothing is
//! copied), and only the rest of the prompt is fed. Kept sequences are
//! bounded by count and dropped least recently used first when space is
//! needed.
//!
//! Batch-invariant mode ([`super::kernels`]) adds one rule: a sequence's
//! cells must lie in the cache in the order of its positions, because the
//! reference attention visits cells in cache order. llama.cpp fills free
//! cells from its head onwards and goes back to holes left by freed cells, so
//! in this mode no cell is freed while the cache is in use: a finished
//! sequence that is not kept hands its cells to a parking id instead, and new
//! cells are always taken at the end. When the end is reached, the cache is
//! cleared and every running sequence is computed again from its tokens
//! ("compaction"); the reference kernels compute a cell the same way in a
//! prefill as in a decode step, so this changes no number.

use std::collections::VecDeque;

use super::ffi::Context;

/// llama.cpp's limit on sequence ids (`LLAMA_MAX_SEQ`).
const MAX_SEQ: u32 = 256;
/// Most finished sequences whose cells are kept.
const MAX_KEPT: u32 = 64;

struct Kept {
    id: i32,
    /// The weights its cells were computed with (0: the model alone, else
    /// a LoRA adapter's load): only a prompt of the same weights reuses them.
    weights: u64,
    /// The tokens whose cells are in the cache (positions `0..len`).
    tokens: Vec<u32>,
}

pub(crate) struct Cells {
    invariant: bool,
    reuse: bool,
    max_kept: usize,
    free_ids: Vec<i32>,
    /// Least recently used first.
    kept: VecDeque<Kept>,
    kept_tokens: usize,
    /// Batch-invariant mode: the id that holds cells no sequence uses.
    parking: i32,
    /// Batch-invariant mode: cells taken since the cache was last cleared.
    appended: usize,
}

/// A cached prefix for a new prompt.
pub(crate) struct Prefix {
    pub source: i32,
    pub len: usize,
}

impl Cells {
    /// Sequence ids the context needs for `max_batch` running sequences.
    pub(crate) fn n_seq_max(max_batch: u32, reuse: bool) -> u32 {
        let kept = if reuse {
            MAX_KEPT.min(MAX_SEQ.saturating_sub(max_batch + 1))
        } else {
            0
        };
        max_batch + kept + 1
    }

    pub(crate) fn new(max_batch: u32, reuse: bool, invariant: bool) -> Cells {
        let n = Self::n_seq_max(max_batch, reuse);
        let parking = n as i32 - 1;
        Cells {
            invariant,
            reuse,
            max_kept: (n - max_batch - 1) as usize,
            free_ids: (0..parking).rev().collect(),
            kept: VecDeque::new(),
            kept_tokens: 0,
            parking,
            appended: 0,
        }
    }

    /// Forgets everything: the context is new, or was just cleared.
    pub(crate) fn reset(&mut self) {
        for k in self.kept.drain(..) {
            self.free_ids.push(k.id);
        }
        self.kept_tokens = 0;
        self.appended = 0;
    }

    pub(crate) fn take_id(&mut self) -> Option<i32> {
        self.free_ids.pop()
    }

    /// Cells in use, given the cells the running sequences hold.
    pub(crate) fn in_use(&self, running: usize) -> usize {
        if self.invariant {
            self.appended
        } else {
            running + self.kept_tokens
        }
    }

    /// `n` cells were just written by a decode step.
    pub(crate) fn appended(&mut self, n: usize) {
        self.appended += n;
    }

    /// The longest cached prefix of `prompt` (at most all but its last
    /// token, whose logits must be computed), among kept sequences of the
    /// same `weights` and the fed tokens of `running` ones (the caller's
    /// sequences of those weights).
    pub(crate) fn find_prefix<'a>(
        &'a self,
        prompt: &[u32],
        weights: u64,
        running: impl Iterator<Item = (i32, &'a [u32])>,
    ) -> Option<Prefix> {
        if !self.reuse || prompt.len() < 2 {
            return None;
        }
        let cap = prompt.len() - 1;
        let kept = self
            .kept
            .iter()
            .filter(|k| k.weights == weights)
            .map(|k| (k.id, k.tokens.as_slice()));
        kept.chain(running)
            .map(|(id, toks)| Prefix {
                source: id,
                len: common_prefix(toks, prompt).min(cap),
            })
            .filter(|p| p.len > 0)
            .max_by_key(|p| p.len)
    }

    /// Makes `dst` share the first `prefix.len` cells of `prefix.source`. A
    /// kept source that the new sequence now covers entirely is dropped (its
    /// cells stay, held by `dst`); a shorter one becomes most recently used.
    pub(crate) fn share(&mut self, ctx: &mut Context<'_>, prefix: &Prefix, dst: i32) {
        ctx.copy_seq(prefix.source, dst, Some(prefix.len));
        if let Some(i) = self.kept.iter().position(|k| k.id == prefix.source) {
            if let Some(k) = self.kept.remove(i) {
                if k.tokens.len() <= prefix.len {
                    self.kept_tokens -= k.tokens.len();
                    self.discard(ctx, k.id);
                } else {
                    self.kept.push_back(k);
                }
            }
        }
    }

    /// A sequence left the batch with `tokens` in its cells, computed with
    /// `weights`: keep them for reuse, or let them go.
    pub(crate) fn finish(&mut self, ctx: &mut Context<'_>, id: i32, tokens: &[u32], weights: u64) {
        if !self.reuse || self.max_kept == 0 || tokens.is_empty() {
            self.discard(ctx, id);
            return;
        }
        self.kept_tokens += tokens.len();
        self.kept.push_back(Kept {
            id,
            weights,
            tokens: tokens.to_vec(),
        });
        while self.kept.len() > self.max_kept {
            self.evict_oldest(ctx);
        }
    }

    /// Lets a sequence's cells go and frees its id. Batch-invariant mode
    /// parks the cells instead of freeing them (see the module doc).
    pub(crate) fn discard(&mut self, ctx: &mut Context<'_>, id: i32) {
        if self.invariant {
            ctx.copy_seq(id, self.parking, None);
        }
        ctx.remove_seq(id);
        self.free_ids.push(id);
    }

    /// Drops the least recently used kept sequence; false when none is kept.
    pub(crate) fn evict_oldest(&mut self, ctx: &mut Context<'_>) -> bool {
        let Some(k) = self.kept.pop_front() else {
            return false;
        };
        self.kept_tokens -= k.tokens.len();
        self.discard(ctx, k.id);
        true
    }

    /// Whether dropping evictable cells frees space now (not in
    /// batch-invariant mode, where cells are only freed by a clear).
    pub(crate) fn can_evict(&self) -> bool {
        !self.invariant && !self.kept.is_empty()
    }

    /// Batch-invariant mode: whether clearing the cache would free cells
    /// that the running sequences (holding `running` cells) do not use.
    pub(crate) fn can_compact(&self, running: usize) -> bool {
        self.invariant && self.appended > running
    }

    /// Clears the whole cache; kept sequences are forgotten. The caller
    /// recomputes the running sequences.
    pub(crate) fn clear(&mut self, ctx: &mut Context<'_>) {
        ctx.clear_cache();
        self.reset();
    }

    /// Whether anything worth keeping is cached (an idle engine clears the
    /// cache only when not).
    pub(crate) fn has_kept(&self) -> bool {
        !self.kept.is_empty()
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_leave_room_for_kept_sequences_within_llama_cpps_limit() {
        assert_eq!(Cells::n_seq_max(16, true), 16 + 64 + 1);
        assert_eq!(Cells::n_seq_max(16, false), 17);
        assert_eq!(Cells::n_seq_max(250, true), 256);
        let c = Cells::new(16, true, true);
        assert_eq!(c.free_ids.len(), 16 + 64);
        assert_eq!(c.parking, 80);
        assert!(!c.free_ids.contains(&c.parking));
    }

    #[test]
    fn the_longest_prefix_wins_and_the_last_prompt_token_is_always_fed() {
        let mut c = Cells::new(4, true, false);
        c.kept.push_back(Kept {
            id: 7,
            weights: 0,
            tokens: vec![1, 2, 3],
        });
        c.kept.push_back(Kept {
            id: 8,
            weights: 0,
            tokens: vec![1, 2, 3, 4, 5],
        });
        let p = c
            .find_prefix(&[1, 2, 3, 4, 9], 0, std::iter::empty())
            .expect("hit");
        assert_eq!((p.source, p.len), (8, 4));
        let p = c
            .find_prefix(&[1, 2, 3, 4, 5], 0, std::iter::empty())
            .expect("hit");
        assert_eq!((p.source, p.len), (8, 4), "all but the last prompt token");
        let running = [1u32, 2, 3, 4, 5, 6];
        let p = c
            .find_prefix(
                &[1, 2, 3, 4, 5, 6, 7],
                0,
                std::iter::once((2, &running[..])),
            )
            .expect("hit");
        assert_eq!((p.source, p.len), (2, 6));
        assert!(c.find_prefix(&[9, 9], 0, std::iter::empty()).is_none());
        // Cells of other weights (an adapter) are not reused.
        assert!(c
            .find_prefix(&[1, 2, 3, 4, 9], 5, std::iter::empty())
            .is_none());
        c.reuse = false;
        assert!(c
            .find_prefix(&[1, 2, 3, 4, 9], 0, std::iter::empty())
            .is_none());
    }
}
