//! The images of a chat call (from any surface, translated to chat
//! messages): each `image_url` part checked and decoded once, bounded, and
//! replaced by its checked part (`render::placeholders`); the request as
//! received loses its copies of the bytes, which the store keeps once.
//!
//! An `image_url` is a base64 `data:` URL, or `sha256:<hex>`: an image the
//! store already holds (a stored request names its images so, and a
//! trajectory rebuilt from the store or continued by `previous_response_id`
//! reads them back), or an `http(s)://` URL when fetching is on
//! (`api::image_fetch`); the request as stored names a fetched image by
//! its hash too.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use super::AppState;
use crate::backend::ImageInputs;
use crate::error::ApiError;
use crate::render::image::{parse_image_url, ImageLimits, PromptImage};
use crate::render::placeholders::{image_part, IMAGE_REF_PREFIX};
use crate::render::vision::VisionConfig;

/// A request's images, in the order their parts appear in its messages.
pub(super) type Images = Arc<Vec<PromptImage>>;

/// Content parts are text or `image_url` (checked and decoded by
/// [`take`], which refuses them for a text-only model); any other part
/// (audio, files) is refused: silently dropped, it would change what the
/// model is asked. Only user and tool messages carry images.
pub(super) fn check_parts(param: &str, role: &str, parts: &[Json]) -> Result<(), ApiError> {
    for (j, part) in parts.iter().enumerate() {
        let p = format!("{param}.content[{j}]");
        let kind = part.get("type").and_then(Json::as_str);
        match kind {
            Some("text") if part.get("text").is_some_and(Json::is_string) => {}
            Some("text") => {
                return Err(ApiError::invalid(
                    &p,
                    format!("`{p}.text` must be a string"),
                ))
            }
            Some("image_url") if role == "user" || role == "tool" => {}
            Some("image_url") => {
                return Err(ApiError::invalid(
                    &p,
                    format!("`{p}`: a {role} message cannot carry an image; images go in user and tool messages"),
                ))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    &p,
                    format!(
                        "content part type `{other}` is not supported: send text or image_url parts"
                    ),
                ))
            }
            None => {
                return Err(ApiError::invalid(
                    &p,
                    format!("`{p}` must be an object with a `type`"),
                ))
            }
        }
    }
    Ok(())
}

/// Checks and decodes the `image_url` parts of `messages` in place (each
/// becomes its checked part) and drops their bytes from `received`.
pub(super) async fn take(
    state: &AppState,
    messages: &mut [Json],
    received: &mut Json,
) -> Result<Images, ApiError> {
    let mut at = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let parts = m.get("content").and_then(Json::as_array);
        for (j, p) in parts.into_iter().flatten().enumerate() {
            if p.get("type").and_then(Json::as_str) == Some("image_url") {
                at.push((i, j));
            }
        }
    }
    if at.is_empty() {
        return Ok(Arc::default());
    }
    let (i, j) = at[0];
    let Some(vision) = state.renderer.vision() else {
        return Err(ApiError::invalid(
            &format!("messages[{i}].content[{j}]"),
            "content part type `image_url` is not supported: this gateway serves a text-only \
             model ([model] vision = \"none\"); send text parts",
        ));
    };
    let model = &state.config.model;
    let most = model.max_images_per_request as usize;
    if at.len() > most {
        return Err(ApiError::bad_request(format!(
            "the request holds {} images, over the limit max_images_per_request = {most}",
            at.len()
        )));
    }
    let limits = ImageLimits {
        max_pixels: model.max_image_pixels,
        max_bytes: usize::try_from(model.max_image_bytes).unwrap_or(usize::MAX),
    };
    let mut decoded = Decoded::default();
    let mut images = Vec::with_capacity(at.len());
    for (i, j) in at {
        let param = format!("messages[{i}].content[{j}]");
        let part = &messages[i]["content"][j];
        let url = part
            .pointer("/image_url/url")
            .or_else(|| part.get("image_url").filter(|u| u.is_string()))
            .and_then(Json::as_str)
            .ok_or_else(|| {
                ApiError::invalid(
                    &param,
                    format!("`{param}.image_url.url` must be a string (a data: URL)"),
                )
            })?;
        let image = decoded
            .get(state, vision, &limits, url)
            .await
            .map_err(|e| match e.status.is_client_error() {
                true => ApiError::invalid(&param, format!("`{param}`: {}", e.message)),
                false => e,
            })?;
        messages[i]["content"][j] = image_part(&image.sha256, image.width, image.height);
        images.push(image);
    }
    decoded.strip(received);
    Ok(Arc::new(images))
}

/// Images this gateway checked lately, by their SHA-256 and by the SHA-256
/// of their base64 payload: a turn that resends its history's images does
/// not decode them again, and a `sha256:` reference resolves before the
/// store has committed the image (`[store] ack = "queued"`). Bounded by
/// bytes; the oldest go first.
pub(crate) struct Recent {
    inner: std::sync::Mutex<RecentInner>,
    max_bytes: usize,
}

#[derive(Default)]
struct RecentInner {
    by_sha: HashMap<String, PromptImage>,
    by_payload: HashMap<[u8; 32], String>,
    order: std::collections::VecDeque<(String, Option<[u8; 32]>)>,
    bytes: usize,
}

impl Recent {
    pub(crate) fn new(max_bytes: usize) -> Self {
        Recent {
            inner: Default::default(),
            max_bytes,
        }
    }

    fn by_sha(&self, sha: &str) -> Option<PromptImage> {
        self.inner.lock().ok()?.by_sha.get(sha).cloned()
    }

    fn by_payload(&self, key: &[u8; 32]) -> Option<PromptImage> {
        let inner = self.inner.lock().ok()?;
        let sha = inner.by_payload.get(key)?;
        inner.by_sha.get(sha).cloned()
    }

    fn insert(&self, image: &PromptImage, payload: Option<[u8; 32]>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if image.bytes.len() > self.max_bytes || inner.by_sha.contains_key(&image.sha256) {
            return;
        }
        inner.bytes += image.bytes.len();
        inner.by_sha.insert(image.sha256.clone(), image.clone());
        if let Some(k) = payload {
            inner.by_payload.insert(k, image.sha256.clone());
        }
        inner.order.push_back((image.sha256.clone(), payload));
        while inner.bytes > self.max_bytes {
            let Some((sha, key)) = inner.order.pop_front() else {
                break;
            };
            if let Some(old) = inner.by_sha.remove(&sha) {
                inner.bytes -= old.bytes.len();
            }
            if let Some(k) = key {
                inner.by_payload.remove(&k);
            }
        }
    }
}

/// The images decoded for one request, by the SHA-256 of their base64
/// payload: an image repeated in a request is decoded once, and its copies
/// in the request as received are found again by the same key.
#[derive(Default)]
struct Decoded {
    by_payload: HashMap<[u8; 32], PromptImage>,
    /// Fetched images by their URL.
    by_url: HashMap<String, PromptImage>,
}

fn payload_key(payload: &str) -> [u8; 32] {
    Sha256::digest(payload.as_bytes()).into()
}

/// The base64 payload of a `data:` URL.
fn data_payload(url: &str) -> Option<&str> {
    // As `parse_image_url` reads it: leading whitespace is no part of it.
    let url = url.trim_start();
    let scheme = url.get(..5)?;
    if !scheme.eq_ignore_ascii_case("data:") {
        return None;
    }
    url.split_once(',').map(|(_, p)| p)
}

impl Decoded {
    async fn get(
        &mut self,
        state: &AppState,
        vision: &VisionConfig,
        limits: &ImageLimits,
        url: &str,
    ) -> Result<PromptImage, ApiError> {
        if let Some(sha) = url.strip_prefix(IMAGE_REF_PREFIX) {
            if let Some(image) = state.recent_images.by_sha(sha) {
                return Ok(image);
            }
            let image = stored(state, vision, sha).await?;
            state.recent_images.insert(&image, None);
            return Ok(image);
        }
        let key = data_payload(url).map(payload_key);
        if let Some(image) = key.and_then(|k| self.by_payload.get(&k)) {
            return Ok(image.clone());
        }
        if let Some(image) = key.and_then(|k| state.recent_images.by_payload(&k)) {
            if let Some(k) = key {
                self.by_payload.insert(k, image.clone());
            }
            return Ok(image);
        }
        if let Some(image) = self.by_url.get(url) {
            return Ok(image.clone());
        }
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        let fetched = scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https");
        let data = match fetched {
            true => state.image_fetch.get(url, limits).await?,
            // Decoding costs by pixels, not by encoded bytes (a small PNG
            // may hold millions): never on an async worker.
            false => crate::render::run_render_work(usize::MAX, || parse_image_url(url, limits))?,
        };
        let (width, height) = data.oriented_size();
        let grid = vision.image_grid(u64::from(height), u64::from(width))?;
        let image = PromptImage::new(data, grid);
        if let Some(k) = key {
            self.by_payload.insert(k, image.clone());
        }
        state.recent_images.insert(&image, key);
        if fetched {
            self.by_url.insert(url.to_string(), image.clone());
        }
        Ok(image)
    }

    /// Replaces in `v` every copy of a decoded image's bytes by its
    /// `sha256:` reference: `data:` URL strings (and fetched URLs, which a
    /// rebuilt history must not fetch again), and base64 sources
    /// (`{"type": "base64", "media_type", "data"}`, Messages' shape), which
    /// become `{"type": "url", "url": "sha256:…"}`.
    fn strip(&self, v: &mut Json) {
        match v {
            Json::String(s) => {
                let found = self.by_url.get(s.as_str());
                if let Some(image) = found.or_else(|| data_payload(s).and_then(|p| self.find(p))) {
                    *s = format!("{IMAGE_REF_PREFIX}{}", image.sha256);
                }
            }
            Json::Array(items) => items.iter_mut().for_each(|i| self.strip(i)),
            Json::Object(obj) => {
                let base64 = obj.get("type").and_then(Json::as_str) == Some("base64");
                let found = obj
                    .get("data")
                    .and_then(Json::as_str)
                    .filter(|_| base64)
                    .and_then(|d| self.find(d));
                match found {
                    Some(image) => {
                        *v = serde_json::json!({
                            "type": "url",
                            "url": format!("{IMAGE_REF_PREFIX}{}", image.sha256),
                        });
                    }
                    None => obj.values_mut().for_each(|i| self.strip(i)),
                }
            }
            _ => {}
        }
    }

    fn find(&self, payload: &str) -> Option<&PromptImage> {
        if self.by_payload.is_empty() {
            return None;
        }
        self.by_payload.get(&payload_key(payload))
    }
}

/// An image the store holds, named by its SHA-256.
async fn stored(
    state: &AppState,
    vision: &VisionConfig,
    sha: &str,
) -> Result<PromptImage, ApiError> {
    let known = sha.len() == 64 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let found = match known {
        true => state.store.store.image(sha).await?,
        false => None,
    };
    let image = found.ok_or_else(|| {
        ApiError::bad_request(format!(
            "image {IMAGE_REF_PREFIX}{sha} is not stored: send the image as a data: URL"
        ))
    })?;
    let grid = vision.image_grid(u64::from(image.height), u64::from(image.width))?;
    Ok(PromptImage {
        sha256: image.sha256,
        mime: image.mime,
        width: image.width,
        height: image.height,
        bytes: image.bytes,
        grid,
        encoded: Default::default(),
    })
}

/// The backend's image inputs of `prompt`, once checked: it holds one
/// placeholder run per image, in order, each as long as its image's pad
/// count, so the ids the backend receives stand for exactly these images;
/// and every backend takes images with token ids.
pub(super) fn inputs(
    state: &AppState,
    prompt: &[u32],
    images: Images,
) -> Result<ImageInputs, ApiError> {
    if let Some(b) = state.config.backends.iter().find(|b| !b.takes_images()) {
        return Err(ApiError::bad_request(format!(
            "images need an SGLang backend or a vLLM one with vllm_api = \"generate\": \
             backend {} ({}) takes no images with token ids (vLLM's /v1/completions has no \
             multimodal field; the bundled engine serves a text-only model)",
            crate::config::redact_url(&b.url),
            b.kind.as_str()
        )));
    }
    let pad = state
        .renderer
        .image_pad_id()
        .ok_or_else(|| ApiError::internal("images without a vision model"))?;
    let (mut runs, mut offsets) = (Vec::new(), Vec::new());
    let mut i = 0;
    while i < prompt.len() {
        if prompt[i] == pad {
            let start = i;
            while i < prompt.len() && prompt[i] == pad {
                i += 1;
            }
            runs.push(i - start);
            offsets.push(u32::try_from(start).unwrap_or(u32::MAX));
        } else {
            i += 1;
        }
    }
    let want: Vec<usize> = images.iter().map(|im| im.grid.pad_count).collect();
    if runs != want {
        return Err(ApiError::bad_request(format!(
            "the prompt holds {} image placeholder runs of lengths {runs:?} for {} images \
             needing {want:?}: a message's text spells an image token, or the history was edited",
            runs.len(),
            images.len()
        )));
    }
    Ok(ImageInputs {
        pad_id: pad,
        images,
        offsets: Arc::new(offsets),
    })
}
