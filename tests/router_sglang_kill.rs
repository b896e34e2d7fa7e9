//! End to end through the real SGLang client: two in-process mock backends
//! plus an SGLang-shaped HTTP server (axum on its own runtime, so killing it
//! closes every socket, pooled keep-alive connections included). The server
//! is killed between turns: no call fails, its trajectories move and say so;
//! restarted on the same port, probes bring it back.

#![allow(clippy::unwrap_used)]

mod router_mock;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::{get, post};
use axum::Json;
use router_mock::{call, config, prompt, MockBackend};
use serde_json::{json, Value};
use tito::backend::sglang::SglangBackend;
use tito::config::{BackendConfig, BackendKind, PolicyKind};
use tito::router::{BackendId, CircuitState, Router};

/// SGLang's `/generate`, streaming cumulative `output_ids`.
async fn generate(Json(body): Json<Value>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let n = body["input_ids"].as_array().map_or(0, Vec::len) as u32;
    let ev = |ids: &[u32], done: bool| {
        json!({
            "output_ids": ids,
            "meta_info": {
                "completion_tokens": ids.len(),
                "finish_reason": if done { json!({"type": "stop", "matched": 2}) } else { Value::Null },
            }
        })
    };
    let text = format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        ev(&[n], false),
        ev(&[n, n + 1], true)
    );
    ([("content-type", "text/event-stream")], text).into_response()
}

/// A server on its own thread and runtime; dropping the handle kills it.
struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(addr: SocketAddr) -> Server {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
                ready_tx.send(listener.local_addr().unwrap()).unwrap();
                let app = axum::Router::new()
                    .route("/generate", post(generate))
                    .route("/health", get(|| async { "ok" }));
                tokio::select! {
                    r = axum::serve(listener, app) => r.unwrap(),
                    _ = stopped => {}
                }
            });
            // Dropping the runtime here drops every connection task.
        });
        let addr = ready_rx.recv().unwrap();
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn kill(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_sglang_backend_fails_over_and_comes_back() {
    let server = Server::start("127.0.0.1:0".parse().unwrap());
    let addr = server.addr;
    let cfg = config(PolicyKind::LeastRequests);
    let router = Router::new(&cfg);
    router
        .add_backend(MockBackend::new("b0", "vllm"), "http://mock-0")
        .unwrap();
    router
        .add_backend(MockBackend::new("b1", "vllm"), "http://mock-1")
        .unwrap();
    let sg_cfg = BackendConfig {
        url: format!("http://{addr}"),
        kind: BackendKind::Sglang,
        name: "sg".into(),
        model: String::new(),
        ca_file: Default::default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    let sg = Arc::new(SglangBackend::new(&sg_cfg, &cfg).unwrap());
    let sg_id = router.add_backend(sg, sg_cfg.url.clone()).unwrap();
    assert_eq!(sg_id, BackendId(2));

    // Turn 1, sequential so each backend gets 10 (round-robin among idle).
    let mut on_sg = Vec::new();
    for t in 0..30u32 {
        let traj = format!("t{t}");
        let out = call(&router, &traj, &prompt(t, 5)).await.unwrap();
        assert_eq!(out.generation.ids.len(), 2);
        if out.backend == "sg" {
            // The SGLang mock echoes the prompt length: the ids went through.
            assert_eq!(out.generation.ids, vec![5, 6]);
            on_sg.push(traj);
        }
    }
    assert_eq!(on_sg.len(), 10);

    server.kill();

    // Turn 2: every call succeeds; sg's trajectories moved and say so.
    for t in 0..30u32 {
        let traj = format!("t{t}");
        let out = call(&router, &traj, &prompt(t, 9)).await.unwrap();
        assert_ne!(out.backend, "sg");
        let was_on_sg = on_sg.contains(&traj);
        assert_eq!(
            out.moved_from.as_deref(),
            was_on_sg.then_some("sg"),
            "{traj}"
        );
    }
    assert_eq!(router.snapshot()[2].circuit, CircuitState::Open);
    assert_eq!(router.moves(), 10);

    // sg comes back on the same address; two good probes close its circuit.
    let _server = Server::start(addr);
    router.probe_once().await;
    router.probe_once().await;
    assert_eq!(router.snapshot()[2].circuit, CircuitState::Closed);
    let mut back = 0;
    for t in 100..103u32 {
        let out = call(&router, &format!("t{t}"), &prompt(t, 4))
            .await
            .unwrap();
        if out.backend == "sg" {
            assert_eq!(out.generation.ids, vec![4, 5]);
            back += 1;
        }
    }
    assert_eq!(
        back, 1,
        "one of three new trajectories lands on the idle sg"
    );
}
