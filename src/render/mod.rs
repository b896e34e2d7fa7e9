//! Chat-template rendering and tokenization, done in the gateway so the
//! prompt token ids are tito's own and never re-derived from text later.
//!
//! Owns: loading a tokenizer (a Hugging Face directory, or a `.gguf` file via
//! [`gguf`]), compiling the chat template, rendering messages, encoding and
//! decoding. Must not: do I/O after start-up, or know about HTTP.

mod bytedecode;
pub mod bytelevel;
pub mod detok;
mod fastbpe;
pub mod gguf;
pub mod harmony;
mod harmony_cache;
mod harmony_stream;
mod hf;
pub mod image;
pub mod pixel_values;
pub mod placeholders;
mod pretok;
mod pyfmt;
pub mod resample;
pub mod shipped;
mod template;
pub mod testing;
pub mod vision;

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;

use minijinja::Environment;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use crate::config::ModelConfig;
use crate::error::ApiError;

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

impl From<RenderError> for ApiError {
    fn from(e: RenderError) -> Self {
        match e {
            RenderError::Template(_) | RenderError::Tokenize(_) => {
                ApiError::bad_request(e.to_string())
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
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
    /// The tokenizer, and its exact table decoder when it has one.
    detok: detok::Detokenizer,
    /// The exact fast encoder, when this tokenizer qualifies (see `fastbpe`).
    fast: Option<fastbpe::FastBpe>,
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    eos_token_ids: Vec<u32>,
    max_model_len: Option<u32>,
    tokenizer_sha256: String,
    template_sha256: String,
    /// Variables every render sees first (transformers' `special_tokens_map`:
    /// `bos_token`, `eos_token`, ... and named extra special tokens).
    template_vars: serde_json::Map<String, Json>,
    content_format: ContentFormat,
    /// The chat template's source, for [`Renderer::template_reads`].
    template_source: String,
    /// Tokens in the vocabulary, added ones included (counted once, here).
    vocab_size: u32,
    /// Whether vocabulary pieces are GPT-2 byte-level strings (each char
    /// one byte), as opposed to SentencePiece pieces (`▁` for a space,
    /// `<0xNN>` byte-fallback tokens).
    byte_level: bool,
    /// The Harmony format (gpt-oss), rendered by `openai-harmony` instead of
    /// a Jinja template.
    harmony: Option<Arc<harmony::Harmony>>,
    /// The vision processor whose placeholder runs images render as
    /// (`[model] vision`); `None` for a text-only model.
    vision: Option<vision::VisionConfig>,
}

/// How a chat template reads `message.content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// As one string: OpenAI's lists of text parts must be flattened first.
    String,
    /// It iterates over OpenAI's list of parts (or reads their `type`), so a
    /// list is passed through as sent.
    Parts,
}

/// Detects [`ContentFormat`] from the template source, as vLLM does for the
/// same choice: a template that loops over a message's `content` or looks at
/// a part's `type` takes parts; any other takes strings.
pub fn detect_content_format(template: &str) -> ContentFormat {
    // `{% for part in message.content %}` / `message['content']`, or a
    // part's type compared with "text" / "image".
    const PARTS: &str = r#"for\s+\w+\s+in\s+\w+(\.content|\[\s*['"]content['"]\s*\])|(\[\s*['"]type['"]\s*\]|\.type)\s*==\s*['"](text|image)"#;
    match fancy_regex::Regex::new(PARTS) {
        Ok(re) if re.is_match(template).unwrap_or(false) => ContentFormat::Parts,
        _ => ContentFormat::String,
    }
}

impl Renderer {
    /// Loads the tokenizer named by `[model] tokenizer` and the template
    /// (override file first, else the tokenizer's own).
    pub fn load(model: &ModelConfig) -> Result<Arc<Renderer>, RenderError> {
        let path = model.tokenizer.as_path();
        let (source, extra_vars) = if path.extension().is_some_and(|e| e == "gguf") {
            (gguf::load_tokenizer(path)?, serde_json::Map::new())
        } else {
            hf::load_dir_with_vars(path)?
        };
        let spec = model.chat_template.as_path();
        if spec.as_os_str() == harmony::TEMPLATE_NAME {
            let mut renderer = Renderer::new_harmony(source, harmony::Harmony::load()?)?;
            renderer.template_vars.extend(extra_vars);
            return Ok(Arc::new(renderer));
        }
        let override_template = if spec.as_os_str().is_empty() {
            None
        } else if let Some(t) = spec.to_str().and_then(shipped::by_name) {
            Some(t.to_string())
        } else {
            Some(read_template(spec)?)
        };
        let harmony_vocab = source.tokenizer.token_to_id("<|channel|>").is_some();
        if override_template.is_none() && source.chat_template.is_none() && harmony_vocab {
            return Err(RenderError::Load {
                path: path.display().to_string(),
                message: format!(
                    "no chat template: this is a Harmony (gpt-oss) tokenizer; set [model] \
                     chat_template = \"{}\"",
                    harmony::TEMPLATE_NAME
                ),
            });
        }
        let mut renderer = Renderer::new(source, override_template)?;
        renderer.template_vars.extend(extra_vars);
        if let Some(family) = vision::VisionFamily::parse(model.vision.as_str()) {
            let config = vision::VisionConfig::from_model_dir(family, path).map_err(|e| {
                RenderError::Load {
                    path: path.display().to_string(),
                    message: format!("[model] vision = \"{}\": {e}", family.as_str()),
                }
            })?;
            renderer
                .set_vision(config)
                .map_err(|message| RenderError::Load {
                    path: path.display().to_string(),
                    message,
                })?;
        }
        Ok(Arc::new(renderer))
    }

    /// Renders image parts as `vision`'s placeholder runs. The tokenizer
    /// must know the vision tokens and the template must read content parts.
    pub fn set_vision(&mut self, vision: vision::VisionConfig) -> Result<(), String> {
        for token in [vision::VISION_START, vision::IMAGE_PAD, vision::VISION_END] {
            if self.token_to_id(token).is_none() {
                return Err(format!(
                    "[model] vision = \"{}\": the tokenizer has no {token} token",
                    vision.family.as_str()
                ));
            }
        }
        if self.content_format != ContentFormat::Parts {
            return Err(format!(
                "[model] vision = \"{}\": the chat template reads message content as a string, \
                 so it cannot render image parts",
                vision.family.as_str()
            ));
        }
        self.vision = Some(vision);
        Ok(())
    }

    /// The vision processor, when this model takes images.
    pub fn vision(&self) -> Option<&vision::VisionConfig> {
        self.vision.as_ref()
    }

    /// The id of `<|image_pad|>`, when this model takes images.
    pub fn image_pad_id(&self) -> Option<u32> {
        self.vision.as_ref()?;
        self.token_to_id(vision::IMAGE_PAD)
    }

    /// Builds a renderer from a loaded tokenizer source; `template` overrides
    /// the source's own chat template.
    pub fn new(source: TokenizerSource, template: Option<String>) -> Result<Renderer, RenderError> {
        let template = template
            .or(source.chat_template.clone())
            .ok_or(RenderError::NoTemplate)?;
        Renderer::build(source, template, None)
    }

    /// A renderer of the Harmony format: `openai-harmony` renders the
    /// prompt ids; the tokenizer decodes and encodes plain text. A turn ends
    /// on Harmony's `<|return|>` / `<|call|>`, whatever the tokenizer's EOS.
    pub fn new_harmony(
        mut source: TokenizerSource,
        harmony: harmony::Harmony,
    ) -> Result<Renderer, RenderError> {
        source.eos_token_ids = harmony.stop_ids().to_vec();
        // What identifies the "template": the crate and its version.
        let template = format!("openai-harmony {}", harmony::CRATE_VERSION);
        Renderer::build(source, template, Some(Arc::new(harmony)))
    }

    fn build(
        source: TokenizerSource,
        template: String,
        harmony: Option<Arc<harmony::Harmony>>,
    ) -> Result<Renderer, RenderError> {
        let template_sha256 = sha256_hex(template.as_bytes());
        let content_format = detect_content_format(&template);
        let template_source = template.clone();
        let env = match harmony {
            Some(_) => template::build_env(String::new())?,
            None => template::build_env(template)?,
        };
        let mut template_vars = serde_json::Map::new();
        for (name, value) in [
            ("bos_token", &source.bos_token),
            ("eos_token", &source.eos_token),
            ("pad_token", &source.pad_token),
            ("unk_token", &source.unk_token),
        ] {
            if let Some(v) = value {
                template_vars.insert(name.into(), Json::String(v.clone()));
            }
        }
        let fast = fast_encoder(&source.tokenizer);
        // The vocabulary map (added tokens included) is built once: its size
        // is the vocabulary's, its largest id bounds the decode table.
        let vocab = source.tokenizer.get_vocab(true);
        let vocab_size = vocab.len() as u32;
        let byte_level = source
            .tokenizer
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|d| d.contains(r#""type":"ByteLevel""#));
        Ok(Renderer {
            vocab_size,
            byte_level,
            fast,
            detok: detok::Detokenizer::with_vocab(source.tokenizer, &vocab),
            env,
            bos_token: source.bos_token,
            eos_token: source.eos_token,
            pad_token: source.pad_token,
            eos_token_ids: source.eos_token_ids,
            max_model_len: source.max_model_len,
            tokenizer_sha256: source.sha256,
            template_sha256,
            template_vars,
            content_format,
            template_source,
            harmony,
            vision: None,
        })
    }

    /// The Harmony format, when this renderer renders it.
    pub fn harmony(&self) -> Option<&Arc<harmony::Harmony>> {
        self.harmony.as_ref()
    }

    /// Whether the chat template reads the variable `name` (a word of its
    /// source), e.g. `enable_thinking` or `reasoning_effort`: only then is
    /// a surface's switch for it passed as a template kwarg.
    pub fn template_reads(&self, name: &str) -> bool {
        if self.harmony.is_some() {
            return [harmony::KWARG_EFFORT, harmony::KWARG_DATE].contains(&name);
        }
        let src = self.template_source.as_str();
        let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        src.match_indices(name).any(|(i, _)| {
            let before = src[..i].chars().next_back();
            let after = src[i + name.len()..].chars().next();
            !before.is_some_and(is_word) && !after.is_some_and(is_word)
        })
    }

    /// How this template reads `message.content` (see [`ContentFormat`]).
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Renders the chat template to text, with the variables transformers'
    /// `apply_chat_template` gives a template: the special tokens, then
    /// `chat_template_kwargs` (which may override them), then `messages`,
    /// `tools` and `documents` (`none` when absent) and
    /// `add_generation_prompt`. Messages get transformers' reasoning aliases
    /// (see [`alias_reasoning_fields`]); `null` values are kept, as plain
    /// jinja2 keeps them (transformers 5.x drops them, which hides e.g.
    /// DeepSeek V3 tool calls).
    pub fn render(&self, input: &RenderInput<'_>) -> Result<String, RenderError> {
        if self.harmony.is_some() {
            let ids = self.render_ids(input)?;
            return self.decode(&ids, false);
        }
        let tmpl = self
            .env
            .get_template(template::TEMPLATE_NAME)
            .map_err(|e| RenderError::Template(crate::error::with_causes(&e)))?;
        let ctx = TemplateContext {
            vars: &self.template_vars,
            kwargs: input.kwargs,
            messages: input.messages.iter().map(alias_reasoning_fields).collect(),
            tools: input.tools,
            add_generation_prompt: input.add_generation_prompt,
        };
        let text = tmpl
            .render(minijinja::Value::from_serialize(&ctx))
            .map_err(|e| RenderError::Template(crate::error::with_causes(&e)))?;
        match &self.vision {
            Some(vision) => {
                placeholders::expand(text, &placeholders::message_grids(vision, input.messages)?)
            }
            None => Ok(text),
        }
    }

    /// Renders and tokenizes: the prompt token ids a backend receives.
    pub fn render_ids(&self, input: &RenderInput<'_>) -> Result<Vec<u32>, RenderError> {
        if let Some(h) = &self.harmony {
            return h.render_ids(
                input.messages,
                input.tools,
                input.kwargs,
                input.add_generation_prompt,
            );
        }
        let text = self.render(input)?;
        self.encode(&text)
    }

    /// The ids of `text`, which [`Renderer::render`] made from `input`:
    /// the tokenizer's encoding of it, or for Harmony the crate's own ids
    /// (Harmony encodes message text without special tokens, so a text
    /// that spells `<|end|>` is not re-encoded as one).
    pub fn rendered_ids(
        &self,
        text: &str,
        input: &RenderInput<'_>,
    ) -> Result<Vec<u32>, RenderError> {
        match &self.harmony {
            Some(_) => self.render_ids(input),
            None => self.encode(text),
        }
    }

    /// Tokenizes text as transformers does after templating: special tokens
    /// written in the text become their ids, and nothing is added (the
    /// template already wrote BOS where the model wants it).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        match &self.fast {
            Some(fast) => fast
                .encode(self.detok.tokenizer(), text)
                .map_err(RenderError::Tokenize),
            None => self.encode_reference(text),
        }
    }

    /// Whether [`Renderer::encode`] runs the fast byte-level BPE encoder.
    pub fn has_fast_encoder(&self) -> bool {
        self.fast.is_some()
    }

    /// [`Renderer::encode`] through the `tokenizers` crate, always: the
    /// reference the fast encoder is checked against.
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        let enc = self
            .detok
            .tokenizer()
            .encode_fast(text, false)
            .map_err(|e| RenderError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Tokenizes text as transformers' `encode(text)` does by default, with
    /// the tokenizer's own special tokens added (e.g. Llama 3's BOS): what
    /// vLLM does for a `/v1/completions` string prompt. Never use it on
    /// rendered chat templates, which already carry their BOS.
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, RenderError> {
        let enc = self
            .detok
            .tokenizer()
            .encode_fast(text, true)
            .map_err(|e| RenderError::Tokenize(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids to text, as `tokenizers`' `decode` makes it.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, RenderError> {
        self.detok.decode(ids, skip_special_tokens)
    }

    /// [`Renderer::decode`], and whether the text can be joined to another
    /// such text (see [`detok::Detokenizer::decode_joinable`]).
    pub fn decode_joinable(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<(String, bool), RenderError> {
        self.detok.decode_joinable(ids, skip_special_tokens)
    }

    /// Whether [`Renderer::decode`] runs the table decoder.
    pub fn has_fast_decoder(&self) -> bool {
        self.detok.has_table()
    }

    /// [`Renderer::decode`] through the `tokenizers` crate, always: the
    /// reference the table decoder is checked against.
    pub fn decode_reference(
        &self,
        ids: &[u32],
        skip_special_tokens: bool,
    ) -> Result<String, RenderError> {
        self.detok.decode_reference(ids, skip_special_tokens)
    }

    /// The token's text form (e.g. `<|im_end|>` or `Ġthe`), for logprob output.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.detok.tokenizer().id_to_token(id)
    }

    /// Whether [`Renderer::id_to_token`] pieces are GPT-2 byte-level strings.
    pub fn byte_level(&self) -> bool {
        self.byte_level
    }

    /// Id of a token given by its exact text, e.g. `<|im_end|>`.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.detok.tokenizer().token_to_id(token)
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.detok.tokenizer()
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

    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    /// The id verl pads with: the tokenizer's `pad_token`, else its first
    /// EOS id (as Hugging Face tokenizers without a pad token are used).
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad_token()
            .and_then(|t| self.token_to_id(t))
            .or_else(|| self.eos_token_ids.first().copied())
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
        self.vocab_size
    }
}

/// Message keys that carry reasoning text, in transformers' order of preference.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// transformers 5.x fills `reasoning_content` (and `thinking`, for gpt-oss
/// templates) from whichever reasoning field a message has, so a template
/// reading either name sees the reasoning. Key order follows Python's
/// `{"thinking": r, **message, "reasoning_content": r}`.
/// A message without a reasoning field is passed on as it is, uncopied.
pub fn alias_reasoning_fields(message: &Json) -> Cow<'_, Json> {
    let Json::Object(map) = message else {
        return Cow::Borrowed(message);
    };
    let reasoning = REASONING_FIELDS
        .iter()
        .find_map(|k| map.get(*k).filter(|v| !v.is_null()));
    let Some(reasoning) = reasoning else {
        return Cow::Borrowed(message);
    };
    let mut out = serde_json::Map::new();
    out.insert("thinking".into(), reasoning.clone());
    for (k, v) in map {
        out.insert(k.clone(), v.clone());
    }
    out.insert("reasoning_content".into(), reasoning.clone());
    Cow::Owned(Json::Object(out))
}

/// The variables a render sees, borrowed from the renderer and the request
/// (nothing is copied before `minijinja` builds its values): the special
/// tokens, then `chat_template_kwargs` (a kwarg replaces a special token of
/// its name), then the four the render itself sets (which replace a kwarg).
struct TemplateContext<'a> {
    vars: &'a serde_json::Map<String, Json>,
    kwargs: Option<&'a serde_json::Map<String, Json>>,
    messages: Vec<Cow<'a, Json>>,
    tools: Option<&'a [Json]>,
    add_generation_prompt: bool,
}

impl serde::Serialize for TemplateContext<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        const SET_BY_RENDER: [&str; 4] =
            ["messages", "tools", "documents", "add_generation_prompt"];
        let by_render = |k: &str| SET_BY_RENDER.contains(&k);
        let by_kwarg = |k: &str| self.kwargs.is_some_and(|m| m.contains_key(k));
        let mut map = s.serialize_map(None)?;
        for (k, v) in self.vars {
            if !by_render(k) && !by_kwarg(k) {
                map.serialize_entry(k, v)?;
            }
        }
        for (k, v) in self.kwargs.into_iter().flatten() {
            if !by_render(k) {
                map.serialize_entry(k, v)?;
            }
        }
        map.serialize_entry("messages", &self.messages)?;
        match self.tools {
            Some(tools) => map.serialize_entry("tools", tools)?,
            None => map.serialize_entry("tools", &Json::Null)?,
        }
        map.serialize_entry("documents", &Json::Null)?;
        map.serialize_entry("add_generation_prompt", &self.add_generation_prompt)?;
        map.end()
    }
}

fn read_template(path: &Path) -> Result<String, RenderError> {
    let text = std::fs::read_to_string(path).map_err(|e| RenderError::Load {
        path: path.display().to_string(),
        message: format!(
            "{e} (a chat_template is a file, or one of the shipped templates: {})",
            shipped::names()
        ),
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

/// Conversations with more message text than this are rendered and
/// tokenized off the async worker (tens of thousands of tokens: milliseconds,
/// longer on the `tokenizers` crate path).
pub const LARGE_RENDER_BYTES: usize = 64 * 1024;

/// Runs render/tokenize work `f`; when `text_bytes` is large and the runtime
/// is multi-threaded, inside `block_in_place`, so the worker's other tasks
/// move to another thread meanwhile. Small work runs inline (cheaper than a
/// thread hand-off).
pub fn run_render_work<T>(text_bytes: usize, f: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi && text_bytes > LARGE_RENDER_BYTES {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests;

/// The fast encoder for this tokenizer, if it qualifies and reproduces the
/// crate on every probe; otherwise the crate encodes (and the log says why).
fn fast_encoder(tokenizer: &Tokenizer) -> Option<fastbpe::FastBpe> {
    let fast = match fastbpe::FastBpe::from_tokenizer(tokenizer) {
        Ok(f) => f,
        Err(why) => {
            tracing::info!(reason = %why, "fast BPE encoder off, the tokenizers crate encodes");
            return None;
        }
    };
    for probe in fastbpe::PROBES {
        let reference = tokenizer.encode_fast(*probe, false).ok()?;
        if fast.encode(tokenizer, probe).ok().as_deref() != Some(reference.get_ids()) {
            tracing::warn!(
                probe,
                "fast BPE encoder disagrees with the tokenizers crate; not used"
            );
            return None;
        }
    }
    Some(fast)
}
