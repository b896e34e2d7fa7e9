//! Router failure handling: a failing backend opens its circuit, its pinned
//! trajectories move (and say so) without client errors, probes bring it
//! back; the background probe loop; admission pause / drain; admin fan-out.

#![allow(clippy::unwrap_used)]

mod router_mock;

use std::collections::HashMap;
use std::time::Duration;

use router_mock::{call, config, fleet, prompt};
use tito::backend::{AdminOp, UpdateMode};
use tito::config::{PolicyKind, RouterConfig};
use tito::router::{AdminOutcome, BackendId, CircuitState, RouteError};

/// A generous bound for waits that must not hang a broken build; never hit
/// by a passing run.
const FAILSAFE: Duration = Duration::from_secs(20);
/// Per-backend deadline of admin fan-outs that are expected to answer.
const ADMIN_DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn failing_backend_opens_circuit_moves_trajectories_and_recovers() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 3);
    let mut home: HashMap<String, String> = HashMap::new();
    for t in 0..30 {
        let traj = format!("t{t}");
        let out = call(&router, &traj, &prompt(t, 16)).await.unwrap();
        home.insert(traj, out.backend);
    }
    let on_b1: Vec<String> = home
        .iter()
        .filter(|(_, b)| *b == "b1")
        .map(|(t, _)| t.clone())
        .collect();
    assert_eq!(on_b1.len(), 10);

    // b1 dies. Every trajectory's next call still succeeds.
    mocks[1].set_down(true);
    let before = mocks[1].generate_calls();
    let mut moved = 0;
    for t in 0..30 {
        let traj = format!("t{t}");
        let out = call(&router, &traj, &prompt(t, 32)).await.unwrap();
        assert_ne!(out.backend, "b1");
        if home[&traj] == "b1" {
            assert_eq!(out.moved_from.as_deref(), Some("b1"), "{traj}");
            moved += 1;
        } else {
            assert_eq!(out.backend, home[&traj]);
            assert_eq!(out.moved_from, None);
        }
    }
    assert_eq!(moved, 10);
    // Only `failure_threshold` calls were tried on b1; then its circuit
    // opened and its trajectories moved without trying it.
    assert_eq!(mocks[1].generate_calls() - before, 3);
    let c = router.counters();
    assert_eq!((c.moves, c.retries), (10, 3));
    let b1 = &router.snapshot()[1];
    assert_eq!(
        (b1.circuit, b1.healthy, b1.sticky),
        (CircuitState::Open, false, 0)
    );
    assert!(b1
        .last_error
        .as_deref()
        .unwrap()
        .contains("connection refused"));

    // Moved trajectories stay on their new backend.
    for traj in &on_b1 {
        let out = call(&router, traj, &prompt(1, 40)).await.unwrap();
        assert!(out.sticky && out.moved_from.is_none() && out.backend != "b1");
    }

    // Probes fail while it is down, and keep the circuit open.
    assert_eq!(router.probe_once().await, 2);
    assert_eq!(router.snapshot()[1].circuit, CircuitState::Open);

    // b1 recovers: one good probe → half-open, another → closed.
    mocks[1].set_down(false);
    assert_eq!(router.probe_once().await, 3);
    assert_eq!(router.snapshot()[1].circuit, CircuitState::HalfOpen);
    assert_eq!(router.probe_once().await, 3);
    let b1 = &router.snapshot()[1];
    assert_eq!(
        (b1.circuit, b1.healthy, b1.last_error.clone()),
        (CircuitState::Closed, true, None)
    );

    // It takes new trajectories again.
    let mut placed_on_b1 = 0;
    for t in 100..106 {
        if call(&router, &format!("t{t}"), &prompt(t, 8))
            .await
            .unwrap()
            .backend
            == "b1"
        {
            placed_on_b1 += 1;
        }
    }
    assert_eq!(placed_on_b1, 2, "round-robin among idle backends");
}

#[tokio::test]
async fn failed_probes_open_an_idle_backend_and_its_pins_move() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 2);
    let first = router.route("quiet", &[1, 2], &[]).unwrap();
    let pinned = first.id;
    drop(first);
    mocks[pinned.0 as usize].set_down(true);
    for _ in 0..2 {
        router.probe_once().await;
        assert_eq!(
            router.snapshot()[pinned.0 as usize].circuit,
            CircuitState::Closed
        );
    }
    router.probe_once().await;
    assert_eq!(
        router.snapshot()[pinned.0 as usize].circuit,
        CircuitState::Open
    );
    let r = router.route("quiet", &[1, 2], &[]).unwrap();
    assert_ne!(r.id, pinned);
    assert!(r.moved_from.is_some());
    assert_eq!(mocks[pinned.0 as usize].generate_calls(), 0);
}

#[tokio::test]
async fn rejected_requests_and_overload_do_not_count_against_a_backend() {
    let (router, _m) = fleet(&config(PolicyKind::LeastRequests), 1);
    let errors = [
        tito::backend::BackendError::Rejected {
            backend: "b0".into(),
            message: "prompt too long".into(),
        },
        tito::backend::BackendError::Overloaded {
            backend: "b0".into(),
            message: "HTTP 503".into(),
        },
    ];
    for err in &errors {
        for _ in 0..10 {
            router.report_error(BackendId(0), err);
        }
        assert_eq!(router.snapshot()[0].circuit, CircuitState::Closed, "{err}");
        assert_eq!(router.snapshot()[0].consecutive_failures, 0, "{err}");
    }
    // A 500 does count.
    let err = tito::backend::BackendError::Status {
        backend: "b0".into(),
        status: 500,
        message: "boom".into(),
    };
    router.report_error(BackendId(0), &err);
    assert_eq!(router.snapshot()[0].consecutive_failures, 1);
}

#[tokio::test]
async fn all_backends_down_is_an_error_not_a_hang() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 2);
    for m in &mocks {
        m.set_down(true);
    }
    // The gateway's loop answers with the last backend's failure.
    let err = call(&router, "doomed", &[1]).await.unwrap_err();
    assert!(err.contains("unreachable") && err.contains("502"), "{err}");
    assert!(matches!(
        router.route("x", &[1], &[BackendId(0), BackendId(1)]),
        Err(RouteError::NoHealthyBackend { excluded: 2, .. })
    ));
}

#[tokio::test]
async fn probe_loop_runs_in_the_background_and_stops() {
    let cfg = RouterConfig {
        health_interval_ms: 10,
        ..config(PolicyKind::LeastRequests)
    };
    let (router, mocks) = fleet(&cfg, 2);
    mocks[0].set_down(true);
    let task = router.start_health_checks();
    // Wait (event-driven) until b0 has been probed often enough to open.
    while mocks[0].health_calls() < 3 {
        tokio::time::timeout(FAILSAFE, mocks[0].probed.notified())
            .await
            .expect("the probe loop should keep probing");
    }
    while router.snapshot()[0].circuit != CircuitState::Open {
        tokio::time::timeout(FAILSAFE, mocks[0].probed.notified())
            .await
            .expect("the circuit should open");
    }
    mocks[0].set_down(false);
    while router.snapshot()[0].circuit != CircuitState::Closed {
        tokio::time::timeout(FAILSAFE, mocks[0].probed.notified())
            .await
            .expect("probes should close the circuit");
    }
    task.stop().await;
    let calls = (mocks[0].health_calls(), mocks[1].health_calls());
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!((mocks[0].health_calls(), mocks[1].health_calls()), calls);
}

#[tokio::test]
async fn pause_waits_drain_empties_and_resume_admits() {
    let (router, _m) = fleet(&config(PolicyKind::LeastRequests), 2);
    let running = router.route("running", &[1], &[]).unwrap();
    router.pause_admission(tito::router::Pause::Operation);
    assert!(router.is_paused());
    assert!(matches!(
        router.route("new", &[1], &[]),
        Err(RouteError::Paused)
    ));
    assert!(matches!(
        router.wait_admitted(Duration::from_millis(5)).await,
        Err(RouteError::AdmissionTimeout(_))
    ));
    assert!(matches!(
        router.drain(Duration::from_millis(5)).await,
        Err(RouteError::DrainTimeout { in_flight: 1, .. })
    ));

    // A call issued during the pause waits...
    let waiting = {
        let router = router.clone();
        tokio::spawn(async move {
            router
                .route_admitted("late", &[1, 2, 3], &[], FAILSAFE)
                .await
                .map(|r| r.name.to_string())
        })
    };
    // ...and a drain completes once the running call ends.
    let draining = {
        let router = router.clone();
        tokio::spawn(async move { router.drain(FAILSAFE).await })
    };
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert!(!waiting.is_finished());
    assert!(!draining.is_finished());
    drop(running);
    draining.await.unwrap().unwrap();
    assert_eq!(router.in_flight(), 0);
    assert!(!waiting.is_finished());

    router.resume_admission(tito::router::Pause::Operation);
    let name = waiting.await.unwrap().unwrap();
    assert!(name == "b0" || name == "b1");
    router.wait_admitted(Duration::ZERO).await.unwrap();
}

#[tokio::test]
async fn admin_fan_out_reports_each_backend_and_tracks_sleep() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 3);
    mocks[2]
        .fail_admin
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let results = router
        .broadcast_admin(&AdminOp::Sleep { level: 1 }, ADMIN_DEADLINE)
        .await;
    let names: Vec<&str> = results.iter().map(|r| r.backend.as_str()).collect();
    assert_eq!(names, ["b0", "b1", "b2"]);
    assert!(results[0].ok && results[1].ok && !results[2].ok);
    match &results[2].outcome {
        AdminOutcome::Failed { error } => assert!(error.contains("admin failed"), "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(results[0].state, "asleep");
    assert_eq!(results[2].state, "awake");
    let sleeping: Vec<bool> = router.snapshot().iter().map(|s| s.sleeping).collect();
    assert_eq!(sleeping, [true, true, false]);

    // Sleeping backends are not probed, and get no calls: if admission is
    // resumed while some failed to wake, traffic goes to the awake ones.
    router.probe_once().await;
    let probes: Vec<usize> = mocks.iter().map(|m| m.health_calls()).collect();
    assert_eq!(probes, [0, 0, 1]);
    for t in 0..3 {
        assert_eq!(
            router
                .route(&format!("t{t}"), &[1], &[])
                .unwrap()
                .name
                .as_ref(),
            "b2"
        );
    }
    assert!(matches!(
        router.route("x", &[1], &[BackendId(2)]),
        Err(RouteError::NoHealthyBackend {
            sleeping: 2,
            excluded: 1,
            open: 0,
            weights_failed: 0,
        })
    ));

    mocks[2]
        .fail_admin
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let results = router
        .broadcast_admin(&AdminOp::WakeUp, ADMIN_DEADLINE)
        .await;
    assert!(results.iter().all(|r| r.ok));
    assert!(router.snapshot().iter().all(|s| !s.sleeping));
    // Awake again: pins stay where they are, new work spreads again.
    assert!(router.route("t0", &[1], &[]).unwrap().sticky);
    let fresh: Vec<_> = (0..3)
        .map(|i| router.route(&format!("fresh{i}"), &[1], &[]).unwrap())
        .collect();
    let names: std::collections::BTreeSet<&str> = fresh.iter().map(|r| r.name.as_ref()).collect();
    assert_eq!(names.len(), 3, "{names:?}");
    let weights = AdminOp::UpdateWeights {
        path: "/ckpt/7".into(),
        version: "v7".into(),
        mode: UpdateMode::Wait,
    };
    router.broadcast_admin(&weights, ADMIN_DEADLINE).await;
    for m in &mocks {
        let ops = m.admin_calls.lock().unwrap().clone();
        assert_eq!(
            ops,
            [
                AdminOp::Sleep { level: 1 },
                AdminOp::WakeUp,
                weights.clone()
            ]
        );
    }
}

#[tokio::test]
async fn snapshot_serializes_for_the_admin_endpoint() {
    let (router, _m) = fleet(&config(PolicyKind::LeastRequests), 1);
    let _r = router.route("t", &[1], &[]).unwrap();
    let json = serde_json::to_value(router.snapshot()).unwrap();
    assert_eq!(
        json,
        serde_json::json!([{
            "id": 0, "name": "b0", "kind": "vllm", "url": "http://mock-0",
            "healthy": true, "circuit": "closed", "consecutive_failures": 0,
            "in_flight": 1, "sticky": 1, "sleeping": false, "last_error": null,
            "weight_version": null, "weights_error": null,
            "update_modes": ["wait", "abort"], "keep": null
        }])
    );
}

/// A new trajectory whose first attempt fails on a backend, then runs on
/// another, never lived on the first: its call records no move. One that
/// was pinned before and retried elsewhere does.
#[tokio::test]
async fn a_retried_first_call_is_not_a_move() {
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 2);
    mocks[0].set_down(true);
    let mut retried = 0;
    for t in 0..4 {
        let out = call(&router, &format!("new-{t}"), &prompt(t, 8))
            .await
            .unwrap();
        assert_eq!(out.backend, "b1");
        if out.attempts > 1 {
            retried += 1;
        }
        assert_eq!(out.moved_from, None, "new-{t}: {} attempts", out.attempts);
    }
    assert!(retried > 0, "some first attempt went to the down backend");
    assert_eq!(
        router.counters().moves,
        0,
        "the router counts no move either"
    );
    // Pinned to b0 while it was up, then retried on b1: a move.
    mocks[0].set_down(false);
    let (router, mocks) = fleet(&config(PolicyKind::LeastRequests), 2);
    let home = call(&router, "old", &prompt(1, 8)).await.unwrap().backend;
    let i = usize::from(home == "b1");
    mocks[i].set_down(true);
    let out = call(&router, "old", &prompt(1, 16)).await.unwrap();
    assert_ne!(out.backend, home);
    assert_eq!(out.moved_from.as_deref(), Some(home.as_str()));
}
