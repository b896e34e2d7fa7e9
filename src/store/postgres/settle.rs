//! The outcome of a `COMMIT` whose answer never came back.
//!
//! When the connection drops after the writer sent `COMMIT`, the server may
//! have committed the batch or not; reporting it failed when it landed would
//! make the client's retry record the call a second time. So each write
//! transaction learns its id and its server process when it begins
//! ([`Xact`]), and a commit that failed without a final answer (no answer, or the server process ending) is
//! settled over a fresh connection: `pg_xact_status` says `committed` or
//! `aborted`. While the old server process still holds the transaction (it
//! has not noticed the connection is gone), it is terminated first and
//! waited for: a process that already wrote its commit record finishes the
//! commit, any other rolls back, and the status is then final.

use super::Conn;
use crate::store::StoreError;

/// How long to wait for the old server process to exit once told to.
const TERMINATE_WAIT_MS: u64 = 10_000;

/// A write transaction: its id (`xid8`) and the server process serving it.
#[derive(Debug, Clone)]
pub(crate) struct Xact {
    id: u64,
    pid: i32,
}

/// What `writer::begin` runs last in its round trip, for [`Xact::of`]. It
/// gives the transaction an id at once, which every write batch takes
/// anyway.
pub(crate) const XACT_SQL: &str = "SELECT pg_current_xact_id()::text, pg_backend_pid()::text";

impl Xact {
    /// The transaction from the answer to a simple query ending in
    /// [`XACT_SQL`] (its last row).
    pub(crate) fn of(answer: &[tokio_postgres::SimpleQueryMessage]) -> Option<Xact> {
        let row = answer.iter().rev().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })?;
        Some(Xact {
            id: row.get(0)?.parse().ok()?,
            pid: row.get(1)?.parse().ok()?,
        })
    }
}

/// Whether the transaction committed, asked over a new connection to `url`:
/// `Ok` when it did, the commit's error (`cause`) saying what became of it
/// when it did not or cannot be known.
pub(crate) async fn settle(url: &str, xact: &Xact, cause: String) -> Result<(), StoreError> {
    let unknown = |why: String| {
        StoreError::Commit(format!(
            "{cause}; whether the transaction committed is unknown: {why}"
        ))
    };
    let conn = Conn::connect(url)
        .await
        .map_err(|e| unknown(e.to_string()))?;
    for round in 0..2 {
        let status = status(&conn, xact)
            .await
            .map_err(|e| unknown(e.to_string()))?;
        match status.as_deref() {
            Some("committed") => {
                tracing::warn!(error = %cause, xact = xact.id,
                    "span store: the commit's answer was lost, but the transaction committed");
                return Ok(());
            }
            Some("aborted") => {
                return Err(StoreError::Commit(format!(
                    "{cause}; the transaction rolled back"
                )))
            }
            Some("in progress") if round == 0 => {
                // Only the process that still runs this transaction: its
                // pid may belong to another session once it has exited.
                let sql = format!(
                    "SELECT pg_terminate_backend(pid, {TERMINATE_WAIT_MS}) FROM pg_stat_activity \
                     WHERE pid = {} AND backend_xid::text = '{}'",
                    xact.pid,
                    xact.id % (1 << 32)
                );
                if let Err(e) = conn.client.simple_query(&sql).await {
                    return Err(unknown(format!("cannot end the old server process: {e}")));
                }
            }
            other => return Err(unknown(format!("pg_xact_status says {other:?}"))),
        }
    }
    Err(unknown("the old server process still holds it".into()))
}

async fn status(conn: &Conn, xact: &Xact) -> Result<Option<String>, tokio_postgres::Error> {
    let sql = format!("SELECT pg_xact_status('{}'::xid8)", xact.id);
    let answer = conn.client.simple_query(&sql).await?;
    Ok(answer.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
        _ => None,
    }))
}
