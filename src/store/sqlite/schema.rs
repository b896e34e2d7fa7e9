//! SQLite schema and its migrations. The version lives in `PRAGMA
//! user_version`; each migration runs in its own transaction together with the
//! version bump, so a crash leaves the database at an old or the new version,
//! never in between. Only append to [`MIGRATIONS`]; never edit a shipped one.

use rusqlite::Connection;

use crate::store::StoreError;

/// Migration `i` (0-based) takes the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: trajectories and calls. Token ids and logprobs are little-endian
    // u32 / f32 BLOBs; JSON columns are TEXT.
    r#"
    CREATE TABLE trajectories (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        status INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        reward REAL,
        num_calls INTEGER NOT NULL,
        next_call_index INTEGER NOT NULL,
        next_sample_index INTEGER NOT NULL
    );
    CREATE TABLE calls (
        traj INTEGER NOT NULL REFERENCES trajectories(seq),
        call_index INTEGER NOT NULL,
        sample_index INTEGER NOT NULL,
        parent_call INTEGER,
        backend TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        prompt_delta_ids BLOB NOT NULL,
        sampled_ids BLOB NOT NULL,
        logprobs BLOB NOT NULL,
        finish_reason TEXT NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        drift TEXT,
        parse_outcome TEXT,
        moved_from TEXT,
        weight_version TEXT,
        tokenizer_sha256 TEXT NOT NULL,
        template_sha256 TEXT NOT NULL,
        reward REAL,
        truncated INTEGER NOT NULL,
        PRIMARY KEY (traj, call_index)
    );
    "#,
    // 2: "finished since T" (the usual export filter) without a table scan.
    r#"
    CREATE INDEX trajectories_status_updated ON trajectories(status, updated_at);
    "#,
    // 3: `[store] ack = "queued"`: the serving gateway's run (was it queued,
    // did it end cleanly), and trajectories a crashed queued run may have
    // lost calls of.
    r#"
    ALTER TABLE trajectories ADD COLUMN incomplete INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE gateway_run (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        ack_queued INTEGER NOT NULL,
        clean INTEGER NOT NULL,
        started_at INTEGER NOT NULL
    );
    "#,
    // 4: normalization rules applied to a call's request before rendering
    // (a JSON list; NULL when none).
    r#"
    ALTER TABLE calls ADD COLUMN normalized TEXT;
    "#,
    // 5: what a trainer needs: the trajectory's group and dataset fields,
    // named reward parts, replay checks (JSON list), and the export queues of
    // consumer groups (leased pages and acknowledged trajectories).
    r#"
    ALTER TABLE trajectories ADD COLUMN group_id TEXT;
    ALTER TABLE trajectories ADD COLUMN data_source TEXT;
    ALTER TABLE trajectories ADD COLUMN data_index INTEGER;
    ALTER TABLE trajectories ADD COLUMN extra_info TEXT;
    ALTER TABLE trajectories ADD COLUMN reward_extra TEXT;
    ALTER TABLE trajectories ADD COLUMN replays TEXT;
    CREATE INDEX trajectories_group ON trajectories(group_id);
    CREATE TABLE export_leases (
        consumer TEXT NOT NULL,
        traj INTEGER NOT NULL REFERENCES trajectories(seq),
        cursor TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        PRIMARY KEY (consumer, traj)
    ) WITHOUT ROWID;
    CREATE INDEX export_leases_cursor ON export_leases(consumer, cursor);
    CREATE TABLE export_acks (
        consumer TEXT NOT NULL,
        traj INTEGER NOT NULL REFERENCES trajectories(seq),
        cursor TEXT NOT NULL,
        acked_at INTEGER NOT NULL,
        PRIMARY KEY (consumer, traj)
    ) WITHOUT ROWID;
    CREATE INDEX export_acks_cursor ON export_acks(consumer, cursor);
    "#,
    // 6: one request body per HTTP request: the other calls it started name
    // the call holding it (their `request` is the JSON text `null`).
    r#"
    ALTER TABLE calls ADD COLUMN request_of INTEGER;
    "#,
    // 7: the fleet's weight version, set by a weight update every backend
    // took, so a restarted gateway tags calls with it.
    r#"
    CREATE TABLE gateway_state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 8: per-trajectory token and drift counts, kept by every append (for
    // lists without reading calls), counted once here for existing rows.
    r#"
    ALTER TABLE trajectories ADD COLUMN num_tokens INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE trajectories ADD COLUMN drift_count INTEGER NOT NULL DEFAULT 0;
    UPDATE trajectories SET
        num_tokens = (SELECT COALESCE(SUM(length(prompt_delta_ids) + length(sampled_ids)), 0) / 4
                      FROM calls WHERE calls.traj = trajectories.seq),
        drift_count = (SELECT COUNT(*) FROM calls
                       WHERE calls.traj = trajectories.seq AND drift IS NOT NULL);
    "#,
    // 9: fewer index pages written per call. No query reads
    // `trajectories_status_updated` (the store's filters page in seq order,
    // so SQLite walks the table), yet every call moved the trajectory's
    // entry in it. Trajectories without a group leave the group index, which
    // serves only lookups by group.
    r#"
    DROP INDEX trajectories_status_updated;
    DROP INDEX trajectories_group;
    CREATE INDEX trajectories_group ON trajectories(group_id) WHERE group_id IS NOT NULL;
    "#,
    // 10: each consumer's mark: every finished trajectory at or below it is
    // acknowledged by that consumer, so a lease starts above the mark
    // instead of walking the acknowledged past (`consumers` keeps it).
    r#"
    CREATE TABLE export_marks (
        consumer TEXT PRIMARY KEY,
        mark INTEGER NOT NULL
    ) WITHOUT ROWID;
    "#,
    // 11: each distinct chat message of a trajectory stored once; a call
    // that continues another and whose body has a message list stores the
    // body with `messages` null and the ids of its messages (little-endian
    // i64s) in `message_refs` (`requests.rs`). Rows stored before keep
    // their bodies whole.
    r#"
    CREATE TABLE request_messages (
        id INTEGER PRIMARY KEY,
        traj INTEGER NOT NULL REFERENCES trajectories(seq),
        sha256 BLOB NOT NULL,
        body TEXT NOT NULL
    );
    CREATE UNIQUE INDEX request_messages_digest ON request_messages(traj, sha256);
    ALTER TABLE calls ADD COLUMN message_refs BLOB;
    "#,
    // 12: a call's row keyed by one integer, `call_key` = traj * 2^32 +
    // call_index, the table's rowid: an append writes one B-tree (the table)
    // instead of two (the table, and the index SQLite kept for the primary
    // key (traj, call_index)). The key is unique where the pair was, and a
    // trajectory's calls are one key range, in call order. Rebuilds the
    // table, rows unchanged.
    r#"
    CREATE TABLE calls_v12 (
        call_key INTEGER PRIMARY KEY,
        traj INTEGER NOT NULL REFERENCES trajectories(seq),
        call_index INTEGER NOT NULL,
        sample_index INTEGER NOT NULL,
        parent_call INTEGER,
        backend TEXT NOT NULL,
        started_at INTEGER NOT NULL,
        finished_at INTEGER NOT NULL,
        prompt_delta_ids BLOB NOT NULL,
        sampled_ids BLOB NOT NULL,
        logprobs BLOB NOT NULL,
        finish_reason TEXT NOT NULL,
        request TEXT NOT NULL,
        response TEXT NOT NULL,
        drift TEXT,
        parse_outcome TEXT,
        moved_from TEXT,
        weight_version TEXT,
        tokenizer_sha256 TEXT NOT NULL,
        template_sha256 TEXT NOT NULL,
        reward REAL,
        truncated INTEGER NOT NULL,
        normalized TEXT,
        request_of INTEGER,
        message_refs BLOB,
        CHECK (call_key = traj * 4294967296 + call_index)
    );
    INSERT INTO calls_v12 (call_key, traj, call_index, sample_index, parent_call, backend,
        started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request,
        response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256,
        template_sha256, reward, truncated, normalized, request_of, message_refs)
    SELECT traj * 4294967296 + call_index, traj, call_index, sample_index, parent_call, backend,
        started_at, finished_at, prompt_delta_ids, sampled_ids, logprobs, finish_reason, request,
        response, drift, parse_outcome, moved_from, weight_version, tokenizer_sha256,
        template_sha256, reward, truncated, normalized, request_of, message_refs
    FROM calls ORDER BY traj, call_index;
    DROP TABLE calls;
    ALTER TABLE calls_v12 RENAME TO calls;
    "#,
    // 13: the surface a call came through (`api`) and the id its answer is
    // retrieved by (`response_id`), NULL for calls stored before. Each
    // response id ever recorded is kept in `responses`, unique, with the
    // key of the call holding it (NULL once forgotten: the id stays
    // taken). An index on `calls` would do for uniqueness, but a table of
    // its own keeps forgotten ids, and leaves `calls` one B-tree.
    r#"
    ALTER TABLE calls ADD COLUMN api TEXT;
    ALTER TABLE calls ADD COLUMN response_id TEXT;
    CREATE TABLE responses (
        response_id TEXT PRIMARY KEY,
        call_key INTEGER
    ) WITHOUT ROWID;
    "#,
    // 14: per-token policy versions. A call's `versions` is its JSON list
    // of version spans (NULL when unknown, as for calls stored before);
    // `weight_versions` numbers each weight version label the fleet served,
    // from 1 up, in the order they were first registered.
    r#"
    ALTER TABLE calls ADD COLUMN versions TEXT;
    CREATE TABLE weight_versions (
        seq INTEGER PRIMARY KEY,
        label TEXT NOT NULL UNIQUE,
        registered_at INTEGER NOT NULL
    );
    "#,
    // 15: images. A call's `images` is its JSON list of image references
    // (NULL when it has none, as for calls stored before); `images` holds
    // each image's bytes once, keyed by their SHA-256 (a rowid table: rows
    // this large do not belong in a WITHOUT ROWID B-tree).
    r#"
    ALTER TABLE calls ADD COLUMN images TEXT;
    CREATE TABLE images (
        sha256 TEXT PRIMARY KEY,
        mime TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        bytes BLOB NOT NULL
    );
    "#,
    // 16: the policy that served a call: the served model's name and its
    // LoRA adapter (NULL: the base model). Both NULL for calls stored before.
    r#"
    ALTER TABLE calls ADD COLUMN model TEXT;
    ALTER TABLE calls ADD COLUMN adapter TEXT;
    "#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

pub fn user_version(conn: &Connection) -> Result<u32, StoreError> {
    Ok(conn.query_row("PRAGMA user_version", [], |r| r.get::<_, u32>(0))?)
}

/// Brings the database to [`SCHEMA_VERSION`]; refuses a newer one.
pub fn migrate(conn: &mut Connection) -> Result<u32, StoreError> {
    migrate_to(conn, SCHEMA_VERSION)
}

/// Applies migrations up to `target` (tests build old databases with it).
#[doc(hidden)]
pub fn migrate_to(conn: &mut Connection, target: u32) -> Result<u32, StoreError> {
    let current = user_version(conn)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::Schema(format!(
            "database is at schema version {current}, this tito knows up to {SCHEMA_VERSION}; \
             upgrade tito"
        )));
    }
    let target = target.min(SCHEMA_VERSION);
    // A new database is created, not upgraded: only upgrades say so (one
    // may rewrite a table, as migration 12 does `calls`).
    let started = std::time::Instant::now();
    let upgrading = current > 0 && current < target;
    if upgrading {
        tracing::info!(from = current, to = target, "upgrading the store's schema");
    }
    for version in current..target {
        let sql = MIGRATIONS
            .get(version as usize)
            .ok_or_else(|| StoreError::Schema(format!("no migration from {version}")))?;
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", version + 1)?;
        tx.commit()?;
    }
    if upgrading {
        let secs = started.elapsed().as_secs_f64();
        tracing::info!(
            from = current,
            to = target,
            secs,
            "upgraded the store's schema"
        );
    }
    user_version(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::params;

    /// The query plan of `sql` with `params` bound, as the store runs it
    /// (literal values could let SQLite fold tests a bound statement keeps).
    fn plan(conn: &Connection, sql: &str, params: impl rusqlite::Params) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
            .expect("explain");
        let rows = stmt
            .query_map(params, |r| r.get::<_, String>(3))
            .expect("plan rows");
        rows.map(|r| r.expect("plan row"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The group index, partial since migration 9 (ungrouped trajectories
    /// left out), still serves the store's lookups by group: the group's
    /// members and the complete-group checks of the shared filter.
    #[test]
    fn the_partial_group_index_serves_lookups_by_group() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        let members = plan(
            &conn,
            "SELECT seq FROM trajectories WHERE group_id = ?1 ORDER BY seq",
            params!["g"],
        );
        assert!(members.contains("INDEX trajectories_group"), "{members}");
        let filter = plan(
            &conn,
            &format!(
                "SELECT seq FROM trajectories WHERE {} ORDER BY seq LIMIT ?7",
                super::super::rows::FILTER_SQL
            ),
            params![0i64, 1i64, None::<i64>, "g", true, 4i64, 10i64],
        );
        assert!(
            filter.contains("USING INDEX trajectories_group"),
            "{filter}"
        );
        assert!(
            filter.contains("USING COVERING INDEX trajectories_group"),
            "{filter}"
        );
    }

    /// A response is found by its id with one lookup in `responses` and
    /// one in `trajectories`, both by key.
    #[test]
    fn a_response_is_found_by_key_lookups() {
        let mut conn = Connection::open_in_memory().expect("open");
        migrate(&mut conn).expect("migrate");
        let found = plan(
            &conn,
            super::super::rows::FIND_RESPONSE_SQL,
            params!["resp_1"],
        );
        assert!(
            found.contains("SEARCH r USING PRIMARY KEY (response_id=?)"),
            "{found}"
        );
        assert!(
            found.contains("SEARCH t USING INTEGER PRIMARY KEY (rowid=?)"),
            "{found}"
        );
    }
}
