//! One call's append on PostgreSQL: the statement that stores it
//! ([`APPEND_SQL`]), its parameters ([`AppendParams`], shared with the bulk
//! `COPY` of `super::bulk`), and the pipelined run of appends the writer
//! sends for a batch ([`append_pipelined`]).

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::rows::status_code;
use super::writer::CREATE_SQL;
use super::Conn;
use crate::store::codec::{ids_to_bytes, images_text, logprobs_to_bytes, split_request};
use crate::store::{CallRecord, StoreError, TrajectoryStatus};

/// One call, in one statement: insert it when its trajectory is active and
/// its parent is stored, record its response id (an id taken before fails
/// the statement on `responses_pkey`), and count it on the trajectory row.
/// Returns the trajectory's status and whether the call went in. `FOR NO KEY UPDATE`
/// waits for a finish another replica has not committed yet, then reads its
/// outcome: a call is never stored after its trajectory's finish. It is the
/// lock the `UPDATE` below takes anyway: a weaker `FOR SHARE` would let two
/// replicas both hold the row and then deadlock upgrading it.
const APPEND_SQL: &str =
    "WITH t AS (SELECT seq, status FROM trajectories WHERE id = $1 FOR NO KEY UPDATE), \
     ins AS (INSERT INTO calls (traj, call_index, sample_index, parent_call, backend, \
       started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
       response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256, \
       template_sha256, reward, truncated, normalized, request_of, message_refs, api, \
       response_id, versions, images, model, adapter) \
     SELECT t.seq, $2::BIGINT, $3::BIGINT, $4::BIGINT, $5::TEXT, $6::BIGINT, $7::BIGINT, \
       $8::BYTEA, $9::BYTEA, $10::BYTEA, $11::TEXT, $12::TEXT, $13::TEXT, $14::TEXT, $15::TEXT, \
       $16::TEXT, $17::TEXT, $18::TEXT, $19::TEXT, $20::FLOAT8, $21::BOOLEAN, $22::TEXT, \
       $23::BIGINT, $24::BYTEA, $25::TEXT, $26::TEXT, $27::TEXT, $28::TEXT, $29::TEXT, \
       $30::TEXT FROM t \
     WHERE t.status = 0 AND ($4::BIGINT IS NULL OR EXISTS \
       (SELECT 1 FROM calls p WHERE p.traj = t.seq AND p.call_index = $4::BIGINT)) \
     RETURNING traj), \
     msgs AS (INSERT INTO request_messages (traj, sha256, body) \
       SELECT ins.traj, m.d, m.b FROM ins, unnest($34::BYTEA[], $35::TEXT[]) AS m(d, b) \
       ON CONFLICT DO NOTHING), \
     resp AS (INSERT INTO responses (response_id, traj, call_index) \
       SELECT $26::TEXT, ins.traj, $2::BIGINT FROM ins WHERE $26::TEXT IS NOT NULL), \
     up AS (UPDATE trajectories SET updated_at = GREATEST(updated_at, $31::BIGINT), \
       num_calls = num_calls + 1, next_call_index = GREATEST(next_call_index, $2::BIGINT + 1), \
       next_sample_index = GREATEST(next_sample_index, $3::BIGINT + 1), \
       num_tokens = num_tokens + $32::BIGINT, drift_count = drift_count + $33::BIGINT \
     WHERE seq IN (SELECT traj FROM ins) RETURNING seq) \
     SELECT t.status, EXISTS (SELECT 1 FROM up) AS stored FROM t";

/// A call's statement parameters, owned so the pipelined futures can borrow
/// them.
pub(super) struct AppendParams {
    pub id: String,
    pub call_index: i64,
    pub sample_index: i64,
    pub parent: Option<i64>,
    pub backend: String,
    pub started_at: i64,
    pub finished_at: i64,
    pub delta: Vec<u8>,
    pub sampled: Vec<u8>,
    pub logprobs: Vec<u8>,
    pub finish_reason: String,
    pub request: String,
    pub response: String,
    pub drift: Option<String>,
    pub parse_outcome: Option<String>,
    pub moved_from: Option<String>,
    pub weight_version: Option<String>,
    pub tokenizer_sha256: String,
    pub template_sha256: String,
    pub reward: Option<f64>,
    pub truncated: bool,
    pub normalized: Option<String>,
    pub request_of: Option<i64>,
    /// The digests of the body's messages when they are stored apart.
    pub message_refs: Option<Vec<u8>>,
    pub api: Option<String>,
    pub response_id: Option<String>,
    /// The call's version spans, JSON; `None` when it has none.
    pub versions: Option<String>,
    /// The call's image references, JSON; `None` when it has none.
    pub images: Option<String>,
    /// The policy that served the call: model name, LoRA adapter.
    pub model: Option<String>,
    pub adapter: Option<String>,
    /// Those messages, digests and texts, for `request_messages`.
    pub message_digests: Vec<Vec<u8>>,
    pub message_bodies: Vec<String>,
    pub now: i64,
    pub tokens: i64,
    pub drifted: i64,
}

impl AppendParams {
    pub(super) fn of(call: &CallRecord, now: i64) -> Result<Self, StoreError> {
        let drift = match &call.drift {
            Some(d) => {
                Some(serde_json::to_string(d).map_err(|e| StoreError::Invalid(e.to_string()))?)
            }
            None => None,
        };
        let request = split_request(&call.request, call.parent_call.is_some())?;
        let messages = request.messages.unwrap_or_default();
        Ok(AppendParams {
            id: call.trajectory_id.clone(),
            call_index: i64::from(call.call_index),
            sample_index: i64::from(call.sample_index),
            parent: call.parent_call.map(i64::from),
            backend: call.backend.clone(),
            started_at: call.started_at,
            finished_at: call.finished_at,
            delta: ids_to_bytes(&call.prompt_delta_ids),
            sampled: ids_to_bytes(&call.sampled_ids),
            logprobs: logprobs_to_bytes(&call.logprobs),
            finish_reason: call.finish_reason.clone(),
            request: request.text,
            response: call.response.to_string(),
            drift,
            parse_outcome: call.parse_outcome.clone(),
            moved_from: call.moved_from.clone(),
            weight_version: call.weight_version.clone(),
            tokenizer_sha256: call.tokenizer_sha256.clone(),
            template_sha256: call.template_sha256.clone(),
            reward: call.reward,
            truncated: call.truncated,
            normalized: (!call.normalized.is_empty())
                .then(|| serde_json::Value::from(call.normalized.clone()).to_string()),
            request_of: call.request_of.map(i64::from),
            message_refs: (!messages.is_empty())
                .then(|| messages.iter().flat_map(|m| m.1).collect()),
            api: call.api.clone(),
            response_id: call.response_id.clone(),
            versions: (!call.versions.is_empty())
                .then(|| serde_json::to_string(&call.versions))
                .transpose()
                .map_err(|e| StoreError::Invalid(e.to_string()))?,
            images: images_text(&call.images)?,
            model: call.model.clone(),
            adapter: call.adapter.clone(),
            message_digests: messages.iter().map(|m| m.1.to_vec()).collect(),
            message_bodies: messages.into_iter().map(|m| m.0).collect(),
            now,
            tokens: (call.prompt_delta_ids.len() + call.sampled_ids.len()) as i64,
            drifted: i64::from(call.drift.is_some()),
        })
    }

    /// The `calls` columns after `traj`, in table order: `$2`..`$30` of
    /// [`APPEND_SQL`], and the bulk `COPY`'s columns after its first.
    pub(super) fn columns(&self) -> [&(dyn ToSql + Sync); 29] {
        [
            &self.call_index,
            &self.sample_index,
            &self.parent,
            &self.backend,
            &self.started_at,
            &self.finished_at,
            &self.delta,
            &self.sampled,
            &self.logprobs,
            &self.finish_reason,
            &self.request,
            &self.response,
            &self.drift,
            &self.parse_outcome,
            &self.moved_from,
            &self.weight_version,
            &self.tokenizer_sha256,
            &self.template_sha256,
            &self.reward,
            &self.truncated,
            &self.normalized,
            &self.request_of,
            &self.message_refs,
            &self.api,
            &self.response_id,
            &self.versions,
            &self.images,
            &self.model,
            &self.adapter,
        ]
    }

    /// `$1`..`$35` of [`APPEND_SQL`].
    fn values(&self) -> Vec<&(dyn ToSql + Sync)> {
        let mut v: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(35);
        v.push(&self.id);
        v.extend(self.columns());
        v.push(&self.now);
        v.push(&self.tokens);
        v.push(&self.drifted);
        v.push(&self.message_digests);
        v.push(&self.message_bodies);
        v
    }
}

/// Appends `calls` in order with every statement pipelined. The outer error
/// is a call naming an image not stored (checked first, before any
/// statement) or the first statement error (the transaction is then
/// aborted); the inner results say which calls were refused (finished
/// trajectory, parent not stored).
pub(super) async fn append_pipelined(
    conn: &mut Conn,
    calls: &[&CallRecord],
    now: i64,
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    super::images::check(conn, calls).await?;
    let create = conn.prep(CREATE_SQL).await?;
    let insert = conn.prep(APPEND_SQL).await?;
    let params = calls
        .iter()
        .map(|c| AppendParams::of(c, now))
        .collect::<Result<Vec<_>, _>>()?;
    let client = &conn.client;
    let values: Vec<_> = params.iter().map(AppendParams::values).collect();
    let keys: Vec<[&(dyn ToSql + Sync); 2]> =
        params.iter().map(|p| [&p.id as _, &p.now as _]).collect();
    // Created in order and polled in order by `join_all`: the statements go
    // out in this order, and the server runs them in this order.
    let futures = keys.iter().zip(&values).flat_map(|(key, values)| {
        [
            client.query(&create, key.as_slice()),
            client.query(&insert, values.as_slice()),
        ]
    });
    let results = futures::future::join_all(futures.collect::<Vec<_>>()).await;
    let mut out = Vec::with_capacity(calls.len());
    for (call, pair) in calls.iter().zip(results.chunks(2)) {
        let [created, inserted] = pair else {
            return Err(StoreError::Task("pipelined append lost a statement".into()));
        };
        match created {
            Ok(rows) => conn.created += rows.len() as u64,
            Err(e) => return Err(e.clone_error()),
        }
        let rows = match inserted {
            Ok(rows) => rows,
            Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
                return Err(taken(call, e));
            }
            Err(e) => return Err(e.clone_error()),
        };
        let Some(row) = rows.first() else {
            return Err(StoreError::Task(format!(
                "trajectory `{}` vanished while appending",
                call.trajectory_id
            )));
        };
        let status: i64 = row.try_get(0)?;
        let stored: bool = row.try_get(1)?;
        out.push(if stored {
            Ok(())
        } else if status == status_code(TrajectoryStatus::Finished) {
            Err(StoreError::Finished(call.trajectory_id.clone()))
        } else {
            Err(missing_parent(call))
        });
    }
    Ok(out)
}

/// The unique key a call's insert violated: its response id, or its slot.
fn taken(call: &CallRecord, e: &tokio_postgres::Error) -> StoreError {
    let constraint = e.as_db_error().and_then(|db| db.constraint());
    match (&call.response_id, constraint) {
        (Some(id), Some(RESPONSES_KEY)) => StoreError::ResponseIdTaken(id.clone()),
        _ => StoreError::Duplicate {
            trajectory: call.trajectory_id.clone(),
            call: call.call_index,
        },
    }
}

/// The primary key of `responses`, as PostgreSQL names it.
const RESPONSES_KEY: &str = "responses_pkey";

trait CloneError {
    fn clone_error(&self) -> StoreError;
}

impl CloneError for tokio_postgres::Error {
    /// A statement error as the store's error (the driver's error is not
    /// `Clone`, and the results are borrowed).
    fn clone_error(&self) -> StoreError {
        match self.as_db_error() {
            Some(db) => {
                StoreError::Postgres(format!("{} (SQLSTATE {})", db.message(), db.code().code()))
            }
            None => StoreError::Postgres(self.to_string()),
        }
    }
}

fn missing_parent(call: &CallRecord) -> StoreError {
    StoreError::Invalid(format!(
        "call {} of `{}`: parent {:?} is not stored",
        call.call_index, call.trajectory_id, call.parent_call
    ))
}

#[cfg(test)]
mod tests {
    use super::super::bulk::tests::{call, database_at, jobs};
    use super::super::rows::{load, Key};
    use super::super::writer;
    use crate::store::{Bodies, CallRecord};

    /// `n` calls of `traj` in a chain, each served by a policy in turn: the
    /// base model, an adapter of it, none recorded.
    fn served(traj: &str, n: u32) -> Vec<CallRecord> {
        (0..n)
            .map(|i| {
                let mut c = call(traj, i, i.checked_sub(1));
                match i % 3 {
                    0 => c.model = Some("planner".into()),
                    1 => (c.model, c.adapter) = (Some("base".into()), Some("coder-lora".into())),
                    _ => {}
                }
                c
            })
            .collect()
    }

    /// The policy goes in by the pipelined append (a short run) and by
    /// `COPY` (a long one: `commit_all` fails rather than fall back), and
    /// reads back as it went in.
    #[tokio::test]
    async fn a_calls_policy_goes_in_by_either_path() {
        let (_, mut conn) = database_at().await;
        let short = served("short", 3);
        let long = served("long", 12);
        for run in [&short, &long] {
            let out = writer::commit_all(&mut conn, &jobs(run.clone()))
                .await
                .expect("the run commits whole");
            assert!(out.iter().all(Result::is_ok), "{out:?}");
        }
        for (id, want) in [("short", &short), ("long", &long)] {
            let t = load(&mut conn, Key::Id(id), Bodies::Read)
                .await
                .expect("load")
                .expect("stored");
            assert_eq!(&t.calls, want, "{id}");
        }
    }
}
