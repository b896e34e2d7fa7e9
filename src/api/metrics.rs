//! `GET /metrics`: samples the router's state into the backend and sticky
//! series, then renders every series in Prometheus' text format.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::metrics::{BackendGauges, RouterCounters};
use crate::router::{CircuitState, Router};

/// Over every served model's router.
pub async fn render(State(routers): State<Arc<Vec<Arc<Router>>>>) -> Response {
    let snapshot: Vec<_> = routers.iter().flat_map(|r| r.snapshot()).collect();
    let backends: Vec<BackendGauges<'_>> = snapshot
        .iter()
        .map(|b| {
            let open = b.circuit == CircuitState::Open;
            BackendGauges {
                name: &b.name,
                in_flight: b.in_flight,
                healthy: b.healthy,
                sleeping: b.sleeping,
                circuit_open: open,
                in_rotation: !open && !b.sleeping && b.weights_error.is_none(),
            }
        })
        .collect();
    let mut counters = RouterCounters {
        sticky_hits: 0,
        sticky_misses: 0,
        sticky_evictions: 0,
        moves: 0,
    };
    for c in routers.iter().map(|r| r.counters()) {
        counters.sticky_hits += c.sticky_hits;
        counters.sticky_misses += c.sticky_misses;
        counters.sticky_evictions += c.sticky_evictions;
        counters.moves += c.moves;
    }
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::metrics::render(&backends, &counters),
    )
        .into_response()
}
