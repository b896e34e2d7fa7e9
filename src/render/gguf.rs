//! Tokenizer and chat template read from a GGUF file's metadata.
//!
//! Owns: a small GGUF metadata reader (header and typed key/value pairs; it
//! stops before the tensor infos and never reads tensor data) and turning the
//! `tokenizer.ggml.*` keys into a `tokenizers` BPE tokenizer that splits text
//! exactly as llama.cpp does. Must not: load weights or link llama.cpp (the
//! gateway may run with a GGUF tokenizer against a remote backend).
//!
//! GGUF only stores the *name* of the pre-tokenizer (`tokenizer.ggml.pre`), so
//! [`split_rules`] keeps a table of names → split rules, mirroring llama.cpp's
//! own table for the names listed there. Unknown names are an error, never a
//! silent fallback: a wrong split rule gives wrong token ids.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;

use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use super::{RenderError, TokenizerSource};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
/// llama.cpp's token type for control tokens (`<|im_end|>` and friends).
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp's token type for user-defined tokens (always matched verbatim).
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// Refuse absurd lengths from a corrupt file instead of allocating them.
const MAX_LEN: u64 = 1 << 31;

/// One typed GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            GgufValue::Uint(v) => Some(*v),
            GgufValue::Int(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            GgufValue::Uint(v) => i64::try_from(*v).ok(),
            GgufValue::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// The metadata of a GGUF file, in file order.
#[derive(Debug, Clone, Default)]
pub struct GgufMetadata {
    pub version: u32,
    pub tensor_count: u64,
    pub kv: Vec<(String, GgufValue)>,
    /// sha256 over the raw bytes of every `tokenizer.*` key/value record.
    pub tokenizer_sha256: String,
}

impl GgufMetadata {
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.kv.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }
}

/// A byte reader that can tee what it reads into a hasher.
struct Reader<R> {
    inner: R,
    hasher: Option<Sha256>,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut buf = [0u8; N];
        self.inner.read_exact(&mut buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(buf);
        }
        Ok(buf)
    }

    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }

    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn string(&mut self) -> std::io::Result<String> {
        let len = self.u64()?;
        if len > MAX_LEN {
            return Err(invalid_data(format!("string of {len} bytes")));
        }
        let mut buf = vec![0u8; len as usize];
        self.inner.read_exact(&mut buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf);
        }
        String::from_utf8(buf).map_err(|e| invalid_data(format!("string is not UTF-8: {e}")))
    }

    fn value(&mut self, ty: u32) -> std::io::Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::Uint(u64::from(u8::from_le_bytes(self.bytes()?))),
            1 => GgufValue::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => GgufValue::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => GgufValue::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => GgufValue::Uint(u64::from(self.u32()?)),
            5 => GgufValue::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => GgufValue::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => GgufValue::Bool(self.bytes::<1>()?[0] != 0),
            8 => GgufValue::Str(self.string()?),
            9 => {
                let elem = self.u32()?;
                let count = self.u64()?;
                if count > MAX_LEN {
                    return Err(invalid_data(format!("array of {count} items")));
                }
                let mut items = Vec::with_capacity(count.min(1 << 20) as usize);
                for _ in 0..count {
                    items.push(self.value(elem)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::Uint(self.u64()?),
            11 => GgufValue::Int(i64::from_le_bytes(self.bytes()?)),
            12 => GgufValue::Float(f64::from_le_bytes(self.bytes()?)),
            other => return Err(invalid_data(format!("unknown value type {other}"))),
        })
    }
}

fn invalid_data(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

fn load_err(path: &Path, message: impl ToString) -> RenderError {
    RenderError::Load {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

/// Reads the header and all metadata key/value pairs of a GGUF file.
pub fn read_metadata(path: &Path) -> Result<GgufMetadata, RenderError> {
    let file = File::open(path).map_err(|e| load_err(path, e))?;
    let mut r = Reader {
        inner: BufReader::with_capacity(1 << 20, file),
        hasher: None,
    };
    parse(&mut r).map_err(|e| load_err(path, format!("not a readable GGUF file: {e}")))
}

fn parse<R: Read>(r: &mut Reader<R>) -> std::io::Result<GgufMetadata> {
    let magic: [u8; 4] = r.bytes()?;
    if &magic != GGUF_MAGIC {
        return Err(invalid_data("bad magic (expected GGUF)".into()));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(invalid_data(format!("unsupported GGUF version {version}")));
    }
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    if kv_count > MAX_LEN {
        return Err(invalid_data(format!("{kv_count} metadata keys")));
    }
    let mut hasher = Sha256::new();
    let mut kv = Vec::with_capacity(kv_count as usize);
    for _ in 0..kv_count {
        let key = r.string()?;
        let hashed = key.starts_with("tokenizer.");
        if hashed {
            hasher.update((key.len() as u64).to_le_bytes());
            hasher.update(key.as_bytes());
            r.hasher = Some(std::mem::take(&mut hasher));
        }
        let ty = r.u32()?;
        let value = r.value(ty)?;
        if let Some(h) = r.hasher.take() {
            hasher = h;
        }
        kv.push((key, value));
    }
    Ok(GgufMetadata {
        version,
        tensor_count,
        kv,
        tokenizer_sha256: hex::encode(hasher.finalize()),
    })
}

/// The pre-tokenizer (as `tokenizers` JSON) for a `tokenizer.ggml.pre` name.
///
/// These mirror llama.cpp's split regexes for the same names. Only `smollm`
/// is checked against llama.cpp by this repository's tests; the others are
/// the well-known published rules of those model families.
pub fn split_rules(pre: &str) -> Option<Json> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let pretokenizers = match pre {
        // GPT-2 rule alone (ByteLevel's built-in regex).
        "gpt-2" | "default" => vec![byte_level(true)],
        // Digits one by one, then the GPT-2 rule (SmolLM / StarCoder family).
        "smollm" | "starcoder" | "refact" => vec![
            json!({"type": "Digits", "individual_digits": true}),
            byte_level(true),
        ],
        "llama-bpe" | "llama3" => vec![split(LLAMA3), byte_level(false)],
        "qwen2" => vec![split(QWEN2), byte_level(false)],
        _ => return None,
    };
    Some(json!({"type": "Sequence", "pretokenizers": pretokenizers}))
}

/// Builds the tokenizer, special tokens, chat template and context length
/// from a GGUF file's metadata.
pub fn load_tokenizer(path: &Path) -> Result<TokenizerSource, RenderError> {
    let meta = read_metadata(path)?;
    source_from_metadata(&meta).map_err(|m| load_err(path, m))
}

/// [`load_tokenizer`] on already-read metadata; errors are plain messages.
pub fn source_from_metadata(meta: &GgufMetadata) -> Result<TokenizerSource, String> {
    let model = meta.get_str("tokenizer.ggml.model").unwrap_or("");
    if model != "gpt2" {
        return Err(format!(
            "tokenizer.ggml.model = {model:?}: only byte-level BPE (\"gpt2\") GGUF tokenizers are supported"
        ));
    }
    let pre = meta.get_str("tokenizer.ggml.pre").unwrap_or("default");
    let pre_tokenizer = split_rules(pre).ok_or_else(|| {
        format!(
            "tokenizer.ggml.pre = {pre:?} is not in tito's pre-tokenizer table \
             (known: gpt-2, default, smollm, starcoder, refact, llama-bpe, llama3, qwen2); \
             use a Hugging Face tokenizer directory for this model instead"
        )
    })?;
    let tokens: Vec<&str> = meta
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .ok_or("tokenizer.ggml.tokens is missing")?
        .iter()
        .map(|v| v.as_str().ok_or("tokenizer.ggml.tokens holds a non-string"))
        .collect::<Result<_, _>>()?;
    let merges: Vec<&str> = meta
        .get("tokenizer.ggml.merges")
        .and_then(GgufValue::as_array)
        .ok_or("tokenizer.ggml.merges is missing")?
        .iter()
        .map(|v| v.as_str().ok_or("tokenizer.ggml.merges holds a non-string"))
        .collect::<Result<_, _>>()?;
    let types: Vec<i64> = match meta
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
    {
        Some(items) => items.iter().map(|v| v.as_i64().unwrap_or(1)).collect(),
        None => Vec::new(),
    };

    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        // First occurrence wins if a token text is duplicated.
        vocab.entry(tok.to_string()).or_insert(json!(id));
        let ty = types.get(id).copied().unwrap_or(1);
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
            }));
        }
    }
    let spec = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    });
    let tokenizer: Tokenizer = spec
        .to_string()
        .parse()
        .map_err(|e| format!("cannot build a BPE tokenizer from the GGUF vocabulary: {e}"))?;

    let token_of = |key: &str| -> Option<String> {
        let id = meta.get_u64(key)?;
        tokens.get(usize::try_from(id).ok()?).map(|t| t.to_string())
    };
    let mut eos_token_ids: Vec<u32> = [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.eom_token_id",
    ]
    .iter()
    .filter_map(|k| meta.get_u64(k))
    .filter(|id| (*id as usize) < tokens.len())
    .map(|id| id as u32)
    .collect();
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();
    let arch = meta.get_str("general.architecture").unwrap_or("llama");
    let max_model_len = meta
        .get_u64(&format!("{arch}.context_length"))
        .and_then(|v| u32::try_from(v).ok());
    Ok(TokenizerSource {
        tokenizer,
        chat_template: meta.get_str("tokenizer.chat_template").map(str::to_string),
        bos_token: token_of("tokenizer.ggml.bos_token_id"),
        eos_token: token_of("tokenizer.ggml.eos_token_id"),
        pad_token: token_of("tokenizer.ggml.padding_token_id"),
        unk_token: token_of("tokenizer.ggml.unknown_token_id"),
        eos_token_ids,
        max_model_len,
        sha256: meta.tokenizer_sha256.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv_str(out: &mut Vec<u8>, key: &str, value: &str) {
        out.extend((key.len() as u64).to_le_bytes());
        out.extend(key.as_bytes());
        out.extend(8u32.to_le_bytes());
        out.extend((value.len() as u64).to_le_bytes());
        out.extend(value.as_bytes());
    }

    #[test]
    fn parses_header_and_typed_values() {
        let mut b = Vec::new();
        b.extend(b"GGUF");
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(3u64.to_le_bytes());
        kv_str(&mut b, "general.architecture", "llama");
        b.extend(("llama.context_length".len() as u64).to_le_bytes());
        b.extend(b"llama.context_length");
        b.extend(4u32.to_le_bytes());
        b.extend(2048u32.to_le_bytes());
        b.extend(("tokenizer.ggml.token_type".len() as u64).to_le_bytes());
        b.extend(b"tokenizer.ggml.token_type");
        b.extend(9u32.to_le_bytes());
        b.extend(5u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend(1i32.to_le_bytes());
        b.extend(3i32.to_le_bytes());
        let mut r = Reader {
            inner: &b[..],
            hasher: None,
        };
        let meta = parse(&mut r).expect("valid GGUF header");
        assert_eq!(meta.version, 3);
        assert_eq!(meta.get_str("general.architecture"), Some("llama"));
        assert_eq!(meta.get_u64("llama.context_length"), Some(2048));
        assert_eq!(
            meta.get("tokenizer.ggml.token_type"),
            Some(&GgufValue::Array(vec![
                GgufValue::Int(1),
                GgufValue::Int(3)
            ]))
        );
        assert_eq!(meta.tokenizer_sha256.len(), 64);
    }

    #[test]
    fn rejects_bad_magic_and_unknown_pre() {
        let mut r = Reader {
            inner: &b"GGML\x03\0\0\0"[..],
            hasher: None,
        };
        assert!(parse(&mut r).is_err());
        assert!(split_rules("smollm").is_some());
        assert!(split_rules("no-such-pre").is_none());
    }
}
