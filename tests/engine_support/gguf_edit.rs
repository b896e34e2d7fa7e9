//! Copies of a GGUF file with one honest change, for the weight-update
//! tests: other weights (the final norm's weights negated, so every logit
//! changes sign and greedy answers change) or another vocabulary (one token's
//! text changed). Same size and layout as the source; only bytes in place
//! change.

use std::path::Path;

/// Where things are in a GGUF file.
struct Layout {
    /// Absolute offset of tensor data.
    data_start: usize,
    /// (name, ggml type, dims, offset relative to `data_start`).
    tensors: Vec<(String, u32, Vec<u64>, usize)>,
    /// Absolute offsets of each string of `tokenizer.ggml.tokens` (its bytes).
    token_texts: Vec<(usize, usize)>,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    /// A string: (offset of its bytes, length).
    fn string(&mut self) -> (usize, usize) {
        let n = self.u64() as usize;
        let at = self.at;
        self.take(n);
        (at, n)
    }
    fn text(&mut self) -> String {
        let (at, n) = self.string();
        String::from_utf8(self.b[at..at + n].to_vec()).expect("utf-8 key")
    }
    /// Skips a value of type `ty`; the strings it held, in order.
    fn value(&mut self, ty: u32, strings: &mut Vec<(usize, usize)>) -> Option<u64> {
        match ty {
            0 | 1 | 7 => Some(u64::from(self.take(1)[0])),
            2 | 3 => {
                self.take(2);
                None
            }
            4 | 5 => Some(u64::from(self.u32())),
            6 => {
                self.take(4);
                None
            }
            8 => {
                strings.push(self.string());
                None
            }
            9 => {
                let elem = self.u32();
                let count = self.u64();
                for _ in 0..count {
                    self.value(elem, strings);
                }
                None
            }
            10 | 11 => Some(self.u64()),
            12 => {
                self.take(8);
                None
            }
            other => panic!("unknown GGUF value type {other}"),
        }
    }
}

fn layout(b: &[u8]) -> Layout {
    let mut c = Cursor { b, at: 0 };
    assert_eq!(c.take(4), b"GGUF");
    let version = c.u32();
    assert!((2..=3).contains(&version), "GGUF v{version}");
    let n_tensors = c.u64();
    let n_kv = c.u64();
    let mut alignment = 32usize;
    let mut token_texts = Vec::new();
    for _ in 0..n_kv {
        let key = c.text();
        let ty = c.u32();
        let mut strings = Vec::new();
        let v = c.value(ty, &mut strings);
        if key == "general.alignment" {
            alignment = v.expect("alignment is an integer") as usize;
        }
        if key == "tokenizer.ggml.tokens" {
            token_texts = strings;
        }
    }
    let mut tensors = Vec::new();
    for _ in 0..n_tensors {
        let name = c.text();
        let n_dims = c.u32();
        let dims: Vec<u64> = (0..n_dims).map(|_| c.u64()).collect();
        let ty = c.u32();
        let offset = c.u64() as usize;
        tensors.push((name, ty, dims, offset));
    }
    Layout {
        data_start: c.at.div_ceil(alignment) * alignment,
        tensors,
        token_texts,
    }
}

/// A copy of `src` at `dst` whose `output_norm.weight` (f32) is negated:
/// the model's logits change sign.
pub fn negated_output_norm(src: &Path, dst: &Path) {
    let mut b = std::fs::read(src).expect("read the model");
    let l = layout(&b);
    let (_, ty, dims, offset) = l
        .tensors
        .iter()
        .find(|t| t.0 == "output_norm.weight")
        .expect("the model has output_norm.weight");
    assert_eq!(*ty, 0, "output_norm.weight is f32");
    let n: u64 = dims.iter().product();
    let start = l.data_start + offset;
    for i in 0..n as usize {
        // The sign bit of each little-endian f32.
        b[start + 4 * i + 3] ^= 0x80;
    }
    std::fs::write(dst, b).expect("write the copy");
}

/// A copy of `src` at `dst` where one token's text is another: the same
/// weights under another vocabulary.
pub fn other_vocabulary(src: &Path, dst: &Path) {
    let mut b = std::fs::read(src).expect("read the model");
    let l = layout(&b);
    assert!(l.token_texts.len() > 1000, "the model has a token list");
    let (at, n) = l.token_texts[1000];
    assert!(n > 0);
    // Stays ASCII when it was: 'a' <-> 'b' style flip of the lowest bit.
    b[at] ^= 0x01;
    std::fs::write(dst, b).expect("write the copy");
}

/// The dimensions (ggml `ne`) of each tensor of `src` whose name ends with
/// `suffix`, by name.
pub fn tensor_dims(src: &Path, suffix: &str) -> Vec<(String, Vec<u64>)> {
    let b = std::fs::read(src).expect("read the model");
    layout(&b)
        .tensors
        .into_iter()
        .filter(|t| t.0.ends_with(suffix))
        .map(|t| (t.0, t.2))
        .collect()
}
