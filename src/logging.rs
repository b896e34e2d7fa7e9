//! The process's log output: one `tracing` subscriber for every `tito`
//! command, writing human-readable text or one JSON object per line.
//!
//! The level filter is `RUST_LOG` (default `info`). In JSON each line holds
//! `timestamp`, `level`, `target`, the event's `message` and fields at the
//! top level, and the spans it happened in (`span` the innermost, `spans`
//! all of them, each with its fields): an HTTP call's lines carry its
//! `request_id` there (the API's request-id middleware). Every command's
//! subscriber also times the request path's phase spans into metrics
//! ([`crate::metrics::PhaseTimer`]).
//!
//! Owns: the output format, colour and destination. Must not: decide what is
//! logged or at which level.

use std::io::IsTerminal;

use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::metrics::PhaseTimer;

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
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = match format {
        LogFormat::Text => {
            let no_color = std::env::var_os("NO_COLOR").is_some();
            fmt.with_ansi(terminal && !no_color).boxed()
        }
        LogFormat::Json => fmt.with_ansi(false).json().flatten_event(true).boxed(),
    };
    // The level filter applies to the log lines alone: the phase timer sees
    // its spans whatever `RUST_LOG` says.
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(PhaseTimer::layer())
        .try_init();
}
