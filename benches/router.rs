//! Router hot path: `route()` + dropping the route, with 3 backends.
//! - sticky_hit: a trajectory already pinned (100k pins in the map).
//! - new_trajectory: a first call (miss, policy pick, insert, LRU eviction
//!   once the 100k map is full), per policy.
//! - contended_2_threads: two OS threads routing at once (least_requests),
//!   each iteration is one call on each thread:
//!   - evicting: random ids from 80k over a 20k map (about 1 hit in 4; each
//!     miss evicts);
//!   - sticky_hit: random ids from 20k, all pinned (100k map).
//! - policies/{1,8,64}: a call on one of N served policies (the model and
//!   N - 1 LoRA adapters, picked in turn): the adapter looked up and its
//!   share taken (`Adapters::is_loaded` + `share`), then a sticky hit, and
//!   both dropped.
//!
//! Run: `cargo bench --bench router`

#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tito::backend::{AdminOp, Backend, BackendError, GenStream, GenerateRequest};
use tito::config::{PolicyKind, RouterConfig};
use tito::router::Router;

struct Idle(String);

#[async_trait::async_trait]
impl Backend for Idle {
    fn name(&self) -> &str {
        &self.0
    }
    fn kind(&self) -> &'static str {
        "vllm"
    }
    async fn generate(&self, _req: GenerateRequest) -> Result<GenStream, BackendError> {
        Ok(Box::pin(futures::stream::empty()))
    }
    async fn health(&self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn admin(&self, _op: &AdminOp) -> Result<String, BackendError> {
        Ok(String::new())
    }
}

fn router(policy: PolicyKind) -> Arc<Router> {
    router_with(policy, 100_000)
}

fn router_with(policy: PolicyKind, sticky_capacity: usize) -> Arc<Router> {
    let cfg = RouterConfig {
        policy,
        sticky_capacity,
        ..RouterConfig::default()
    };
    let r = Router::new(&cfg);
    for i in 0..3 {
        r.add_backend(Arc::new(Idle(format!("b{i}"))), format!("http://b{i}"))
            .unwrap();
    }
    r
}

fn bench(c: &mut Criterion) {
    let prompt: Vec<u32> = (0..2048).collect();
    let r = router(PolicyKind::LeastRequests);
    let ids: Vec<String> = (0..100_000).map(|i| format!("traj-{i}")).collect();
    for id in &ids {
        drop(r.route(id, &prompt, &[]).unwrap());
    }
    let mut i = 0usize;
    c.bench_function("route/sticky_hit", |b| {
        b.iter(|| {
            i = (i + 7919) % ids.len();
            drop(r.route(&ids[i], &prompt, &[]).unwrap());
        })
    });
    for (name, policy) in [
        ("least_requests", PolicyKind::LeastRequests),
        ("round_robin", PolicyKind::RoundRobin),
        ("prefix_affinity", PolicyKind::PrefixAffinity),
    ] {
        let r = router(policy);
        let mut n = 0u64;
        c.bench_function(&format!("route/new_trajectory/{name}"), |b| {
            b.iter_batched(
                || {
                    n += 1;
                    format!("new-{n}")
                },
                |id| drop(r.route(&id, &prompt, &[]).unwrap()),
                BatchSize::SmallInput,
            )
        });
    }
}

/// Both threads start together; returns the wall time for `iters` calls on
/// each thread.
fn two_threads(r: &Router, ids: &[String], prompt: &[u32], iters: u64) -> Duration {
    let start = Barrier::new(3);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..2u64)
            .map(|t| {
                let start = &start;
                s.spawn(move || {
                    // xorshift64: a different id stream per thread.
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    start.wait();
                    for _ in 0..iters {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let id = &ids[(x % ids.len() as u64) as usize];
                        drop(r.route(id, prompt, &[]).unwrap());
                    }
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        for w in workers {
            w.join().unwrap();
        }
        t0.elapsed()
    })
}

fn contended(c: &mut Criterion) {
    let prompt: Vec<u32> = (0..2048).collect();
    let mut g = c.benchmark_group("route/contended_2_threads");
    g.throughput(Throughput::Elements(2));
    for (name, pool, capacity) in [
        ("evicting", 80_000, 20_000),
        ("sticky_hit", 20_000, 100_000),
    ] {
        let r = router_with(PolicyKind::LeastRequests, capacity);
        let ids: Vec<String> = (0..pool).map(|i| format!("traj-{i}")).collect();
        for id in &ids {
            drop(r.route(id, &prompt, &[]).unwrap());
        }
        g.bench_function(name, |b| {
            b.iter_custom(|iters| two_threads(&r, &ids, &prompt, iters))
        });
    }
    g.finish();
}

/// Per-call cost of the policy a request names, with `n` served ids.
fn policies(c: &mut Criterion) {
    use tito::config::AdapterConfig;
    use tito::router::adapters::Adapters;
    let prompt: Vec<u32> = (0..2048).collect();
    let r = router(PolicyKind::LeastRequests);
    let ids: Vec<String> = (0..10_000).map(|i| format!("traj-{i}")).collect();
    for id in &ids {
        drop(r.route(id, &prompt, &[]).unwrap());
    }
    let mut g = c.benchmark_group("route/policies");
    for n in [1usize, 8, 64] {
        let adapters: Vec<AdapterConfig> = (1..n)
            .map(|i| AdapterConfig {
                name: format!("lora-{i}"),
                path: format!("/loras/{i}"),
            })
            .collect();
        let registry = Adapters::from_config(&adapters);
        // The model itself (no adapter) is one of the n served ids.
        let served: Vec<Option<String>> = std::iter::once(None)
            .chain(adapters.iter().map(|a| Some(a.name.clone())))
            .collect();
        let mut i = 0usize;
        g.bench_function(n.to_string(), |b| {
            b.iter(|| {
                i = (i + 7919) % ids.len();
                let share = served[i % served.len()].as_deref().map(|name| {
                    assert!(registry.is_loaded(name));
                    futures::executor::block_on(registry.share(name)).unwrap()
                });
                drop(r.route(&ids[i], &prompt, &[]).unwrap());
                drop(share);
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, contended, policies);
criterion_main!(benches);
