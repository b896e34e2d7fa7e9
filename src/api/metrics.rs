//! `GET /metrics`: samples the router's state into the backend and sticky
//! series, then renders every series in Prometheus' text format.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::metrics::{BackendGauges, RouterCounters};
use crate::router::{CircuitState, Router};

pub async fn render(State(router): State<Arc<Router>>) -> Response {
    let snapshot = router.snapshot();
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
    let c = router.counters();
    let counters = RouterCounters {
        sticky_hits: c.sticky_hits,
        sticky_misses: c.sticky_misses,
        sticky_evictions: c.sticky_evictions,
        moves: c.moves,
    };
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::metrics::render(&backends, &counters),
    )
        .into_response()
}
