//! A slow disk does not stall the runtime: a SQLite store whose every
//! commit takes 200 ms (a commit hook that blocks inside `COMMIT`, on the
//! thread that commits, as a slow write or `fsync` would) keeps a gateway
//! answering `GET /health` and a chat call on another trajectory (`[store]
//! ack = "queued"`) in under 50 ms each while one of those commits is in
//! progress.
//!
//! Why this can fail: the gateway runs on a runtime of one thread (a
//! `current_thread` runtime on a thread of its own). The slow commit is a
//! trainer's `POST /v1/trajectories/{id}/metadata`, a write its caller
//! waits for, and the first the store takes (nothing else is queued or
//! committing). Were it committed on the thread serving its request (a
//! runtime worker), that thread, the gateway's only one, would be inside
//! the 200 ms hook: `/health` and the chat call could not be answered
//! before the hook returned, well past 50 ms. They answer in time only
//! because every commit runs on the store's writer thread while the request
//! awaits a channel.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::mock_vllm::{MockVllm, Scripted};
use serde_json::json;
use tito::render::testing::{chatml_renderer, IM_END};
use tito::store::{DynStore, SqliteStore, StoreOptions};
use tokio::sync::{mpsc, oneshot};

/// What each commit that writes takes: the slow disk.
const SLOW_COMMIT: Duration = Duration::from_millis(200);
/// The most an unrelated request may take while a commit is slow.
const PROMPT: Duration = Duration::from_millis(50);
/// Beyond this a request is taken as never answered.
const GIVE_UP: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq)]
enum Commit {
    Began,
    Ended,
}

/// A gateway served by a runtime of one thread, on a thread of its own.
struct OneThreadGateway {
    addr: std::net::SocketAddr,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl OneThreadGateway {
    async fn start(config: tito::Config, store: DynStore) -> OneThreadGateway {
        let (started, addr) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("gateway runtime");
            rt.block_on(async move {
                let g = common::start_gateway_on(config, chatml_renderer(), store).await;
                started.send(g.addr).expect("test waits for the address");
                let _ = stopped.await;
            });
        });
        let addr = addr.await.expect("gateway started");
        OneThreadGateway { addr, stop, thread }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Stops the server; the store's writer commits what is queued.
    async fn stop(self) {
        let _ = self.stop.send(());
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .expect("join")
            .expect("gateway thread");
    }
}

/// `req`, answered: its status and how long it took.
async fn timed(req: reqwest::RequestBuilder) -> (reqwest::StatusCode, Duration) {
    let start = Instant::now();
    let resp = tokio::time::timeout(GIVE_UP, req.send())
        .await
        .expect("answered")
        .expect("gateway reachable");
    let status = resp.status();
    tokio::time::timeout(GIVE_UP, resp.bytes())
        .await
        .expect("body answered")
        .expect("body");
    (status, start.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_commit_does_not_stall_unrelated_requests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mock = MockVllm::start(Scripted::ids(vec![b'o'.into(), b'k'.into(), IM_END])).await;
    let extra = format!(
        "[store]\nurl = \"sqlite://{}/spans.db\"\nack = \"queued\"\n",
        dir.path().display()
    );
    let config = common::config(&[mock.url()], &extra);
    let url = config.store.url.clone();

    let (commits, mut commit) = mpsc::unbounded_channel();
    // Commits that ended.
    let ended = Arc::new(AtomicUsize::new(0));
    let hook = {
        let ended = ended.clone();
        move || {
            let _ = commits.send(Commit::Began);
            std::thread::sleep(SLOW_COMMIT);
            ended.fetch_add(1, Ordering::SeqCst);
            let _ = commits.send(Commit::Ended);
        }
    };
    let watched_in_progress = || ended.load(Ordering::SeqCst) == 0;
    let store = SqliteStore::open_with_commit_hook(&url, &StoreOptions::from(&config.store), hook)
        .expect("store");
    let g = OneThreadGateway::start(config, Arc::new(store)).await;
    let client = reqwest::Client::new();

    // The watched commit: a trainer registers a task, and waits for it.
    let register = client
        .post(g.url("/v1/trajectories/task-1/metadata"))
        .json(&json!({"data_source": "slow-disk"}));
    let register = tokio::spawn(timed(register));
    assert_eq!(commit.recv().await, Some(Commit::Began));

    let (status, took) = timed(client.get(g.url("/health"))).await;
    assert_eq!(status, 200);
    eprintln!("/health answered in {took:?} during a slow commit");
    assert!(took < PROMPT, "/health took {took:?} during a slow commit");
    assert!(
        watched_in_progress(),
        "/health was answered after the slow commit: it proves nothing"
    );

    // A chat call on another trajectory, answered before its commit.
    let chat = client
        .post(g.url("/t/b/v1/chat/completions"))
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}));
    let (status, took) = timed(chat).await;
    assert_eq!(status, 200);
    eprintln!("a chat call on another trajectory answered in {took:?} during a slow commit");
    assert!(
        took < PROMPT,
        "a chat call on another trajectory took {took:?} during a slow commit"
    );
    assert!(
        watched_in_progress(),
        "the chat call was answered after the slow commit: it proves nothing"
    );

    let (status, took) = register.await.expect("register task");
    assert_eq!(status, 200);
    assert!(took >= SLOW_COMMIT, "the trainer waited for its commit");
    g.stop().await;

    // Everything answered was committed in the end.
    let store = tito::store::open(&url).expect("reopen");
    let task = store.get_meta("task-1").await.expect("read").expect("task");
    assert_eq!(task.metadata.data_source.as_deref(), Some("slow-disk"));
    let b = store.get_trajectory("b").await.expect("read").expect("b");
    assert_eq!(b.calls.len(), 1);
}
