//! The fleet's numbering of weight versions on PostgreSQL: one
//! `weight_versions` row per label, numbered 1, 2, ... in the order labels
//! were first registered, the same on every replica.
//!
//! A new label's number is the largest so far + 1, so two replicas
//! registering new labels at once must not both read the same largest:
//! each registration takes [`VERSIONS_LOCK`] (held to the end of the
//! writer's transaction) before it reads. At READ COMMITTED each statement
//! sees what was committed before it started, and a transaction holding the
//! lock released it only after its commit, so the read sees every label
//! numbered before. The table's keys (`seq`, `label`) refuse a duplicate
//! outright should anything number without the lock.

use super::Conn;
use crate::store::{StoreError, VersionRecord};

/// The advisory lock under which weight versions are numbered: "tito_ver".
pub(super) const VERSIONS_LOCK: i64 = 0x7469_746f_5f76_6572;

fn seq_of(seq: i64) -> Result<u64, StoreError> {
    u64::try_from(seq).map_err(|_| StoreError::Corrupt(format!("weight version seq {seq}")))
}

/// In the writer's open transaction: the sequence number of `label`,
/// registering it (largest so far + 1, the first 1) when new.
pub(super) async fn register(conn: &mut Conn, label: &str, now: i64) -> Result<u64, StoreError> {
    let lock = conn.prep("SELECT pg_advisory_xact_lock($1)").await?;
    conn.client.execute(&lock, &[&VERSIONS_LOCK]).await?;
    let find = conn
        .prep("SELECT seq FROM weight_versions WHERE label = $1")
        .await?;
    if let Some(row) = conn.client.query_opt(&find, &[&label]).await? {
        return seq_of(row.try_get(0)?);
    }
    let insert = conn
        .prep(
            "INSERT INTO weight_versions (seq, label, registered_at) \
             SELECT COALESCE(MAX(seq), 0) + 1, $1, $2 FROM weight_versions RETURNING seq",
        )
        .await?;
    seq_of(
        conn.client
            .query_one(&insert, &[&label, &now])
            .await?
            .try_get(0)?,
    )
}

/// Every registered weight version, ascending by seq.
pub(super) async fn all(conn: &mut Conn) -> Result<Vec<VersionRecord>, StoreError> {
    let stmt = conn
        .prep("SELECT seq, label, registered_at FROM weight_versions ORDER BY seq")
        .await?;
    let rows = conn.client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|row| {
            Ok(VersionRecord {
                seq: seq_of(row.try_get(0)?)?,
                label: row.try_get(1)?,
                registered_at: row.try_get(2)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::bulk::tests::database_at;
    use super::super::{writer, Conn};
    use super::*;
    use crate::store::group_commit::{Done, Job, Op};

    fn register_job(label: &str) -> Vec<Job> {
        let (ack, _) = tokio::sync::oneshot::channel();
        vec![Job {
            op: Op::RegisterVersion {
                label: label.into(),
            },
            ack: Some(ack),
        }]
    }

    /// Another replica is numbering a new label and has not committed: a
    /// registration here waits for it and numbers its own label after it,
    /// where reading the largest number without the lock would have taken
    /// the same number (and failed on the key once the other committed).
    #[tokio::test]
    async fn a_registration_waits_for_another_replica_numbering_one() {
        let (url, mut other) = database_at().await;
        let mut conn = Conn::connect(&url).await.expect("connect");
        other.client.batch_execute("BEGIN").await.expect("begin");
        let theirs = register(&mut other, "theirs", 1).await.expect("theirs");
        assert_eq!(theirs, 1);
        // The whole batch's one transaction, without the fallback that
        // would run a failed job again.
        let mine =
            tokio::spawn(async move { writer::commit_all(&mut conn, &register_job("mine")).await });
        let probe = Conn::connect(&url).await.expect("connect");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "the registration never waited on the other replica"
            );
            let waiting: i64 = probe
                .client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .get(0);
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        other.client.batch_execute("COMMIT").await.expect("commit");
        let out = mine.await.expect("task").expect("commits at once");
        assert!(matches!(out[..], [Ok(Done::Version(2))]), "{out:?}");
        let listed: Vec<(u64, String)> = all(&mut other)
            .await
            .expect("all")
            .into_iter()
            .map(|v| (v.seq, v.label))
            .collect();
        assert_eq!(listed, [(1, "theirs".into()), (2, "mine".into())]);
    }
}
