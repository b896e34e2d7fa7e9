//! JSONL sink: one JSON object per row and line, written as it comes, with
//! the columns (names, order, values) of [`super::columns`].

use std::io::Write;

use super::columns::{columns, Cell, ColumnDef, ImageField};
use super::{ExportError, ExportOptions, ExportRow, RowSink};

pub struct JsonlSink<W: Write> {
    out: W,
    cols: Vec<ColumnDef>,
}

impl<W: Write> JsonlSink<W> {
    pub fn new(out: W, opts: &ExportOptions) -> Self {
        JsonlSink {
            out,
            cols: columns(opts),
        }
    }
}

fn write_cell(out: &mut impl Write, cell: Cell<'_>) -> Result<(), ExportError> {
    match cell {
        Cell::Str(s) => serde_json::to_writer(out, s)?,
        Cell::OptStr(s) => serde_json::to_writer(out, &s)?,
        Cell::I32(x) => serde_json::to_writer(out, &x)?,
        Cell::OptI64(x) => serde_json::to_writer(out, &x)?,
        Cell::Bool(x) => serde_json::to_writer(out, &x)?,
        Cell::OptF64(x) => serde_json::to_writer(out, &x)?,
        Cell::Ids(xs) => serde_json::to_writer(out, xs)?,
        Cell::Mask(xs) => serde_json::to_writer(out, xs)?,
        Cell::Floats(xs) => serde_json::to_writer(out, xs)?,
        Cell::OptFloats(xs) => serde_json::to_writer(out, xs)?,
        Cell::OptU64s(xs) => serde_json::to_writer(out, xs)?,
        Cell::I64s(xs) => serde_json::to_writer(out, xs)?,
        Cell::OptStrs(xs) => serde_json::to_writer(out, xs)?,
        Cell::Json(j) => serde_json::to_writer(out, &j)?,
        Cell::Images(images, field) => {
            use base64::Engine as _;
            let values: Vec<serde_json::Value> = images
                .iter()
                .map(|im| match field {
                    ImageField::Bytes => match &im.bytes {
                        Some(b) => base64::engine::general_purpose::STANDARD
                            .encode(b.as_slice())
                            .into(),
                        None => serde_json::Value::Null,
                    },
                    ImageField::Sha256 => im.sha256.as_str().into(),
                    ImageField::Mime => im.mime.as_str().into(),
                    ImageField::Size => serde_json::json!(im.size),
                    ImageField::GridThw => serde_json::json!(im.grid_thw),
                })
                .collect();
            serde_json::to_writer(out, &values)?
        }
        Cell::OptBytes(b) => match b {
            Some(b) => {
                out.write_all(b"\"")?;
                {
                    // Streamed: a row's pixel values can be tens of MB.
                    let mut enc = base64::write::EncoderWriter::new(
                        &mut *out,
                        &base64::engine::general_purpose::STANDARD,
                    );
                    enc.write_all(b)?;
                    enc.finish()?;
                }
                out.write_all(b"\"")?;
            }
            None => out.write_all(b"null")?,
        },
        Cell::OptInts(xs) => serde_json::to_writer(out, &xs)?,
    }
    Ok(())
}

impl<W: Write> RowSink for JsonlSink<W> {
    fn write_row(&mut self, row: &ExportRow) -> Result<(), ExportError> {
        self.out.write_all(b"{")?;
        for (i, col) in self.cols.iter().enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            serde_json::to_writer(&mut self.out, col.name)?;
            self.out.write_all(b":")?;
            write_cell(&mut self.out, (col.get)(row))?;
        }
        self.out.write_all(b"}\n")?;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ExportError> {
        self.out.flush()?;
        Ok(())
    }
}
