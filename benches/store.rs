//! Span store ingest (calls/s with durability on, group commit under
//! concurrent appenders), export throughput (tokens/s to Parquet / JSONL),
//! and a consumer's lease on a store whose trajectories it has all
//! acknowledged (time per lease as the store grows).
//!
//! `scripts/bench-store.sh` (a throwaway PostgreSQL cluster, then `cargo
//! bench --bench store`; without `TITO_BENCH_POSTGRES` only SQLite runs).
//! Ingest reports calls/s; each case's name carries its tokens per call
//! (200 + 100 or 4,096 + 1,024): multiply for tokens/s.

#[path = "../tests/store_support/mod.rs"]
mod store_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use tito::export::{export, ExportOptions, Format, Layout};
use tito::store::{CallRecord, DynStore, TrajectoryFilter};

fn call(traj: &str, i: u32, delta: u32, sampled: u32) -> CallRecord {
    CallRecord {
        trajectory_id: traj.into(),
        call_index: i,
        sample_index: 0,
        parent_call: i.checked_sub(1),
        backend: "http://127.0.0.1:8001".into(),
        started_at: 0,
        finished_at: 0,
        prompt_delta_ids: (0..delta).map(|k| (k * 7919 + i) % 151_000).collect(),
        sampled_ids: (0..sampled).map(|k| (k * 104_729 + i) % 151_000).collect(),
        logprobs: (0..sampled).map(|k| Some(-(k as f32) / 1000.0)).collect(),
        finish_reason: "stop".into(),
        request: json!({"messages": [{"role": "tool", "content": "result"}], "temperature": 1.0})
            .into(),
        response: json!({"role": "assistant", "content": "text"}).into(),
        drift: None,
        parse_outcome: Some("ok".into()),
        moved_from: None,
        weight_version: Some("step-1".into()),
        tokenizer_sha256: "a".repeat(64),
        template_sha256: "b".repeat(64),
        reward: None,
        truncated: false,
        normalized: Vec::new(),
        request_of: None,
        api: None,
        response_id: None,
        versions: Vec::new(),
        images: Vec::new(),
        model: None,
        adapter: None,
    }
}

/// `total` calls of `delta` + `sampled` tokens from `conc` tasks, each
/// appending a chain to its own trajectory, every append awaited
/// (acknowledged after commit).
async fn ingest_batch(store: &DynStore, conc: u64, total: u64, round: u64, size: (u32, u32)) {
    let mut tasks = Vec::new();
    for t in 0..conc {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("r{round}-{t}");
            for i in 0..(total / conc) as u32 {
                let c = call(&id, i, size.0, size.1);
                if let Err(e) = store.append_call(c).await {
                    panic!("append failed: {e}");
                }
            }
        }));
    }
    for t in tasks {
        if let Err(e) = t.await {
            panic!("task failed: {e}");
        }
    }
}

/// The multi-threaded runtime each bench group drives its store from.
fn runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("runtime: {e}"),
    }
}

/// A fresh SQLite store at the default durability in a new temporary
/// folder (kept alive by the returned guard).
fn sqlite_normal() -> (tempfile::TempDir, DynStore) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let url = format!(
        "sqlite://{}/spans.db?synchronous=normal",
        dir.path().display()
    );
    let store = tito::store::open(&url).unwrap_or_else(|e| panic!("open: {e}"));
    (dir, store)
}

/// A fresh database on the cluster `scripts/bench-store.sh` starts
/// (`TITO_BENCH_POSTGRES`, its base URL), or `None` without one.
fn postgres_url() -> Option<String> {
    let base = std::env::var("TITO_BENCH_POSTGRES").ok()?;
    Some(store_support::postgres_database(&base))
}

fn ingest(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("store_ingest_calls");
    g.sample_size(10);
    // (store, appenders, calls per iteration, (prompt-delta ids, sampled ids))
    let small = (200, 100);
    let large = (4096, 1024);
    let mut cases = vec![
        ("sqlite_full", 1u64, 100u64, small),
        ("sqlite_full", 64, 2048, small),
        ("sqlite_normal", 1, 100, small),
        ("sqlite_normal", 64, 2048, small),
        ("sqlite_normal", 64, 1024, large),
    ];
    let postgres = postgres_url();
    if postgres.is_some() {
        cases.extend([
            ("postgres", 1, 100, small),
            ("postgres", 64, 2048, small),
            ("postgres", 64, 1024, large),
        ]);
    } else {
        eprintln!("TITO_BENCH_POSTGRES unset: no postgres rows (scripts/bench-store.sh sets it)");
    }
    for (kind, conc, total, size) in cases {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let url = match (kind, &postgres) {
            ("postgres", Some(_)) => postgres_url().unwrap_or_else(|| panic!("postgres url")),
            ("sqlite_full", _) => format!(
                "sqlite://{}/spans.db?synchronous=full",
                dir.path().display()
            ),
            _ => format!(
                "sqlite://{}/spans.db?synchronous=normal",
                dir.path().display()
            ),
        };
        let store = tito::store::open(&url).unwrap_or_else(|e| panic!("open: {e}"));
        let round = AtomicU64::new(0);
        let tokens = u64::from(size.0 + size.1);
        g.throughput(Throughput::Elements(total));
        g.bench_function(
            BenchmarkId::new(kind, format!("{conc}_appenders_{tokens}_tokens")),
            |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            let r = round.fetch_add(1, Ordering::Relaxed);
                            ingest_batch(&store, conc, total, r, size).await;
                        }
                        start.elapsed()
                    })
                })
            },
        );
        // The store's writer commits what is queued before the next case.
        drop(store);
    }
    g.finish();
}

fn export_tokens(c: &mut Criterion) {
    let rt = runtime();
    let (_dir, store) = sqlite_normal();
    // 100 trajectories x 8 turns: a 1000-id prompt, then 50 observation ids
    // and 200 sampled ids per turn (~2950 tokens per sample).
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..100 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let id = format!("t-{t}");
                for i in 0..8u32 {
                    let delta = if i == 0 { 1000 } else { 50 };
                    if let Err(e) = store.append_call(call(&id, i, delta, 200)).await {
                        panic!("append: {e}");
                    }
                }
            }));
        }
        for t in tasks {
            if let Err(e) = t.await {
                panic!("{e}");
            }
        }
    });
    let store: Arc<dyn tito::store::SpanStore> = store;
    let mut g = c.benchmark_group("export_tokens");
    g.sample_size(10);
    let cases = [
        ("parquet_trajectory", Format::Parquet, Layout::Trajectory),
        ("parquet_verl", Format::Parquet, Layout::Verl),
        ("jsonl_trajectory", Format::Jsonl, Layout::Trajectory),
    ];
    for (name, format, layout) in cases {
        let mut opts = ExportOptions::new(format, layout);
        if layout == Layout::Verl {
            opts.prompt_length = Some(1024);
            opts.response_length = Some(2048);
        }
        let run = || {
            let it = store
                .scan(&TrajectoryFilter::default())
                .unwrap_or_else(|e| panic!("scan: {e}"));
            export(it, &*store, &opts, std::io::sink(), &mut |_| {})
                .unwrap_or_else(|e| panic!("export: {e}"))
        };
        let tokens = run().tokens;
        g.throughput(Throughput::Elements(tokens));
        g.bench_function(name, |b| b.iter(run));
    }
    g.finish();
}

/// One consumer lease (limit 100) on a store whose `n` finished
/// trajectories that consumer has all acknowledged, so nothing is left to
/// lease: what a trainer polling for new data pays as the store grows. The
/// store's oldest trajectory is an abandoned one, never finished. A lease
/// runs on the store's writer, so commits wait for it.
fn lease_after_acks(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("store_lease_all_acked");
    g.sample_size(10);
    let postgres = std::env::var("TITO_BENCH_POSTGRES").is_ok();
    for (kind, n) in [
        ("sqlite", 2_000u32),
        ("sqlite", 20_000),
        ("postgres", 2_000),
        ("postgres", 20_000),
    ] {
        let (_dir, pg, store) = match kind {
            "postgres" if postgres => {
                let url = postgres_url().unwrap_or_else(|| panic!("postgres url"));
                let store = tito::store::open(&url).unwrap_or_else(|e| panic!("open: {e}"));
                (None, Some(url), store)
            }
            "postgres" => continue,
            _ => {
                let (dir, store) = sqlite_normal();
                (Some(dir), None, store)
            }
        };
        let filter = TrajectoryFilter::default();
        rt.block_on(async {
            if let Err(e) = store.append_call(call("abandoned", 0, 200, 100)).await {
                panic!("append: {e}");
            }
            // `n` one-call trajectories from 64 appenders, each finished.
            let mut tasks = Vec::new();
            for t in 0..64 {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    for k in (t..n).step_by(64) {
                        let id = format!("l-{k}");
                        if let Err(e) = store.append_call(call(&id, 0, 200, 100)).await {
                            panic!("append: {e}");
                        }
                        if let Err(e) = store.finish(&id).await {
                            panic!("finish: {e}");
                        }
                    }
                }));
            }
            for t in tasks {
                if let Err(e) = t.await {
                    panic!("task failed: {e}");
                }
            }
            // The consumer takes and acknowledges all of them.
            let mut acked = 0;
            loop {
                let lease = match store.lease("trainer", &filter, 500, 600_000).await {
                    Ok(l) => l,
                    Err(e) => panic!("lease: {e}"),
                };
                let Some(cursor) = lease.cursor else { break };
                acked += lease.ids.len();
                if let Err(e) = store.ack("trainer", &cursor).await {
                    panic!("ack: {e}");
                }
            }
            assert_eq!(acked, n as usize, "every trajectory leased once");
            // The statistics autovacuum keeps for a store that has served a
            // while. Without them, right after the load, the planner works
            // from figures taken mid-load and scans the table
            // (docs/benchmarks.md, "A consumer's lease as the store grows").
            if let Some(url) = &pg {
                let client = store_support::pg_session(url).await;
                if let Err(e) = client.batch_execute("ANALYZE").await {
                    panic!("analyze: {e}");
                }
            }
        });
        g.bench_function(BenchmarkId::new(kind, n), |b| {
            b.iter(|| {
                rt.block_on(async {
                    match store.lease("trainer", &filter, 100, 600_000).await {
                        Ok(l) => assert!(l.ids.is_empty(), "all were acknowledged"),
                        Err(e) => panic!("lease: {e}"),
                    }
                })
            })
        });
        drop(store);
    }
    g.finish();
}

criterion_group!(benches, ingest, export_tokens, lease_after_acks);
criterion_main!(benches);
