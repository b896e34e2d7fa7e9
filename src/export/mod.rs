//! Export of stored trajectories as training rows, to any `std::io::Write`,
//! incrementally: rows are produced one trajectory at a time and written
//! (JSONL: at once; Parquet: a row group every N rows or M values), so memory
//! stays bounded by one trajectory plus one row group, whatever the store
//! size. The HTTP export streams through the same code.
//!
//! Owns layouts ([`rows`]), formats ([`jsonl`], [`parquet`]) and the driver
//! [`export`]. It reads trajectories from an iterator and must not touch the
//! store's internals or HTTP.

pub mod columns;
pub mod jsonl;
pub mod parquet;
pub mod rows;

use std::io::Write;

use serde::{Deserialize, Serialize};

pub use rows::{version_cmp, ExportRow, PixelValues, RowImage, VerlColumns};

/// The export schema this build writes, sent as `X-Export-Schema-Version`
/// by `GET /v1/export`. It changes when a column of any layout is removed,
/// renamed or changes type; a column added beside the others keeps it, so
/// a reader of this version reads every later export of it.
pub const EXPORT_SCHEMA_VERSION: &str = "1";

/// Largest `prompt_length` / `response_length` an export accepts.
pub const MAX_LENGTH: usize = 131_072;

use crate::store::{StoreError, Trajectory};

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// An export option out of range; `param` names it as the HTTP query
    /// parameter / CLI flag spells it.
    #[error("{message}")]
    Param {
        param: &'static str,
        message: String,
    },
    #[error("{0}")]
    Options(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("export i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("parquet: {0}")]
    Parquet(#[from] ::parquet::errors::ParquetError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Jsonl,
    Parquet,
}

impl Format {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "jsonl" => Some(Format::Jsonl),
            "parquet" => Some(Format::Parquet),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Jsonl => "application/x-ndjson",
            Format::Parquet => "application/vnd.apache.parquet",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Jsonl => "jsonl",
            Format::Parquet => "parquet",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layout {
    /// One row per sample (root-to-leaf path of calls).
    Trajectory,
    /// One row per call: full prompt, sampled ids (mask all 1).
    PerCall,
    /// One row per sample, padded for verl; needs both lengths.
    Verl,
}

impl Layout {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "trajectory" => Some(Layout::Trajectory),
            "per_call" => Some(Layout::PerCall),
            "verl" => Some(Layout::Verl),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    pub format: Format,
    pub layout: Layout,
    /// Rows with longer prompts are skipped (and counted).
    pub prompt_length: Option<usize>,
    /// Longer responses are cut on the right and marked `truncated`.
    pub response_length: Option<usize>,
    /// Padding id of the verl layout (the tokenizer's pad token, else its
    /// EOS, unless the caller overrides it).
    pub pad_id: u32,
    /// Parquet: rows per row group at most.
    pub row_group_rows: usize,
    /// Parquet: list values (all columns) buffered before a row group is
    /// flushed, whatever the row count; bounds memory for long samples.
    pub row_group_values: usize,
    /// Rows left out by the weights that sampled them.
    pub versions: VersionFilter,
    /// Whether image bytes go in the rows (`inline`) or only their hashes
    /// (`ref`: a trainer reads `GET /v1/images/{sha256}`).
    pub images: ImagesMode,
    /// `?pixel_values=true`: each row's images' pixel values, computed with
    /// this processor config (the model's).
    pub pixel_values: Option<crate::render::pixel_values::PixelConfig>,
    /// `?model=` / `?adapter=`: only this policy's rows, its mask 1 only on
    /// the tokens it sampled.
    pub policy: Option<crate::store::Policy>,
}

/// `?images=`: image bytes in each row, or by reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ImagesMode {
    #[default]
    Inline,
    Ref,
}

impl ImagesMode {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "inline" => Some(Self::Inline),
            "ref" => Some(Self::Ref),
            _ => None,
        }
    }
}

/// Which rows an export keeps by their `min_version` (the oldest weights
/// that sampled a token the row keeps): `min_version_seq = N` keeps rows
/// with `min_version >= N`; `max_staleness = N` keeps rows with
/// `newest - min_version <= N`, `newest` being the newest version the store
/// has registered. With either set, a row without a known version is left
/// out; with `max_staleness` and no version registered, no row is too
/// stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VersionFilter {
    pub min_version_seq: Option<u64>,
    pub max_staleness: Option<u64>,
    /// The store's newest registered version
    /// ([`SpanStore::versions`](crate::store::SpanStore::versions)).
    pub newest: Option<u64>,
}

impl VersionFilter {
    /// No filter asked for.
    pub fn is_off(&self) -> bool {
        self.min_version_seq.is_none() && self.max_staleness.is_none()
    }

    /// Whether a row whose `min_version` is `min_version` is kept.
    pub fn keeps(&self, min_version: Option<u64>) -> bool {
        if self.is_off() {
            return true;
        }
        let Some(v) = min_version else {
            return false;
        };
        let fresh = match (self.max_staleness, self.newest) {
            (Some(n), Some(newest)) => newest.saturating_sub(v) <= n,
            _ => true,
        };
        fresh && self.min_version_seq.is_none_or(|n| v >= n)
    }
}

impl ExportOptions {
    pub fn new(format: Format, layout: Layout) -> Self {
        ExportOptions {
            format,
            layout,
            prompt_length: None,
            response_length: None,
            pad_id: 0,
            row_group_rows: 1024,
            row_group_values: 4 << 20,
            versions: VersionFilter::default(),
            images: ImagesMode::Inline,
            pixel_values: None,
            policy: None,
        }
    }

    pub fn validate(&self) -> Result<(), ExportError> {
        let param = |param, message: String| Err(ExportError::Param { param, message });
        if self.layout == Layout::Verl {
            for (name, len) in [
                ("prompt_length", self.prompt_length),
                ("response_length", self.response_length),
            ] {
                if len.is_none() {
                    return param(
                        name,
                        "layout=verl needs prompt_length and response_length".into(),
                    );
                }
            }
        }
        for (name, len) in [
            ("prompt_length", self.prompt_length),
            ("response_length", self.response_length),
        ] {
            match len {
                Some(0) => return param(name, format!("{name} must be positive")),
                Some(n) if n > MAX_LENGTH => {
                    return param(
                        name,
                        format!("{name} = {n} is above the limit of {MAX_LENGTH} tokens"),
                    )
                }
                _ => {}
            }
        }
        if let Some(p) = &self.policy {
            let names = [("model", &p.model), ("adapter", &p.adapter)];
            for (name, value) in names {
                let Some(v) = value else { continue };
                let max = crate::store::CallRecord::MAX_POLICY_NAME;
                if v.is_empty() || v.len() > max || v.chars().any(char::is_control) {
                    return param(
                        name,
                        format!("{name} must be a served id of 1 to {max} bytes without control characters"),
                    );
                }
            }
        }
        if self.row_group_rows == 0 || self.row_group_values == 0 {
            return Err(ExportError::Options(
                "row group limits must be positive".into(),
            ));
        }
        Ok(())
    }
}

/// Counters of one export run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ExportStats {
    pub trajectories: u64,
    pub rows: u64,
    /// Prompt + response ids written (padding included in verl).
    pub tokens: u64,
    pub skipped_long_prompt: u64,
    /// Rows left out by `min_version_seq` / `max_staleness`.
    pub skipped_version: u64,
    pub truncated_responses: u64,
}

/// Where rows go.
pub trait RowSink {
    fn write_row(&mut self, row: &ExportRow) -> Result<(), ExportError>;
    /// Flushes buffered rows and writes any footer.
    fn finish(&mut self) -> Result<(), ExportError>;
}

/// A sink for `opts.format` writing to `out`.
pub fn sink<'w, W: Write + Send + 'w>(
    opts: &ExportOptions,
    out: W,
) -> Result<Box<dyn RowSink + 'w>, ExportError> {
    Ok(match opts.format {
        Format::Jsonl => Box::new(jsonl::JsonlSink::new(out, opts)),
        Format::Parquet => Box::new(parquet::ParquetSink::new(out, opts)?),
    })
}

/// Writes the rows of every trajectory to `out` in `opts.format`, calling
/// `progress` after each trajectory; image bytes (`ImagesMode::Inline`)
/// are read from `images`, once per trajectory each. Blocking.
pub fn export<W: Write + Send>(
    trajectories: impl Iterator<Item = Result<Trajectory, StoreError>>,
    images: &dyn crate::store::SpanStore,
    opts: &ExportOptions,
    out: W,
    progress: &mut dyn FnMut(&ExportStats),
) -> Result<ExportStats, ExportError> {
    opts.validate()?;
    let mut sink = sink(opts, out)?;
    let mut stats = ExportStats::default();
    let mut rows = Vec::new();
    let mut bytes = std::collections::HashMap::new();
    for trajectory in trajectories {
        let trajectory = trajectory?;
        rows::rows_of(&trajectory, opts, &mut stats, &mut rows)?;
        bytes.clear();
        for mut row in rows.drain(..) {
            if opts.images == ImagesMode::Inline || opts.pixel_values.is_some() {
                for im in &mut row.images {
                    im.bytes = Some(image_bytes(images, &mut bytes, &im.sha256)?);
                }
            }
            if let Some(cfg) = &opts.pixel_values {
                row.pixel_values = pixel_values(cfg, &row);
            }
            if opts.images == ImagesMode::Ref {
                for im in &mut row.images {
                    im.bytes = None;
                }
            }
            sink.write_row(&row)?;
        }
        stats.trajectories += 1;
        progress(&stats);
    }
    sink.finish()?;
    Ok(stats)
}

/// The pixel values of a row's images (their bytes read), concatenated;
/// `None` for a row without images, or when one image has none (logged).
/// An image listed twice is computed once.
fn pixel_values(
    cfg: &crate::render::pixel_values::PixelConfig,
    row: &ExportRow,
) -> Option<PixelValues> {
    if row.images.is_empty() {
        return None;
    }
    let mut out: Vec<u8> = Vec::new();
    let mut done: std::collections::HashMap<&str, std::ops::Range<usize>> = Default::default();
    let mut patches = 0usize;
    for im in &row.images {
        if let Some(r) = done.get(im.sha256.as_str()) {
            out.extend_from_within(r.clone());
            patches += (r.end - r.start) / (4 * cfg.dim());
            continue;
        }
        let bytes = im.bytes.as_ref()?;
        let thw = im.grid_thw.map(u64::from);
        let p = match cfg.compute(bytes, &im.mime, thw) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(trajectory = %row.trajectory_id, sample = row.sample,
                    image = %im.sha256, error = %e, "export: no pixel values for this row");
                return None;
            }
        };
        let start = out.len();
        out.reserve(p.values.len() * 4);
        for v in &p.values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        patches += p.values.len() / p.dim.max(1);
        done.insert(&im.sha256, start..out.len());
    }
    Some(PixelValues {
        bytes: out,
        shape: [u32::try_from(patches).ok()?, u32::try_from(cfg.dim()).ok()?],
    })
}

/// The bytes of image `sha`, from `cache` or the store.
fn image_bytes(
    store: &dyn crate::store::SpanStore,
    cache: &mut std::collections::HashMap<String, std::sync::Arc<Vec<u8>>>,
    sha: &str,
) -> Result<std::sync::Arc<Vec<u8>>, ExportError> {
    if let Some(b) = cache.get(sha) {
        return Ok(b.clone());
    }
    let image = store.image_blocking(sha)?.ok_or_else(|| {
        ExportError::Store(StoreError::Invalid(format!(
            "image {sha} is named by a call but not stored"
        )))
    })?;
    cache.insert(sha.to_string(), image.bytes.clone());
    Ok(image.bytes)
}

/// Offline export of a store to a file: writes `PATH.partial`, then renames
/// it to `path` on success, so a failed run never leaves a plausible file.
/// `progress(done_trajectories, stats)`; the total is
/// [`SpanStore::count`](crate::store::SpanStore::count) of the same filter.
pub fn to_file(
    store: &dyn crate::store::SpanStore,
    filter: &crate::store::TrajectoryFilter,
    opts: &ExportOptions,
    path: &std::path::Path,
    progress: &mut dyn FnMut(&ExportStats),
) -> Result<ExportStats, ExportError> {
    opts.validate()?;
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let file = std::fs::File::create(&partial)?;
    let result = export(
        store.scan(filter)?,
        store,
        opts,
        std::io::BufWriter::with_capacity(1 << 20, file),
        progress,
    );
    match result {
        Ok(stats) => {
            std::fs::rename(&partial, path)?;
            Ok(stats)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            Err(e)
        }
    }
}
