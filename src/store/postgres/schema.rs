//! PostgreSQL schema and its migrations. The version lives in the one-row
//! table `tito_schema`; each migration runs in its own transaction together
//! with the version bump, all under one advisory lock, so replicas starting
//! at once migrate one after the other and a crash leaves the database at an old
//! or the new version, never in between. Only append to [`MIGRATIONS`].
//!
//! The layout follows the SQLite schema (`store::sqlite::schema`; version 1
//! here is its version 8, version 2 its 9 and 10, version 4 its 11, version 5
//! its 13, version 6 its 14, version 7 its 15, version 8 its 16): every
//! integer is `BIGINT`, token ids and logprobs are `BYTEA` in the
//! [`crate::store::codec`] layout, and JSON is `TEXT`, not `JSONB`, so a
//! stored request keeps its key order byte for byte.

use crate::store::StoreError;

use super::Conn;

/// Migration `i` (0-based) takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
    CREATE TABLE trajectories (
        seq BIGSERIAL PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        status BIGINT NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        reward DOUBLE PRECISION,
        num_calls BIGINT NOT NULL DEFAULT 0,
        next_call_index BIGINT NOT NULL DEFAULT 0,
        next_sample_index BIGINT NOT NULL DEFAULT 0,
        incomplete BOOLEAN NOT NULL DEFAULT FALSE,
        group_id TEXT,
        data_source TEXT,
        data_index BIGINT,
        extra_info TEXT,
        reward_extra TEXT,
        replays TEXT,
        num_tokens BIGINT NOT NULL DEFAULT 0,
        drift_count BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX trajectories_status_updated ON trajectories(status, updated_at);
    CREATE INDEX trajectories_group ON trajectories(group_id);
    CREATE TABLE calls (
        traj BIGINT NOT NULL REFERENCES trajectories(seq),
        call_index BIGINT NOT NULL,
        sample_index BIGINT NOT NULL,
        parent_call BIGINT,
        backend TEXT NOT NULL,
        started_at BIGINT NOT NULL,
        finished_at BIGINT NOT NULL,
        prompt_delta_ids BYTEA NOT NULL,
        sampled_ids BYTEA NOT NULL,
        logprobs BYTEA NOT NULL,
        finish_reason TEXT NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        drift TEXT,
        parse_outcome TEXT,
        moved_from TEXT,
        weight_version TEXT,
        tokenizer_sha256 TEXT NOT NULL,
        template_sha256 TEXT NOT NULL,
        reward DOUBLE PRECISION,
        truncated BOOLEAN NOT NULL,
        normalized TEXT,
        request_of BIGINT,
        PRIMARY KEY (traj, call_index)
    );
    -- Token ids and logprobs are near-random words that compress poorly:
    -- store them out of line without compression (pglz's CPU per call).
    ALTER TABLE calls ALTER COLUMN prompt_delta_ids SET STORAGE EXTERNAL;
    ALTER TABLE calls ALTER COLUMN sampled_ids SET STORAGE EXTERNAL;
    ALTER TABLE calls ALTER COLUMN logprobs SET STORAGE EXTERNAL;
    CREATE TABLE export_leases (
        consumer TEXT NOT NULL,
        traj BIGINT NOT NULL REFERENCES trajectories(seq),
        cursor TEXT NOT NULL,
        expires_at BIGINT NOT NULL,
        PRIMARY KEY (consumer, traj)
    );
    CREATE INDEX export_leases_cursor ON export_leases(consumer, cursor);
    CREATE TABLE export_acks (
        consumer TEXT NOT NULL,
        traj BIGINT NOT NULL REFERENCES trajectories(seq),
        cursor TEXT NOT NULL,
        acked_at BIGINT NOT NULL,
        PRIMARY KEY (consumer, traj)
    );
    CREATE INDEX export_acks_cursor ON export_acks(consumer, cursor);
    CREATE TABLE gateway_state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at BIGINT NOT NULL
    );
    "#,
    // 2: each consumer's mark (see `consumers`): every finished trajectory
    // at or below it is acknowledged by that consumer, as of the finish
    // numbered `fmark` (`fseq`: the order of finishes). And the indexes of
    // SQLite's migration 9: `trajectories_status_updated` goes (the filters
    // page in seq order; with it, a planner working from stale statistics
    // served a lease by reading every finished trajectory, and each call's
    // new `updated_at` kept PostgreSQL from updating the row in place);
    // trajectories without a group leave the group index.
    r#"
    ALTER TABLE trajectories ADD COLUMN fseq BIGINT;
    CREATE SEQUENCE trajectories_finish_order;
    CREATE INDEX trajectories_fseq ON trajectories(fseq) WHERE fseq IS NOT NULL;
    CREATE TABLE export_marks (
        consumer TEXT PRIMARY KEY,
        mark BIGINT NOT NULL,
        fmark BIGINT NOT NULL
    );
    DROP INDEX trajectories_status_updated;
    DROP INDEX trajectories_group;
    CREATE INDEX trajectories_group ON trajectories(group_id) WHERE group_id IS NOT NULL;
    "#,
    // 3: the listing key `lseq`, drawn from its own sequence when the
    // creating transaction commits, under a lock (`writer::COMMIT_SQL`), so
    // listing order is commit order across replicas. Existing rows keep
    // their creation order; new keys start above them. A row whose key is
    // not drawn yet (its transaction is open) is found by the partial index.
    r#"
    ALTER TABLE trajectories ADD COLUMN lseq BIGINT;
    UPDATE trajectories SET lseq = seq;
    CREATE SEQUENCE trajectories_listing_order;
    SELECT setval('trajectories_listing_order',
                  (SELECT COALESCE(max(seq), 0) + 1 FROM trajectories), false);
    CREATE UNIQUE INDEX trajectories_lseq ON trajectories(lseq);
    CREATE INDEX trajectories_unlisted ON trajectories(seq) WHERE lseq IS NULL;
    "#,
    // 4: SQLite's migration 11, each distinct chat message of a trajectory
    // once (`crate::store::codec::SplitRequest`); here a split body's
    // `message_refs` are its messages' SHA-256 digests in order, 32 bytes
    // each, so a replica inserts messages without reading ids back.
    r#"
    CREATE TABLE request_messages (
        traj BIGINT NOT NULL REFERENCES trajectories(seq),
        sha256 BYTEA NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (traj, sha256)
    );
    ALTER TABLE calls ADD COLUMN message_refs BYTEA;
    "#,
    // 5: SQLite's migration 13: a call's surface (`api`) and the id its
    // answer is retrieved by (`response_id`), NULL for calls stored before;
    // each response id ever recorded once in `responses`, with the call
    // holding it (NULL once forgotten: the id stays taken, on every
    // replica, by its primary key).
    r#"
    ALTER TABLE calls ADD COLUMN api TEXT;
    ALTER TABLE calls ADD COLUMN response_id TEXT;
    CREATE TABLE responses (
        response_id TEXT PRIMARY KEY,
        traj BIGINT,
        call_index BIGINT
    );
    "#,
    // 6: SQLite's migration 14: a call's version spans (`versions`, JSON,
    // NULL when unknown, as for calls stored before) and the fleet's
    // numbering of weight version labels, one row per label; a writer
    // numbers a new label under an advisory lock (`versions::VERSIONS_LOCK`),
    // so replicas agree and numbers leave no gaps.
    r#"
    ALTER TABLE calls ADD COLUMN versions TEXT;
    CREATE TABLE weight_versions (
        seq BIGINT PRIMARY KEY,
        label TEXT NOT NULL UNIQUE,
        registered_at BIGINT NOT NULL
    );
    "#,
    // 7: SQLite's migration 15: a call's image references (`images`, JSON,
    // NULL when it has none) and each image's bytes once, by SHA-256.
    r#"
    ALTER TABLE calls ADD COLUMN images TEXT;
    CREATE TABLE images (
        sha256 TEXT PRIMARY KEY,
        mime TEXT NOT NULL,
        width BIGINT NOT NULL,
        height BIGINT NOT NULL,
        bytes BYTEA NOT NULL
    );
    "#,
    // 8: SQLite's migration 16: the policy that served a call, its model's
    // name and LoRA adapter (NULL: the base model; both NULL for calls
    // stored before).
    r#"
    ALTER TABLE calls ADD COLUMN model TEXT;
    ALTER TABLE calls ADD COLUMN adapter TEXT;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Any constant both sides agree on: the advisory lock migrations take.
const MIGRATION_LOCK: i64 = 0x7469_746f_5f73_6368; // "tito_sch"

/// Brings the database to [`SCHEMA_VERSION`]; refuses a newer one. Holds a
/// session advisory lock throughout, so replicas starting together take
/// turns (even to create the version table).
pub(crate) async fn migrate(conn: &Conn) -> Result<u32, StoreError> {
    let c = &conn.client;
    c.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let result = migrate_locked(conn).await;
    let unlocked = c
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    let version = result?;
    unlocked?;
    Ok(version)
}

async fn migrate_locked(conn: &Conn) -> Result<u32, StoreError> {
    let c = &conn.client;
    c.batch_execute("CREATE TABLE IF NOT EXISTS tito_schema (version BIGINT NOT NULL)")
        .await?;
    loop {
        c.batch_execute("BEGIN").await?;
        let step = migrate_step(conn).await;
        match step {
            Ok(Some(_)) => c.batch_execute("COMMIT").await?,
            Ok(None) => {
                c.batch_execute("COMMIT").await?;
                return Ok(SCHEMA_VERSION);
            }
            Err(e) => {
                let _ = c.batch_execute("ROLLBACK").await;
                return Err(e);
            }
        }
    }
}

/// In an open transaction: applies the next migration, if any, and returns
/// the version it reached.
async fn migrate_step(conn: &Conn) -> Result<Option<u32>, StoreError> {
    let c = &conn.client;
    let current: i64 = match c.query_opt("SELECT version FROM tito_schema", &[]).await? {
        Some(row) => row.try_get(0)?,
        None => {
            c.execute("INSERT INTO tito_schema (version) VALUES (0)", &[])
                .await?;
            0
        }
    };
    if current > i64::from(SCHEMA_VERSION) {
        return Err(StoreError::Schema(format!(
            "database is at schema version {current}, this tito knows up to {SCHEMA_VERSION}; \
             upgrade tito"
        )));
    }
    let Some(sql) = usize::try_from(current)
        .ok()
        .and_then(|v| MIGRATIONS.get(v))
    else {
        return Ok(None);
    };
    c.batch_execute(sql).await?;
    c.execute("UPDATE tito_schema SET version = $1", &[&(current + 1)])
        .await?;
    Ok(Some((current + 1) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Bodies;

    /// A database at version 4 with a call: migration 5 leaves it without
    /// an api or a response id, and new calls record both.
    #[tokio::test]
    async fn migration_5_reads_old_calls_with_api_and_response_id_null() {
        let (_, mut conn) = super::super::test_database().await;
        for sql in &MIGRATIONS[..4] {
            conn.client.batch_execute(sql).await.expect("v4");
        }
        // Call 0: prompt [1], sampled [2], logprob -0.5 (little-endian).
        conn.client
            .batch_execute(
                "CREATE TABLE tito_schema (version BIGINT NOT NULL); \
                 INSERT INTO tito_schema VALUES (4); \
                 INSERT INTO trajectories (id, status, created_at, updated_at, num_calls, \
                   next_call_index, next_sample_index, lseq) VALUES ('old', 0, 1, 1, 1, 1, 1, 1); \
                 INSERT INTO calls (traj, call_index, sample_index, backend, started_at, \
                   finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
                   response, tokenizer_sha256, template_sha256, truncated) \
                 SELECT seq, 0, 0, 'b', 1, 2, decode('01000000', 'hex'), \
                   decode('02000000', 'hex'), decode('000000bf', 'hex'), 'stop', '{}', '{}', \
                   't', 'p', false FROM trajectories",
            )
            .await
            .expect("a version 4 database");
        assert_eq!(migrate(&conn).await.expect("migrates"), SCHEMA_VERSION);
        let load = super::super::rows::load;
        let old = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        let c = &old.calls[0];
        assert_eq!((c.api.as_deref(), c.response_id.as_deref()), (None, None));
        assert_eq!(
            (c.prompt_delta_ids.as_slice(), c.sampled_ids.as_slice()),
            (&[1][..], &[2][..])
        );
        assert_eq!(c.logprobs, [Some(-0.5)]);

        let mut new = super::super::bulk::tests::call("old", 1, Some(0));
        new.response_id = Some("resp_1".into());
        let mut jobs = super::super::bulk::tests::jobs(vec![new.clone()]);
        let out = super::super::writer::commit_batch(&mut conn, &mut jobs).await;
        assert!(out[0].is_ok(), "{out:?}");
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(t.calls[1], new);
        let found = super::super::rows::find_response(&mut conn, "resp_1")
            .await
            .expect("find");
        assert_eq!(found.map(|r| r.call_index), Some(1));
    }

    /// A database at version 5 with a call: migration 6 reads it back with
    /// no version spans, numbers no version, and new calls keep theirs.
    #[tokio::test]
    async fn migration_6_reads_old_calls_without_versions() {
        let (_, mut conn) = super::super::test_database().await;
        for sql in &MIGRATIONS[..5] {
            conn.client.batch_execute(sql).await.expect("v5");
        }
        conn.client
            .batch_execute(
                "CREATE TABLE tito_schema (version BIGINT NOT NULL); \
                 INSERT INTO tito_schema VALUES (5); \
                 INSERT INTO trajectories (id, status, created_at, updated_at, num_calls, \
                   next_call_index, next_sample_index, lseq) VALUES ('old', 0, 1, 1, 1, 1, 1, 1); \
                 INSERT INTO calls (traj, call_index, sample_index, backend, started_at, \
                   finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request, \
                   response, weight_version, tokenizer_sha256, template_sha256, truncated, api) \
                 SELECT seq, 0, 0, 'b', 1, 2, decode('01000000', 'hex'), \
                   decode('02000000', 'hex'), decode('000000bf', 'hex'), 'stop', '{}', '{}', \
                   'w1', 't', 'p', false, 'chat' FROM trajectories",
            )
            .await
            .expect("a version 5 database");
        assert_eq!(migrate(&conn).await.expect("migrates"), SCHEMA_VERSION);
        let load = super::super::rows::load;
        let old = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        let c = &old.calls[0];
        assert_eq!(c.versions, []);
        assert_eq!(
            (c.sampled_ids.as_slice(), c.weight_version.as_deref()),
            (&[2][..], Some("w1"))
        );
        assert_eq!(
            super::super::versions::all(&mut conn).await.expect("all"),
            []
        );

        let new = super::super::bulk::tests::call("old", 1, Some(0));
        assert_eq!(new.versions.len(), 2);
        let mut jobs = super::super::bulk::tests::jobs(vec![new.clone()]);
        let out = super::super::writer::commit_batch(&mut conn, &mut jobs).await;
        assert!(out[0].is_ok(), "{out:?}");
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(t.calls[1], new);
    }

    /// A database at version 6 with a call: migration 7 adds the images
    /// table, the old call reads back without images, a new one keeps its.
    #[tokio::test]
    async fn migration_7_reads_old_calls_without_images() {
        let (_, mut conn) = super::super::test_database().await;
        for sql in &MIGRATIONS[..6] {
            conn.client.batch_execute(sql).await.expect("v6");
        }
        let old = super::super::bulk::tests::call("old", 0, None);
        conn.client
            .batch_execute(
                "CREATE TABLE tito_schema (version BIGINT NOT NULL); \
                 INSERT INTO tito_schema VALUES (6); \
                 INSERT INTO trajectories (id, status, created_at, updated_at, num_calls, \
                   next_call_index, next_sample_index, lseq) VALUES ('old', 0, 1, 1, 1, 1, 1, 1)",
            )
            .await
            .expect("a version 6 database");
        // Call 0 as a version 6 writer stored it: every column but images.
        let p = super::super::append::AppendParams::of(&old, 1).expect("params");
        let cols = p.columns();
        let stmt = "INSERT INTO calls (traj, call_index, sample_index, parent_call, backend, \
             started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, \
             request, response, drift, parse_outcome, moved_from, weight_version, \
             tokenizer_sha256, template_sha256, reward, truncated, normalized, request_of, \
             message_refs, api, response_id, versions) SELECT seq, $1, $2, $3, $4, $5, $6, $7, \
             $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, \
             $25, $26 FROM trajectories";
        conn.client
            .execute(stmt, &cols[..26])
            .await
            .expect("a version 6 call");
        assert_eq!(migrate(&conn).await.expect("migrates"), SCHEMA_VERSION);
        let load = super::super::rows::load;
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(t.calls, [old]);

        let image = crate::store::StoredImage::new("image/png", 1, 1, vec![7; 10]);
        let mut new = super::super::bulk::tests::call("old", 1, Some(0));
        new.images = vec![crate::store::CallImage {
            sha256: image.sha256.clone(),
            mime: image.mime.clone(),
            width: 1,
            height: 1,
            grid_thw: [1, 2, 2],
            offset: 0,
            tokens: 1,
        }];
        let (ack, _) = tokio::sync::oneshot::channel();
        let mut jobs = super::super::bulk::tests::jobs(vec![new.clone()]);
        jobs.push(crate::store::group_commit::Job {
            op: crate::store::group_commit::Op::PutImages(vec![image]),
            ack: Some(ack),
        });
        let out = super::super::writer::commit_batch(&mut conn, &mut jobs).await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(t.calls[1], new);
    }

    /// A database at version 7 with a call: migration 8 adds `model` and
    /// `adapter`, the old call reads back with both `None`, a new one
    /// keeps its policy.
    #[tokio::test]
    async fn migration_8_reads_old_calls_without_a_policy() {
        let (_, mut conn) = super::super::test_database().await;
        for sql in &MIGRATIONS[..7] {
            conn.client.batch_execute(sql).await.expect("v7");
        }
        let old = super::super::bulk::tests::call("old", 0, None);
        conn.client
            .batch_execute(
                "CREATE TABLE tito_schema (version BIGINT NOT NULL); \
                 INSERT INTO tito_schema VALUES (7); \
                 INSERT INTO trajectories (id, status, created_at, updated_at, num_calls, \
                   next_call_index, next_sample_index, lseq) VALUES ('old', 0, 1, 1, 1, 1, 1, 1)",
            )
            .await
            .expect("a version 7 database");
        // Call 0 as a version 7 writer stored it: every column but the policy.
        let p = super::super::append::AppendParams::of(&old, 1).expect("params");
        let cols = p.columns();
        let stmt = "INSERT INTO calls (traj, call_index, sample_index, parent_call, backend, \
             started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, \
             request, response, drift, parse_outcome, moved_from, weight_version, \
             tokenizer_sha256, template_sha256, reward, truncated, normalized, request_of, \
             message_refs, api, response_id, versions, images) SELECT seq, $1, $2, $3, $4, $5, \
             $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, \
             $23, $24, $25, $26, $27 FROM trajectories";
        conn.client
            .execute(stmt, &cols[..27])
            .await
            .expect("a version 7 call");
        assert_eq!(migrate(&conn).await.expect("migrates"), SCHEMA_VERSION);
        let load = super::super::rows::load;
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(
            (t.calls[0].model.as_deref(), t.calls[0].adapter.as_deref()),
            (None, None)
        );
        assert_eq!(t.calls, [old]);

        let mut new = super::super::bulk::tests::call("old", 1, Some(0));
        new.model = Some("base".into());
        new.adapter = Some("coder-lora".into());
        let mut jobs = super::super::bulk::tests::jobs(vec![new.clone()]);
        let out = super::super::writer::commit_batch(&mut conn, &mut jobs).await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
        let t = load(&mut conn, super::super::rows::Key::Id("old"), Bodies::Read)
            .await
            .expect("load")
            .expect("kept");
        assert_eq!(t.calls[1], new);
    }

    /// A database at version 2 with trajectories: migration 3 gives them
    /// listing keys equal to their creation order, and new keys go above.
    #[tokio::test]
    async fn migration_3_keys_existing_trajectories_in_creation_order() {
        let (_, conn) = super::super::test_database().await;
        let c = &conn.client;
        c.batch_execute(MIGRATIONS[0]).await.expect("v1");
        c.batch_execute(MIGRATIONS[1]).await.expect("v2");
        c.batch_execute(
            "CREATE TABLE tito_schema (version BIGINT NOT NULL); \
             INSERT INTO tito_schema VALUES (2); \
             INSERT INTO trajectories (id, status, created_at, updated_at) \
             VALUES ('a', 0, 1, 1), ('b', 0, 1, 1)",
        )
        .await
        .expect("a version 2 database");
        assert_eq!(migrate(&conn).await.expect("migrates"), SCHEMA_VERSION);
        let keyed: Vec<(i64, i64)> = c
            .query("SELECT seq, lseq FROM trajectories ORDER BY seq", &[])
            .await
            .expect("rows")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert!(keyed.iter().all(|(seq, lseq)| seq == lseq), "{keyed:?}");
        let next: i64 = c
            .query_one("SELECT nextval('trajectories_listing_order')", &[])
            .await
            .expect("nextval")
            .get(0);
        assert!(
            keyed.iter().all(|(_, lseq)| *lseq < next),
            "{keyed:?} then {next}"
        );
    }
}
