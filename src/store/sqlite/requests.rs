//! The SQLite side of [`crate::store::codec::SplitRequest`]: a trajectory's
//! distinct messages in `request_messages`, one row each, found by their
//! SHA-256; a split body's row in `calls` holds the ids of its messages in
//! order in `message_refs` (little-endian i64s). Bodies kept whole have
//! `message_refs` NULL, as every call stored before this layout (schema
//! version 11).

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::store::codec::{join_request, split_request};
use crate::store::StoreError;

/// A body's text as it goes in the `calls` row, and its message ids when
/// its messages are stored apart.
pub(crate) struct StoredRequest {
    pub text: String,
    pub refs: Option<Vec<u8>>,
}

/// Stores the messages of `request` that trajectory `traj` does not hold
/// yet; `continues`: the call continues another.
pub(crate) fn store(
    conn: &Connection,
    traj: i64,
    request: &Value,
    continues: bool,
) -> Result<StoredRequest, StoreError> {
    let split = split_request(request, continues)?;
    let refs = match split.messages {
        None => None,
        Some(messages) => {
            let mut refs = Vec::with_capacity(8 * messages.len());
            for (text, digest) in &messages {
                refs.extend_from_slice(&message_id(conn, traj, text, digest)?.to_le_bytes());
            }
            Some(refs)
        }
    };
    Ok(StoredRequest {
        text: split.text,
        refs,
    })
}

/// The id of message `text` in trajectory `traj`, inserted if new.
fn message_id(
    conn: &Connection,
    traj: i64,
    text: &str,
    digest: &[u8; 32],
) -> Result<i64, StoreError> {
    let digest = &digest[..];
    let found = conn
        .prepare_cached("SELECT id FROM request_messages WHERE traj = ?1 AND sha256 = ?2")?
        .query_row(params![traj, digest], |r| r.get(0))
        .optional()?;
    if let Some(id) = found {
        return Ok(id);
    }
    conn.prepare_cached("INSERT INTO request_messages (traj, sha256, body) VALUES (?1, ?2, ?3)")?
        .execute(params![traj, digest, text])?;
    Ok(conn.last_insert_rowid())
}

/// Every stored message of trajectory `traj`, parsed, by id.
pub(crate) fn messages_of(conn: &Connection, traj: i64) -> Result<HashMap<i64, Value>, StoreError> {
    let mut stmt = conn.prepare_cached("SELECT id, body FROM request_messages WHERE traj = ?1")?;
    let mut rows = stmt.query(params![traj])?;
    let mut out = HashMap::new();
    while let Some(row) = rows.next()? {
        let text = row.get_ref(1)?.as_str().map_err(rusqlite::Error::from)?;
        let body: Value =
            serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        out.insert(row.get(0)?, body);
    }
    Ok(out)
}

/// The body a call was made with, from its stored `shell` and `refs`.
pub(crate) fn rebuild(
    shell: Value,
    refs: &[u8],
    messages: &HashMap<i64, Value>,
) -> Result<Value, StoreError> {
    join_request(shell, refs, 8, |key| {
        let id = i64::from_le_bytes(key.try_into().ok()?);
        messages.get(&id)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_whose_message_ids_are_not_all_stored_is_an_error() {
        let messages = HashMap::from([(1, json!({"role": "user", "content": "hi"}))]);
        let shell = json!({"model": "m", "messages": null});
        let one = 1i64.to_le_bytes();
        let rebuilt = rebuild(shell.clone(), &one, &messages).expect("rebuilt");
        assert_eq!(
            rebuilt.to_string(),
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#
        );
        let two = [one, 2i64.to_le_bytes()].concat();
        for refs in [&two[..], &one[..7]] {
            assert!(matches!(
                rebuild(shell.clone(), refs, &messages),
                Err(StoreError::Corrupt(_))
            ));
        }
        assert!(rebuild(json!({"model": "m"}), &one, &messages).is_err());
    }
}
