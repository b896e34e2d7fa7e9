//! Router placement: stickiness under concurrency, even spread of new
//! trajectories (least_requests), prefix affinity for GRPO samples, sticky
//! LRU eviction, round robin, and runtime add/remove of backends.

#![allow(clippy::unwrap_used)]

mod router_mock;

use std::collections::{BTreeMap, HashMap, HashSet};

use router_mock::{call, config, fleet, prompt, MockBackend};
use tito::config::PolicyKind;
use tito::router::prefix_affinity::PrefixAffinity;
use tito::router::{BackendId, Candidate, RouteError};

/// 100 concurrent trajectories × 5 turns on a single-threaded runtime, so
/// interleaving (and therefore placement) is deterministic.
#[tokio::test]
async fn hundred_trajectories_stick_and_spread_evenly() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 3);
    let mut tasks = Vec::new();
    for t in 0..100u32 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let traj = format!("traj-{t}");
            let mut seen = Vec::new();
            for turn in 0..5 {
                let out = call(&router, &traj, &prompt(t, 10 + turn * 5))
                    .await
                    .unwrap();
                assert_eq!(out.sticky, turn > 0, "{traj} turn {turn}");
                assert_eq!(out.moved_from, None);
                assert_eq!(out.generation.ids.len(), 2);
                seen.push(out.backend);
            }
            (traj, seen)
        }));
    }
    let mut first_by_backend: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        let (traj, seen) = task.await.unwrap();
        let distinct: HashSet<&String> = seen.iter().collect();
        assert_eq!(distinct.len(), 1, "{traj} hit {distinct:?}");
        *first_by_backend.entry(seen[0].clone()).or_default() += 1;
    }
    // Within 20% of 100/3 each.
    let even = 100.0 / 3.0;
    for (b, n) in &first_by_backend {
        let n = *n as f64;
        assert!(
            (n - even).abs() <= 0.2 * even,
            "{b} got {n} new trajectories: {first_by_backend:?}"
        );
    }
    assert_eq!(first_by_backend.len(), 3);
    let total: usize = mocks.iter().map(|m| m.generate_calls()).sum();
    assert_eq!(total, 500);
    let c = router.counters();
    assert_eq!(
        (c.sticky_misses, c.sticky_hits, c.moves, c.retries),
        (100, 400, 0, 0)
    );
    assert_eq!(router.in_flight(), 0);
    let snap = router.snapshot();
    assert_eq!(snap.iter().map(|s| s.sticky).sum::<usize>(), 100);
    assert!(snap.iter().all(|s| s.in_flight == 0 && s.healthy));
    assert_eq!(snap[2].kind, "sglang");
}

/// The same on a multi-threaded runtime: placement timing varies, the
/// one-backend-per-trajectory invariant must not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stickiness_holds_on_a_multi_threaded_runtime() {
    let (router, _mocks) = fleet(&config(PolicyKind::LeastRequests), 3);
    let mut tasks = Vec::new();
    for t in 0..100u32 {
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let traj = format!("mt-{t}");
            let mut seen = HashSet::new();
            for turn in 0..5 {
                seen.insert(
                    call(&router, &traj, &prompt(t, 8 + turn))
                        .await
                        .unwrap()
                        .backend,
                );
            }
            seen.len()
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 1);
    }
    assert_eq!(router.in_flight(), 0);
    assert_eq!(router.counters().sticky_misses, 100);
}

#[tokio::test]
async fn least_requests_sends_new_work_to_the_idle_backend() {
    let (router, _m) = fleet(&config(PolicyKind::LeastRequests), 3);
    let a = router.route("a", &[1], &[]).unwrap();
    let b = router.route("b", &[1], &[]).unwrap();
    assert_ne!(a.id, b.id);
    let c = router.route("c", &[1], &[]).unwrap();
    let ids: HashSet<BackendId> = [a.id, b.id, c.id].into();
    assert_eq!(ids.len(), 3, "each idle backend got one");
    drop(b);
    // b's backend is now the only idle one.
    let d = router.route("d", &[1], &[]).unwrap();
    assert_eq!(d.id, router.pinned("b").unwrap());
    assert_eq!(
        router.snapshot().iter().map(|s| s.in_flight).sum::<usize>(),
        3
    );
}

#[tokio::test]
async fn round_robin_rotates_new_trajectories() {
    let (router, _m) = fleet(&config(PolicyKind::RoundRobin), 3);
    let held = router.route("busy", &[1], &[]).unwrap(); // load is ignored
    let ids: Vec<u64> = (0..5)
        .map(|i| router.route(&format!("t{i}"), &[1], &[]).unwrap().id.0)
        .collect();
    assert_eq!(held.id.0, 0);
    assert_eq!(ids, vec![1, 2, 0, 1, 2]);
}

#[tokio::test]
async fn prefix_affinity_keeps_grpo_samples_together() {
    let cfg = tito::config::RouterConfig {
        affinity_prefix_tokens: 64,
        affinity_margin: 8,
        ..config(PolicyKind::PrefixAffinity)
    };
    let (router, _m) = fleet(&cfg, 3);
    // Pick four GRPO prompts whose preferred backends are b0, b1, b2 and b0
    // again (found with the policy's own hash, so the test does not depend
    // on its values): 8 samples each, all running at once (routes held).
    let policy = PrefixAffinity::new(64, 8);
    let idle: Vec<Candidate> = (0..3)
        .map(|i| Candidate {
            id: BackendId(i),
            in_flight: 0,
        })
        .collect();
    let mut prompts: Vec<Vec<u32>> = Vec::new();
    for want in [0usize, 1, 2, 0] {
        let p = (0..)
            .map(|seed| prompt(seed + 100 * prompts.len() as u32, 200))
            .find(|p| policy.preferred(&idle, p) == want)
            .unwrap();
        prompts.push(p);
    }
    let mut held = Vec::new();
    let mut placement: HashMap<u32, HashSet<BackendId>> = HashMap::new();
    for (group, p) in prompts.iter().enumerate() {
        let group = group as u32;
        for sample in 0..8 {
            let route = router
                .route(&format!("g{group}-s{sample}"), p, &[])
                .unwrap();
            placement.entry(group).or_default().insert(route.id);
            held.push(route);
        }
        // Load on any backend stays within the margin of the least loaded.
        let loads: Vec<usize> = router.snapshot().iter().map(|s| s.in_flight).collect();
        let (min, max) = (*loads.iter().min().unwrap(), *loads.iter().max().unwrap());
        assert!(max - min <= 8, "{loads:?}");
    }
    assert_eq!(
        router
            .snapshot()
            .iter()
            .map(|s| s.in_flight)
            .collect::<Vec<_>>(),
        vec![16, 8, 8]
    );
    for (group, ids) in &placement {
        assert_eq!(ids.len(), 1, "group {group} split over {ids:?}");
    }
    // Later turns of each sample stay put (sticky), whatever the policy says.
    drop(held);
    for group in 0..4u32 {
        let home = placement[&group].iter().next().copied().unwrap();
        for sample in 0..8 {
            let r = router
                .route(&format!("g{group}-s{sample}"), &prompt(99, 300), &[])
                .unwrap();
            assert!(r.sticky);
            assert_eq!(r.id, home);
        }
    }
}

#[tokio::test]
async fn prefix_affinity_spills_over_past_the_margin() {
    let cfg = tito::config::RouterConfig {
        affinity_prefix_tokens: 64,
        affinity_margin: 2,
        ..config(PolicyKind::PrefixAffinity)
    };
    let (router, _m) = fleet(&cfg, 3);
    let p = prompt(3, 100);
    let mut held = Vec::new();
    for s in 0..12 {
        held.push(router.route(&format!("s{s}"), &p, &[]).unwrap());
        let loads: Vec<usize> = router.snapshot().iter().map(|x| x.in_flight).collect();
        let (min, max) = (*loads.iter().min().unwrap(), *loads.iter().max().unwrap());
        assert!(max - min <= 2 + 1, "after sample {s}: {loads:?}");
    }
    let homes: HashSet<BackendId> = held.iter().map(|r| r.id).collect();
    assert!(homes.len() > 1, "12 samples with margin 2 must spill over");
    let first = held[0].id;
    let at_home = held.iter().filter(|r| r.id == first).count();
    assert!(
        at_home >= 4,
        "the preferred backend keeps the most: {at_home}"
    );
}

#[tokio::test]
async fn sticky_lru_evicts_oldest_and_counts() {
    let cfg = tito::config::RouterConfig {
        sticky_capacity: 10,
        ..config(PolicyKind::LeastRequests)
    };
    let (router, _m) = fleet(&cfg, 3);
    for t in 0..15 {
        router.route(&format!("t{t}"), &[1], &[]).unwrap();
    }
    let c = router.counters();
    assert_eq!(
        (c.sticky_misses, c.sticky_hits, c.sticky_evictions),
        (15, 0, 5)
    );
    assert_eq!(router.sticky_len(), 10);
    assert_eq!(router.pinned("t4"), None);
    assert!(router.pinned("t5").is_some());
    // A hit refreshes recency: t5 survives the next eviction, t6 does not.
    assert!(router.route("t5", &[1], &[]).unwrap().sticky);
    router.route("new", &[1], &[]).unwrap();
    assert!(router.pinned("t5").is_some());
    assert_eq!(router.pinned("t6"), None);
    let c = router.counters();
    assert_eq!(
        (c.sticky_misses, c.sticky_hits, c.sticky_evictions),
        (16, 1, 6)
    );
    assert_eq!(
        router.snapshot().iter().map(|s| s.sticky).sum::<usize>(),
        10
    );
}

#[tokio::test]
async fn backends_are_added_and_removed_at_runtime() {
    let (router, _m) = fleet(&config(PolicyKind::LeastRequests), 2);
    let a = router.route("a", &[1], &[]).unwrap();
    let b = router.route("b", &[1], &[]).unwrap();
    // A third backend joins: it is the idle one, so it gets the next new trajectory.
    let extra = MockBackend::new("b-extra", "vllm");
    let extra_id = router.add_backend(extra.clone(), "http://extra").unwrap();
    assert_eq!(extra_id, BackendId(2));
    let c = router.route("c", &[1], &[]).unwrap();
    assert_eq!(c.id, extra_id);
    assert!(matches!(
        router.add_backend(MockBackend::new("b0", "vllm"), "http://dup"),
        Err(RouteError::DuplicateName(n)) if n == "b0"
    ));
    // Remove b0 while a call is running on it: the call keeps its backend,
    // the in-flight count still returns to zero, and the trajectory moves.
    let removed = router.remove_backend(BackendId(0)).unwrap();
    assert_eq!(
        (removed.name.as_str(), removed.in_flight, removed.sticky),
        ("b0", 1, 1)
    );
    assert_eq!(a.name.as_ref(), "b0");
    drop((a, b, c));
    assert_eq!(router.in_flight(), 0);
    let moved = router.route("a", &[1], &[]).unwrap();
    assert_eq!(moved.moved_from.as_deref(), Some("b0"));
    assert!(!moved.sticky);
    assert_ne!(moved.id, BackendId(0));
    assert_eq!(router.pinned("a"), Some(moved.id));
    assert_eq!(router.moves(), 1);
    // Ids are never reused.
    let ids: Vec<u64> = router.snapshot().iter().map(|s| s.id.0).collect();
    assert_eq!(ids, vec![1, 2]);
    let again = router
        .add_backend(MockBackend::new("b0", "vllm"), "http://b0-again")
        .unwrap();
    assert_eq!(again, BackendId(3));
    assert_eq!(router.backend_id("b0"), Some(again));
    assert!(matches!(
        router.remove_backend(BackendId(0)),
        Err(RouteError::UnknownBackend(BackendId(0)))
    ));
    // With every backend gone, routing says so.
    for id in [1, 2, 3] {
        router.remove_backend(BackendId(id)).unwrap();
    }
    drop(moved);
    assert!(matches!(
        router.route("z", &[1], &[]),
        Err(RouteError::NoBackends)
    ));
}

#[tokio::test]
async fn configured_vllm_and_sglang_backends_join_the_router() {
    let text = r#"
[model]
tokenizer = "models/tok"

[[backends]]
url = "http://127.0.0.1:8001"
kind = "vllm"

[[backends]]
url = "http://127.0.0.1:8002/"
kind = "sglang"
name = "sg-1"

[router]
policy = "prefix_affinity"
"#;
    let config = tito::Config::from_toml(text).unwrap();
    let router = tito::router::Router::new(&config.router);
    for (b, cfg) in tito::api::build_backends(&config)
        .unwrap()
        .into_iter()
        .zip(&config.backends)
    {
        router.add_backend(b, cfg.url.clone()).unwrap();
    }
    assert_eq!(router.policy_name(), "prefix_affinity");
    let snap = router.snapshot();
    let got: Vec<(&str, &str, &str)> = snap
        .iter()
        .map(|s| (s.name.as_str(), s.kind.as_str(), s.url.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("http://127.0.0.1:8001", "vllm", "http://127.0.0.1:8001"),
            ("sg-1", "sglang", "http://127.0.0.1:8002/"),
        ]
    );
}
