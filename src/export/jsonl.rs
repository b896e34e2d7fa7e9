//! JSONL sink: one JSON object per row and line, written as it comes.

use std::io::Write;

use super::{ExportError, ExportRow, RowSink};

pub struct JsonlSink<W: Write> {
    out: W,
}

impl<W: Write> JsonlSink<W> {
    pub fn new(out: W) -> Self {
        JsonlSink { out }
    }
}

impl<W: Write> RowSink for JsonlSink<W> {
    fn write_row(&mut self, row: &ExportRow) -> Result<(), ExportError> {
        serde_json::to_writer(&mut self.out, row)?;
        self.out.write_all(b"\n")?;
        Ok(())
    }

    fn finish(&mut self) -> Result<(), ExportError> {
        self.out.flush()?;
        Ok(())
    }
}
