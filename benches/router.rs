//! Router hot path: `route()` + dropping the route, with 3 backends.
//! - sticky_hit: a trajectory already pinned (100k pins in the map).
//! - new_trajectory: a first call (miss, policy pick, insert, LRU eviction
//!   once the 100k map is full), per policy.
//!
//! Run: `cargo bench --bench router`

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
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
    let cfg = RouterConfig {
        policy,
        sticky_capacity: 100_000,
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

criterion_group!(benches, bench);
criterion_main!(benches);
