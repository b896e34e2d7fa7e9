//! Starting one sequence: route, generate, wait for the first event; a
//! backend that fails before its first event is reported to the router and
//! another one is tried, up to `router.max_attempts`. After the first event
//! nothing is retried (tokens may already be on their way to the client),
//! but how the stream ends is still reported: its finish as a success, an
//! error (a stall, a cut connection) as a failure.
//!
//! Each retry first waits its backoff ([`crate::router::retry`]), ending by
//! the failed attempt's first-token deadline. This is the only retry loop
//! in tito: the API and the router tests both call [`start_sequence`].

use std::time::{Duration, Instant};

use futures::StreamExt;
use tracing::Instrument;

use crate::backend::{BackendError, FinishReason, GenEvent, GenStream, GenerateRequest};
use crate::error::ApiError;
use crate::metrics::PHASE;
use crate::router::{Interruption, RouteError, Router};

/// How long a call waits for admission while backends sleep.
pub const ADMISSION_TIMEOUT: Duration = Duration::from_secs(600);

/// A sequence that produced its first event. The stream starts with that
/// event and holds the router's in-flight guard until it is dropped.
pub struct Started {
    pub backend: String,
    /// The trajectory was already pinned to this backend.
    pub sticky: bool,
    /// Where the trajectory was pinned before this call, when the call ran
    /// elsewhere (a backend this call itself tried first is no move).
    pub moved_from: Option<String>,
    /// Backends tried, this one included.
    pub attempts: u32,
    /// The weights that backend serves.
    pub weight_version: Option<String>,
    /// Their fleet sequence number, when known.
    pub weight_seq: Option<u64>,
    /// Tells an abort sent by a weight update from any other.
    pub interruption: Interruption,
    pub stream: GenStream,
}

/// Routes `req` for `trajectory_id` and waits for its first event, retrying
/// on another backend while nothing has been generated.
pub async fn start_sequence(
    router: &Router,
    trajectory_id: &str,
    req: GenerateRequest,
) -> Result<Started, ApiError> {
    let t0 = Instant::now();
    let mut exclude = Vec::new();
    // Where the trajectory was pinned before this call: the first route
    // stayed there (sticky) or moved away from it. A trajectory pinned by
    // this call's own first attempt has not moved when a retry runs
    // elsewhere.
    let mut pinned_before: Option<Option<String>> = None;
    let mut last_err: Option<BackendError> = None;
    let attempts = router.max_attempts().max(1);
    // The first-token deadline of the attempt in progress: a retry's wait
    // ends by the deadline of the attempt that failed.
    let mut deadline = tokio::time::Instant::now();
    let mut attempt = 0;
    while attempt < attempts {
        attempt += 1;
        if attempt > 1 {
            router.backoff().pause(attempt - 1, deadline).await;
        }
        deadline = tokio::time::Instant::now() + router.first_token_timeout();
        let route = match router
            .route_admitted(trajectory_id, &req.prompt_ids, &exclude, ADMISSION_TIMEOUT)
            .instrument(tracing::info_span!(target: PHASE, "route"))
            .await
        {
            Ok(r) => r,
            Err(e) => return Err(no_route(e, last_err)),
        };
        if pinned_before.is_none() {
            let before = match &route.moved_from {
                Some(from) => Some(from.clone()),
                None => route.sticky.then(|| route.name.to_string()),
            };
            pinned_before = Some(before);
        }
        if route.moved_from.is_some() || !route.sticky {
            tracing::debug!(trajectory = %trajectory_id, backend = %route.name,
                moved_from = route.moved_from.as_deref().unwrap_or(""), "trajectory routed");
        }
        let interruption = route.interruption();
        let first = tokio::select! {
            // A first event already here is taken: its tokens are kept
            // (an abort that follows continues the call).
            biased;
            first = first_event(&route, req.clone())
                .instrument(tracing::info_span!(target: PHASE, "first_token")) => first,
            // A weight update in `abort` mode reached the backend before
            // the first token: withdraw the request (nothing was sampled)
            // and route it again once admission resumes, on the new
            // weights. Not the backend's failure, and no attempt spent.
            () = interruption.wait() => Err(BackendError::Overloaded {
                backend: route.name.to_string(),
                message: "interrupted by a weight update before its first token".into(),
            }),
        };
        if first.is_err() && interruption.happened() {
            if !route.sticky {
                router.unpin_from(trajectory_id, route.id);
            }
            attempt -= 1;
            continue;
        }
        match first {
            Ok((stream, first)) => {
                crate::metrics::time_to_first_token(t0.elapsed());
                let backend = route.name.to_string();
                let moved_from = pinned_before.flatten().filter(|b| *b != backend);
                let sticky = route.sticky;
                let weight_version = route.weight_version.as_deref().map(str::to_string);
                let weight_seq = route.weight_seq;
                // The route (and its in-flight guard) lives as long as the
                // stream, and tells the backend's health how it ended.
                let mut outcome = Outcome {
                    route,
                    reported: false,
                };
                let stream: GenStream = Box::pin(
                    futures::stream::once(async { Ok(first) })
                        .chain(stream)
                        .map(move |ev| {
                            outcome.see(&ev);
                            ev
                        }),
                );
                return Ok(Started {
                    backend,
                    sticky,
                    moved_from,
                    attempts: attempt,
                    weight_version,
                    weight_seq,
                    interruption,
                    stream,
                });
            }
            Err(e) => {
                router.report_error(route.id, &e);
                if !route.sticky {
                    router.unpin_from(trajectory_id, route.id);
                }
                if !e.is_retryable() {
                    return Err(e.into());
                }
                tracing::warn!(backend = %route.name, error = %e,
                    "backend failed before the first token; trying another");
                crate::metrics::retry(&route.name);
                exclude.push(route.id);
                last_err = Some(e);
            }
        }
    }
    Err(match last_err {
        Some(e) => e.into(),
        None => ApiError::overloaded("no healthy backend is available"),
    })
}

/// Sends `req` to the routed backend and waits for its first event.
async fn first_event(
    route: &crate::router::Route,
    req: GenerateRequest,
) -> Result<(GenStream, GenEvent), BackendError> {
    let mut stream = route.backend.generate(req).await?;
    match stream.next().await {
        // Aborted before any token (SGLang's `/pause_generation` abort
        // during a weight update, an `/abort_request`): nothing was
        // generated, so the call goes elsewhere like any other failure
        // before the first token.
        Some(Ok(GenEvent::Done {
            finish_reason: FinishReason::Abort,
        })) => Err(BackendError::Overloaded {
            backend: route.name.to_string(),
            message: "aborted the request before its first token".into(),
        }),
        Some(Ok(ev)) => Ok((stream, ev)),
        Some(Err(e)) => Err(e),
        None => Err(BackendError::Protocol {
            backend: route.name.to_string(),
            message: "stream ended before any event".into(),
        }),
    }
}

/// Tells a backend's health, once, how a stream it started ended: a finish
/// is a success, and so is a stream the gateway dropped while it was fine
/// (a stop string reached, a client gone); an error (a stall, a cut
/// connection) is a failure, as before the first token; an abort neither.
struct Outcome {
    route: crate::router::Route,
    reported: bool,
}

impl Outcome {
    fn see(&mut self, ev: &Result<GenEvent, BackendError>) {
        if self.reported {
            return;
        }
        match ev {
            Ok(GenEvent::Tokens { .. } | GenEvent::Versions(_) | GenEvent::PromptDrift(_)) => {
                return
            }
            Ok(GenEvent::Done { finish_reason }) => {
                if *finish_reason != FinishReason::Abort {
                    self.route.succeeded();
                }
            }
            Err(e) => self.route.failed(e),
        }
        self.reported = true;
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.reported {
            self.route.succeeded();
        }
    }
}

/// The error of a call that found no backend: the last backend error when
/// some backend was tried and failed, else the router's reason.
fn no_route(e: RouteError, last: Option<BackendError>) -> ApiError {
    match last {
        Some(b) => b.into(),
        None => e.into(),
    }
}
