//! The soak driver behind `scripts/soak.sh` (see docs/reliability.md).
//!
//! `soak mock [--listen ADDR]`: a mock vLLM backend (the one the Rust tests
//! use, tests/common/mock_vllm.rs) in quiet mode, so it keeps nothing per
//! request over a long run. Every completion answers
//! [`REPLY`]: a sentence, a Hermes tool call and `<|im_end|>` in the Qwen3
//! vocabulary. Prints `listening on ADDR`.
//!
//! `soak drive --url URL --pid PID [--agents N] [--minutes M] [--turns T]`:
//! N concurrent agents, each running T-turn tool-calling trajectories
//! against `URL/t/{id}/v1/chat/completions` (history grows by the served
//! assistant message and a tool result each turn; every other trajectory
//! streams), then `POST /v1/trajectories/{id}/finish`, for M minutes. It
//! records every acknowledged call (a 200 answer read to its end), samples
//! the gateway's RSS (`/proc/PID/status`), prints a progress line every
//! 30 s, and at the end exports the store (`GET /v1/export?format=jsonl&
//! layout=trajectory`) and checks that each trajectory holds exactly the
//! calls and sampled tokens its agent saw acknowledged, in one sample
//! (each turn continues the answer tito served). Prints a table; exits 1
//! when a call is lost or extra, a trajectory's tokens differ or it split
//! into several samples, or a 5xx or transport error happened.

#[path = "../../tests/common/mock_vllm.rs"]
mod mock_vllm;

mod agent;

use agent::agent;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};

/// "I will run the tests next.\n<tool_call>\n{"name": "run_command",
/// "arguments": {"cmd": "pytest -q tests"}}\n</tool_call><|im_end|>" in
/// Qwen3 ids.
const REPLY: [u32; 30] = [
    40, 686, 1598, 279, 7032, 1790, 624, 151657, 198, 4913, 606, 788, 330, 6108, 10811, 497, 330,
    16370, 788, 5212, 8710, 788, 330, 26721, 481, 80, 7032, 95642, 151658, 151645,
];

fn usage() -> ! {
    eprintln!(
        "usage: soak mock [--listen ADDR]\n       soak drive --url URL --pid PID [--agents N] [--minutes M] [--turns T] [--db FILE] [--log FILE]"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match args.first().map(String::as_str) {
        Some("mock") => rt.block_on(mock(&args[1..])),
        Some("drive") => {
            let opts = DriveOpts::parse(&args[1..]).unwrap_or_else(|e| {
                eprintln!("soak drive: {e}");
                usage()
            });
            let ok = rt.block_on(drive(opts));
            std::process::exit(if ok { 0 } else { 1 });
        }
        _ => usage(),
    }
}

async fn mock(args: &[String]) {
    let listen = match args {
        [] => "127.0.0.1:0".to_string(),
        [flag, addr] if flag == "--listen" => addr.clone(),
        _ => usage(),
    };
    let mock =
        mock_vllm::MockVllm::start_on(&listen, mock_vllm::Scripted::ids(REPLY.to_vec())).await;
    mock.quiet();
    // Quiet mode keeps no bodies; streamed answers are still logged to
    // `completed` (tests read it): empty it as it fills.
    let state = mock.state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            state.completed.lock().expect("lock").clear();
        }
    });
    println!("listening on {}", mock.addr);
    let _ = std::io::stdout().flush();
    let _ = tokio::signal::ctrl_c().await;
}

struct DriveOpts {
    url: String,
    pid: u32,
    agents: usize,
    minutes: f64,
    turns: usize,
    db: Option<String>,
    log: Option<String>,
}

impl DriveOpts {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = DriveOpts {
            url: String::new(),
            pid: 0,
            agents: 200,
            minutes: 30.0,
            turns: 8,
            db: None,
            log: None,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let bad = |e: &dyn std::fmt::Display| format!("{flag} {v}: {e}");
            match flag.as_str() {
                "--url" => o.url = v.trim_end_matches('/').to_string(),
                "--pid" => o.pid = v.parse().map_err(|e| bad(&e))?,
                "--agents" => o.agents = v.parse().map_err(|e| bad(&e))?,
                "--minutes" => o.minutes = v.parse().map_err(|e| bad(&e))?,
                "--turns" => o.turns = v.parse().map_err(|e| bad(&e))?,
                "--db" => o.db = Some(v.clone()),
                "--log" => o.log = Some(v.clone()),
                _ => return Err(format!("unknown argument {flag:?}")),
            }
        }
        if o.url.is_empty() || o.pid == 0 {
            return Err("--url and --pid are required".into());
        }
        if o.agents == 0 || o.turns == 0 || o.minutes <= 0.0 {
            return Err("--agents, --turns and --minutes must be positive".into());
        }
        Ok(o)
    }
}

/// What the agents saw, shared.
#[derive(Default)]
struct Tally {
    /// Latency of every acknowledged call, microseconds.
    latencies_us: Vec<u32>,
    /// Trajectory id → (acknowledged calls, sampled tokens they reported).
    acked: HashMap<String, (u64, u64)>,
    /// Failed calls by status ("429", "502", "io", "stream").
    errors: BTreeMap<String, u64>,
    /// Failed finish calls by status.
    finish_errors: BTreeMap<String, u64>,
    trajectories_finished: u64,
    /// A few error bodies, to show.
    samples: Vec<String>,
}

struct Shared {
    tally: Mutex<Tally>,
    calls: AtomicU64,
    /// Latencies of the current progress window, microseconds.
    window: Mutex<Vec<u32>>,
}

impl Shared {
    fn error(&self, kind: String, detail: String) {
        let mut t = self.tally.lock().expect("lock");
        *t.errors.entry(kind).or_default() += 1;
        if t.samples.len() < 5 {
            t.samples.push(detail);
        }
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The 1-minute load average (other work on the machine skews latency).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_default()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The `q` quantile of sorted `v`, in milliseconds.
fn pct_ms(v: &[u32], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i] as f64 / 1000.0
}

const SYSTEM: &str = "You are a coding agent. Use the run_command tool to run shell commands \
in the repository, read their output, and keep going until the task is done.";

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string", "description": "the command line"}},
                "required": ["cmd"]
            }
        }
    }])
}

struct RssPoint {
    t: f64,
    kib: u64,
}

/// `tito_hot_trajectory_bytes` from `/metrics`.
/// The gateway's own memory estimates from `/metrics`: the hot trajectory
/// view and the retry cache, in bytes.
async fn gauges(client: &reqwest::Client, base: &str) -> [Option<f64>; 2] {
    let text = match client.get(format!("{base}/metrics")).send().await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let read = |name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))?
            .split_whitespace()
            .last()?
            .parse()
            .ok()
    };
    [
        read("tito_hot_trajectory_bytes"),
        read("tito_retry_cache_bytes"),
    ]
}

/// Per trajectory of the export: (samples, calls on the paths, sampled
/// tokens), and the export's wall time.
async fn export(
    client: &reqwest::Client,
    base: &str,
) -> Result<(HashMap<String, (u64, u64, u64)>, f64, u64), String> {
    let t0 = Instant::now();
    let resp = client
        .get(format!("{base}/v1/export?format=jsonl&layout=trajectory"))
        .timeout(Duration::from_secs(3600))
        .send()
        .await
        .map_err(|e| format!("export: {e:#}"))?;
    if resp.status() != 200 {
        return Err(format!("export: HTTP {}", resp.status()));
    }
    let mut out: HashMap<String, (u64, u64, u64)> = HashMap::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut bytes = 0u64;
    let mut body = resp.bytes_stream();
    let mut handle = |line: &[u8]| -> Result<(), String> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let v: Value = serde_json::from_slice(line).map_err(|e| format!("export line: {e}"))?;
        let tid = v["trajectory_id"].as_str().unwrap_or("").to_string();
        let turns = v["num_turns"].as_u64().unwrap_or(0);
        let sampled = v["response_mask"]
            .as_array()
            .map(|m| m.iter().filter(|x| x.as_u64() == Some(1)).count() as u64)
            .unwrap_or(0);
        let e = out.entry(tid).or_default();
        e.0 += 1;
        e.1 += turns;
        e.2 += sampled;
        Ok(())
    };
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("export body: {e:#}"))?;
        bytes += chunk.len() as u64;
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(p) = buf[start..].iter().position(|&b| b == b'\n') {
            handle(&buf[start..start + p])?;
            start += p + 1;
        }
        buf.drain(..start);
    }
    handle(&buf)?;
    Ok((out, t0.elapsed().as_secs_f64(), bytes))
}

/// The number of calls `GET /v1/trajectories/{id}` lists (None: 404).
async fn stored_calls(client: &reqwest::Client, base: &str, tid: &str) -> Option<u64> {
    let r = client
        .get(format!("{base}/v1/trajectories/{tid}"))
        .send()
        .await
        .ok()?;
    if r.status() != 200 {
        return None;
    }
    let v: Value = r.json().await.ok()?;
    v["calls"].as_array().map(|c| c.len() as u64)
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

async fn drive(o: DriveOpts) -> bool {
    let base = Arc::new(o.url.clone());
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(o.agents + 8)
        .build()
        .expect("http client");
    let run = Duration::from_secs_f64(o.minutes * 60.0);
    let warmup = run.mul_f64(0.1);
    println!(
        "soak: {} agents x {}-turn trajectories for {:.1} min against {} (gateway pid {}); warm-up {:.0} s",
        o.agents,
        o.turns,
        o.minutes,
        o.url,
        o.pid,
        warmup.as_secs_f64()
    );
    let Some(rss_start) = rss_kib(o.pid) else {
        println!("soak: cannot read /proc/{}/status", o.pid);
        return false;
    };
    let gauges_start = gauges(&client, &base).await;
    let load_start = loadavg();
    let shared = Arc::new(Shared {
        tally: Mutex::new(Tally::default()),
        calls: AtomicU64::new(0),
        window: Mutex::new(Vec::new()),
    });
    let start = Instant::now();
    let deadline = start + run;
    let mut agents = Vec::new();
    for a in 0..o.agents {
        agents.push(tokio::spawn(agent(
            a,
            client.clone(),
            base.clone(),
            o.turns,
            deadline,
            shared.clone(),
        )));
    }

    // RSS every second; a progress line every 30 s.
    let mut rss: Vec<RssPoint> = vec![RssPoint {
        t: 0.0,
        kib: rss_start,
    }];
    let mut warm: Option<(RssPoint, u64, [Option<f64>; 2])> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_progress = Instant::now();
    let mut last_calls = 0u64;
    let mut gateway_died = false;
    while Instant::now() < deadline {
        tick.tick().await;
        let t = start.elapsed().as_secs_f64();
        match rss_kib(o.pid) {
            Some(kib) => rss.push(RssPoint { t, kib }),
            None => {
                println!("soak: the gateway (pid {}) is gone at {t:.0} s", o.pid);
                gateway_died = true;
                break;
            }
        }
        let calls = shared.calls.load(Ordering::Relaxed);
        if warm.is_none() && start.elapsed() >= warmup {
            let kib = rss.last().map(|p| p.kib).unwrap_or(0);
            warm = Some((RssPoint { t, kib }, calls, gauges(&client, &base).await));
        }
        if last_progress.elapsed() >= Duration::from_secs(30) {
            let mut w = std::mem::take(&mut *shared.window.lock().expect("lock"));
            w.sort_unstable();
            let dt = last_progress.elapsed().as_secs_f64();
            let (errs, fin) = {
                let t = shared.tally.lock().expect("lock");
                (t.errors.values().sum::<u64>(), t.trajectories_finished)
            };
            println!(
                "[{:>5.0} s] calls {calls} ({:.0}/s)  trajectories finished {fin}  errors {errs}  latency p50 {:.1} ms p99 {:.1} ms  RSS {:.1} MiB  load {}",
                t,
                (calls - last_calls) as f64 / dt,
                pct_ms(&w, 0.5),
                pct_ms(&w, 0.99),
                mib(rss.last().map(|p| p.kib).unwrap_or(0)),
                loadavg(),
            );
            let _ = std::io::stdout().flush();
            last_calls = calls;
            last_progress = Instant::now();
        }
    }
    for a in agents {
        let _ = a.await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let rss_end = rss_kib(o.pid);
    let load_end = loadavg();
    let gauges_end = gauges(&client, &base).await;
    let rss_max = rss.iter().map(|p| p.kib).max().unwrap_or(0);
    let (warm_rss, warm_calls, gauges_warm) = match warm {
        Some((p, c, h)) => (Some(p), c, h),
        None => (None, 0, [None, None]),
    };
    let mut tally = std::mem::take(&mut *shared.tally.lock().expect("lock"));
    tally.latencies_us.sort_unstable();
    let acked_calls: u64 = tally.acked.values().map(|v| v.0).sum();
    let acked_tokens: u64 = tally.acked.values().map(|v| v.1).sum();
    println!(
        "soak: load done after {elapsed:.0} s: {acked_calls} calls acknowledged in {} trajectories; exporting",
        tally.acked.len()
    );
    let _ = std::io::stdout().flush();

    // Every acknowledged call is in the store, nothing else is.
    let mut lost = 0u64;
    let mut extra = 0u64;
    let mut token_mismatch = 0u64;
    let mut split = 0u64;
    let mut shown = 0;
    let mut export_line = String::from("failed");
    let mut exported_calls = 0u64;
    let mut rss_after_export = None;
    let mut export_ok = false;
    if !gateway_died {
        match export(&client, &base).await {
            Ok((rows, secs, bytes)) => {
                export_ok = true;
                rss_after_export = rss_kib(o.pid);
                export_line = format!(
                    "{} trajectories, {:.1} MiB in {secs:.1} s",
                    rows.len(),
                    bytes as f64 / 1048576.0
                );
                let mut ids: Vec<&String> = tally.acked.keys().chain(rows.keys()).collect();
                ids.sort();
                ids.dedup();
                for tid in ids {
                    let (want, want_tok) = tally.acked.get(tid).copied().unwrap_or((0, 0));
                    let (samples, turns, tok) = rows.get(tid).copied().unwrap_or((0, 0, 0));
                    // One linear sample per trajectory: its num_turns is the
                    // call count. Anything else: count the store's calls.
                    let have = if samples == 1 {
                        turns
                    } else {
                        stored_calls(&client, &base, tid).await.unwrap_or(0)
                    };
                    exported_calls += have;
                    if have < want {
                        lost += want - have;
                    } else {
                        extra += have - want;
                    }
                    if samples == 1 && have == want && tok != want_tok {
                        token_mismatch += 1;
                    }
                    // Every turn continues the served answer: a second
                    // sample means tito did not recognise its own answer.
                    if samples > 1 {
                        split += 1;
                    }
                    if (have != want || samples > 1 || (samples == 1 && tok != want_tok))
                        && shown < 10
                    {
                        shown += 1;
                        println!(
                            "  mismatch {tid}: acknowledged {want} calls / {want_tok} tokens; export: {samples} samples, {turns} turns, {tok} sampled tokens; store: {have} calls"
                        );
                    }
                }
            }
            Err(e) => println!("soak: {e}"),
        }
    }

    // The table.
    let warm_kib = warm_rss.as_ref().map(|p| p.kib);
    let growth = match (warm_kib, rss_end) {
        (Some(w), Some(e)) if w > 0 => Some((e as f64 - w as f64) / w as f64 * 100.0),
        _ => None,
    };
    let fivexx: u64 = tally
        .errors
        .iter()
        .filter(|(k, _)| k.starts_with('5'))
        .map(|(_, v)| v)
        .sum::<u64>()
        + tally
            .finish_errors
            .iter()
            .filter(|(k, _)| k.starts_with('5'))
            .map(|(_, v)| v)
            .sum::<u64>();
    let transport = tally.errors.get("io").copied().unwrap_or(0)
        + tally.errors.get("stream").copied().unwrap_or(0)
        + tally.finish_errors.get("io").copied().unwrap_or(0);
    let fmt_map = |m: &BTreeMap<String, u64>| {
        if m.is_empty() {
            "none".to_string()
        } else {
            m.iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let opt_mib = |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.1} MiB", mib(k)));
    let opt_mib_f = |h: Option<f64>| h.map_or("-".into(), |h| format!("{:.1} MiB", h / 1048576.0));
    // One of [`gauges`]' series at the start, at warm-up and at the end.
    let gauge_row = |i: usize| {
        format!(
            "{} / {} / {}",
            opt_mib_f(gauges_start[i]),
            opt_mib_f(gauges_warm[i]),
            opt_mib_f(gauges_end[i])
        )
    };
    let lat = &tally.latencies_us;
    let rows: Vec<(&str, String)> = vec![
        ("agents x turns", format!("{} x {}", o.agents, o.turns)),
        (
            "duration",
            format!("{elapsed:.0} s (warm-up {:.0} s)", warmup.as_secs_f64()),
        ),
        (
            "machine load (1-min avg) start / end",
            format!("{load_start} / {load_end}"),
        ),
        ("calls acknowledged", acked_calls.to_string()),
        (
            "throughput",
            format!("{:.0} calls/s", acked_calls as f64 / elapsed),
        ),
        (
            "trajectories",
            format!(
                "{} with calls, {} finished",
                tally.acked.len(),
                tally.trajectories_finished
            ),
        ),
        (
            "latency p50 / p90 / p99 / max",
            format!(
                "{:.1} / {:.1} / {:.1} / {:.1} ms",
                pct_ms(lat, 0.5),
                pct_ms(lat, 0.9),
                pct_ms(lat, 0.99),
                pct_ms(lat, 1.0)
            ),
        ),
        ("call errors by status", fmt_map(&tally.errors)),
        ("finish errors by status", fmt_map(&tally.finish_errors)),
        ("RSS start", opt_mib(Some(rss_start))),
        (
            "RSS after warm-up",
            match &warm_rss {
                Some(p) => format!(
                    "{} (at {:.0} s, {warm_calls} calls)",
                    opt_mib(Some(p.kib)),
                    p.t
                ),
                None => "-".into(),
            },
        ),
        ("RSS end of load", opt_mib(rss_end)),
        ("RSS max during load", opt_mib(Some(rss_max))),
        (
            "RSS growth after warm-up",
            growth.map_or("-".into(), |g| format!("{g:+.1} %")),
        ),
        ("RSS after export", opt_mib(rss_after_export)),
        ("hot view start / warm-up / end", gauge_row(0)),
        ("retry cache start / warm-up / end", gauge_row(1)),
        ("export", export_line),
        ("sampled tokens acknowledged", acked_tokens.to_string()),
        ("calls in export", exported_calls.to_string()),
        (
            "lost calls (acknowledged, not stored)",
            if export_ok {
                lost.to_string()
            } else {
                "unknown".into()
            },
        ),
        (
            "extra calls (stored, not acknowledged)",
            if export_ok {
                extra.to_string()
            } else {
                "unknown".into()
            },
        ),
        (
            "trajectories with other sampled tokens",
            if export_ok {
                token_mismatch.to_string()
            } else {
                "unknown".into()
            },
        ),
        (
            "trajectories split into several samples",
            if export_ok {
                split.to_string()
            } else {
                "unknown".into()
            },
        ),
    ];
    let mut rows = rows;
    if let Some(db) = &o.db {
        let size: u64 = ["", "-wal", "-shm"]
            .iter()
            .filter_map(|s| std::fs::metadata(format!("{db}{s}")).ok())
            .map(|m| m.len())
            .sum();
        rows.push((
            "store size (sqlite + wal)",
            format!("{:.1} MiB", size as f64 / 1048576.0),
        ));
    }
    if let Some(log) = &o.log {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let panics = text.lines().filter(|l| l.contains("panicked")).count();
        let errors = text.lines().filter(|l| l.contains(" ERROR ")).count();
        let warns = text.lines().filter(|l| l.contains(" WARN ")).count();
        rows.push((
            "gateway log",
            format!("{panics} panics, {errors} ERROR, {warns} WARN lines"),
        ));
    }
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    println!();
    println!("| {:width$} | value |", "soak figure");
    println!("|{}|---|", "-".repeat(width + 2));
    for (k, v) in &rows {
        println!("| {k:width$} | {v} |");
    }
    for s in &tally.samples {
        if !s.is_empty() {
            println!(
                "  error sample: {}",
                s.chars().take(300).collect::<String>()
            );
        }
    }
    let mut ok = true;
    let mut why = Vec::new();
    if gateway_died || !alive(o.pid) {
        ok = false;
        why.push("the gateway died".to_string());
    }
    if !export_ok {
        ok = false;
        why.push("the export failed".to_string());
    }
    if lost > 0 || extra > 0 {
        ok = false;
        why.push(format!("{lost} lost and {extra} extra calls"));
    }
    if token_mismatch > 0 {
        ok = false;
        why.push(format!(
            "{token_mismatch} trajectories with other sampled tokens"
        ));
    }
    if split > 0 {
        ok = false;
        why.push(format!(
            "{split} trajectories split into several samples (a turn did not continue the answer tito served)"
        ));
    }
    if fivexx > 0 {
        ok = false;
        why.push(format!("{fivexx} 5xx answers"));
    }
    if transport > 0 {
        ok = false;
        why.push(format!("{transport} transport / stream errors"));
    }
    if acked_calls == 0 {
        ok = false;
        why.push("no call was acknowledged".to_string());
    }
    if ok {
        println!("\nsoak: PASS");
    } else {
        println!("\nsoak: FAIL: {}", why.join("; "));
    }
    ok
}
