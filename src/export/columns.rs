//! The columns of each layout, in file order: one table that both encoders
//! ([`super::jsonl`], [`super::parquet`]) walk, so a column has the same
//! name and value in JSONL and Parquet.
//!
//! `trajectory` / `per_call` use tito's names (`prompt_ids`, `response_ids`,
//! `response_logprobs`, ...). `verl` uses the keys of verl's `DataProto` as its
//! agent loop produces them: tensors `prompts`, `responses`, `response_mask`,
//! `input_ids`, `attention_mask`, `position_ids`, `rollout_log_probs`,
//! `rm_scores`; non-tensor `uid`, `data_source`, `index`, `extra_info`,
//! `reward_extra_info`, `__num_turns__`; then tito's provenance columns.

use super::{ExportRow, Layout};

/// One row's value in one column.
pub enum Cell<'a> {
    Str(&'a str),
    OptStr(Option<&'a str>),
    I32(i32),
    OptI64(Option<i64>),
    Bool(bool),
    OptF64(Option<f64>),
    Ids(&'a [u32]),
    Mask(&'a [u8]),
    Floats(&'a [f32]),
    OptFloats(&'a [Option<f32>]),
    OptU64s(&'a [Option<u64>]),
    I64s(&'a [i64]),
    OptStrs(&'a [Option<String>]),
    /// JSON in JSONL, its text in Parquet.
    Json(Option<&'a serde_json::Value>),
    /// A row's images, read by [`ImageField`].
    Images(&'a [super::RowImage], ImageField),
    /// Raw bytes or null (base64 in JSONL).
    OptBytes(Option<&'a [u8]>),
    /// A list of ints or null.
    OptInts(Option<&'a [u32]>),
}

/// Which field of a row's images a column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageField {
    /// The encoded bytes (base64 in JSONL; null by reference).
    Bytes,
    Sha256,
    Mime,
    /// `[width, height]`.
    Size,
    /// `[t, h, w]`.
    GridThw,
}

/// Physical type of a column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Str,
    OptStr,
    I32,
    OptI64,
    Bool,
    OptF64,
    /// list<int32> (ids, masks, positions).
    ListI32,
    /// list<float>, no nulls.
    ListF32,
    /// list<float> with optional elements (missing logprobs).
    ListOptF32,
    /// list<int64> with optional elements (per-token versions).
    ListOptI64,
    /// list<int64>, no nulls (verl's `rollout_versions`).
    ListI64,
    /// list<string> with optional elements (weight versions).
    ListOptStr,
    /// list<binary> with optional elements (image bytes).
    ListOptBytes,
    /// list<list<int32>> (image sizes and grids).
    ListListI32,
    /// Optional UTF-8 JSON text.
    Json,
    /// Optional binary (`pixel_values`).
    OptBytes,
    /// Optional list<int32> (`pixel_values_shape`).
    OptListI32,
}

pub type Getter = for<'a> fn(&'a ExportRow) -> Cell<'a>;

pub struct ColumnDef {
    pub name: &'static str,
    pub kind: Kind,
    pub get: Getter,
}

fn col(name: &'static str, kind: Kind, get: Getter) -> ColumnDef {
    ColumnDef { name, kind, get }
}

/// A version's sequence number as the signed column it is written to.
fn seq(v: Option<u64>) -> Option<i64> {
    v.and_then(|v| i64::try_from(v).ok())
}

fn verl<T>(row: &ExportRow, f: impl Fn(&super::VerlColumns) -> &[T]) -> &[T] {
    row.verl.as_ref().map(f).unwrap_or(&[])
}

/// The image columns, shared by every layout: parallel lists, one element
/// per image. In verl's terms `images` is `multi_modal_data["images"]` and
/// `image_grid_thw` is `multi_modal_inputs["image_grid_thw"]`.
fn images() -> Vec<ColumnDef> {
    use Kind::*;
    vec![
        col("images", ListOptBytes, |r| {
            Cell::Images(&r.images, ImageField::Bytes)
        }),
        col("image_sha256", ListOptStr, |r| {
            Cell::Images(&r.images, ImageField::Sha256)
        }),
        col("image_mime", ListOptStr, |r| {
            Cell::Images(&r.images, ImageField::Mime)
        }),
        col("image_sizes", ListListI32, |r| {
            Cell::Images(&r.images, ImageField::Size)
        }),
        col("image_grid_thw", ListListI32, |r| {
            Cell::Images(&r.images, ImageField::GridThw)
        }),
    ]
}

/// `?pixel_values=true`'s columns, after the image columns: in verl's terms
/// `pixel_values` is `multi_modal_inputs["pixel_values"]` (the `[patches,
/// dim]` f32 matrix, little-endian) and `pixel_values_shape` its shape.
fn pixel_values() -> Vec<ColumnDef> {
    use Kind::*;
    vec![
        col("pixel_values", OptBytes, |r| {
            Cell::OptBytes(r.pixel_values.as_ref().map(|p| &p.bytes[..]))
        }),
        col("pixel_values_shape", OptListI32, |r| {
            Cell::OptInts(r.pixel_values.as_ref().map(|p| &p.shape[..]))
        }),
    ]
}

/// Columns describing where a row came from, shared by every layout.
fn provenance() -> Vec<ColumnDef> {
    use Kind::*;
    vec![
        col("weight_version", OptStr, |r| {
            Cell::OptStr(r.weight_version.as_deref())
        }),
        col("weight_versions", ListOptStr, |r| {
            Cell::OptStrs(&r.weight_versions)
        }),
        col("call_offsets", ListI32, |r| Cell::Ids(&r.call_offsets)),
        col("min_weight_version", OptStr, |r| {
            Cell::OptStr(r.min_weight_version.as_deref())
        }),
        col("max_weight_version", OptStr, |r| {
            Cell::OptStr(r.max_weight_version.as_deref())
        }),
        col("min_version", OptI64, |r| Cell::OptI64(seq(r.min_version))),
        col("max_version", OptI64, |r| Cell::OptI64(seq(r.max_version))),
        col("tokenizer_sha256", Str, |r| Cell::Str(&r.tokenizer_sha256)),
        col("template_sha256", Str, |r| Cell::Str(&r.template_sha256)),
        col("finish_reason", Str, |r| Cell::Str(&r.finish_reason)),
        col("truncated", Bool, |r| Cell::Bool(r.truncated)),
        col("incomplete", Bool, |r| Cell::Bool(r.incomplete)),
        col("replay_max_abs_diff", OptF64, |r| {
            Cell::OptF64(r.replay_max_abs_diff)
        }),
        col("replay_mean_abs_diff", OptF64, |r| {
            Cell::OptF64(r.replay_mean_abs_diff)
        }),
        col("model", OptStr, |r| Cell::OptStr(r.model.as_deref())),
        col("adapter", OptStr, |r| Cell::OptStr(r.adapter.as_deref())),
    ]
}

/// The columns of an export, in file order: the layout's, and the
/// `pixel_values` ones when asked for.
pub fn columns(opts: &super::ExportOptions) -> Vec<ColumnDef> {
    let mut cols = layout_columns(opts.layout);
    if opts.pixel_values.is_some() {
        let at = cols
            .iter()
            .position(|c| c.name == "image_grid_thw")
            .map_or(cols.len(), |i| i + 1);
        cols.splice(at..at, pixel_values());
    }
    cols
}

/// The columns of a layout, in file order.
fn layout_columns(layout: Layout) -> Vec<ColumnDef> {
    use Kind::*;
    let mut cols = Vec::new();
    if layout == Layout::Verl {
        cols.extend([
            col("prompts", ListI32, |r| Cell::Ids(&r.prompt_ids)),
            col("responses", ListI32, |r| Cell::Ids(&r.response_ids)),
            col("response_mask", ListI32, |r| Cell::Mask(&r.response_mask)),
            col("input_ids", ListI32, |r| {
                Cell::Ids(verl(r, |v| &v.input_ids))
            }),
            col("attention_mask", ListI32, |r| {
                Cell::Mask(verl(r, |v| &v.attention_mask))
            }),
            col("position_ids", ListI32, |r| {
                Cell::Ids(verl(r, |v| &v.position_ids))
            }),
            col("rollout_log_probs", ListOptF32, |r| {
                Cell::OptFloats(&r.response_logprobs)
            }),
            col("rollout_versions", ListI64, |r| {
                Cell::I64s(verl(r, |v| &v.rollout_versions))
            }),
            col("rm_scores", ListF32, |r| {
                Cell::Floats(verl(r, |v| &v.rm_scores))
            }),
            col("uid", Str, |r| Cell::Str(r.uid())),
            col("data_source", OptStr, |r| {
                Cell::OptStr(r.data_source.as_deref())
            }),
            col("index", OptI64, |r| Cell::OptI64(r.index)),
            col("extra_info", Json, |r| Cell::Json(r.extra_info.as_ref())),
            col("reward_extra_info", Json, |r| {
                Cell::Json(r.reward_extra_info.as_ref())
            }),
            col("__num_turns__", I32, |r| Cell::I32(r.num_turns as i32)),
            col("trajectory_id", Str, |r| Cell::Str(&r.trajectory_id)),
            col("sample", I32, |r| Cell::I32(r.sample as i32)),
            col("reward", OptF64, |r| Cell::OptF64(r.reward)),
        ]);
        cols.extend(images());
        cols.extend(provenance());
        return cols;
    }
    cols.extend([
        col("trajectory_id", Str, |r| Cell::Str(&r.trajectory_id)),
        col("sample", I32, |r| Cell::I32(r.sample as i32)),
    ]);
    if layout == Layout::PerCall {
        cols.push(col("call", I32, |r| Cell::I32(r.call.unwrap_or(0) as i32)));
    }
    cols.extend([
        col("prompt_ids", ListI32, |r| Cell::Ids(&r.prompt_ids)),
        col("response_ids", ListI32, |r| Cell::Ids(&r.response_ids)),
        col("response_mask", ListI32, |r| Cell::Mask(&r.response_mask)),
        col("response_logprobs", ListOptF32, |r| {
            Cell::OptFloats(&r.response_logprobs)
        }),
        col("response_versions", ListOptI64, |r| {
            Cell::OptU64s(&r.response_versions)
        }),
        col("reward", OptF64, |r| Cell::OptF64(r.reward)),
        col("reward_extra_info", Json, |r| {
            Cell::Json(r.reward_extra_info.as_ref())
        }),
        col("num_turns", I32, |r| Cell::I32(r.num_turns as i32)),
        col("group", OptStr, |r| Cell::OptStr(r.group.as_deref())),
        col("data_source", OptStr, |r| {
            Cell::OptStr(r.data_source.as_deref())
        }),
        col("index", OptI64, |r| Cell::OptI64(r.index)),
        col("extra_info", Json, |r| Cell::Json(r.extra_info.as_ref())),
    ]);
    cols.extend(images());
    cols.extend(provenance());
    cols
}
