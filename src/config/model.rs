//! `[model]`: the tokenizer and template, the parsers that read its output,
//! its context window, and the vision processor and image limits.

use std::path::PathBuf;

use serde::Deserialize;

use super::{invalid, ConfigError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Model id served by /v1/models; other ids get 404 model_not_found.
    pub name: String,
    /// Directory with tokenizer.json + tokenizer_config.json, or a .gguf file.
    pub tokenizer: PathBuf,
    /// Optional chat template override file (Jinja).
    pub chat_template: PathBuf,
    /// One of [`TOOL_PARSERS`].
    pub tool_parser: String,
    pub reasoning_parser: String,
    /// Context window in tokens (prompt + completion). 0 = take it from the
    /// model files when they say, else 32768.
    pub max_model_len: u32,
    /// Completion length used when a request names none.
    pub default_max_tokens: u32,
    /// The vision processor whose placeholder tokens images render as;
    /// `none` (the default) refuses images.
    pub vision: VisionName,
    /// Most pixels (width x height) of one image, checked from its header
    /// before it is decoded.
    pub max_image_pixels: u64,
    /// Most encoded bytes of one image.
    pub max_image_bytes: u64,
    /// Most images in one request, its history included.
    pub max_images_per_request: u32,
    /// Fetch `http(s)://` image URLs (off: only `data:` URLs are taken; a
    /// gateway that fetches any URL is an SSRF hole).
    pub image_fetch: bool,
    /// The hosts images are fetched from (`host` or `host:port`), when
    /// `image_fetch` is on; any other host is refused unasked.
    pub image_fetch_hosts: Vec<String>,
    /// Seconds one image fetch may take, connect to last byte.
    pub image_fetch_timeout_s: u64,
    /// LoRA adapters of this model its backends serve (`[[model.adapters]]`),
    /// each requested by its name as a model id.
    pub adapters: Vec<AdapterConfig>,
    /// `[[models]]` only: the model's backends (`[[models.backends]]`
    /// tables, or names of `[[backends]]` entries).
    pub backends: Vec<super::BackendRef>,
}

/// `[[model.adapters]]`: a LoRA adapter of the model, served by the model's
/// backends under `name` (vLLM `--lora-modules name=path`, SGLang
/// `--lora-paths name=path`, or loaded at run time by `POST /admin/adapters`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdapterConfig {
    pub name: String,
    /// Where the backends load it from (a path on their disk).
    pub path: String,
}

/// Whether `name` can be a served model or adapter id: 1 to 256 bytes of
/// printable ASCII without spaces.
pub fn usable_model_id(name: &str) -> bool {
    !name.is_empty() && name.len() <= 256 && name.bytes().all(|b| b.is_ascii_graphic())
}

/// `[model] vision`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionName {
    #[default]
    None,
    Qwen2Vl,
    Qwen3Vl,
}

impl VisionName {
    pub fn as_str(self) -> &'static str {
        match self {
            VisionName::None => "none",
            VisionName::Qwen2Vl => "qwen2_vl",
            VisionName::Qwen3Vl => "qwen3_vl",
        }
    }
}

/// The `[model] tool_parser` names `parse::tool_parser` accepts (this module
/// may not use `parse`; tests/parse_families.rs checks the two agree).
pub const TOOL_PARSERS: &[&str] = &[
    "hermes",
    "llama3_json",
    "mistral",
    "deepseek_v3",
    "deepseek_v31",
    "qwen3_coder",
    "glm45",
    "kimi_k2",
    "pythonic",
    "gpt_oss",
    "none",
];

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: "smollm2-135m-instruct".into(),
            tokenizer: PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
            chat_template: PathBuf::new(),
            tool_parser: "hermes".into(),
            reasoning_parser: String::new(),
            max_model_len: 0,
            default_max_tokens: 1024,
            vision: VisionName::None,
            max_image_pixels: 32 * 1024 * 1024,
            max_image_bytes: 20 * 1024 * 1024,
            max_images_per_request: 32,
            image_fetch: false,
            image_fetch_hosts: Vec::new(),
            image_fetch_timeout_s: 10,
            adapters: Vec::new(),
            backends: Vec::new(),
        }
    }
}

impl ModelConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.name.trim().is_empty() {
            return Err(invalid("model.name", &self.name, "must not be empty"));
        }
        if self.tokenizer.as_os_str().is_empty() {
            return Err(invalid(
                "model.tokenizer",
                &self.tokenizer,
                "must name a tokenizer directory or a .gguf file",
            ));
        }
        if !TOOL_PARSERS.contains(&self.tool_parser.as_str()) {
            return Err(invalid(
                "model.tool_parser",
                &self.tool_parser,
                &format!("expected one of {}", TOOL_PARSERS.join(", ")),
            ));
        }
        const REASONING_PARSERS: [&str; 7] = [
            "",
            "think",
            "deepseek_r1",
            "glm45",
            "kimi_k2",
            "gpt_oss",
            "none",
        ];
        if !REASONING_PARSERS.contains(&self.reasoning_parser.as_str()) {
            return Err(invalid(
                "model.reasoning_parser",
                &self.reasoning_parser,
                "expected one of think, deepseek_r1, glm45, kimi_k2, gpt_oss, none (or empty)",
            ));
        }
        if self.default_max_tokens == 0 {
            return Err(invalid("model.default_max_tokens", 0, "must be at least 1"));
        }
        if self.vision != VisionName::None
            && self.tokenizer.extension().is_some_and(|e| e == "gguf")
        {
            return Err(invalid(
                "model.vision",
                self.vision.as_str(),
                "a vision model reads preprocessor_config.json from a tokenizer directory, not a .gguf file",
            ));
        }
        for (key, v) in [
            ("model.max_image_pixels", self.max_image_pixels),
            ("model.max_image_bytes", self.max_image_bytes),
            (
                "model.max_images_per_request",
                u64::from(self.max_images_per_request),
            ),
            ("model.image_fetch_timeout_s", self.image_fetch_timeout_s),
        ] {
            if v == 0 {
                return Err(invalid(key, v, "must be at least 1"));
            }
        }
        if self.image_fetch && self.image_fetch_hosts.is_empty() {
            return Err(invalid(
                "model.image_fetch_hosts",
                &self.image_fetch_hosts,
                "image_fetch = true needs the hosts images may come from",
            ));
        }
        let mut names = std::collections::HashSet::from([self.name.as_str()]);
        for (i, a) in self.adapters.iter().enumerate() {
            if !usable_model_id(&a.name) {
                return Err(invalid(
                    &format!("model.adapters[{i}].name"),
                    &a.name,
                    "must be 1 to 256 printable ASCII characters without spaces",
                ));
            }
            if !names.insert(a.name.as_str()) {
                return Err(invalid(
                    &format!("model.adapters[{i}].name"),
                    &a.name,
                    "names the model or another adapter: each served id is unique",
                ));
            }
            if a.path.trim().is_empty() {
                return Err(invalid(
                    &format!("model.adapters[{i}].path"),
                    &a.path,
                    "must name where the backends load the adapter from",
                ));
            }
        }
        if let Some(bad) = self.image_fetch_hosts.iter().find(|h| !is_host(h)) {
            return Err(invalid(
                "model.image_fetch_hosts",
                bad,
                "expected a host name or host:port, without a scheme or path",
            ));
        }
        Ok(())
    }
}

/// `host` or `host:port`: letters, digits, `.`, `-`, and an optional port.
fn is_host(entry: &str) -> bool {
    let (host, port) = match entry.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (entry, None),
    };
    !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        && port.is_none_or(|p| p.parse::<u16>().is_ok())
}
