//! `GET /v1/export`: streams an export from the store. A `spawn_blocking`
//! producer scans the store and encodes rows into a writer that hands 64 KiB
//! chunks to a bounded channel; the response body drains that channel. A slow
//! client therefore stalls the producer instead of growing memory, and a
//! client that goes away ends it (the next send fails).
//!
//! With `consumer=NAME` the export is one page of that consumer group's
//! queue: finished trajectories it has not acknowledged, leased to this
//! request (cursor in `X-Export-Cursor`) until `POST /v1/export/ack` or the
//! lease's end, after which they are served again. Handlers only; access
//! control is layered on by the app.

use std::io::{self, Write};

use axum::body::{Body, Bytes};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRef, Query, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::trajectories::{FilterParams, StoreState};
use crate::error::ApiError;
use crate::export::{
    export as run_export, ExportError, ExportOptions, Format, ImagesMode, Layout,
    EXPORT_SCHEMA_VERSION,
};
use crate::store::{TrajectoryFilter, TrajectoryIter, TrajectoryStatus};

/// Chunks in flight between the producer and the response body.
const CHANNEL_CHUNKS: usize = 8;
const CHUNK_BYTES: usize = 64 * 1024;

/// Trajectories per consumer page unless `limit` says otherwise, and most.
const DEFAULT_PAGE: usize = 1000;
const MAX_PAGE: usize = 100_000;
/// A consumer page's lease unless `lease_s` says otherwise, and longest.
const DEFAULT_LEASE_S: u64 = 600;
const MAX_LEASE_S: u64 = 7 * 24 * 3600;

/// `GET /v1/export`, `POST /v1/export/ack`, `GET /v1/images/{sha256}`.
pub fn routes<S>() -> Router<S>
where
    StoreState: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/v1/export", get(export))
        .route("/v1/export/ack", post(ack))
        .route("/v1/images/{sha256}", get(image))
}

/// `GET /v1/images/{sha256}`: a stored image's bytes as sent, with its MIME
/// type (what an export by reference names). Content-addressed, so
/// cacheable forever.
async fn image(
    State(st): State<StoreState>,
    axum::extract::Path(sha): axum::extract::Path<String>,
) -> Result<Response, ApiError> {
    let hex = sha.len() == 64 && sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !hex {
        return Err(ApiError::invalid(
            "sha256",
            "an image is named by its SHA-256: 64 lowercase hex digits",
        ));
    }
    let found = st.store.image(&sha).await?;
    let image = found.ok_or_else(|| ApiError::not_found(format!("image {sha} is not stored")))?;
    let mime = HeaderValue::from_str(&image.mime)
        .map_err(|_| ApiError::internal(format!("image {sha} has a bad stored MIME type")))?;
    let mut resp = Response::new(axum::body::Body::from(image.bytes.to_vec()));
    let h = resp.headers_mut();
    h.insert(axum::http::header::CONTENT_TYPE, mime);
    h.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    Ok(resp)
}

/// Unknown parameters are refused: a misspelled `group_size` or
/// `complete_groups` would otherwise export incomplete groups unnoticed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportParams {
    pub format: Option<String>,
    pub layout: Option<String>,
    pub status: Option<String>,
    pub since: Option<String>,
    pub group: Option<String>,
    /// One trajectory's rows, by id (not with `consumer` or other filters).
    pub trajectory: Option<String>,
    pub complete_groups: Option<bool>,
    pub group_size: Option<u32>,
    pub prompt_length: Option<usize>,
    pub response_length: Option<usize>,
    pub pad_id: Option<u32>,
    /// Only rows whose oldest token version has at least this sequence
    /// number (parsed by [`ExportParams::options`]).
    pub min_version_seq: Option<String>,
    /// Only rows at most this many versions behind the newest registered.
    pub max_staleness: Option<String>,
    /// Read as this consumer group (exactly-once pages).
    pub consumer: Option<String>,
    /// Consumer mode: trajectories per page.
    pub limit: Option<usize>,
    /// Consumer mode: seconds until an unacknowledged page is served again.
    pub lease_s: Option<u64>,
    /// `inline` (default): image bytes in the rows; `ref`: hashes only.
    pub images: Option<String>,
    /// `true`: each row carries its images' `pixel_values` (computed here
    /// with the model's image processor config).
    pub pixel_values: Option<bool>,
    /// Only this model's rows (with `adapter`: that adapter's; alone: the
    /// model's own calls, without adapter).
    pub model: Option<String>,
    /// Only this LoRA adapter's rows.
    pub adapter: Option<String>,
}

impl ExportParams {
    /// Options from query parameters; defaults `format=jsonl`,
    /// `layout=trajectory`, `pad_id` the tokenizer's (`default_pad`).
    pub fn options(&self, default_pad: u32) -> Result<ExportOptions, ApiError> {
        let format = match self.format.as_deref() {
            None | Some("") => Format::Jsonl,
            Some(f) => Format::parse(f).ok_or_else(|| {
                ApiError::invalid("format", "`format` must be `jsonl` or `parquet`")
            })?,
        };
        let layout = match self.layout.as_deref() {
            None | Some("") => Layout::Trajectory,
            Some(l) => Layout::parse(l).ok_or_else(|| {
                ApiError::invalid(
                    "layout",
                    "`layout` must be `trajectory`, `per_call` or `verl`",
                )
            })?,
        };
        let mut opts = ExportOptions::new(format, layout);
        if let Some(m) = self.images.as_deref().filter(|m| !m.is_empty()) {
            opts.images = ImagesMode::parse(m)
                .ok_or_else(|| ApiError::invalid("images", "`images` must be `inline` or `ref`"))?;
        }
        opts.prompt_length = self.prompt_length;
        opts.response_length = self.response_length;
        opts.pad_id = self.pad_id.unwrap_or(default_pad);
        opts.versions.min_version_seq = count_param("min_version_seq", &self.min_version_seq)?;
        opts.versions.max_staleness = count_param("max_staleness", &self.max_staleness)?;
        if self.model.is_some() || self.adapter.is_some() {
            opts.policy = Some(crate::store::Policy {
                model: self.model.clone(),
                adapter: self.adapter.clone(),
            });
        }
        opts.validate().map_err(|e| match e {
            ExportError::Param { param, message } => ApiError::invalid(param, message),
            e => ApiError::bad_request(e.to_string()),
        })?;
        Ok(opts)
    }

    fn filter(&self) -> Result<TrajectoryFilter, ApiError> {
        FilterParams {
            status: self.status.clone(),
            since: self.since.clone(),
            group: self.group.clone(),
            complete_groups: self.complete_groups,
            group_size: self.group_size,
        }
        .filter()
    }
}

/// A non-negative integer query parameter, `None` when absent.
fn count_param(name: &str, value: &Option<String>) -> Result<Option<u64>, ApiError> {
    match value.as_deref() {
        None => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            ApiError::invalid(
                name,
                format!(
                    "`{name}` must be a non-negative integer (a number of versions), not `{v}`"
                ),
            )
        }),
    }
}

/// A `Write` that sends full chunks into a bounded channel (blocking).
struct ChannelWriter {
    tx: mpsc::Sender<Result<Bytes, io::Error>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send_buf(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(CHUNK_BYTES),
        ));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "export client went away"))
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK_BYTES {
            self.send_buf()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send_buf()
    }
}

async fn export(
    State(st): State<StoreState>,
    params: Result<Query<ExportParams>, QueryRejection>,
) -> Result<Response, ApiError> {
    // Parse.
    let Query(p) = params?;
    let mut opts = p.options(st.pad_id)?;
    if p.pixel_values == Some(true) {
        let cfg = st
            .pixel_values
            .as_ref()
            .map_err(|why| ApiError::invalid("pixel_values", why.as_str()))?;
        opts.pixel_values = Some(cfg.clone());
    }
    let filter = p.filter()?;
    if opts.versions.max_staleness.is_some() {
        opts.versions.newest = st.store.versions().await?.last().map(|v| v.seq);
    }
    // Prepare: what to scan, and for a consumer the lease it reads under.
    let mut headers = vec![
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(opts.format.content_type()),
        ),
        (
            header::CONTENT_DISPOSITION,
            HeaderValue::from_str(&format!(
                "attachment; filename=\"tito-export.{}\"",
                opts.format.extension()
            ))
            .map_err(|e| ApiError::internal(e.to_string()))?,
        ),
    ];
    headers.push((
        header::HeaderName::from_static("x-export-schema-version"),
        HeaderValue::from_static(EXPORT_SCHEMA_VERSION),
    ));
    let source = match (&p.consumer, &p.trajectory) {
        (None, None) => Source::Filter(filter),
        (consumer, Some(id)) => Source::Ids(one_trajectory(&st, id, consumer.is_some(), &p).await?),
        (Some(consumer), None) => {
            let lease = lease(&st, consumer, filter, &p).await?;
            // Nothing left to lease: the consumer has caught up.
            let lag_ms = lease
                .oldest_updated_at
                .map_or(0, |at| crate::store::now_ms().saturating_sub(at).max(0));
            crate::metrics::export_lag(consumer, lag_ms as f64 / 1000.0);
            let count = lease.ids.len().to_string();
            headers.push((
                header::HeaderName::from_static("x-export-trajectories"),
                HeaderValue::from_str(&count).map_err(|e| ApiError::internal(e.to_string()))?,
            ));
            if let Some(cursor) = &lease.cursor {
                let value =
                    HeaderValue::from_str(cursor).map_err(|e| ApiError::internal(e.to_string()))?;
                headers.push((header::HeaderName::from_static("x-export-cursor"), value));
                let expires = HeaderValue::from_str(&lease.expires_at.to_string())
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                headers.push((
                    header::HeaderName::from_static("x-export-lease-expires"),
                    expires,
                ));
            }
            Source::Ids(lease.ids)
        }
    };
    // Run: the producer encodes into the response body as it scans.
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let store = st.store.clone();
    let errors = tx.clone();
    let consumer = p.consumer.clone().unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK_BYTES),
        };
        let scan: Result<TrajectoryIter, _> = match source {
            Source::Filter(f) => store.scan(&f),
            Source::Ids(ids) => store.scan_ids(ids),
        };
        let result = scan
            .map_err(Into::into)
            .and_then(|it| run_export(it, &*store, &opts, writer, &mut |_| {}));
        match result {
            // Its headers are gone by the time this is known: the rows left
            // out are counted and logged here (the CLI prints them).
            Ok(stats) => {
                if stats.skipped_long_prompt > 0 {
                    crate::metrics::export_skipped(&consumer, stats.skipped_long_prompt);
                    tracing::warn!(consumer = %consumer, rows = stats.skipped_long_prompt,
                        "export left out rows whose prompt is longer than prompt_length");
                }
                if stats.skipped_version > 0 {
                    crate::metrics::export_skipped_version(&consumer, stats.skipped_version);
                    tracing::info!(consumer = %consumer, rows = stats.skipped_version,
                        "export left out rows by min_version_seq / max_staleness");
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "export aborted");
                // Headers are gone already: an error item aborts the body,
                // so the client sees a broken transfer, never a silently
                // short file.
                let _ = errors.blocking_send(Err(io::Error::other(e.to_string())));
            }
        }
    });
    // Respond.
    let mut resp = Body::from_stream(ReceiverStream::new(rx)).into_response();
    resp.headers_mut().extend(headers);
    Ok(resp)
}

/// `trajectory=ID`: that trajectory alone, whatever its status; 404 when
/// the store has no such trajectory. It names its rows exactly, so it is
/// refused beside a consumer (pages are leased) or another filter.
async fn one_trajectory(
    st: &StoreState,
    id: &str,
    with_consumer: bool,
    p: &ExportParams,
) -> Result<Vec<String>, ApiError> {
    super::check_id("trajectory", "trajectory", id)?;
    let others = [
        ("consumer", with_consumer),
        ("status", p.status.is_some()),
        ("since", p.since.is_some()),
        ("group", p.group.is_some()),
        ("complete_groups", p.complete_groups.is_some()),
        ("group_size", p.group_size.is_some()),
        ("limit", p.limit.is_some()),
        ("lease_s", p.lease_s.is_some()),
    ];
    if let Some((name, _)) = others.iter().find(|(_, given)| *given) {
        return Err(ApiError::invalid(
            "trajectory",
            format!("`trajectory` names the rows to export and cannot be combined with `{name}`"),
        ));
    }
    if st.store.get_meta(id).await?.is_none() {
        return Err(ApiError::not_found(format!("no trajectory `{id}`")));
    }
    Ok(vec![id.to_owned()])
}

/// What an export reads.
enum Source {
    Filter(TrajectoryFilter),
    /// A consumer's leased page.
    Ids(Vec<String>),
}

/// Leases the consumer's next page.
async fn lease(
    st: &StoreState,
    consumer: &str,
    filter: TrajectoryFilter,
    p: &ExportParams,
) -> Result<crate::store::Lease, ApiError> {
    super::check_id("consumer", "consumer", consumer)?;
    if filter.status == Some(TrajectoryStatus::Active) {
        return Err(ApiError::invalid(
            "status",
            "a consumer reads finished trajectories only (their samples are final)",
        ));
    }
    let limit = p.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::invalid(
            "limit",
            format!("`limit` must be 1 to {MAX_PAGE} trajectories"),
        ));
    }
    let lease_s = p.lease_s.unwrap_or(DEFAULT_LEASE_S);
    if lease_s == 0 || lease_s > MAX_LEASE_S {
        return Err(ApiError::invalid(
            "lease_s",
            format!("`lease_s` must be 1 to {MAX_LEASE_S} seconds"),
        ));
    }
    let lease_ms = i64::try_from(lease_s * 1000).unwrap_or(i64::MAX);
    Ok(st.store.lease(consumer, &filter, limit, lease_ms).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBody {
    consumer: String,
    cursor: String,
}

/// `POST /v1/export/ack`: the consumer is done with a page.
async fn ack(
    State(st): State<StoreState>,
    body: Result<Json<AckBody>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(b) = body.map_err(ApiError::from)?;
    super::check_id("consumer", "consumer", &b.consumer)?;
    if b.cursor.is_empty() || b.cursor.len() > 64 {
        return Err(ApiError::invalid("cursor", "not an export cursor"));
    }
    let acked = st.store.ack(&b.consumer, &b.cursor).await?;
    Ok(Json(serde_json::json!({
        "object": "export.ack",
        "consumer": b.consumer,
        "cursor": b.cursor,
        "trajectories": acked.trajectories,
        "already_acknowledged": acked.already,
    })))
}
