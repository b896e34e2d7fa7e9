//! Where a request's time goes, from `tracing` spans: the request path opens
//! one span per phase (target [`PHASE`]: `parse`, `render`, `route`,
//! `first_token`, `commit`), and [`PhaseTimer`], a subscriber layer, records
//! each one's life (creation to close) in `tito_phase_duration_seconds`,
//! labelled by the span's name.
//!
//! The layer is part of every command's subscriber (`crate::logging`); a
//! program that installs none records nothing here, and a phase span then
//! costs one disabled-callsite check.

use std::time::Instant;

use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::filter::{FilterFn, Filtered};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The target of the request path's phase spans.
pub const PHASE: &str = "tito::phase";

/// When a phase span was made.
struct Opened(Instant);

/// Records the duration of every [`PHASE`] span as it closes.
pub struct PhaseTimer;

impl PhaseTimer {
    /// The layer, filtered to phase spans alone: other layers' filters
    /// (`RUST_LOG`) neither hide phases from it nor see more because of it.
    pub fn layer<S>() -> Filtered<PhaseTimer, FilterFn, S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        PhaseTimer.with_filter(FilterFn::new(|meta| meta.target() == PHASE))
    }
}

impl<S> Layer<S> for PhaseTimer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Opened(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let opened = span.extensions().get::<Opened>().map(|o| o.0);
        if let Some(opened) = opened {
            super::phase(span.name(), opened.elapsed());
        }
    }
}
