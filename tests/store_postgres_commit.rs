//! A PostgreSQL commit whose answer is lost with the connection is reported
//! as what the server did: committed when it landed (so the client's retry
//! does not record the call twice), failed when it rolled back. The store
//! talks to the test cluster through a proxy that cuts the connection at a
//! `COMMIT`, in one of three ways.

mod store_support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use store_support::{call, ids, postgres_url};
use tito::store::{DynStore, StoreError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy does at the next `COMMIT` it sees.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// The server gets the `COMMIT` and answers; the client never hears.
    AfterCommit,
    /// Neither side hears more: the server sees the connection end.
    BeforeCommit,
    /// The client's side ends, the server's stays open and idle, as when
    /// the client's host is gone: the server does not know.
    Stall,
}

type Plan = Arc<Mutex<Option<Cut>>>;
type Shared<T> = Arc<tokio::sync::Mutex<Option<T>>>;

/// One typed protocol message (`type`, length, body), or `None` at the end.
async fn message(r: &mut OwnedReadHalf) -> Option<Vec<u8>> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head).await.ok()?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut out = head.to_vec();
    out.resize(1 + len, 0);
    r.read_exact(&mut out[5..]).await.ok()?;
    Some(out)
}

async fn write(to: &Shared<OwnedWriteHalf>, bytes: &[u8]) -> bool {
    match to.lock().await.as_mut() {
        Some(w) => w.write_all(bytes).await.is_ok(),
        None => false,
    }
}

/// A proxy to `upstream` on a free loopback port.
async fn proxy(upstream: SocketAddr, plan: Plan) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = TcpStream::connect(upstream).await.expect("upstream");
            // Messages are relayed one by one: without this, Nagle's
            // algorithm holds each behind the peer's delayed ACK.
            for s in [&client, &server] {
                s.set_nodelay(true).expect("nodelay");
            }
            tokio::spawn(relay(client, server, plan.clone()));
        }
    });
    addr
}

async fn relay(client: TcpStream, server: TcpStream, plan: Plan) {
    let (mut cr, cw) = client.into_split();
    let (mut sr, sw) = server.into_split();
    let cw: Shared<OwnedWriteHalf> = Arc::new(tokio::sync::Mutex::new(Some(cw)));
    let sw: Shared<OwnedWriteHalf> = Arc::new(tokio::sync::Mutex::new(Some(sw)));
    let swallow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Server to client: after an `AfterCommit` cut, everything up to the
    // server's next ReadyForQuery is dropped and the client's side closed.
    let (down_cw, down_swallow) = (cw.clone(), swallow.clone());
    tokio::spawn(async move {
        while let Some(m) = message(&mut sr).await {
            if down_swallow.load(std::sync::atomic::Ordering::SeqCst) {
                if m[0] == b'Z' {
                    down_cw.lock().await.take();
                }
                continue;
            }
            write(&down_cw, &m).await;
        }
        down_cw.lock().await.take();
    });
    // Client to server: the untyped startup message, then typed ones.
    let mut len = [0u8; 4];
    if cr.read_exact(&mut len).await.is_err() {
        return;
    }
    let mut startup = len.to_vec();
    startup.resize(u32::from_be_bytes(len) as usize, 0);
    if cr.read_exact(&mut startup[4..]).await.is_err() || !write(&sw, &startup).await {
        return;
    }
    while let Some(m) = message(&mut cr).await {
        let commit = m[0] == b'Q'
            && String::from_utf8_lossy(&m[5..])
                .trim_end_matches('\0')
                .trim_end()
                .ends_with("COMMIT");
        let cut = if commit {
            plan.lock().expect("plan").take()
        } else {
            None
        };
        match cut {
            Some(Cut::AfterCommit) => swallow.store(true, std::sync::atomic::Ordering::SeqCst),
            Some(Cut::BeforeCommit) => {
                sw.lock().await.take();
                cw.lock().await.take();
                return;
            }
            Some(Cut::Stall) => {
                cw.lock().await.take();
                // The server's side stays open until the server ends it.
                std::future::pending::<()>().await;
            }
            None => {}
        }
        if !write(&sw, &m).await {
            return;
        }
    }
    sw.lock().await.take();
}

/// A store on a fresh database, reached through a cutting proxy.
async fn store_behind_proxy() -> (DynStore, Plan) {
    let url = postgres_url();
    let (prefix, rest) = url.split_once('@').expect("url has a user");
    let (host_port, db) = rest.split_once('/').expect("url has a database");
    let upstream: SocketAddr = host_port.parse().expect("loopback address");
    let plan: Plan = Arc::new(Mutex::new(None));
    let addr = proxy(upstream, plan.clone()).await;
    let via = format!("{prefix}@{addr}/{db}");
    let store = tokio::task::spawn_blocking(move || tito::store::open(&via))
        .await
        .expect("open task")
        .expect("open through the proxy");
    (store, plan)
}

fn arm(plan: &Plan, cut: Cut) {
    *plan.lock().expect("plan") = Some(cut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_landed_is_reported_committed_and_one_that_did_not_failed() {
    let (store, plan) = store_behind_proxy().await;
    let turn = |i: u32| {
        let parent = i.checked_sub(1);
        call("cut", i, 0, parent, ids(10 * i, 3), ids(100 + 10 * i, 2))
    };

    // The commit that creates the trajectory (and draws its listing key)
    // lands; its answer is lost.
    arm(&plan, Cut::AfterCommit);
    let first = store.append_call(turn(0)).await;
    assert!(
        first.is_ok(),
        "a commit that landed is committed: {first:?}"
    );
    assert!(
        plan.lock().expect("plan").is_none(),
        "the proxy cut a commit"
    );

    // A plain commit that lands, its answer lost.
    arm(&plan, Cut::AfterCommit);
    store.append_call(turn(1)).await.expect("landed commit");

    // A commit the server never got: it rolled back.
    arm(&plan, Cut::BeforeCommit);
    match store.append_call(turn(2)).await {
        Err(StoreError::Commit(m)) => assert!(m.contains("rolled back"), "{m}"),
        other => panic!("a commit that never reached the server: {other:?}"),
    }
    // A commit the server never got, its process still holding the
    // transaction: ended, then rolled back.
    arm(&plan, Cut::Stall);
    match store.append_call(turn(2)).await {
        Err(StoreError::Commit(m)) => assert!(m.contains("rolled back"), "{m}"),
        other => panic!("a commit stalled before the server: {other:?}"),
    }

    // The client's retry of call 2 is stored once, after the two landed.
    store.append_call(turn(2)).await.expect("retry");
    let traj = store
        .get_trajectory("cut")
        .await
        .expect("read")
        .expect("exists");
    let stored: Vec<(u32, Vec<u32>)> = traj
        .calls
        .iter()
        .map(|c| (c.call_index, c.sampled_ids.clone()))
        .collect();
    let expected: Vec<(u32, Vec<u32>)> = (0..3).map(|i| (i, ids(100 + 10 * i, 2))).collect();
    assert_eq!(stored, expected);
    assert_eq!(traj.meta.num_calls, 3);
    let listed = store
        .list_trajectories(&tito::store::ListQuery {
            filter: Default::default(),
            limit: 10,
            cursor: None,
        })
        .await
        .expect("list");
    assert_eq!(
        listed
            .items
            .iter()
            .map(|m| m.id.as_str())
            .collect::<Vec<_>>(),
        ["cut"],
        "the landed creating commit gave the trajectory its listing key"
    );
}
