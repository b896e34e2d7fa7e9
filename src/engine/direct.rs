//! llama.cpp driven directly, with no scheduling or sampling of ours: the
//! reference the engine is checked and benchmarked against (tests compare
//! logprobs and tokenization with it; the engine bench compares throughput
//! with it, one sequence alone and several decoding together).
//!
//! Owns: a plain decode loop over a fixed set of sequences and llama.cpp's
//! own tokenizer.
//! Must not: be used on the serving path.

use std::num::NonZeroU32;
use std::path::Path;

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;

use super::EngineError;
use crate::config::Device;

/// One llama.cpp context holding a fixed number of sequences.
pub struct Direct<'m> {
    ctx: LlamaContext<'m>,
    batch: LlamaBatch<'static>,
    /// Each sequence's next position.
    pos: Vec<i32>,
}

impl Direct<'_> {
    /// Feeds `tokens` after what is already in sequence 0's cache and
    /// returns the logits of the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        self.feed_seq(0, tokens)
    }

    /// Feeds `tokens` after what is already in sequence `seq`'s cache and
    /// returns the logits of the last one.
    pub fn feed_seq(&mut self, seq: usize, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let start = *self
            .pos
            .get(seq)
            .ok_or_else(|| EngineError::Load(format!("no sequence {seq}")))?;
        self.batch.clear();
        for (i, &t) in tokens.iter().enumerate() {
            let last = i + 1 == tokens.len();
            self.batch
                .add(
                    LlamaToken::new(t as i32),
                    start + i as i32,
                    &[seq as i32],
                    last,
                )
                .map_err(|e| EngineError::Load(e.to_string()))?;
        }
        self.decode()?;
        self.pos[seq] += tokens.len() as i32;
        Ok(self.ctx.get_logits_ith(self.batch.n_tokens() - 1).to_vec())
    }

    /// Feeds one token to each of the first `next.len()` sequences in one
    /// `llama_decode`, then calls `each(sequence, its logits)` for each.
    pub fn decode_each(
        &mut self,
        next: &[u32],
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if next.len() > self.pos.len() {
            return Err(EngineError::Load(format!(
                "{} tokens for {} sequences",
                next.len(),
                self.pos.len()
            )));
        }
        self.batch.clear();
        for (seq, &t) in next.iter().enumerate() {
            self.batch
                .add(
                    LlamaToken::new(t as i32),
                    self.pos[seq],
                    &[seq as i32],
                    true,
                )
                .map_err(|e| EngineError::Load(e.to_string()))?;
        }
        self.decode()?;
        for seq in 0..next.len() {
            self.pos[seq] += 1;
            each(seq, self.ctx.get_logits_ith(seq as i32));
        }
        Ok(())
    }

    fn decode(&mut self) -> Result<(), EngineError> {
        self.ctx
            .decode(&mut self.batch)
            .map_err(|e| EngineError::Load(format!("llama_decode: {e}")))
    }

    /// Empties the KV cache.
    pub fn reset(&mut self) {
        self.ctx.clear_kv_cache();
        self.pos.fill(0);
    }
}

/// Loads `model` on `device` (its layers placed as the engine places them)
/// and runs `f` with a single-sequence context of `n_ctx` cells that
/// accepts up to `n_batch` tokens per call.
pub fn with_direct<R>(
    model: &Path,
    device: Device,
    n_ctx: u32,
    n_batch: u32,
    threads: u32,
    f: impl FnOnce(&mut Direct<'_>) -> R,
) -> Result<R, EngineError> {
    with_direct_seqs(model, device, n_ctx, n_batch, 1, true, threads, f)
}

/// [`with_direct`] with `n_seqs` sequences sharing the context's `n_ctx`
/// cells: one cache for all of them where `unified` (as the engine's is),
/// else llama.cpp's split cache, `n_ctx / n_seqs` cells a sequence.
#[allow(clippy::too_many_arguments)]
pub fn with_direct_seqs<R>(
    model: &Path,
    device: Device,
    n_ctx: u32,
    n_batch: u32,
    n_seqs: u32,
    unified: bool,
    threads: u32,
    f: impl FnOnce(&mut Direct<'_>) -> R,
) -> Result<R, EngineError> {
    let backend = super::llama_backend()?;
    let params = LlamaModelParams::default().with_n_gpu_layers(super::gpu_layers(device));
    let model = LlamaModel::load_from_file(backend, model, &params)
        .map_err(|e| EngineError::Load(format!("{}: {e}", model.display())))?;
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(n_ctx))
        .with_n_batch(n_batch)
        .with_n_ubatch(n_batch)
        .with_n_seq_max(n_seqs.max(1))
        .with_kv_unified(unified)
        .with_n_threads(threads as i32)
        .with_n_threads_batch(threads as i32);
    let ctx = model
        .new_context(backend, params)
        .map_err(|e| EngineError::Load(format!("cannot create context: {e}")))?;
    let mut direct = Direct {
        ctx,
        // One sequence id a token: the second argument bounds the ids a
        // token may carry, not the sequences.
        batch: LlamaBatch::new(n_batch as usize, 1),
        pos: vec![0; n_seqs.max(1) as usize],
    };
    Ok(f(&mut direct))
}

/// The greedy pick of the reference loops (benches, tests): the first
/// largest logit, found by a plain scan, deliberately not the engine's own
/// (`rank::argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0 as u32
}

/// llama.cpp's own tokenization of `text` (special tokens in the text are
/// parsed, nothing is added), for checking the GGUF tokenizer.
pub fn llama_tokenize(model: &Path, texts: &[&str]) -> Result<Vec<Vec<u32>>, EngineError> {
    let backend = super::llama_backend()?;
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend, model, &params)
        .map_err(|e| EngineError::Load(format!("{}: {e}", model.display())))?;
    let vocab = model.vocab();
    Ok(texts
        .iter()
        .map(|t| {
            vocab
                .tokenize(t.as_bytes(), false, true)
                .into_iter()
                .map(|tok| tok.0 as u32)
                .collect()
        })
        .collect())
}
