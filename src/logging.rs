//! The process's log output: one `tracing` subscriber for every `tito`
//! command, writing human-readable text or one JSON object per line.
//!
//! The level filter is `RUST_LOG` (default `info`). In JSON each line holds
//! `timestamp`, `level`, `target`, the event's `message` and fields at the
//! top level, and the spans it happened in (`span` the innermost, `spans`
//! all of them, each with its fields): an HTTP call's lines carry its
//! `request_id` there (see [`crate::api::request_id`]).
//!
//! Owns: the output format, colour and destination. Must not: decide what is
//! logged or at which level.

use std::io::IsTerminal;

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, coloured on a terminal (unless `NO_COLOR`).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. Logs go to stdout, or to stderr for
/// commands whose stdout is data (`to_stderr`).
pub fn init(format: LogFormat, to_stderr: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, terminal) = if to_stderr {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        )
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some();
            builder.with_ansi(terminal && !no_color).init();
        }
        LogFormat::Json => builder.with_ansi(false).json().flatten_event(true).init(),
    }
}
