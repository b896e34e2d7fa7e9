//! Shared by the router integration tests: an in-process mock backend that
//! implements the `Backend` trait (switchable failures, call counters), and
//! `call`, the retry loop the API layer runs around the router.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use tito::backend::{
    AdminOp, Backend, BackendError, DynBackend, FinishReason, GenEvent, GenStream, GenerateRequest,
    Generation, SamplingParams,
};
use tito::call::start_sequence;
use tito::config::{PolicyKind, RouterConfig};
use tito::router::{BackendId, Router};

pub struct MockBackend {
    name: String,
    kind: &'static str,
    pub fail_generate: AtomicBool,
    pub fail_health: AtomicBool,
    pub fail_admin: AtomicBool,
    pub generate_calls: AtomicUsize,
    pub health_calls: AtomicUsize,
    /// Woken on every health probe.
    pub probed: tokio::sync::Notify,
    pub admin_calls: Mutex<Vec<AdminOp>>,
}

impl MockBackend {
    pub fn new(name: &str, kind: &'static str) -> Arc<MockBackend> {
        Arc::new(MockBackend {
            name: name.to_string(),
            kind,
            fail_generate: AtomicBool::new(false),
            fail_health: AtomicBool::new(false),
            fail_admin: AtomicBool::new(false),
            generate_calls: AtomicUsize::new(0),
            health_calls: AtomicUsize::new(0),
            probed: tokio::sync::Notify::new(),
            admin_calls: Mutex::new(Vec::new()),
        })
    }

    /// Makes generate and health fail (`true`) or succeed again.
    pub fn set_down(&self, down: bool) {
        self.fail_generate.store(down, Ordering::SeqCst);
        self.fail_health.store(down, Ordering::SeqCst);
    }

    pub fn generate_calls(&self) -> usize {
        self.generate_calls.load(Ordering::SeqCst)
    }

    pub fn health_calls(&self) -> usize {
        self.health_calls.load(Ordering::SeqCst)
    }

    fn unreachable(&self) -> BackendError {
        BackendError::Unreachable {
            backend: self.name.clone(),
            message: "connection refused (mock)".into(),
        }
    }
}

#[async_trait::async_trait]
impl Backend for MockBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> &'static str {
        self.kind
    }

    async fn generate(&self, req: GenerateRequest) -> Result<GenStream, BackendError> {
        self.generate_calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_generate.load(Ordering::SeqCst) {
            return Err(self.unreachable());
        }
        // Echo the prompt length so callers can tell calls apart; yield
        // between events so concurrent calls interleave.
        let n = req.prompt_ids.len() as u32;
        let events = vec![
            Ok(GenEvent::Tokens {
                ids: vec![n],
                logprobs: vec![],
            }),
            Ok(GenEvent::Tokens {
                ids: vec![n + 1],
                logprobs: vec![],
            }),
            Ok(GenEvent::Done {
                finish_reason: FinishReason::Stop,
            }),
        ];
        Ok(Box::pin(futures::stream::iter(events).then(
            |ev| async move {
                tokio::task::yield_now().await;
                ev
            },
        )))
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.health_calls.fetch_add(1, Ordering::SeqCst);
        self.probed.notify_one();
        if self.fail_health.load(Ordering::SeqCst) {
            Err(self.unreachable())
        } else {
            Ok(())
        }
    }

    async fn admin(&self, op: &AdminOp) -> Result<String, BackendError> {
        self.admin_calls.lock().unwrap().push(op.clone());
        if self.fail_admin.load(Ordering::SeqCst) {
            Err(BackendError::Status {
                backend: self.name.clone(),
                status: 500,
                message: "admin failed (mock)".into(),
            })
        } else {
            Ok(format!("{op:?} ok"))
        }
    }
}

pub fn config(policy: PolicyKind) -> RouterConfig {
    RouterConfig {
        policy,
        failure_threshold: 3,
        max_attempts: 3,
        ..RouterConfig::default()
    }
}

/// A router over `n` mocks named b0, b1, ... (b2 SGLang-shaped, the rest vLLM).
pub fn fleet(cfg: &RouterConfig, n: usize) -> (Arc<Router>, Vec<Arc<MockBackend>>) {
    let router = Router::new(cfg);
    let mocks: Vec<Arc<MockBackend>> = (0..n)
        .map(|i| MockBackend::new(&format!("b{i}"), if i == 2 { "sglang" } else { "vllm" }))
        .collect();
    for (i, m) in mocks.iter().enumerate() {
        let b: DynBackend = m.clone();
        let id = router.add_backend(b, format!("http://mock-{i}")).unwrap();
        assert_eq!(id, BackendId(i as u64));
    }
    (router, mocks)
}

/// What one successful call saw.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub backend: String,
    pub sticky: bool,
    /// The first `moved_from` seen over the attempts (where the trajectory
    /// was pinned before this call).
    pub moved_from: Option<String>,
    pub attempts: u32,
    pub generation: Generation,
}

/// One call through the gateway's own retry loop
/// ([`tito::call::start_sequence`]): route → generate → on an error before
/// the first token, report it and route again without that backend, up to
/// `max_attempts`; then the rest of the stream is collected.
pub async fn call(router: &Router, trajectory: &str, prompt: &[u32]) -> Result<Outcome, String> {
    let req = GenerateRequest {
        request_id: format!("{trajectory}-{}", prompt.len()),
        prompt_ids: Arc::new(prompt.to_vec()),
        params: SamplingParams {
            max_tokens: 2,
            ..Default::default()
        },
        images: None,
        adapter: None,
    };
    let started = start_sequence(router, trajectory, req)
        .await
        .map_err(|e| e.to_string())?;
    let mut generation = Generation::default();
    let mut stream = started.stream;
    while let Some(ev) = stream.next().await {
        generation.push(ev.map_err(|e| e.to_string())?);
    }
    // `stream` (and the route's in-flight count) is dropped here, after the
    // last token.
    Ok(Outcome {
        backend: started.backend,
        sticky: started.sticky,
        moved_from: started.moved_from,
        attempts: started.attempts,
        generation,
    })
}

/// A prompt of `len` ids starting at `seed`.
pub fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| seed.wrapping_mul(1000).wrapping_add(i))
        .collect()
}
