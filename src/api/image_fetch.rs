//! `http(s)://` image URLs, fetched only when `[model] image_fetch` is on
//! and only from `[model] image_fetch_hosts`: a host not listed is refused
//! before any connection is made. Redirects are not followed (one could
//! lead anywhere), the body is read up to `max_image_bytes` and no further,
//! and the whole fetch is bounded by `image_fetch_timeout_s`. The response's
//! `Content-Type` is the declared MIME type the image's bytes must match.

use std::time::Duration;

use futures::StreamExt;

use crate::config::ModelConfig;
use crate::error::ApiError;
use crate::render::image::{decode_image, ImageData, ImageError, ImageLimits};

/// The fetcher of one gateway; `None` inside when fetching is off.
pub(crate) struct Fetch(Option<Fetcher>);

struct Fetcher {
    client: reqwest::Client,
    hosts: Vec<String>,
}

impl Fetch {
    pub(super) fn new(model: &ModelConfig) -> anyhow::Result<Self> {
        if !model.image_fetch {
            return Ok(Fetch(None));
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // An allowed host is reached directly, never through a proxy
            // the environment names.
            .no_proxy()
            .timeout(Duration::from_secs(model.image_fetch_timeout_s))
            .build()?;
        let hosts = model
            .image_fetch_hosts
            .iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        Ok(Fetch(Some(Fetcher { client, hosts })))
    }

    /// The image at `url` (an `http(s)://` URL), checked like a data URL's.
    pub(super) async fn get(&self, url: &str, limits: &ImageLimits) -> Result<ImageData, ApiError> {
        let Some(f) = &self.0 else {
            let scheme = url.split_once(':').map_or("", |(s, _)| s);
            return Err(ImageError::FetchDisabled {
                scheme: scheme.to_ascii_lowercase(),
            }
            .into());
        };
        let parsed = url::Url::parse(url)
            .map_err(|e| ApiError::bad_request(format!("image URL is not a valid URL: {e}")))?;
        let host = parsed.host_str().unwrap_or_default().to_ascii_lowercase();
        let with_port = parsed
            .port()
            .map_or(host.clone(), |p| format!("{host}:{p}"));
        if !f.hosts.iter().any(|h| *h == host || *h == with_port) {
            return Err(ApiError::bad_request(format!(
                "image host {with_port} is not in [model] image_fetch_hosts"
            )));
        }
        let failed = |e: reqwest::Error| {
            ApiError::bad_request(format!("image URL {with_port}: fetch failed: {e}"))
        };
        let resp = f.client.get(parsed.clone()).send().await.map_err(failed)?;
        if !resp.status().is_success() {
            return Err(ApiError::bad_request(format!(
                "image URL {with_port}: the host answered HTTP {} (redirects are not followed)",
                resp.status().as_u16()
            )));
        }
        let mime = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        let mut bytes = Vec::new();
        let mut body = resp.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(failed)?;
            if bytes.len() + chunk.len() > limits.max_bytes {
                return Err(ImageError::TooManyBytes {
                    bytes: bytes.len() + chunk.len(),
                    limit: limits.max_bytes,
                }
                .into());
            }
            bytes.extend_from_slice(&chunk);
        }
        // Decoding costs by pixels, not by encoded bytes.
        Ok(crate::render::run_render_work(usize::MAX, || {
            decode_image(bytes, &mime, limits)
        })?)
    }
}
