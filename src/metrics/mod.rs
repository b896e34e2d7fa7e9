//! Prometheus metrics: one recorder per process, names in one place, buckets
//! chosen per metric. Request metrics are labelled by the matched route
//! template (`/t/{tid}/v1/chat/completions`), never the raw path. Router and
//! backend state is sampled at scrape time from the router's own counters.
//!
//! Must not: block, or allocate label sets from request input.

mod spans;

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use spans::{PhaseTimer, PHASE};

pub const REQUESTS: &str = "tito_requests_total";
pub const REQUEST_DURATION: &str = "tito_request_duration_seconds";
pub const GATEWAY_OVERHEAD: &str = "tito_gateway_overhead_seconds";
pub const TTFT: &str = "tito_time_to_first_token_seconds";
pub const TOKENS: &str = "tito_tokens_total";
pub const BACKEND_IN_FLIGHT: &str = "tito_backend_in_flight";
pub const BACKEND_HEALTHY: &str = "tito_backend_healthy";
pub const BACKEND_CIRCUIT_OPEN: &str = "tito_backend_circuit_open";
pub const BACKEND_SLEEPING: &str = "tito_backend_sleeping";
pub const BACKEND_IN_ROTATION: &str = "tito_backend_in_rotation";
pub const STICKY_HITS: &str = "tito_sticky_hits_total";
pub const STICKY_MISSES: &str = "tito_sticky_misses_total";
pub const STICKY_EVICTIONS: &str = "tito_sticky_evictions_total";
pub const RETRIES: &str = "tito_retries_total";
pub const MOVES: &str = "tito_trajectory_moves_total";
pub const DRIFT: &str = "tito_drift_events_total";
pub const STORE_COMMIT: &str = "tito_store_commit_seconds";
pub const PHASE_DURATION: &str = "tito_phase_duration_seconds";
pub const STORE_TRANSIENT_RETRIES: &str = "tito_store_transient_retries_total";
pub const CALLS_WITHOUT_LOGPROBS: &str = "tito_calls_without_logprobs_total";
pub const REPLAYS: &str = "tito_replayed_calls_total";
pub const SERVER_ERRORS: &str = "tito_server_errors_total";
/// Requests refused with 429 at `[server] max_concurrent_requests`.
pub const REJECTED_OVERLOAD: &str = "tito_requests_rejected_overload_total";
pub const BACKEND_PROTOCOL_ERRORS: &str = "tito_backend_protocol_errors_total";
pub const REPLAY_ABS_DIFF: &str = "tito_replay_logprob_abs_diff";
pub const REPLAY_SAMPLES: &str = "tito_replay_check_samples_total";
pub const REPLAY_FAILURES: &str = "tito_replay_check_failures_total";
pub const BUILD_INFO: &str = "tito_build_info";
pub const HOT_EVICTIONS: &str = "tito_hot_trajectory_evictions_total";
pub const HOT_BYTES: &str = "tito_hot_trajectory_bytes";
pub const HOT_STALE_RELOADS: &str = "tito_hot_trajectory_stale_reloads_total";
pub const EXPORT_LAG: &str = "tito_export_lag_seconds";
pub const EXPORT_SKIPPED: &str = "tito_export_rows_skipped_total";
pub const EXPORT_SKIPPED_VERSION: &str = "tito_export_rows_skipped_version_total";
pub const RETRY_CACHE_BYTES: &str = "tito_retry_cache_bytes";
pub const ENGINE_PREFILL_TOKENS: &str = "tito_engine_prefill_tokens_total";
pub const ENGINE_REUSED_TOKENS: &str = "tito_engine_reused_tokens_total";
pub const ENGINE_PREEMPTIONS: &str = "tito_engine_preemptions_total";
pub const ENGINE_COMPACTIONS: &str = "tito_engine_compactions_total";
pub const ENGINE_RUNNING: &str = "tito_engine_running_sequences";
pub const CALLS_INTERRUPTED: &str = "tito_calls_interrupted_total";
pub const CALLS_RESUMED: &str = "tito_calls_resumed_total";
pub const UPDATE_PAUSE: &str = "tito_update_pause_seconds";
pub const VERSION_TOKENS: &str = "tito_sampled_tokens_by_version_total";
pub const ENGINE_QUEUED: &str = "tito_engine_queued_requests";
pub const SSE_SEND_TIMEOUTS: &str = "tito_sse_send_timeouts_total";
pub const POLICY_CALLS: &str = "tito_policy_calls_total";
pub const POLICY_TOKENS: &str = "tito_policy_sampled_tokens_total";

/// `# HELP` text of every series, given to the recorder once.
fn describe() {
    use Unit::{Count, Seconds};
    let counters: [(&'static str, &'static str); 30] = [
        (
            POLICY_CALLS,
            "Calls recorded, by the policy (served model or LoRA adapter id) that served them",
        ),
        (
            POLICY_TOKENS,
            "Sampled tokens recorded, by the policy (served model or LoRA adapter id) that sampled them",
        ),
        (
            CALLS_INTERRUPTED,
            "Generations stopped by an update in abort mode: of the weights (abort) or of the call's LoRA adapter (adapter_abort)",
        ),
        (
            CALLS_RESUMED,
            "Interrupted generations continued on the new weights",
        ),
        (
            VERSION_TOKENS,
            "Sampled tokens recorded, by the weight version (label) that generated them",
        ),
        (
            REQUESTS,
            "HTTP requests answered, by matched route and status",
        ),
        (
            TOKENS,
            "Tokens recorded, by kind (prompt, observation, sampled)",
        ),
        (
            STICKY_HITS,
            "Routing lookups that found the trajectory's pinned backend",
        ),
        (
            STICKY_MISSES,
            "Routing lookups of a trajectory without a pin",
        ),
        (
            STICKY_EVICTIONS,
            "Sticky pins evicted to stay within router.sticky_capacity",
        ),
        (
            RETRIES,
            "Calls routed again after a failure before their first token",
        ),
        (MOVES, "Trajectories moved off their pinned backend"),
        (
            DRIFT,
            "Continued calls whose exact prompt differs from a fresh render, by cause",
        ),
        (
            CALLS_WITHOUT_LOGPROBS,
            "Calls for which a backend reported no logprob for some sampled token",
        ),
        (
            REPLAYS,
            "Retries and repeated Idempotency-Keys answered from a recorded call",
        ),
        (SERVER_ERRORS, "5xx answers, by matched route"),
        (
            REJECTED_OVERLOAD,
            "Requests refused with 429 at server.max_concurrent_requests",
        ),
        (
            BACKEND_PROTOCOL_ERRORS,
            "Backend answers tito could not decode, by backend",
        ),
        (
            REPLAY_SAMPLES,
            "Samples checked by the teacher-forced replay, by backend",
        ),
        (
            REPLAY_FAILURES,
            "Replay checks that failed, by source (api, background)",
        ),
        (
            HOT_EVICTIONS,
            "Trajectories dropped from the hot view to stay within trajectory.hot_bytes",
        ),
        (
            EXPORT_SKIPPED,
            "Export rows left out because their prompt is longer than the prompt_length asked, by consumer (empty without one)",
        ),
        (
            EXPORT_SKIPPED_VERSION,
            "Export rows left out by the min_version_seq or max_staleness asked, by consumer (empty without one)",
        ),
        (
            HOT_STALE_RELOADS,
            "Trajectory views brought up to date (or reloaded) because another replica wrote to them (shared store)",
        ),
        (
            STORE_TRANSIENT_RETRIES,
            "PostgreSQL write batches rolled back by a deadlock or serialization failure and run again",
        ),
        (
            SSE_SEND_TIMEOUTS,
            "Streams ended because the client took no chunk for server.sse_send_timeout_s",
        ),
        (
            ENGINE_PREFILL_TOKENS,
            "Prompt tokens the bundled engine computed (recomputation included), by engine",
        ),
        (
            ENGINE_REUSED_TOKENS,
            "Prompt tokens the bundled engine took from cached KV cells instead, by engine",
        ),
        (
            ENGINE_PREEMPTIONS,
            "Sequences the bundled engine sent back to its queue because the KV cache was full",
        ),
        (
            ENGINE_COMPACTIONS,
            "Batch-invariant engine: cache clears that recomputed the running sequences to free parked cells",
        ),
    ];
    for (name, help) in counters {
        describe_counter!(name, Count, help);
    }
    let gauges: [(&'static str, &'static str); 11] = [
        (
            EXPORT_LAG,
            "Seconds the oldest trajectory of a consumer's last export page waited since its last update (finish or reward)",
        ),
        (BACKEND_IN_FLIGHT, "Calls in flight on a backend"),
        (BACKEND_HEALTHY, "1 when the backend's circuit is closed"),
        (
            BACKEND_CIRCUIT_OPEN,
            "1 when the backend's circuit is open (0 when closed or half-open)",
        ),
        (
            BACKEND_IN_ROTATION,
            "1 when calls may be routed to the backend: awake, its weights known, its circuit not open; 0 once it is removed",
        ),
        (
            BACKEND_SLEEPING,
            "1 while the backend is asleep (POST /admin/sleep)",
        ),
        (BUILD_INFO, "Always 1; the labels name this build (version)"),
        (
            HOT_BYTES,
            "Estimated bytes of the hot trajectory view (bounded by trajectory.hot_bytes)",
        ),
        (
            RETRY_CACHE_BYTES,
            "Estimated bytes of the recorded answers kept for retries (bodies included)",
        ),
        (ENGINE_RUNNING, "Sequences in the bundled engine's batch"),
        (
            ENGINE_QUEUED,
            "Requests waiting for a place in the bundled engine's batch",
        ),
    ];
    for (name, help) in gauges {
        describe_gauge!(name, help);
    }
    let histograms: [(&'static str, &'static str); 6] = [
        (
            UPDATE_PAUSE,
            "Time admission was paused by a weight update, by update mode",
        ),
        (
            REQUEST_DURATION,
            "Time to answer a request (a stream: to its head)",
        ),
        (
            GATEWAY_OVERHEAD,
            "Time a call spent in tito itself, generation excluded",
        ),
        (
            TTFT,
            "Time from a call's start to its first generated token",
        ),
        (STORE_COMMIT, "Time to record a finished call durably"),
        (
            PHASE_DURATION,
            "Time a request spent in one phase (parse, render, route, first_token, commit)",
        ),
    ];
    for (name, help) in histograms {
        describe_histogram!(name, Seconds, help);
    }
    describe_histogram!(
        REPLAY_ABS_DIFF,
        "Per sampled token |recorded - replayed| logprob in nats, by backend"
    );
}

fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let fast = [
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
        ];
        // Phases span both: a render takes µs, a first token seconds.
        let phases = [
            0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
            2.5, 5.0, 10.0, 30.0,
        ];
        let slow = [
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
        ];
        // |Δ| in nats of the replay check: 0 exactly, then kernel noise up
        // to gross disagreement.
        let nats = [
            0.0, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0,
        ];
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(REQUEST_DURATION.into()), &slow)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(TTFT.into()), &slow))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(UPDATE_PAUSE.into()), &slow))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(GATEWAY_OVERHEAD.into()), &fast))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(STORE_COMMIT.into()), &fast))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(PHASE_DURATION.into()), &phases))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(REPLAY_ABS_DIFF.into()), &nats));
        let recorder = match builder {
            Ok(b) => b.build_recorder(),
            Err(_) => PrometheusBuilder::new().build_recorder(),
        };
        let handle = recorder.handle();
        // Another recorder may already be installed (e.g. by an embedding
        // program); then our series are simply not collected.
        let _ = metrics::set_global_recorder(recorder);
        // Histogram samples wait in the recorder until they are folded into
        // their buckets, which happens on a scrape or in this upkeep: without
        // it, a gateway nobody scrapes keeps every sample (~40 bytes a call).
        let upkeep = handle.clone();
        let _ = std::thread::Builder::new()
            .name("tito-metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            });
        handle
    })
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the recorder and describes every series (idempotent). Call
/// once at start-up.
pub fn init() {
    static DESCRIBED: OnceLock<()> = OnceLock::new();
    let _ = handle();
    DESCRIBED.get_or_init(|| {
        describe();
        gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    });
}

// The series every call updates keep their handles (below, and in
// `request`): a `counter!` or `histogram!` call builds its key (allocating
// its label values) and searches the registry each time, a few hundred ns
// apiece and about ten a call. The recorder is installed before a handle
// is made: one made before would count nothing, ever.

/// Handles of one series by the value of its one label, made on first use.
/// The values are a small fixed set (the routes that report a gateway
/// overhead, token kinds), so a short list searched in order is enough.
struct ByLabel<H> {
    made: Mutex<Vec<(&'static str, H)>>,
}

impl<H: Clone> ByLabel<H> {
    const fn new() -> Self {
        ByLabel {
            made: Mutex::new(Vec::new()),
        }
    }

    fn get(&self, value: &'static str, make: impl FnOnce() -> H) -> H {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, h)) = made.iter().find(|(v, _)| *v == value) {
            return h.clone();
        }
        let _ = handle();
        let h = make();
        made.push((value, h.clone()));
        h
    }
}

/// The handle of a series without labels, made the first time.
fn made_once<H>(cell: &'static OnceLock<H>, make: impl FnOnce() -> H) -> &'static H {
    cell.get_or_init(|| {
        let _ = handle();
        make()
    })
}

/// One route's request series, each status's count made on first use.
struct RouteSeries {
    route: String,
    duration: Histogram,
    counts: Vec<(u16, Counter)>,
}

/// One answered request, by matched route and status.
pub fn request(route: &str, status: u16, took: Duration) {
    // Searched in order: routes are the router's few dozen templates (and
    // `unmatched`), statuses a handful each.
    static BY_ROUTE: Mutex<Vec<RouteSeries>> = Mutex::new(Vec::new());
    let (count, duration) = {
        let mut routes = BY_ROUTE.lock().unwrap_or_else(|e| e.into_inner());
        let at = match routes.iter().position(|r| r.route == route) {
            Some(at) => at,
            None => {
                let _ = handle();
                routes.push(RouteSeries {
                    route: route.to_string(),
                    duration: histogram!(REQUEST_DURATION, "route" => route.to_string()),
                    counts: Vec::new(),
                });
                routes.len() - 1
            }
        };
        let series = &mut routes[at];
        let count = match series.counts.iter().find(|(s, _)| *s == status) {
            Some((_, c)) => c.clone(),
            None => {
                let _ = handle();
                let c = counter!(REQUESTS, "route" => route.to_string(), "status" => status.to_string());
                series.counts.push((status, c.clone()));
                c
            }
        };
        (count, series.duration.clone())
    };
    count.increment(1);
    duration.record(took.as_secs_f64());
}

pub fn gateway_overhead(route: &'static str, d: Duration) {
    static BY_ROUTE: ByLabel<Histogram> = ByLabel::new();
    let h = BY_ROUTE.get(route, || histogram!(GATEWAY_OVERHEAD, "route" => route));
    h.record(d.as_secs_f64());
}

pub fn time_to_first_token(d: Duration) {
    static SERIES: OnceLock<Histogram> = OnceLock::new();
    made_once(&SERIES, || histogram!(TTFT)).record(d.as_secs_f64());
}

pub fn tokens(kind: &'static str, n: usize) {
    static BY_KIND: ByLabel<Counter> = ByLabel::new();
    let c = BY_KIND.get(kind, || counter!(TOKENS, "kind" => kind));
    c.increment(n as u64);
}

/// A generation stopped by a weight update in `mode`.
pub fn call_interrupted(mode: &'static str) {
    counter!(CALLS_INTERRUPTED, "mode" => mode).increment(1);
}

/// An interrupted generation continued on the new weights.
pub fn call_resumed() {
    counter!(CALLS_RESUMED).increment(1);
}

/// How long a weight update in `mode` kept admission paused.
pub fn update_pause(mode: &'static str, d: Duration) {
    histogram!(UPDATE_PAUSE, "mode" => mode).record(d.as_secs_f64());
}

/// Sampled tokens recorded from weight version `version` (`initial`: the
/// weights the backend started with).
pub fn version_tokens(version: Option<&str>, n: usize) {
    let v = version.unwrap_or("initial").to_string();
    counter!(VERSION_TOKENS, "version" => v).increment(n as u64);
}

/// A recorded call of `policy` (the served id a request names: the model or
/// one of its adapters) that sampled `sampled` tokens.
pub fn policy_call(policy: &str, sampled: usize) {
    counter!(POLICY_CALLS, "policy" => policy.to_string()).increment(1);
    counter!(POLICY_TOKENS, "policy" => policy.to_string()).increment(sampled as u64);
}

pub fn drift(cause: &str) {
    counter!(DRIFT, "cause" => cause.to_string()).increment(1);
}

pub fn retry(backend: &str) {
    counter!(RETRIES, "backend" => backend.to_string()).increment(1);
}

/// A choice whose backend reported no logprob for some sampled token.
pub fn call_without_logprobs(backend: &str) {
    counter!(CALLS_WITHOUT_LOGPROBS, "backend" => backend.to_string()).increment(1);
}

/// A retry or repeated `Idempotency-Key` answered from a recorded call.
pub fn replay() {
    counter!(REPLAYS).increment(1);
}

/// A backend answer the gateway could not decode.
pub fn backend_protocol_error(backend: &str) {
    counter!(BACKEND_PROTOCOL_ERRORS, "backend" => backend.to_string()).increment(1);
}

/// A request refused at the concurrency limit.
pub fn rejected_overload() {
    counter!(REJECTED_OVERLOAD).increment(1);
}

/// A 5xx answer, by matched route.
pub fn server_error(route: &str) {
    counter!(SERVER_ERRORS, "route" => route.to_string()).increment(1);
}

/// One sample's replay check: every compared token's |Δ| (nats).
pub fn replay_sample(backend: &str, abs_diffs: &[f64]) {
    counter!(REPLAY_SAMPLES, "backend" => backend.to_string()).increment(1);
    let h = histogram!(REPLAY_ABS_DIFF, "backend" => backend.to_string());
    for &d in abs_diffs {
        h.record(d);
    }
}

/// A replay check that failed (`source`: `api`, `background`, `cli`).
pub fn replay_failure(source: &'static str) {
    counter!(REPLAY_FAILURES, "source" => source).increment(1);
}

/// Trajectories evicted from the hot view.
pub fn hot_evictions(n: u64) {
    counter!(HOT_EVICTIONS).increment(n);
}

/// Seconds the oldest trajectory of a consumer's last leased page waited
/// between its last update (its finish, or a later reward) and that lease
/// (0 when the page was empty).
pub fn export_lag(consumer: &str, seconds: f64) {
    gauge!(EXPORT_LAG, "consumer" => consumer.to_string()).set(seconds);
}

/// Export rows left out for a prompt over the `prompt_length` asked.
pub fn export_skipped(consumer: &str, rows: u64) {
    counter!(EXPORT_SKIPPED, "consumer" => consumer.to_string()).increment(rows);
}

/// Export rows left out by `min_version_seq` / `max_staleness`.
pub fn export_skipped_version(consumer: &str, rows: u64) {
    counter!(EXPORT_SKIPPED_VERSION, "consumer" => consumer.to_string()).increment(rows);
}

/// Trajectory views brought up to date from a shared store (reading the
/// calls they lack, or reloaded whole) because another replica wrote to them.
pub fn hot_stale_reloads(n: u64) {
    counter!(HOT_STALE_RELOADS).increment(n);
}

pub fn hot_bytes(bytes: u64) {
    static SERIES: OnceLock<Gauge> = OnceLock::new();
    made_once(&SERIES, || gauge!(HOT_BYTES)).set(bytes as f64);
}

pub fn retry_cache_bytes(bytes: usize) {
    static SERIES: OnceLock<Gauge> = OnceLock::new();
    made_once(&SERIES, || gauge!(RETRY_CACHE_BYTES)).set(bytes as f64);
}

/// One bundled-engine step: prompt tokens computed, sequences running and
/// requests waiting after it.
pub fn engine_step(engine: &str, prefilled: u64, running: usize, queued: usize) {
    if prefilled > 0 {
        counter!(ENGINE_PREFILL_TOKENS, "engine" => engine.to_string()).increment(prefilled);
    }
    gauge!(ENGINE_RUNNING, "engine" => engine.to_string()).set(running as f64);
    gauge!(ENGINE_QUEUED, "engine" => engine.to_string()).set(queued as f64);
}

pub fn engine_reused_tokens(engine: &str, n: usize) {
    counter!(ENGINE_REUSED_TOKENS, "engine" => engine.to_string()).increment(n as u64);
}

pub fn engine_preemption(engine: &str) {
    counter!(ENGINE_PREEMPTIONS, "engine" => engine.to_string()).increment(1);
}

pub fn engine_compaction(engine: &str) {
    counter!(ENGINE_COMPACTIONS, "engine" => engine.to_string()).increment(1);
}

/// A stream ended because its client stopped reading.
pub fn sse_send_timeout() {
    counter!(SSE_SEND_TIMEOUTS).increment(1);
}

/// A PostgreSQL batch rolled back by a deadlock or a serialization failure
/// and run again.
pub fn store_transient_retry() {
    counter!(STORE_TRANSIENT_RETRIES).increment(1);
}

pub fn store_commit(d: Duration) {
    static SERIES: OnceLock<Histogram> = OnceLock::new();
    made_once(&SERIES, || histogram!(STORE_COMMIT)).record(d.as_secs_f64());
}

/// One phase of a request, by the name of its span ([`PhaseTimer`]).
fn phase(name: &'static str, d: Duration) {
    static BY_PHASE: ByLabel<Histogram> = ByLabel::new();
    let h = BY_PHASE.get(name, || histogram!(PHASE_DURATION, "phase" => name));
    h.record(d.as_secs_f64());
}

/// A backend's state, as `GET /metrics` samples it from the router.
pub struct BackendGauges<'a> {
    pub name: &'a str,
    pub in_flight: usize,
    pub healthy: bool,
    pub sleeping: bool,
    pub circuit_open: bool,
    pub in_rotation: bool,
}

/// The router's counters, as `GET /metrics` samples them.
pub struct RouterCounters {
    pub sticky_hits: u64,
    pub sticky_misses: u64,
    pub sticky_evictions: u64,
    pub moves: u64,
}

/// Backend names reported so far.
static SEEN_BACKENDS: Mutex<std::collections::BTreeSet<String>> =
    Mutex::new(std::collections::BTreeSet::new());

/// Sets the sampled router series, then renders every series in
/// Prometheus' text format.
pub fn render(backends: &[BackendGauges<'_>], counters: &RouterCounters) -> String {
    let flag = |b: bool| f64::from(u8::from(b));
    let mut now = std::collections::BTreeSet::new();
    for b in backends {
        let name = b.name.to_string();
        gauge!(BACKEND_IN_FLIGHT, "backend" => name.clone()).set(b.in_flight as f64);
        gauge!(BACKEND_HEALTHY, "backend" => name.clone()).set(flag(b.healthy));
        gauge!(BACKEND_SLEEPING, "backend" => name.clone()).set(flag(b.sleeping));
        gauge!(BACKEND_CIRCUIT_OPEN, "backend" => name.clone()).set(flag(b.circuit_open));
        gauge!(BACKEND_IN_ROTATION, "backend" => name.clone()).set(flag(b.in_rotation));
        now.insert(name);
    }
    // A removed backend's series stay (the exporter keeps every series it
    // saw): they say it takes no calls, rather than its last state.
    let mut seen = SEEN_BACKENDS.lock().unwrap_or_else(|e| e.into_inner());
    for gone in seen.difference(&now) {
        for g in [BACKEND_IN_FLIGHT, BACKEND_HEALTHY, BACKEND_IN_ROTATION] {
            gauge!(g, "backend" => gone.clone()).set(0.0);
        }
    }
    seen.extend(now);
    drop(seen);
    counter!(STICKY_HITS).absolute(counters.sticky_hits);
    counter!(STICKY_MISSES).absolute(counters.sticky_misses);
    counter!(STICKY_EVICTIONS).absolute(counters.sticky_evictions);
    counter!(MOVES).absolute(counters.moves);
    handle().render()
}
