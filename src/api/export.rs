//! `GET /v1/export`: streams an export from the store. A `spawn_blocking`
//! producer scans the store and encodes rows into a writer that hands 64 KiB
//! chunks to a bounded channel; the response body drains that channel. A slow
//! client therefore stalls the producer instead of growing memory, and a
//! client that goes away ends it (the next send fails). Handler only; access
//! control (admin token) is layered on by the app.

use std::io::{self, Write};

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRef, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::trajectories::{FilterParams, StoreState};
use crate::error::ApiError;
use crate::export::{export as run_export, ExportOptions, Format, Layout};

/// Chunks in flight between the producer and the response body.
const CHANNEL_CHUNKS: usize = 8;
const CHUNK_BYTES: usize = 64 * 1024;

/// `GET /v1/export`.
pub fn routes<S>() -> Router<S>
where
    StoreState: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    Router::new().route("/v1/export", get(export))
}

#[derive(Deserialize)]
pub struct ExportParams {
    pub format: Option<String>,
    pub layout: Option<String>,
    pub status: Option<String>,
    pub since: Option<String>,
    pub group: Option<String>,
    pub complete_groups: Option<bool>,
    pub group_size: Option<u32>,
    pub prompt_length: Option<usize>,
    pub response_length: Option<usize>,
    pub pad_id: Option<u32>,
}

impl ExportParams {
    /// Options from query parameters; defaults `format=jsonl`,
    /// `layout=trajectory`, `pad_id=0`.
    pub fn options(&self) -> Result<ExportOptions, ApiError> {
        let format = match self.format.as_deref() {
            None | Some("") => Format::Jsonl,
            Some(f) => Format::parse(f)
                .ok_or_else(|| ApiError::invalid("format", "expected `jsonl` or `parquet`"))?,
        };
        let layout = match self.layout.as_deref() {
            None | Some("") => Layout::Trajectory,
            Some(l) => Layout::parse(l).ok_or_else(|| {
                ApiError::invalid("layout", "expected `trajectory`, `per_call` or `verl`")
            })?,
        };
        let mut opts = ExportOptions::new(format, layout);
        opts.prompt_length = self.prompt_length;
        opts.response_length = self.response_length;
        opts.pad_id = self.pad_id.unwrap_or(0);
        opts.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok(opts)
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
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let opts = p.options()?;
    let filter = FilterParams {
        status: p.status.clone(),
        since: p.since.clone(),
        group: p.group.clone(),
        complete_groups: p.complete_groups,
        group_size: p.group_size,
    }
    .filter()?;
    let format = opts.format;
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let store = st.store.clone();
    let errors = tx.clone();
    tokio::task::spawn_blocking(move || {
        let writer = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK_BYTES),
        };
        let result = store
            .scan(&filter)
            .map_err(Into::into)
            .and_then(|it| run_export(it, &opts, writer, &mut |_| {}));
        if let Err(e) = result {
            tracing::warn!(error = %e, "export aborted");
            // Headers are gone already: an error item aborts the body, so
            // the client sees a broken transfer, never a silently short file.
            let _ = errors.blocking_send(Err(io::Error::other(e.to_string())));
        }
    });
    let disposition = format!(
        "attachment; filename=\"tito-export.{}\"",
        format.extension()
    );
    Ok((
        [
            (header::CONTENT_TYPE, format.content_type().to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        Body::from_stream(ReceiverStream::new(rx)),
    )
        .into_response())
}
