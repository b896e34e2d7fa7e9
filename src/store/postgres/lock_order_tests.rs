use super::super::bulk::tests::{call, database_at, jobs};
use super::super::{writer, Conn};
use super::{key, sort, Key};
use crate::store::group_commit::{Job, Op};
use crate::store::{CallRecord, StoreError};

/// Two replicas store call 0 of the same `n` trajectories at once, one
/// given them in ascending order and the other in descending: each slot is
/// stored once, the other replica gets `Duplicate`, and neither transaction
/// is rolled back to break a deadlock. Below the bulk path's threshold the
/// appends are pipelined one by one; at or above it they go in by `COPY`;
/// the replica that loses a slot then redoes its batch call by call, under
/// savepoints.
async fn opposite_orders(n: usize, rounds: usize) {
    let (url, mut a) = database_at().await;
    let mut b = Conn::connect(&url).await.expect("connect");
    for round in 0..rounds {
        let ids: Vec<String> = (0..n).map(|t| format!("r{round}-t{t:03}")).collect();
        let mine = |sampled: u32| -> Vec<CallRecord> {
            ids.iter()
                .map(|t| {
                    let mut c = call(t, 0, None);
                    c.sampled_ids = vec![sampled, sampled];
                    c
                })
                .collect()
        };
        let up = jobs(mine(1));
        let down = jobs(mine(2).into_iter().rev().collect());
        race(&mut a, &mut b, up, down, n, round).await;
        let rows: i64 = a
            .client
            .query_one(
                "SELECT count(*) FROM calls c JOIN trajectories t ON t.seq = c.traj \
                 WHERE t.id LIKE $1",
                &[&format!("r{round}-%")],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, n as i64, "round {round}");
    }
    assert_no_reruns(&a, &b);
}

/// Commits `first` through `a` and `second` through `b` at once, as two
/// replicas' writers would: every outcome is stored or `Duplicate`, and
/// `slots` calls were stored between them.
async fn race(
    a: &mut Conn,
    b: &mut Conn,
    mut first: Vec<Job>,
    mut second: Vec<Job>,
    slots: usize,
    round: usize,
) {
    let (from_a, from_b) = tokio::join!(
        writer::commit_batch(a, &mut first),
        writer::commit_batch(b, &mut second),
    );
    for out in from_a.iter().chain(&from_b) {
        assert!(
            matches!(out, Ok(_) | Err(StoreError::Duplicate { .. })),
            "round {round}: {out:?}"
        );
    }
    let stored = from_a.iter().chain(&from_b).filter(|o| o.is_ok()).count();
    assert_eq!(stored, slots, "round {round}: each slot stored once");
}

fn assert_no_reruns(a: &Conn, b: &Conn) {
    assert_eq!(
        (a.transient_retries, b.transient_retries),
        (0, 0),
        "no transaction was rolled back to break a deadlock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_appending_in_opposite_orders_never_deadlock() {
    opposite_orders(6, 20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_runs_in_opposite_orders_never_deadlock() {
    opposite_orders(60, 10).await;
}

/// One replica's bulk run continues stored trajectories and starts new
/// ones while another appends to one of each, the same slots: the bulk run
/// creates or locks each trajectory in the one order, as the single appends
/// do (creating every new trajectory first and then locking the stored ones
/// made a cycle with a single append holding a stored one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_run_and_single_appends_never_deadlock() {
    let (url, mut a) = database_at().await;
    let mut b = Conn::connect(&url).await.expect("connect");
    for round in 0..20 {
        let stored = |i: usize| format!("r{round}-e{i}");
        let new = |i: usize| format!("r{round}-n{i}");
        let mut first = jobs((0..10).map(|i| call(&stored(i), 0, None)).collect());
        let out = writer::commit_batch(&mut a, &mut first).await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        let mut run: Vec<CallRecord> = Vec::new();
        for i in 0..10 {
            run.push(call(&new(i), 0, None));
            run.push(call(&stored(i), 1, Some(0)));
        }
        let single = jobs(vec![call(&stored(9), 1, Some(0)), call(&new(0), 0, None)]);
        race(&mut a, &mut b, jobs(run), single, 20, round).await;
    }
    assert_no_reruns(&a, &b);
}

#[test]
fn consumers_come_before_trajectories_and_a_trajectorys_jobs_keep_their_order() {
    let append = |t: &str, i: u32| Job {
        op: Op::Append(Box::new(call(t, i, i.checked_sub(1)))),
        ack: None,
    };
    let mut batch = vec![
        append("b", 0),
        Job {
            op: Op::Finish {
                trajectory: "a".into(),
            },
            ack: None,
        },
        append("b", 1),
        Job {
            op: Op::Ack {
                consumer: "c".into(),
                cursor: "x".into(),
            },
            ack: None,
        },
        append("a", 0),
        Job {
            op: Op::Ping,
            ack: None,
        },
    ];
    sort(&mut batch);
    let keys: Vec<Key> = batch.iter().map(|j| key(&j.op)).collect();
    assert_eq!(
        keys,
        [
            Key::Other,
            Key::Consumer("c"),
            Key::Trajectory("a"),
            Key::Trajectory("a"),
            Key::Trajectory("b"),
            Key::Trajectory("b"),
        ]
    );
    // "a": the finish arrived before the append, and stays before it.
    assert!(matches!(batch[2].op, Op::Finish { .. }));
    let b: Vec<u32> = batch[4..]
        .iter()
        .filter_map(|j| match &j.op {
            Op::Append(c) => Some(c.call_index),
            _ => None,
        })
        .collect();
    assert_eq!(b, [0, 1]);
}
