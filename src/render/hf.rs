//! Loading a Hugging Face tokenizer directory: `tokenizer.json`,
//! `tokenizer_config.json` (chat template, special tokens) and, if present,
//! `generation_config.json` (extra EOS ids).

use std::path::Path;

use serde_json::Value as Json;
use tokenizers::Tokenizer;

use super::{sha256_hex, RenderError, TokenizerSource};

fn load_err(path: &Path, message: impl ToString) -> RenderError {
    RenderError::Load {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

pub(super) fn load_dir(dir: &Path) -> Result<TokenizerSource, RenderError> {
    let tok_path = dir.join("tokenizer.json");
    let bytes = std::fs::read(&tok_path).map_err(|e| load_err(&tok_path, e))?;
    let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| load_err(&tok_path, e))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let config: Json = match std::fs::read_to_string(&cfg_path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| load_err(&cfg_path, e))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Json::Null,
        Err(e) => return Err(load_err(&cfg_path, e)),
    };
    // Some repos keep the template in a separate chat_template.jinja file.
    let jinja_path = dir.join("chat_template.jinja");
    let chat_template = match template_from_config(&config) {
        Some(t) => Some(t),
        None => std::fs::read_to_string(&jinja_path).ok(),
    };
    let token = |key: &str| special_token(config.get(key));
    let eos_token = token("eos_token");
    let mut eos_token_ids = Vec::new();
    if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
        eos_token_ids.push(id);
    }
    let gen_path = dir.join("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&gen_path) {
        let gen: Json = serde_json::from_str(&text).map_err(|e| load_err(&gen_path, e))?;
        match gen.get("eos_token_id") {
            Some(Json::Number(n)) => eos_token_ids.extend(n.as_u64().map(|v| v as u32)),
            Some(Json::Array(items)) => {
                eos_token_ids.extend(items.iter().filter_map(|v| v.as_u64()).map(|v| v as u32))
            }
            _ => {}
        }
    }
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();
    let max_model_len = config
        .get("model_max_length")
        .and_then(Json::as_f64)
        .filter(|v| *v >= 1.0 && *v < 1e8)
        .map(|v| v as u32);
    let mut hashed = bytes;
    if let Some(t) = &chat_template {
        hashed.extend_from_slice(t.as_bytes());
    }
    Ok(TokenizerSource {
        tokenizer,
        chat_template,
        bos_token: token("bos_token"),
        eos_token,
        pad_token: token("pad_token"),
        unk_token: token("unk_token"),
        eos_token_ids,
        max_model_len,
        sha256: sha256_hex(&hashed),
    })
}

/// The chat template of a tokenizer_config: a string, or a list of named
/// templates of which "default" is used.
pub(super) fn template_from_config(config: &Json) -> Option<String> {
    match config.get("chat_template")? {
        Json::String(s) => Some(s.clone()),
        Json::Array(items) => items
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .or_else(|| items.first())
            .and_then(|t| t.get("template"))
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}

/// Special tokens appear as plain strings or as AddedToken dicts.
fn special_token(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Object(map) => map
            .get("content")
            .and_then(Json::as_str)
            .map(str::to_string),
        _ => None,
    }
}
