//! `[[backends]]`: one inference server (vLLM, SGLang, a `tito engine`
//! server) or the in-process engine, and the checks on each entry.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::redact::{redact_url, redacted_token, usable_token, Secret};
use super::{invalid, is_http_url, ConfigError, ENGINE_NOT_BUILT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    Vllm,
    Sglang,
    Engine,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Vllm => "vllm",
            BackendKind::Sglang => "sglang",
            BackendKind::Engine => "engine",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Base URL, or "engine" for the bundled in-process engine.
    pub url: String,
    pub kind: BackendKind,
    /// Optional stable name (defaults to the URL).
    #[serde(default)]
    pub name: String,
    /// Model id to send to this backend (empty: omitted, the backend uses its
    /// only served model).
    #[serde(default)]
    pub model: String,
    /// A PEM file of CA certificates this backend's `https://` certificate
    /// may chain to, besides the bundled web roots (a private CA).
    #[serde(default)]
    pub ca_file: PathBuf,
    /// Sent as `Authorization: Bearer` on every request to this backend
    /// (vLLM's and SGLang's `--api-key`).
    #[serde(default)]
    pub api_key: Secret,
    /// Sent as `Authorization: Bearer` on admin requests instead of
    /// `api_key` (SGLang's `--admin-api-key`).
    #[serde(default)]
    pub admin_api_key: Secret,
    /// Which vLLM route generations go to (kind = "vllm" only).
    #[serde(default)]
    pub vllm_api: VllmApi,
}

/// vLLM's two token-in routes. `completions` (`/v1/completions`, every
/// vLLM) takes token ids but no images; `generate` (`/inference/v1/generate`,
/// `vllm serve --enable-scale-out`) takes token ids with images.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VllmApi {
    #[default]
    Completions,
    Generate,
}

impl VllmApi {
    pub fn as_str(self) -> &'static str {
        match self {
            VllmApi::Completions => "completions",
            VllmApi::Generate => "generate",
        }
    }
}

impl BackendConfig {
    /// Whether this backend takes images with token ids: SGLang's
    /// `/generate`, or vLLM's `/inference/v1/generate`.
    pub fn takes_images(&self) -> bool {
        match self.kind {
            BackendKind::Sglang => true,
            BackendKind::Vllm => self.vllm_api == VllmApi::Generate,
            BackendKind::Engine => false,
        }
    }

    /// `ca_file`, when set.
    pub fn ca_file(&self) -> Option<&Path> {
        (!self.ca_file.as_os_str().is_empty()).then_some(self.ca_file.as_path())
    }

    /// The name in logs, metrics, errors and `/admin/backends`: `name`, else
    /// the URL with any credentials in it replaced by `***`.
    pub fn display_name(&self) -> String {
        if self.name.is_empty() {
            redact_url(&self.url)
        } else {
            self.name.clone()
        }
    }
}

/// Checks every `[[backends]]` entry, naming the key of the first bad one.
pub(super) fn validate(backends: &[BackendConfig]) -> Result<(), ConfigError> {
    for (i, b) in backends.iter().enumerate() {
        let key = format!("backends[{i}].url");
        match b.kind {
            BackendKind::Engine => {
                if b.url != "engine" && !is_http_url(&b.url) {
                    return Err(invalid(
                        &key,
                        redact_url(&b.url),
                        "kind = \"engine\" takes url = \"engine\" (in-process) or the http URL of a `tito engine` server",
                    ));
                }
            }
            _ => {
                if !is_http_url(&b.url) {
                    return Err(invalid(
                        &key,
                        redact_url(&b.url),
                        "expected an http:// or https:// URL",
                    ));
                }
            }
        }
        if b.url == "engine" && !cfg!(feature = "engine") {
            return Err(invalid(&key, "engine", ENGINE_NOT_BUILT));
        }
        if let Some(ca) = b.ca_file() {
            if !b.url.starts_with("https://") {
                return Err(invalid(
                    &format!("backends[{i}].ca_file"),
                    ca.display().to_string(),
                    "applies to an https:// url only",
                ));
            }
        }
        for (field, secret) in [("api_key", &b.api_key), ("admin_api_key", &b.admin_api_key)] {
            if let Some(t) = secret.get() {
                if !usable_token(t) {
                    return Err(invalid(
                        &format!("backends[{i}].{field}"),
                        redacted_token(t),
                        "a key is 8 to 4096 printable ASCII characters without spaces",
                    ));
                }
                if b.url == "engine" {
                    return Err(invalid(
                        &format!("backends[{i}].{field}"),
                        redacted_token(t),
                        "the in-process engine takes no key",
                    ));
                }
                if redact_url(&b.url) != b.url {
                    return Err(invalid(
                        &format!("backends[{i}].{field}"),
                        redacted_token(t),
                        "the url carries credentials too (sent as basic auth): give one of them",
                    ));
                }
            }
        }
        if b.vllm_api != VllmApi::Completions && b.kind != BackendKind::Vllm {
            return Err(invalid(
                &format!("backends[{i}].vllm_api"),
                b.vllm_api.as_str(),
                "applies to kind = \"vllm\" only",
            ));
        }
        if b.url == "engine" && b.kind != BackendKind::Engine {
            return Err(invalid(
                &format!("backends[{i}].kind"),
                b.kind.as_str(),
                "url = \"engine\" needs kind = \"engine\"",
            ));
        }
    }
    Ok(())
}
