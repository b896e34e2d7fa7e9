//! LoRA adapters for the fetched model, written as llama.cpp reads them: a
//! GGUF v3 file with `general.type = adapter`, `adapter.type = lora`,
//! `adapter.lora.alpha`, and for each adapted weight `W` (ggml `ne` =
//! `[n_in, n_out]`) an f32 pair `W.lora_a` (`[n_in, r]`) and `W.lora_b`
//! (`[r, n_out]`).

use std::path::Path;

use super::gguf_edit::tensor_dims;

const ALIGN: usize = 32;

fn put_str(o: &mut Vec<u8>, s: &str) {
    o.extend_from_slice(&(s.len() as u64).to_le_bytes());
    o.extend_from_slice(s.as_bytes());
}

fn put_kv_str(o: &mut Vec<u8>, k: &str, v: &str) {
    put_str(o, k);
    o.extend_from_slice(&8u32.to_le_bytes());
    put_str(o, v);
}

/// Deterministic values in [-1, 1) (a 64-bit LCG).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// Writes at `dst` a rank-`r` adapter of every `attn_q` weight of the model
/// at `model`: `lora_a` random in ±0.1, `lora_b` random in ±`strength`
/// (0: an adapter that changes no number), from `seed`.
pub fn write_lora(model: &Path, dst: &Path, r: u64, strength: f32, seed: u64) {
    let targets = tensor_dims(model, "attn_q.weight");
    assert!(!targets.is_empty(), "the model has attn_q weights");
    let mut rng = Lcg(seed);
    let mut tensors: Vec<(String, Vec<u64>, Vec<f32>)> = Vec::new();
    for (name, dims) in targets {
        let (n_in, n_out) = (dims[0], dims[1]);
        let a = (0..n_in * r).map(|_| 0.1 * rng.next()).collect();
        let b = (0..r * n_out).map(|_| strength * rng.next()).collect();
        tensors.push((format!("{name}.lora_a"), vec![n_in, r], a));
        tensors.push((format!("{name}.lora_b"), vec![r, n_out], b));
    }
    let mut o = Vec::new();
    o.extend_from_slice(b"GGUF");
    o.extend_from_slice(&3u32.to_le_bytes());
    o.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    o.extend_from_slice(&4u64.to_le_bytes());
    put_kv_str(&mut o, "general.architecture", "llama");
    put_kv_str(&mut o, "general.type", "adapter");
    put_kv_str(&mut o, "adapter.type", "lora");
    put_str(&mut o, "adapter.lora.alpha");
    o.extend_from_slice(&6u32.to_le_bytes());
    o.extend_from_slice(&(r as f32).to_le_bytes());
    let mut offset = 0usize;
    for (name, dims, data) in &tensors {
        put_str(&mut o, name);
        o.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            o.extend_from_slice(&d.to_le_bytes());
        }
        o.extend_from_slice(&0u32.to_le_bytes());
        o.extend_from_slice(&(offset as u64).to_le_bytes());
        offset = (offset + 4 * data.len()).div_ceil(ALIGN) * ALIGN;
    }
    o.resize(o.len().div_ceil(ALIGN) * ALIGN, 0);
    for (_, _, data) in &tensors {
        for v in data {
            o.extend_from_slice(&v.to_le_bytes());
        }
        o.resize(o.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    std::fs::write(dst, o).expect("write the adapter");
}
