//! Chat-template rendering and tokenization, done in the gateway so the
//! prompt token ids are tito's own and never re-derived from text later.
//!
//! Owns: loading a tokenizer (a Hugging Face directory, or a `.gguf` file via
//! [`gguf`]), compiling the chat template, rendering messages, encoding and
//! decoding. Must not: do I/O after start-up, or know about HTTP.

pub mod gguf;
mod hf;
mod pyfmt;
mod template;

use std::path::Path;
use std::sync::Arc;

use minijinja::Environment;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::config::ModelConfig;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("cannot load tokenizer from {path}: {message}")]
    Load { path: String, message: String },
    #[error("chat template does not compile: {0}")]
    TemplateCompile(String),
    #[error("no chat template: the tokenizer has none and [model] chat_template is empty")]
    NoTemplate,
    /// Rendering failed for this input (e.g. the template's raise_exception).
    #[error("chat template error: {0}")]
    Template(String),
    #[error("tokenizer error: {0}")]
    Tokenize(String),
}

/// Everything a tokenizer source provides, whatever its file format.
pub struct TokenizerSource {
    pub tokenizer: Tokenizer,
    /// The chat template shipped with the tokenizer, if any.
    pub chat_template: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub pad_token: Option<String>,
    pub unk_token: Option<String>,
    /// Token ids that end generation (EOS plus generation_config extras).
    pub eos_token_ids: Vec<u32>,
    /// Context window the model files declare, if any.
    pub max_model_len: Option<u32>,
    /// sha256 over the tokenizer's defining bytes.
    pub sha256: String,
}

/// What a template renders from.
#[derive(Debug, Clone, Default)]
pub struct RenderInput<'a> {
    pub messages: &'a [Json],
    pub tools: Option<&'a [Json]>,
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g. enable_thinking).
    pub kwargs: Option<&'a serde_json::Map<String, Json>>,
}

/// A compiled chat template plus tokenizer. Cheap to share (`Arc`).
pub struct Renderer {
    tokenizer: Tokenizer,
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    eos_token_ids: Vec<u32>,
    max_model_len: Option<u32>,
    tokenizer_sha256: String,
    template_sha256: String,
}

impl Renderer {
    /// Loads the tokenizer named by `[model] tokenizer` and the template
    /// (override file first, else the tokenizer's own).
    pub fn load(model: &ModelConfig) -> Result<Arc<Renderer>, RenderError> {
        let path = model.tokenizer.as_path();
        let source = if path.extension().is_some_and(|e| e == "gguf") {
            gguf::load_tokenizer(path)?
        } else {
            hf::load_dir(path)?
        };
        let override_template = if model.chat_template.as_os_str().is_empty() {
            None
        } else {
            Some(read_template(&model.chat_template)?)
        };
        Ok(Arc::new(Renderer::new(source, override_template)?))
    }

    /// Builds a renderer from a loaded tokenizer source; `template` overrides
    /// the source's own chat template.
    pub fn new(source: TokenizerSource, template: Option<String>) -> Result<Renderer, RenderError> {
        let template = template
            .or(source.chat_template)
            .ok_or(RenderError::NoTemplate)?;
        let template_sha256 = sha256_hex(template.as_bytes());
        let env = template::build_env(template)?;
        Ok(Renderer {
            tokenizer: source.tokenizer,
            env,
            bos_token: source.bos_token,
            eos_token: source.eos_token,
            pad_token: source.pad_token,
            unk_token: source.unk_token,
            eos_token_ids: source.eos_token_ids,
            max_model_len: source.max_model_len,
            tokenizer_sha256: source.sha256,
            template_sha256,
        })
    }

    /// Renders the chat template to text.
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, RenderError> {
        let tmpl = self
            .env
            .get_template(template::TEMPLATE_NAME)
            .map_err(|e| RenderError::Template(template::format_error(&e)))?;
        let mut ctx = serde_json::Map::new();
        if let Some(kwargs) = input.kwargs {
            for (k, v) in kwargs {
                ctx.insert(k.clone(), v.clone());
            }
        }
        ctx.insert("messages".into(), Json::Array(input.messages.to_vec()));
        if let Some(tools) = input.tools {
            ctx.insert("tools".into(), Json::Array(tools.to_vec()));
        }
        ctx.insert(
            "add_generation_prompt".into(),
            Json::Bool(input.add_generation_prompt),
        );
        for (name, value) in [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
            ("pad_token", &self.pad_token),
            ("unk_token", &self.unk_token),
        ] {
            if let Some(v) = value {
                ctx.insert(name.into(), Json::String(v.clone()));
            }
        }
        tmpl.render(minijinja::Value::from_serialize(&ctx))
            .map_err(|e| RenderError::Template(template::format_error(&e)))
    }

    /// Renders and tokenizes: the prompt token ids a backend receives.
    pub fn render_ids(&self, input: &RenderInput<'_>) -> Result<Vec<u32>, RenderError> {
        let text = self.render(input)?;
        self.encode(&text)
    }

    /// Tokenizes text as transformers does after templating: special tokens
    /// written in the text become their ids, and nothing is added (the
    /// template already wrote BOS where the model wants it).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        let enc = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| RenderError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, RenderError> {
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| RenderError::Tokenize(e.to_string()))
    }

    /// The token's text form (e.g. `<|im_end|>` or `Ġthe`), for logprob output.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tokenizer.id_to_token(id)
    }

    /// Id of a token given by its exact text, e.g. `<|im_end|>`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.tokenizer.token_to_id(token)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn max_model_len(&self) -> Option<u32> {
        self.max_model_len
    }

    pub fn tokenizer_sha256(&self) -> &str {
        &self.tokenizer_sha256
    }

    pub fn template_sha256(&self) -> &str {
        &self.template_sha256
    }

    pub fn vocab_size(&self) -> u32 {
        self.tokenizer.get_vocab_size(true) as u32
    }
}

fn read_template(path: &Path) -> Result<String, RenderError> {
    let text = std::fs::read_to_string(path).map_err(|e| RenderError::Load {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    // A `.json` override may be a tokenizer_config-style {"chat_template": ...}.
    if path.extension().is_some_and(|e| e == "json") {
        let v: Json = serde_json::from_str(&text).map_err(|e| RenderError::Load {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        return hf::template_from_config(&v).ok_or_else(|| RenderError::Load {
            path: path.display().to_string(),
            message: "no chat_template in this JSON file".into(),
        });
    }
    Ok(text)
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}
