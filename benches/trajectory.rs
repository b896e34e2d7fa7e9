//! Per-turn prompt cost in a long trajectory: turn 50 of a ~32k-token
//! conversation on the Qwen3 tokenizer, built three ways in the same run:
//!
//! - tito exact mode (`Trajectories::prepare_chat`: earlier prompt + sampled
//!   ids reused; only the new messages are tokenized; drift check by text),
//! - a full re-render + tokenization of the whole conversation in tito,
//! - Python `transformers` `apply_chat_template(tokenize=True)` (when
//!   `.venv` exists), on the same messages.
//!
//! The 49 turns before it are recorded with the body a client sends (the
//! whole history each time); the bench prints those bodies' bytes against
//! the token data's, and appends the same calls to a new SQLite store:
//! the appends' time, the file's size, and reading the trajectory back; and
//! turn 50 on a fresh `Trajectories` over that store (a gateway that just
//! started: the history rebuilt from the store, then the prepare).
//!
//! Run: `scripts/fetch-tokenizers.sh && scripts/setup-python.sh`, then
//! `cargo bench --bench trajectory`. `TITO_BENCH_COLD_REPS=N` repeats the
//! first call after a restart N times (default 15), e.g. for a profile.
//! `TITO_BENCH_POSTGRES=<url>` adds turn 50 on a gateway replica whose view
//! is one call behind a PostgreSQL store (another replica served turn 49);
//! the URL names a database, e.g. the `postgres` one of the cluster that
//! `scripts/postgres.sh start DIR` prints.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tito::config::{ModelConfig, TrajectoryConfig};
use tito::render::{RenderInput, Renderer};
use tito::store::CallRecord;
use tito::trajectory::{testing, ChatInput, Trajectories};

const TURNS: usize = 50;
const REPS: usize = 15;

fn words(seed: usize, n: usize) -> String {
    const W: &[&str] = &[
        "alpha", "beta", "gamma", "delta", "tokens", "reward", "policy", "agent", "tool", "value",
    ];
    (0..n)
        .map(|i| W[(seed * 7 + i * 3) % W.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Bytes of the recorded calls: each request body as JSON text (what a
/// store that keeps bodies whole writes); prompt-delta and sampled ids,
/// 4 bytes each, and a 4-byte logprob per sampled id (the stores' layout).
struct StoreBytes {
    requests: usize,
    tokens: usize,
    last_request: usize,
}

async fn store_bytes(traj: &Trajectories) -> (StoreBytes, Vec<CallRecord>) {
    let t = traj
        .store()
        .get_trajectory("bench")
        .await
        .expect("read")
        .expect("stored");
    let sizes: Vec<usize> = t
        .calls
        .iter()
        .map(|c| c.request.to_string().len())
        .collect();
    let bytes = StoreBytes {
        requests: sizes.iter().sum(),
        tokens: t
            .calls
            .iter()
            .map(|c| 4 * (c.prompt_delta_ids.len() + 2 * c.sampled_ids.len()))
            .sum(),
        last_request: sizes.last().copied().unwrap_or(0),
    };
    (bytes, t.calls)
}

/// The same calls appended one by one to a new SQLite store (left in
/// `dir`): the time the appends took, the database's size once the store is
/// closed, and the time to read the trajectory back from it reopened.
async fn sqlite_of(dir: &tempfile::TempDir, calls: &[CallRecord]) -> (Duration, u64, Duration) {
    let path = dir.path().join("spans.db");
    let store = tito::store::open(&format!("sqlite://{}", path.display())).expect("sqlite");
    let started = Instant::now();
    for c in calls {
        store.append_call(c.clone()).await.expect("append");
    }
    let took = started.elapsed();
    drop(store);
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
    let wal = dir.path().join("spans.db-wal");
    let bytes = size(&path) + size(&wal);
    let store = tito::store::open(&format!("sqlite://{}", path.display())).expect("reopen");
    let started = Instant::now();
    let read = store.get_trajectory("bench").await.expect("read");
    let read_took = started.elapsed();
    assert_eq!(
        read.map(|t| t.calls).as_deref(),
        Some(calls),
        "read back whole"
    );
    (took, bytes, read_took)
}

/// Turn 50 on a gateway replica that served turn 48 while another replica
/// served turn 49, over one PostgreSQL store at `url`: the replica's view
/// holds 48 calls and the store 49, so it reads what it lacks, then
/// prepares. The median of [`REPS`], each on a trajectory of its own.
async fn replica_behind(
    url: &str,
    renderer: &Arc<Renderer>,
    calls: &[CallRecord],
    messages: &[Value],
    want: &[u32],
) -> Duration {
    let store = tito::store::open(url).expect("postgres");
    let input = |messages| ChatInput {
        messages,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    };
    let (last, before) = calls.split_last().expect("calls");
    let run = std::process::id();
    let mut took = Vec::new();
    for rep in 0..REPS {
        let tid = format!("bench-behind-{run}-{rep}");
        let as_tid = |c: &CallRecord| CallRecord {
            trajectory_id: tid.clone(),
            ..c.clone()
        };
        for c in before {
            store.append_call(as_tid(c)).await.expect("append");
        }
        let replica =
            Trajectories::new(store.clone(), renderer.clone(), TrajectoryConfig::default());
        // Its view of the 48 calls, as when it prepared turn 49 (the
        // system message, 48 turns and turn 49's user message).
        let turn_49 = &messages[..messages.len() - 2];
        drop(
            replica
                .prepare_chat(&tid, input(turn_49))
                .await
                .expect("prepare"),
        );
        store.append_call(as_tid(last)).await.expect("append");
        let t = Instant::now();
        let p = replica
            .prepare_chat(&tid, input(messages))
            .await
            .expect("prepare");
        took.push(t.elapsed());
        assert_eq!(p.prompt_ids[..], *want, "caught up == hot");
    }
    median(took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join(".cache/tokenizers/qwen3");
    if !dir.join("tokenizer.json").exists() {
        eprintln!("skipped: run scripts/fetch-tokenizers.sh first");
        return;
    }
    let renderer: Arc<Renderer> = Renderer::load(&ModelConfig {
        tokenizer: dir.clone(),
        ..Default::default()
    })
    .expect("qwen3");
    let im_end = renderer.token_to_id("<|im_end|>").expect("im_end");
    let store = tito::store::open("memory://").expect("store");
    let traj = Trajectories::new(store, renderer.clone(), TrajectoryConfig::default());
    let mut messages: Vec<Value> = vec![json!({"role": "system", "content": "You are an agent."})];
    // 49 served turns, each ~320 user + ~320 assistant tokens.
    let served = Instant::now();
    for t in 0..TURNS - 1 {
        messages.push(json!({"role": "user", "content": words(t, 300)}));
        let input = ChatInput {
            messages: &messages,
            tools: None,
            kwargs: None,
            add_generation_prompt: true,
        };
        let prepared = traj.prepare_chat("bench", input).await.expect("prepare");
        let reply = words(t + 1000, 300);
        let sampled = [renderer.encode(&reply).expect("enc"), vec![im_end]].concat();
        // The body a client sends (its whole history), as a call stores it.
        let body = json!({"model": "qwen3", "messages": messages});
        let ctx = testing::context("bench", body, Some(messages.clone()));
        let served = json!({"role": "assistant", "content": reply});
        let outcome = testing::stopped(sampled, served);
        traj.commit(&ctx, &prepared, vec![outcome], None)
            .await
            .expect("commit");
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    let served = served.elapsed();
    let (stored, calls) = store_bytes(&traj).await;
    let dir_db = tempfile::tempdir().expect("tempdir");
    let (appended, sqlite_bytes, read) = sqlite_of(&dir_db, &calls).await;
    messages.push(json!({"role": "user", "content": words(TURNS, 300)}));
    let input = ChatInput {
        messages: &messages,
        tools: None,
        kwargs: None,
        add_generation_prompt: true,
    };
    let prepared = traj.prepare_chat("bench", input).await.expect("prepare");
    let tokens = prepared.prompt_ids.len();
    let exact: Vec<Duration> = {
        let mut v = Vec::new();
        for _ in 0..REPS {
            let t = Instant::now();
            let p = traj.prepare_chat("bench", input).await.expect("prepare");
            v.push(t.elapsed());
            assert!(p.drift.is_none(), "this conversation renders without drift");
        }
        v
    };
    // The same turn on a gateway that just started: its hot view rebuilt
    // from the SQLite store holding the 49 calls, then the prepare.
    let url = format!("sqlite://{}", dir_db.path().join("spans.db").display());
    let mut cold = Vec::new();
    let cold_reps: usize = std::env::var("TITO_BENCH_COLD_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(REPS);
    for _ in 0..cold_reps {
        let store = tito::store::open(&url).expect("reopen");
        let fresh = Trajectories::new(store, renderer.clone(), TrajectoryConfig::default());
        let t = Instant::now();
        let p = fresh.prepare_chat("bench", input).await.expect("prepare");
        cold.push(t.elapsed());
        assert_eq!(p.prompt_ids, prepared.prompt_ids, "rebuilt == hot");
    }
    let behind = match std::env::var("TITO_BENCH_POSTGRES") {
        Ok(url) => {
            Some(replica_behind(&url, &renderer, &calls, &messages, &prepared.prompt_ids).await)
        }
        Err(_) => None,
    };
    let full: Vec<Duration> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            let ids = renderer
                .render_ids(&RenderInput {
                    messages: &messages,
                    tools: None,
                    add_generation_prompt: true,
                    kwargs: None,
                })
                .expect("render");
            assert_eq!(ids.len(), tokens, "full render == exact prompt length");
            t.elapsed()
        })
        .collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (e, f) = (median(exact), median(full));
    println!(
        "{} turns prepared and recorded (memory store, sampled ids encoded by the bench): {:.1} ms",
        TURNS - 1,
        served.as_secs_f64() * 1000.0
    );
    println!(
        "their request bodies as JSON text {:.2} MB (what a store keeping each body whole writes), token ids and logprobs {:.2} MB ({:.1}x); the last call's body {:.0} KB",
        stored.requests as f64 / 1e6,
        stored.tokens as f64 / 1e6,
        stored.requests as f64 / stored.tokens as f64,
        stored.last_request as f64 / 1e3
    );
    println!(
        "the same calls appended to a new SQLite store: {:.1} ms; its file once closed {:.2} MB; the trajectory read back from it {:.1} ms",
        appended.as_secs_f64() * 1000.0,
        sqlite_bytes as f64 / 1e6,
        read.as_secs_f64() * 1000.0
    );
    println!("turn {TURNS} of a {tokens}-token trajectory (qwen3), median of {REPS}");
    println!("| method | ms | vs exact |");
    println!("|---|---|---|");
    println!("| tito exact (prepare_chat) | {:.2} | 1.00x |", ms(e));
    let c = median(cold);
    println!(
        "| tito exact, first call after a restart (history rebuilt from SQLite) | {:.2} | {:.1}x |",
        ms(c),
        ms(c) / ms(e)
    );
    if let Some(b) = behind {
        println!(
            "| tito exact, a replica one call behind (the call read from PostgreSQL) | {:.2} | {:.1}x |",
            ms(b),
            ms(b) / ms(e)
        );
    }
    println!(
        "| tito full re-render + tokenize | {:.2} | {:.1}x |",
        ms(f),
        ms(f) / ms(e)
    );
    let py = root.join(".venv/bin/python");
    if py.exists() {
        let conv = std::env::temp_dir().join("tito-bench-conv.json");
        std::fs::write(&conv, serde_json::to_string(&messages).expect("json")).expect("write");
        let out = std::process::Command::new(py)
            .arg(root.join("scripts/bench_apply_chat_template.py"))
            .arg(&dir)
            .arg(&conv)
            .arg(REPS.to_string())
            .output();
        match out {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                let mut parts = text.split_whitespace();
                let (py_ms, py_tokens) = (
                    parts.next().and_then(|s| s.parse::<f64>().ok()),
                    parts.next(),
                );
                if let Some(p) = py_ms {
                    println!(
                        "| transformers apply_chat_template | {p:.2} | {:.1}x |",
                        p / ms(e)
                    );
                    println!(
                        "(transformers produced {} tokens)",
                        py_tokens.unwrap_or("?")
                    );
                }
            }
            Ok(o) => eprintln!(
                "python bench failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("python bench not run: {e}"),
        }
    }
}
