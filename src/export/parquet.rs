//! Parquet sink, written with the parquet crate's low-level column writers
//! (no Arrow: much less to compile), over the column table of
//! [`super::columns`]. Id, mask and position columns are `list<int32>`,
//! `rm_scores` `list<float>`, logprobs `list<float>` with optional elements
//! (null where no logprob exists), weight versions `list<string>` with
//! optional elements, per-token version numbers `list<int64>` with optional
//! elements (`rollout_versions`: required elements), `reward` an optional
//! double, strings and JSON UTF-8. Rows are buffered per column and flushed as a row
//! group every `row_group_rows` rows or `row_group_values` list values,
//! whichever comes first, so memory is bounded by one row group.

use std::io::Write;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::column::writer::ColumnWriter;
use parquet::data_type::ByteArray;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::ColumnPath;

use super::columns::{columns, Cell, ColumnDef, ImageField, Kind};
use super::{ExportError, ExportOptions, ExportRow, RowSink};

/// Buffered values (and levels) of one column of the current row group.
enum Buf {
    Str(Vec<ByteArray>),
    OptStr(Vec<ByteArray>, Vec<i16>),
    I32(Vec<i32>),
    OptI64(Vec<i64>, Vec<i16>),
    Bool(Vec<bool>),
    OptF64(Vec<f64>, Vec<i16>),
    /// list<int32>: values, definition levels, repetition levels.
    ListI32(Vec<i32>, Vec<i16>, Vec<i16>),
    ListF32(Vec<f32>, Vec<i16>, Vec<i16>),
    /// list<float> whose elements may be null (missing logprobs).
    ListOptF32(Vec<f32>, Vec<i16>, Vec<i16>),
    /// list<int64>, with optional (`ListOptI64`) or required elements.
    ListI64(Vec<i64>, Vec<i16>, Vec<i16>),
    ListOptStr(Vec<ByteArray>, Vec<i16>, Vec<i16>),
    /// list<list<int32>>: values, definition levels (0 empty outer list,
    /// 1 empty inner list, 2 a value), repetition levels (0 a new row, 1 a
    /// new inner list, 2 the same inner list).
    ListListI32(Vec<i32>, Vec<i16>, Vec<i16>),
    /// Optional list<int32>: definition level 0 null, 1 empty, 2 a value.
    OptListI32(Vec<i32>, Vec<i16>, Vec<i16>),
}

impl Buf {
    fn of(kind: Kind) -> Buf {
        match kind {
            Kind::Str => Buf::Str(Vec::new()),
            Kind::OptStr | Kind::Json | Kind::OptBytes => Buf::OptStr(Vec::new(), Vec::new()),
            Kind::I32 => Buf::I32(Vec::new()),
            Kind::OptI64 => Buf::OptI64(Vec::new(), Vec::new()),
            Kind::Bool => Buf::Bool(Vec::new()),
            Kind::OptF64 => Buf::OptF64(Vec::new(), Vec::new()),
            Kind::ListI32 => Buf::ListI32(Vec::new(), Vec::new(), Vec::new()),
            Kind::ListF32 => Buf::ListF32(Vec::new(), Vec::new(), Vec::new()),
            Kind::ListOptF32 => Buf::ListOptF32(Vec::new(), Vec::new(), Vec::new()),
            Kind::ListI64 | Kind::ListOptI64 => Buf::ListI64(Vec::new(), Vec::new(), Vec::new()),
            Kind::ListOptStr | Kind::ListOptBytes => {
                Buf::ListOptStr(Vec::new(), Vec::new(), Vec::new())
            }
            Kind::ListListI32 => Buf::ListListI32(Vec::new(), Vec::new(), Vec::new()),
            Kind::OptListI32 => Buf::OptListI32(Vec::new(), Vec::new(), Vec::new()),
        }
    }
}

struct Column {
    def: ColumnDef,
    buf: Buf,
}

fn schema_text(cols: &[Column]) -> String {
    let mut s = String::from("message tito_export {\n");
    for c in cols {
        let n = c.def.name;
        let list = |element: &str| {
            format!("REQUIRED group {n} (LIST) {{ REPEATED group list {{ {element}; }} }}")
        };
        let line = match c.def.kind {
            Kind::Str => format!("REQUIRED BYTE_ARRAY {n} (UTF8);"),
            Kind::OptStr | Kind::Json => format!("OPTIONAL BYTE_ARRAY {n} (UTF8);"),
            Kind::OptBytes => format!("OPTIONAL BYTE_ARRAY {n};"),
            Kind::OptListI32 => format!(
                "OPTIONAL group {n} (LIST) {{ REPEATED group list {{ REQUIRED INT32 element; }} }}"
            ),
            Kind::I32 => format!("REQUIRED INT32 {n};"),
            Kind::OptI64 => format!("OPTIONAL INT64 {n};"),
            Kind::Bool => format!("REQUIRED BOOLEAN {n};"),
            Kind::OptF64 => format!("OPTIONAL DOUBLE {n};"),
            Kind::ListI32 => list("REQUIRED INT32 element"),
            Kind::ListF32 => list("REQUIRED FLOAT element"),
            Kind::ListOptF32 => list("OPTIONAL FLOAT element"),
            Kind::ListI64 => list("REQUIRED INT64 element"),
            Kind::ListOptI64 => list("OPTIONAL INT64 element"),
            Kind::ListOptStr => list("OPTIONAL BYTE_ARRAY element (UTF8)"),
            Kind::ListOptBytes => list("OPTIONAL BYTE_ARRAY element"),
            Kind::ListListI32 => format!(
                "REQUIRED group {n} (LIST) {{ REPEATED group list {{ REQUIRED group element (LIST) \
                 {{ REPEATED group list {{ REQUIRED INT32 element; }} }} }} }}"
            ),
        };
        s.push_str("  ");
        s.push_str(&line);
        s.push('\n');
    }
    s.push('}');
    s
}

/// Appends the levels of one list of `n` elements: repetition level 0
/// starts the row, 1 continues it; an empty list is one level pair with
/// definition level 0 and no value.
fn push_levels(def: &mut Vec<i16>, rep: &mut Vec<i16>, n: usize) -> bool {
    rep.push(0);
    if n == 0 {
        def.push(0);
        return false;
    }
    rep.resize(rep.len() + n - 1, 1);
    true
}

/// Appends one list of REQUIRED elements (definition level 1 each).
fn push_required<T: Copy, U>(
    vals: &mut Vec<U>,
    def: &mut Vec<i16>,
    rep: &mut Vec<i16>,
    xs: &[T],
    f: impl Fn(T) -> U,
) -> usize {
    if push_levels(def, rep, xs.len()) {
        def.resize(def.len() + xs.len(), 1);
        vals.extend(xs.iter().map(|x| f(*x)));
    }
    xs.len()
}

/// Appends one list of OPTIONAL elements: definition level 2 where `f`
/// gives a value, 1 for a null element.
fn push_optional<T: Copy, U>(
    vals: &mut Vec<U>,
    def: &mut Vec<i16>,
    rep: &mut Vec<i16>,
    xs: &[T],
    f: impl Fn(T) -> Option<U>,
) -> usize {
    if push_levels(def, rep, xs.len()) {
        def.reserve(xs.len());
        for x in xs {
            match f(*x) {
                Some(v) => {
                    def.push(2);
                    vals.push(v);
                }
                None => def.push(1),
            }
        }
    }
    xs.len()
}

/// Appends one list of non-empty lists of REQUIRED int32 elements.
fn push_nested(
    vals: &mut Vec<i32>,
    def: &mut Vec<i16>,
    rep: &mut Vec<i16>,
    xs: &[&[u32]],
) -> usize {
    if xs.is_empty() {
        rep.push(0);
        def.push(0);
        return 0;
    }
    let mut n = 0;
    for (i, inner) in xs.iter().enumerate() {
        for (j, &x) in inner.iter().enumerate() {
            rep.push(match (i, j) {
                (0, 0) => 0,
                (_, 0) => 1,
                _ => 2,
            });
            def.push(2);
            vals.push(x as i32);
            n += 1;
        }
    }
    n
}

impl Column {
    /// Buffers one row's cell; returns the number of list values added.
    fn push(&mut self, row: &ExportRow) -> usize {
        let text = |s: &str| ByteArray::from(s.as_bytes().to_vec());
        match (&mut self.buf, (self.def.get)(row)) {
            (Buf::Str(v), Cell::Str(s)) => v.push(ByteArray::from(s.as_bytes().to_vec())),
            (Buf::OptStr(v, d), Cell::OptStr(s)) => match s {
                Some(s) => {
                    v.push(ByteArray::from(s.as_bytes().to_vec()));
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::OptStr(v, d), Cell::OptBytes(b)) => match b {
                Some(b) => {
                    v.push(ByteArray::from(b.to_vec()));
                    d.push(1);
                    // Counted as the f32 values they hold, so a row group
                    // of pixel values stays within `row_group_values`.
                    return b.len() / 4;
                }
                None => d.push(0),
            },
            (Buf::OptListI32(v, d, r), Cell::OptInts(xs)) => match xs {
                None => {
                    r.push(0);
                    d.push(0);
                }
                Some(xs) => {
                    if push_levels(d, r, xs.len()) {
                        d.resize(d.len() + xs.len(), 2);
                        v.extend(xs.iter().map(|&x| x as i32));
                    } else {
                        // An empty list: defined (1), unlike a null (0).
                        if let Some(last) = d.last_mut() {
                            *last = 1;
                        }
                    }
                    return xs.len();
                }
            },
            (Buf::OptStr(v, d), Cell::Json(j)) => match j {
                Some(j) => {
                    v.push(text(&j.to_string()));
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::I32(v), Cell::I32(x)) => v.push(x),
            (Buf::OptI64(v, d), Cell::OptI64(x)) => match x {
                Some(x) => {
                    v.push(x);
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::Bool(v), Cell::Bool(x)) => v.push(x),
            (Buf::OptF64(v, d), Cell::OptF64(x)) => match x {
                Some(x) => {
                    v.push(x);
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::ListI32(v, d, r), Cell::Ids(xs)) => {
                return push_required(v, d, r, xs, |x| x as i32)
            }
            (Buf::ListI32(v, d, r), Cell::Mask(xs)) => {
                return push_required(v, d, r, xs, i32::from)
            }
            (Buf::ListF32(v, d, r), Cell::Floats(xs)) => return push_required(v, d, r, xs, |x| x),
            (Buf::ListOptF32(v, d, r), Cell::OptFloats(xs)) => {
                return push_optional(v, d, r, xs, |x| x)
            }
            (Buf::ListI64(v, d, r), Cell::OptU64s(xs)) => {
                return push_optional(v, d, r, xs, |x| x.and_then(|x| i64::try_from(x).ok()))
            }
            (Buf::ListI64(v, d, r), Cell::I64s(xs)) => return push_required(v, d, r, xs, |x| x),
            (Buf::ListOptStr(v, d, r), Cell::OptStrs(xs)) => {
                let refs: Vec<Option<&str>> = xs.iter().map(Option::as_deref).collect();
                return push_optional(v, d, r, &refs, |x| x.map(text));
            }
            (Buf::ListOptStr(v, d, r), Cell::Images(images, field)) => {
                let refs: Vec<&super::RowImage> = images.iter().collect();
                return push_optional(v, d, r, &refs, |im| match field {
                    ImageField::Bytes => im.bytes.as_ref().map(|b| ByteArray::from(b.to_vec())),
                    ImageField::Sha256 => Some(text(&im.sha256)),
                    ImageField::Mime => Some(text(&im.mime)),
                    _ => None,
                });
            }
            (Buf::ListListI32(v, d, r), Cell::Images(images, field)) => {
                let lists: Vec<&[u32]> = images
                    .iter()
                    .map(|im| match field {
                        ImageField::Size => &im.size[..],
                        _ => &im.grid_thw[..],
                    })
                    .collect();
                return push_nested(v, d, r, &lists);
            }
            // `columns` pairs every getter with its buffer shape.
            _ => {}
        }
        0
    }

    fn write(&mut self, w: &mut ColumnWriter<'_>) -> Result<(), ExportError> {
        let mismatch =
            || ExportError::Options(format!("column `{}`: type mismatch", self.def.name));
        match (&mut self.buf, w) {
            (Buf::Str(v), ColumnWriter::ByteArrayColumnWriter(w)) => {
                w.write_batch(v, None, None)?;
                v.clear();
            }
            (Buf::OptStr(v, d), ColumnWriter::ByteArrayColumnWriter(w)) => {
                w.write_batch(v, Some(d), None)?;
                v.clear();
                d.clear();
            }
            (
                Buf::ListListI32(v, d, r) | Buf::OptListI32(v, d, r),
                ColumnWriter::Int32ColumnWriter(w),
            ) => {
                w.write_batch(v, Some(d), Some(r))?;
                v.clear();
                d.clear();
                r.clear();
            }
            (Buf::ListOptStr(v, d, r), ColumnWriter::ByteArrayColumnWriter(w)) => {
                w.write_batch(v, Some(d), Some(r))?;
                v.clear();
                d.clear();
                r.clear();
            }
            (Buf::OptI64(v, d), ColumnWriter::Int64ColumnWriter(w)) => {
                w.write_batch(v, Some(d), None)?;
                v.clear();
                d.clear();
            }
            (Buf::I32(v), ColumnWriter::Int32ColumnWriter(w)) => {
                w.write_batch(v, None, None)?;
                v.clear();
            }
            (Buf::Bool(v), ColumnWriter::BoolColumnWriter(w)) => {
                w.write_batch(v, None, None)?;
                v.clear();
            }
            (Buf::OptF64(v, d), ColumnWriter::DoubleColumnWriter(w)) => {
                w.write_batch(v, Some(d), None)?;
                v.clear();
                d.clear();
            }
            (Buf::ListI64(v, d, r), ColumnWriter::Int64ColumnWriter(w)) => {
                w.write_batch(v, Some(d), Some(r))?;
                v.clear();
                d.clear();
                r.clear();
            }
            (Buf::ListI32(v, d, r), ColumnWriter::Int32ColumnWriter(w)) => {
                w.write_batch(v, Some(d), Some(r))?;
                v.clear();
                d.clear();
                r.clear();
            }
            (
                Buf::ListF32(v, d, r) | Buf::ListOptF32(v, d, r),
                ColumnWriter::FloatColumnWriter(w),
            ) => {
                w.write_batch(v, Some(d), Some(r))?;
                v.clear();
                d.clear();
                r.clear();
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }
}

pub struct ParquetSink<W: Write + Send> {
    writer: Option<SerializedFileWriter<W>>,
    cols: Vec<Column>,
    rows: usize,
    values: usize,
    max_rows: usize,
    max_values: usize,
}

impl<W: Write + Send> ParquetSink<W> {
    pub fn new(out: W, opts: &ExportOptions) -> Result<Self, ExportError> {
        let cols: Vec<Column> = columns(opts)
            .into_iter()
            .map(|def| Column {
                buf: Buf::of(def.kind),
                def,
            })
            .collect();
        let schema = Arc::new(parse_message_type(&schema_text(&cols))?);
        // Token ids and logprobs hardly repeat: dictionary pages cost time and
        // are abandoned anyway, so only the string columns (ids, hashes,
        // finish reasons: very repetitive) use a dictionary.
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .set_created_by(format!("tito {}", env!("CARGO_PKG_VERSION")));
        for c in &cols {
            let name = c.def.name;
            let element =
                || ColumnPath::from(vec![name.to_string(), "list".into(), "element".into()]);
            match c.def.kind {
                Kind::Str | Kind::OptStr => {
                    props = props.set_column_dictionary_enabled(ColumnPath::from(name), true);
                }
                Kind::ListOptStr => {
                    props = props.set_column_dictionary_enabled(element(), true);
                }
                // Min/max of megabytes of pixel values serve no reader either.
                Kind::OptBytes => {
                    props = props.set_column_statistics_enabled(
                        ColumnPath::from(name),
                        EnabledStatistics::None,
                    );
                }
                // Min/max of token ids or logprobs serve no reader.
                Kind::ListI32 | Kind::ListF32 | Kind::ListOptF32 => {
                    props = props.set_column_statistics_enabled(element(), EnabledStatistics::None);
                }
                _ => {}
            }
        }
        let props = props.build();
        Ok(ParquetSink {
            writer: Some(SerializedFileWriter::new(out, schema, Arc::new(props))?),
            cols,
            rows: 0,
            values: 0,
            max_rows: opts.row_group_rows.max(1),
            max_values: opts.row_group_values.max(1),
        })
    }

    fn flush_group(&mut self) -> Result<(), ExportError> {
        if self.rows == 0 {
            return Ok(());
        }
        let writer = self.writer.as_mut().ok_or_else(closed)?;
        let mut group = writer.next_row_group()?;
        for col in &mut self.cols {
            let mut cw = group.next_column()?.ok_or_else(|| {
                ExportError::Options(format!("no column writer for `{}`", col.def.name))
            })?;
            col.write(cw.untyped())?;
            cw.close()?;
        }
        group.close()?;
        self.rows = 0;
        self.values = 0;
        Ok(())
    }
}

fn closed() -> ExportError {
    ExportError::Options("parquet sink already finished".into())
}

impl<W: Write + Send> RowSink for ParquetSink<W> {
    fn write_row(&mut self, row: &ExportRow) -> Result<(), ExportError> {
        for col in &mut self.cols {
            self.values += col.push(row);
        }
        self.rows += 1;
        if self.rows >= self.max_rows || self.values >= self.max_values {
            self.flush_group()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ExportError> {
        self.flush_group()?;
        let writer = self.writer.take().ok_or_else(closed)?;
        let mut out = writer.into_inner()?;
        out.flush()?;
        Ok(())
    }
}
