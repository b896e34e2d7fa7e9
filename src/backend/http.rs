//! What the vLLM and SGLang clients share: one backend's name, base URL,
//! pooled reqwest client and stream timeouts, and the four kinds of request
//! they make over it — a streamed generation (through the [`pump`]), a
//! one-shot JSON call (the replay check's teacher-forced pass), the health
//! probe and an admin POST. Each client adds only its paths and bodies.
//!
//! [`pump`]: super::pump

use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::pump::{self, Body, EventDecoder, StreamTimeouts};
use super::{BackendError, GenStream};
use crate::config::{BackendConfig, RouterConfig};

pub struct HttpBackend {
    name: String,
    /// The URL paths are appended to (no trailing `/`).
    base: String,
    client: reqwest::Client,
    timeouts: StreamTimeouts,
    /// `Authorization` of every request (`[[backends]] api_key`).
    auth: Option<String>,
    /// `Authorization` of admin requests (`admin_api_key`, else `api_key`).
    admin_auth: Option<String>,
}

impl HttpBackend {
    pub fn new(cfg: &BackendConfig, router: &RouterConfig) -> anyhow::Result<Self> {
        Ok(HttpBackend {
            name: cfg.display_name(),
            base: cfg.url.trim_end_matches('/').to_string(),
            client: super::http_client(router, cfg.ca_file())?,
            timeouts: StreamTimeouts::from_router(router),
            auth: cfg.api_key.get().map(|k| format!("Bearer {k}")),
            admin_auth: cfg
                .admin_api_key
                .get()
                .or(cfg.api_key.get())
                .map(|k| format!("Bearer {k}")),
        })
    }

    /// A request to `path` with this backend's key, if it has one.
    fn request(&self, method: reqwest::Method, path: &str, admin: bool) -> reqwest::RequestBuilder {
        let req = self.client.request(method, self.url(path));
        match if admin { &self.admin_auth } else { &self.auth } {
            Some(a) => req.header(reqwest::header::AUTHORIZATION, a),
            None => req,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn timeouts(&self) -> StreamTimeouts {
        self.timeouts
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn unreachable(&self, e: reqwest::Error) -> BackendError {
        super::map_reqwest(&self.name, e)
    }

    /// POSTs `body` (JSON bytes) to `path`: the answer's status and body, as
    /// they arrive.
    pub(crate) async fn post_stream(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Body), BackendError> {
        let resp = self
            .request(reqwest::Method::POST, path, false)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        let status = resp.status().as_u16();
        let name = self.name.clone();
        let body = resp
            .bytes_stream()
            .map(move |r| r.map_err(|e| super::map_reqwest(&name, e)));
        Ok((status, Box::pin(body)))
    }

    /// A streamed generation: `body` to `path`, its SSE answer read by
    /// `decoder` under the stream timeouts.
    pub async fn generate<D: EventDecoder + Unpin>(
        &self,
        path: &str,
        body: &impl Serialize,
        decoder: D,
    ) -> Result<GenStream, BackendError> {
        pump::send_and_pump(self, path, body, decoder).await
    }

    /// A non-streamed JSON call, its whole answer read as `T` within the
    /// first-token timeout.
    pub async fn call_json<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, BackendError> {
        let request = self.request(reqwest::Method::POST, path, false).json(body);
        super::send_json(&self.name, request, self.timeouts.first_token).await
    }

    /// `GET /health`: any 2xx is healthy.
    pub async fn health(&self) -> Result<(), BackendError> {
        let resp = self
            .request(reqwest::Method::GET, "/health", false)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        super::check_status(&self.name, resp).await.map(|_| ())
    }

    /// A refusal by this backend, for `message`.
    pub fn rejected(&self, message: impl Into<String>) -> BackendError {
        BackendError::Rejected {
            backend: self.name.clone(),
            message: message.into(),
        }
    }

    /// The JSON a server describes itself with: the first of `paths` (GET,
    /// with the admin key) that exists; `None` when every one is a 404.
    pub async fn server_info(
        &self,
        paths: &[&str],
    ) -> Result<Option<serde_json::Value>, BackendError> {
        for path in paths {
            let resp = self
                .request(reqwest::Method::GET, path, true)
                .send()
                .await
                .map_err(|e| self.unreachable(e))?;
            if resp.status() == reqwest::StatusCode::NOT_FOUND {
                continue;
            }
            let resp = super::check_status(&self.name, resp).await?;
            let text = resp.text().await.map_err(|e| self.unreachable(e))?;
            let info = serde_json::from_str(&text)
                .map_err(|e| self.rejected(format!("GET {path} is not JSON: {e}")))?;
            return Ok(Some(info));
        }
        Ok(None)
    }

    /// POSTs to an admin endpoint (a query may be in `path`), with a JSON
    /// body or none; the answer's text.
    pub async fn post_admin(
        &self,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<String, BackendError> {
        let mut req = self.request(reqwest::Method::POST, path, true);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let resp = super::check_status(&self.name, resp).await?;
        resp.text().await.map_err(|e| self.unreachable(e))
    }
}
