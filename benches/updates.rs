//! Weight updates in `wait` mode against `abort` mode: how long each update
//! keeps admission paused, and the tokens the fleet generates per second
//! over a run of updates.
//!
//! Mock vLLM backends (in-process, loopback) generate at a fixed token rate
//! per stream and honour `/pause?mode=wait|abort` as vLLM 0.33 does
//! (`common/paced_vllm.rs`). Agents call tito back to back, each on its own
//! trajectory (`/t/{tid}/v1/chat/completions`, even agents streamed, odd
//! ones not); most calls ask for 200 tokens, 5% for 8,000. After a warm-up,
//! a window of fixed length holds evenly spaced two-step updates (`begin
//! {"mode"}`, the trainer's transfer, `commit {"version"}`); the pause of
//! an update is the time from sending `begin` to `commit`'s answer; the
//! throughput is the tokens the backends generated in the window over its
//! length. Each round runs every mode once, the first mode rotating from
//! round to round, each run on a fresh gateway and fresh backends. Every
//! answer is checked (status 200, `finish_reason: "length"`, exactly the
//! tokens asked for); the last column is the tokens the backends generated
//! less those tito recorded (`tito_tokens_total{kind="sampled"}`) and those
//! of requests it withdrew and sent again: 0 when each is accounted for.
//! Run:
//!
//!     cargo bench --bench updates
//!
//! Knobs (environment, defaults in brackets): `TITO_UPDATES_AGENTS` [32],
//! `TITO_UPDATES_BACKENDS` [2], `TITO_UPDATES_TOKEN_US` (µs between two
//! tokens of a stream) [250], `TITO_UPDATES_CHUNK` (tokens a streamed
//! chunk) [4], `TITO_UPDATES_SHORT` [200], `TITO_UPDATES_LONG` [8000],
//! `TITO_UPDATES_LONG_PCT` [5], `TITO_UPDATES_N` (updates a run) [10],
//! `TITO_UPDATES_SECS` (the window) [20], `TITO_UPDATES_ROUNDS` (rounds of
//! one run per mode) [3], `TITO_UPDATES_TRANSFER_MS` (the trainer's
//! transfer between begin and commit) [0], `TITO_UPDATES_CONTEXT` (the
//! length in tokens after which an agent starts a new trajectory) [8192],
//! `TITO_UPDATES_BASELINE=1` (each round also runs without updates, mode
//! `none`) [off].

#[path = "common/load.rs"]
mod load;
#[path = "common/paced_vllm.rs"]
mod paced_vllm;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use load::env_or;
use paced_vllm::PacedVllm;
use serde_json::{json, Value};
use tito::render::testing::chatml_renderer;
use tito::{build_app, AppState, Config};
use tokio::time::Instant;

#[derive(Clone)]
struct Setup {
    agents: usize,
    backends: usize,
    interval: Duration,
    chunk: usize,
    short: usize,
    long: usize,
    long_pct: u64,
    updates: usize,
    window: Duration,
    rounds: usize,
    transfer: Duration,
    context: usize,
    /// Also run without updates, each round: the fleet's rate undisturbed.
    baseline: bool,
}

impl Setup {
    fn from_env() -> Setup {
        let long = env_or("TITO_UPDATES_LONG", 8000usize);
        Setup {
            agents: env_or("TITO_UPDATES_AGENTS", 32usize).max(1),
            backends: env_or("TITO_UPDATES_BACKENDS", 2usize).max(1),
            interval: Duration::from_micros(env_or("TITO_UPDATES_TOKEN_US", 250u64)),
            chunk: env_or("TITO_UPDATES_CHUNK", 4usize).max(1),
            short: env_or("TITO_UPDATES_SHORT", 200usize),
            long,
            long_pct: env_or("TITO_UPDATES_LONG_PCT", 5u64),
            updates: env_or("TITO_UPDATES_N", 10usize).max(1),
            window: Duration::from_secs_f64(env_or("TITO_UPDATES_SECS", 20.0f64)),
            rounds: env_or("TITO_UPDATES_ROUNDS", 3usize).max(1),
            transfer: Duration::from_millis(env_or("TITO_UPDATES_TRANSFER_MS", 0u64)),
            context: env_or("TITO_UPDATES_CONTEXT", 8192usize),
            baseline: env_or("TITO_UPDATES_BASELINE", 0u8) == 1,
        }
    }

    /// The modes each round runs, in its first order.
    fn modes(&self) -> Vec<&'static str> {
        let mut m = vec!["wait", "abort"];
        if self.baseline {
            m.push("none");
        }
        m
    }

    /// How long one long generation takes at the mock's rate.
    fn long_call(&self) -> Duration {
        self.interval * self.long as u32
    }

    fn max_model_len(&self) -> usize {
        self.context + self.long + 1024
    }
}

/// A gateway on a free port over `mocks` (SQLite store in `dir`).
async fn start_tito(s: &Setup, mocks: &[PacedVllm], dir: &std::path::Path) -> String {
    let backends: String = mocks
        .iter()
        .map(|m| format!("[[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n", m.url()))
        .collect();
    let config = Config::from_toml(&format!(
        "[model]\nname = \"m\"\ntokenizer = \"unused\"\nmax_model_len = {}\n{backends}\
         [store]\nurl = \"sqlite://{}/spans.db\"\n",
        s.max_model_len(),
        dir.display()
    ))
    .expect("config");
    let store = tito::store::open(&config.store.url).expect("store");
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, chatml_renderer(), backends, store).expect("state");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        tito::server::serve(
            listener,
            tito::config::DEFAULT_MAX_CONNECTIONS,
            build_app(state),
            std::future::pending(),
        )
        .await;
    });
    format!("http://{addr}")
}

/// xorshift64: the same call lengths, agent by agent, in every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[derive(Default)]
struct AgentTally {
    calls: usize,
    failed: usize,
    first_failure: Option<String>,
}

/// The text and finish of one answer, or why it is not a good one.
async fn call(client: &reqwest::Client, url: &str, body: &Value) -> Result<String, String> {
    let r = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let text = r.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("{status}: {text}"));
    }
    let (mut content, mut finish) = (String::new(), None);
    if body["stream"] == true {
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).map_err(|e| e.to_string())?;
            if v.get("error").is_some() {
                return Err(format!("error chunk: {v}"));
            }
            let c = &v["choices"][0];
            content.push_str(c["delta"]["content"].as_str().unwrap_or(""));
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    } else {
        let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let c = &v["choices"][0];
        content = c["message"]["content"].as_str().unwrap_or("").to_string();
        finish = c["finish_reason"].as_str().map(str::to_string);
    }
    let want = body["max_tokens"].as_u64().unwrap_or(0) as usize;
    if finish.as_deref() != Some("length") || content.len() != want {
        return Err(format!(
            "finish {finish:?} with {} of {want} tokens",
            content.len()
        ));
    }
    Ok(content)
}

/// One agent: calls back to back on its trajectory, a new trajectory once
/// the last one is `context` tokens long, until `stop`.
async fn agent(
    s: Setup,
    client: reqwest::Client,
    base: String,
    i: usize,
    stop: Arc<AtomicBool>,
) -> AgentTally {
    let mut rng =
        Rng((0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)) | 1);
    let mut tally = AgentTally::default();
    let (mut traj, mut messages, mut context) = (0usize, Vec::<Value>::new(), 0usize);
    while !stop.load(Ordering::Relaxed) {
        if messages.is_empty() || context > s.context {
            traj += 1;
            messages = vec![json!({"role": "user", "content": format!("task {i}.{traj}")})];
            context = 32;
        }
        let n = if rng.next() % 100 < s.long_pct {
            s.long
        } else {
            s.short
        };
        let body =
            json!({"model": "m", "messages": messages, "max_tokens": n, "stream": i % 2 == 0});
        let url = format!("{base}/t/agent-{i}-{traj}/v1/chat/completions");
        tally.calls += 1;
        match call(&client, &url, &body).await {
            Ok(text) => {
                context += text.len() + 16;
                messages.push(json!({"role": "assistant", "content": text}));
                messages.push(json!({"role": "user", "content": "go on"}));
            }
            Err(e) => {
                tally.failed += 1;
                tally.first_failure.get_or_insert(e);
                messages.clear();
            }
        }
    }
    tally
}

/// The value of the series `name` (with its labels, as exported).
fn series(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        rest.strip_prefix(' ')?.trim().parse().ok()
    })
}

async fn metrics(client: &reqwest::Client, base: &str) -> String {
    let r = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics");
    r.text().await.expect("metrics text")
}

async fn admin(client: &reqwest::Client, base: &str, path: &str, body: Value) -> Value {
    let r = client
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .expect("admin request");
    let status = r.status();
    let v: Value = r.json().await.expect("admin answer");
    assert!(status.is_success(), "{path}: {status} {v}");
    assert!(v.get("aborted").is_none(), "{path} called off: {v}");
    v
}

struct RunResult {
    round: usize,
    mode: &'static str,
    /// Begin sent to commit answered, per update.
    pauses: Vec<Duration>,
    /// `tito_update_pause_seconds` of this run: sum and count.
    histogram: Option<(f64, f64)>,
    window: Duration,
    /// Tokens the backends generated in the window, per second.
    generated_rate: f64,
    calls: usize,
    /// `tito_calls_interrupted_total` and `tito_calls_resumed_total`.
    interrupted: f64,
    resumed: f64,
    /// Streams whose request the gateway sent again, and their tokens.
    superseded: (u64, u64),
    /// Sampled tokens tito recorded over the whole run, and what the
    /// backends generated.
    recorded_total: Option<f64>,
    generated_total: u64,
}

fn metric_delta(before: &str, after: &str, name: &str) -> Option<f64> {
    Some(series(after, name)? - series(before, name).unwrap_or(0.0))
}

/// A counter's growth: a counter never incremented in this process has no
/// series yet, which is a count of 0.
fn counter_delta(before: &str, after: &str, name: &str) -> f64 {
    series(after, name).unwrap_or(0.0) - series(before, name).unwrap_or(0.0)
}

async fn run(s: &Setup, round: usize, mode: &'static str) -> RunResult {
    let mut mocks = Vec::new();
    for _ in 0..s.backends {
        mocks.push(PacedVllm::start(s.interval, s.chunk).await);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let base = start_tito(s, &mocks, dir.path()).await;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("client");
    admin(&client, &base, "/admin/weights", json!({"version": "v0"})).await;
    let m_start = metrics(&client, &base).await;
    let stop = Arc::new(AtomicBool::new(false));
    let agents: Vec<_> = (0..s.agents)
        .map(|i| {
            tokio::spawn(agent(
                s.clone(),
                client.clone(),
                base.clone(),
                i,
                stop.clone(),
            ))
        })
        .collect();
    let generated = |mocks: &[PacedVllm]| mocks.iter().map(PacedVllm::generated).sum::<u64>();
    // Warm-up: one long generation's time, so that long and short calls mix
    // as they do later.
    tokio::time::sleep(s.long_call()).await;
    let t0 = Instant::now();
    let (g0, m0) = (generated(&mocks), metrics(&client, &base).await);
    let slot = s.window / s.updates as u32;
    let mut pauses = Vec::new();
    let updates = if mode == "none" { 0 } else { s.updates };
    for k in 1..=updates {
        // Each update in the middle of its slot; late if the last one ran over.
        tokio::time::sleep_until(t0 + slot * (k as u32 - 1) + slot / 2).await;
        let sent = Instant::now();
        admin(
            &client,
            &base,
            "/admin/weights/begin",
            json!({"mode": mode}),
        )
        .await;
        tokio::time::sleep(s.transfer).await;
        let version = format!("v{k}");
        admin(
            &client,
            &base,
            "/admin/weights/commit",
            json!({"version": version}),
        )
        .await;
        pauses.push(sent.elapsed());
    }
    tokio::time::sleep_until(t0 + s.window).await;
    let (g1, m1) = (generated(&mocks), metrics(&client, &base).await);
    let window = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut tally = AgentTally::default();
    for a in agents {
        let t = a.await.expect("agent");
        tally.calls += t.calls;
        tally.failed += t.failed;
        if tally.first_failure.is_none() {
            tally.first_failure = t.first_failure;
        }
    }
    assert_eq!(
        tally.failed,
        0,
        "{mode}: {} of {} calls failed, first: {}",
        tally.failed,
        tally.calls,
        tally.first_failure.unwrap_or_default()
    );
    for m in &mocks {
        m.idle().await;
    }
    let m_end = metrics(&client, &base).await;
    let sampled = "tito_tokens_total{kind=\"sampled\"}";
    let sum = format!("tito_update_pause_seconds_sum{{mode=\"{mode}\"}}");
    let count = format!("tito_update_pause_seconds_count{{mode=\"{mode}\"}}");
    let secs = window.as_secs_f64();
    RunResult {
        round,
        mode,
        pauses,
        histogram: metric_delta(&m0, &m1, &sum).zip(metric_delta(&m0, &m1, &count)),
        window,
        generated_rate: (g1 - g0) as f64 / secs,
        calls: tally.calls,
        interrupted: counter_delta(
            &m_start,
            &m_end,
            &format!("tito_calls_interrupted_total{{mode=\"{mode}\"}}"),
        ),
        resumed: counter_delta(&m_start, &m_end, "tito_calls_resumed_total"),
        superseded: paced_vllm::superseded(&mocks),
        recorded_total: metric_delta(&m_start, &m_end, sampled),
        generated_total: generated(&mocks),
    }
}

/// The median; `None` for no values.
fn median_of(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Median and longest pause in ms; `None` without updates.
fn pause_stats(pauses: &[Duration]) -> Option<(f64, f64)> {
    let secs: Vec<f64> = pauses.iter().map(Duration::as_secs_f64).collect();
    let max = secs.iter().copied().fold(0.0, f64::max);
    Some((median_of(secs)? * 1000.0, max * 1000.0))
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "null".to_string(), f)
}

#[tokio::main]
async fn main() {
    let s = Setup::from_env();
    println!(
        "{} agents, {} backends, one token every {} µs a stream ({} a chunk); calls of {} tokens, \
         {}% of {}; {} updates in {:.0} s after a {:.1} s warm-up, transfer {} ms; {} rounds; \
         every agent always generating would make {:.0} tokens/s\n",
        s.agents,
        s.backends,
        s.interval.as_micros(),
        s.chunk,
        s.short,
        s.long_pct,
        s.long,
        s.updates,
        s.window.as_secs_f64(),
        s.long_call().as_secs_f64(),
        s.transfer.as_millis(),
        s.rounds,
        s.agents as f64 / s.interval.as_secs_f64(),
    );
    println!(
        "| round | mode | window s | median pause ms | max pause ms | histogram mean ms | \
         tokens/s | calls | interrupted / resumed | \
         re-sent streams (tokens) | generated - recorded - re-sent |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut results: Vec<RunResult> = Vec::new();
    for round in 1..=s.rounds {
        // Rotate which mode goes first, so none always meets the machine
        // in the state another left it.
        let mut order = s.modes();
        let len = order.len();
        order.rotate_left((round - 1) % len);
        for mode in order {
            let r = run(&s, round, mode).await;
            let stats = pause_stats(&r.pauses);
            let whole = |v: f64| format!("{v:.0}");
            let mean = r
                .histogram
                .filter(|h| h.1 > 0.0)
                .map(|(sum, n)| sum / n * 1000.0);
            let unaccounted = r
                .recorded_total
                .map(|t| r.generated_total as f64 - t - r.superseded.1 as f64);
            println!(
                "| {round} | {mode} | {:.1} | {} | {} | {} | {:.0} | {} | {:.0} / {:.0} | {} ({}) | {} |",
                r.window.as_secs_f64(),
                opt(stats.map(|p| p.0), whole),
                opt(stats.map(|p| p.1), whole),
                opt(mean, whole),
                r.generated_rate,
                r.calls,
                r.interrupted,
                r.resumed,
                r.superseded.0,
                r.superseded.1,
                opt(unaccounted, whole),
            );
            results.push(r);
        }
    }
    println!("\n| mode | median pause ms | max pause ms | tokens/s (median run) |");
    println!("|---|---|---|---|");
    let mut pause_medians = Vec::new();
    for mode in s.modes() {
        let runs: Vec<&RunResult> = results.iter().filter(|r| r.mode == mode).collect();
        let all: Vec<Duration> = runs.iter().flat_map(|r| r.pauses.clone()).collect();
        let stats = pause_stats(&all);
        let rate = median_of(runs.iter().map(|r| r.generated_rate).collect());
        let whole = |v: f64| format!("{v:.0}");
        println!(
            "| {mode} | {} | {} | {} |",
            opt(stats.map(|p| p.0), whole),
            opt(stats.map(|p| p.1), whole),
            opt(rate, whole),
        );
        pause_medians.push(stats.map(|p| p.0));
    }
    let rate = |round: usize, mode: &str| {
        results
            .iter()
            .find(|r| r.round == round && r.mode == mode)
            .map(|r| r.generated_rate)
    };
    // Throughput of `a` over `b`, per round (both ran in each).
    let ratios = |a: &str, b: &str| -> Vec<f64> {
        (1..=s.rounds)
            .filter_map(|round| Some(rate(round, a)? / rate(round, b)?))
            .collect()
    };
    let list = |v: &[f64]| {
        v.iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let per_round = ratios("abort", "wait");
    println!(
        "\nabort / wait: median pause {}x, tokens/s {}x (per round: {})",
        opt(
            pause_medians[1].zip(pause_medians[0]).map(|(a, w)| a / w),
            |v| format!("{v:.3}")
        ),
        opt(median_of(per_round.clone()), |v| format!("{v:.3}")),
        list(&per_round)
    );
    if s.baseline {
        for mode in ["abort", "wait"] {
            let per_round = ratios(mode, "none");
            println!(
                "{mode} / none: tokens/s {}x (per round: {})",
                opt(median_of(per_round.clone()), |v| format!("{v:.3}")),
                list(&per_round)
            );
        }
    }
}
