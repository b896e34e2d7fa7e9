//! Parquet sink, written with the parquet crate's low-level column writers
//! (no Arrow: much less to compile). Id, mask and position columns are
//! `list<int32>`, `rm_scores` `list<float>`, `response_logprobs` `list<float>`
//! with optional elements (null where no logprob exists), `reward` an optional
//! double, strings UTF-8. Rows are buffered per column and flushed as a row
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

use super::{ExportError, ExportOptions, ExportRow, Layout, RowSink};

/// The value of one row in one column.
enum Cell<'a> {
    Str(&'a str),
    OptStr(Option<&'a str>),
    I32(i32),
    Bool(bool),
    OptF64(Option<f64>),
    Ids(&'a [u32]),
    Mask(&'a [u8]),
    Floats(&'a [f32]),
    OptFloats(&'a [Option<f32>]),
}

/// Physical shape of a column and its buffered values / levels.
enum Buf {
    Str(Vec<ByteArray>),
    OptStr(Vec<ByteArray>, Vec<i16>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
    OptF64(Vec<f64>, Vec<i16>),
    /// list<int32>: values, definition levels, repetition levels.
    ListI32(Vec<i32>, Vec<i16>, Vec<i16>),
    ListF32(Vec<f32>, Vec<i16>, Vec<i16>),
    /// list<float> whose elements may be null (missing logprobs).
    ListOptF32(Vec<f32>, Vec<i16>, Vec<i16>),
}

type Getter = for<'a> fn(&'a ExportRow) -> Cell<'a>;

struct Column {
    name: &'static str,
    get: Getter,
    buf: Buf,
}

fn verl_or_empty<T>(row: &ExportRow, f: impl Fn(&super::VerlColumns) -> &[T]) -> &[T] {
    row.verl.as_ref().map(f).unwrap_or(&[])
}

/// Columns of a layout, in file order.
fn columns(layout: Layout) -> Vec<Column> {
    let col = |name, get: Getter, buf| Column { name, get, buf };
    let list_i32 = || Buf::ListI32(Vec::new(), Vec::new(), Vec::new());
    let list_f32 = || Buf::ListF32(Vec::new(), Vec::new(), Vec::new());
    let mut cols = vec![
        col(
            "trajectory_id",
            |r| Cell::Str(&r.trajectory_id),
            Buf::Str(Vec::new()),
        ),
        col(
            "sample",
            |r| Cell::I32(r.sample as i32),
            Buf::I32(Vec::new()),
        ),
    ];
    if layout == Layout::PerCall {
        cols.push(col(
            "call",
            |r| Cell::I32(r.call.unwrap_or(0) as i32),
            Buf::I32(Vec::new()),
        ));
    }
    cols.extend([
        col("prompt_ids", |r| Cell::Ids(&r.prompt_ids), list_i32()),
        col("response_ids", |r| Cell::Ids(&r.response_ids), list_i32()),
        col(
            "response_mask",
            |r| Cell::Mask(&r.response_mask),
            list_i32(),
        ),
        col(
            "response_logprobs",
            |r| Cell::OptFloats(&r.response_logprobs),
            Buf::ListOptF32(Vec::new(), Vec::new(), Vec::new()),
        ),
        col(
            "reward",
            |r| Cell::OptF64(r.reward),
            Buf::OptF64(Vec::new(), Vec::new()),
        ),
        col(
            "num_turns",
            |r| Cell::I32(r.num_turns as i32),
            Buf::I32(Vec::new()),
        ),
        col(
            "weight_version",
            |r| Cell::OptStr(r.weight_version.as_deref()),
            Buf::OptStr(Vec::new(), Vec::new()),
        ),
        col(
            "tokenizer_sha256",
            |r| Cell::Str(&r.tokenizer_sha256),
            Buf::Str(Vec::new()),
        ),
        col(
            "template_sha256",
            |r| Cell::Str(&r.template_sha256),
            Buf::Str(Vec::new()),
        ),
        col(
            "finish_reason",
            |r| Cell::Str(&r.finish_reason),
            Buf::Str(Vec::new()),
        ),
        col(
            "truncated",
            |r| Cell::Bool(r.truncated),
            Buf::Bool(Vec::new()),
        ),
        col(
            "incomplete",
            |r| Cell::Bool(r.incomplete),
            Buf::Bool(Vec::new()),
        ),
    ]);
    if layout == Layout::Verl {
        cols.extend([
            col(
                "input_ids",
                |r| Cell::Ids(verl_or_empty(r, |v| &v.input_ids)),
                list_i32(),
            ),
            col(
                "attention_mask",
                |r| Cell::Mask(verl_or_empty(r, |v| &v.attention_mask)),
                list_i32(),
            ),
            col(
                "position_ids",
                |r| Cell::Ids(verl_or_empty(r, |v| &v.position_ids)),
                list_i32(),
            ),
            col(
                "rm_scores",
                |r| Cell::Floats(verl_or_empty(r, |v| &v.rm_scores)),
                list_f32(),
            ),
        ]);
    }
    cols
}

fn schema_text(cols: &[Column]) -> String {
    let mut s = String::from("message tito_export {\n");
    for c in cols {
        let n = c.name;
        let line = match c.buf {
            Buf::Str(_) => format!("REQUIRED BYTE_ARRAY {n} (UTF8);"),
            Buf::OptStr(..) => format!("OPTIONAL BYTE_ARRAY {n} (UTF8);"),
            Buf::I32(_) => format!("REQUIRED INT32 {n};"),
            Buf::Bool(_) => format!("REQUIRED BOOLEAN {n};"),
            Buf::OptF64(..) => format!("OPTIONAL DOUBLE {n};"),
            Buf::ListI32(..) => {
                format!("REQUIRED group {n} (LIST) {{ REPEATED group list {{ REQUIRED INT32 element; }} }}")
            }
            Buf::ListF32(..) => {
                format!("REQUIRED group {n} (LIST) {{ REPEATED group list {{ REQUIRED FLOAT element; }} }}")
            }
            Buf::ListOptF32(..) => {
                format!("REQUIRED group {n} (LIST) {{ REPEATED group list {{ OPTIONAL FLOAT element; }} }}")
            }
        };
        s.push_str("  ");
        s.push_str(&line);
        s.push('\n');
    }
    s.push('}');
    s
}

/// Appends one list to (values, def, rep). Definition levels: 0 for an
/// empty list (one level pair, no value); for an element, `full` when `f`
/// gives a value and one less when it gives none (a null element of a list
/// of OPTIONAL elements, max level 2; REQUIRED elements, max level 1, always
/// have a value). Repetition level 0 starts the row.
fn push_list<T: Copy, U>(
    vals: &mut Vec<U>,
    def: &mut Vec<i16>,
    rep: &mut Vec<i16>,
    xs: &[T],
    full: i16,
    f: impl Fn(T) -> Option<U>,
) -> usize {
    if xs.is_empty() {
        def.push(0);
        rep.push(0);
        return 0;
    }
    for (i, x) in xs.iter().enumerate() {
        rep.push(i16::from(i > 0));
        match f(*x) {
            Some(v) => {
                def.push(full);
                vals.push(v);
            }
            None => def.push(full - 1),
        }
    }
    xs.len()
}

impl Column {
    /// Buffers one row's cell; returns the number of list values added.
    fn push(&mut self, row: &ExportRow) -> usize {
        match (&mut self.buf, (self.get)(row)) {
            (Buf::Str(v), Cell::Str(s)) => v.push(ByteArray::from(s.as_bytes().to_vec())),
            (Buf::OptStr(v, d), Cell::OptStr(s)) => match s {
                Some(s) => {
                    v.push(ByteArray::from(s.as_bytes().to_vec()));
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::I32(v), Cell::I32(x)) => v.push(x),
            (Buf::Bool(v), Cell::Bool(x)) => v.push(x),
            (Buf::OptF64(v, d), Cell::OptF64(x)) => match x {
                Some(x) => {
                    v.push(x);
                    d.push(1);
                }
                None => d.push(0),
            },
            (Buf::ListI32(v, d, r), Cell::Ids(xs)) => {
                return push_list(v, d, r, xs, 1, |x| Some(x as i32))
            }
            (Buf::ListI32(v, d, r), Cell::Mask(xs)) => {
                return push_list(v, d, r, xs, 1, |x| Some(i32::from(x)))
            }
            (Buf::ListF32(v, d, r), Cell::Floats(xs)) => return push_list(v, d, r, xs, 1, Some),
            (Buf::ListOptF32(v, d, r), Cell::OptFloats(xs)) => {
                return push_list(v, d, r, xs, 2, |x| x)
            }
            // `columns` pairs every getter with its buffer shape.
            _ => {}
        }
        0
    }

    fn write(&mut self, w: &mut ColumnWriter<'_>) -> Result<(), ExportError> {
        let mismatch = || ExportError::Options(format!("column `{}`: type mismatch", self.name));
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
        let cols = columns(opts.layout);
        let schema = Arc::new(parse_message_type(&schema_text(&cols))?);
        // Token ids and logprobs hardly repeat: dictionary pages cost time and
        // are abandoned anyway, so only the string columns (ids, hashes,
        // finish reasons: very repetitive) use a dictionary.
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_dictionary_enabled(false)
            .set_created_by(format!("tito {}", env!("CARGO_PKG_VERSION")));
        for c in &cols {
            match c.buf {
                Buf::Str(_) | Buf::OptStr(..) => {
                    props = props.set_column_dictionary_enabled(ColumnPath::from(c.name), true);
                }
                // Min/max of token ids or logprobs serve no reader.
                Buf::ListI32(..) | Buf::ListF32(..) | Buf::ListOptF32(..) => {
                    let path =
                        ColumnPath::from(vec![c.name.to_string(), "list".into(), "element".into()]);
                    props = props.set_column_statistics_enabled(path, EnabledStatistics::None);
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
                ExportError::Options(format!("no column writer for `{}`", col.name))
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
