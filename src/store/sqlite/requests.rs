//! How the SQLite store keeps a call's request body: each distinct chat
//! message of a trajectory once, in `request_messages`, and each body with
//! its `messages` set to null plus `calls.message_refs`, the ids of its
//! messages in order.
//!
//! An agent sends its whole history with every call, so bodies stored whole
//! grow with the square of a trajectory's turns (25x the token data at turn
//! 49 in `cargo bench --bench trajectory`); stored this way they grow with
//! its messages. A message is identified by the SHA-256 of its JSON text:
//! two texts with one digest are taken for the same message.
//!
//! Exact: a body is read back as the same JSON value, its keys in their
//! order (`messages` keeps its place). A root call's body, and a body
//! without a non-empty `messages` list (a completions call, a choice whose
//! body another call holds), is stored whole, `message_refs` NULL, as every
//! call stored before this layout (schema version 11).

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::store::StoreError;

/// A body's text as stored, and its message ids (8 little-endian bytes
/// each) when its messages are stored apart.
pub(crate) struct StoredRequest {
    pub text: String,
    pub refs: Option<Vec<u8>>,
}

/// The body with the value of its `messages` written as null.
struct Shell<'a>(&'a Map<String, Value>);

impl Serialize for Shell<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            if k == "messages" {
                map.serialize_entry(k, &())?;
            } else {
                map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

fn json_error(e: serde_json::Error) -> StoreError {
    StoreError::Invalid(e.to_string())
}

/// Stores the messages of `request` that trajectory `traj` does not hold
/// yet, and returns the body as it goes in the `calls` row. A root call's
/// body (`continues` false) is stored whole: most trajectories of one call
/// never send a history, and a continuation stores the root's messages
/// once, the first time it sends them.
pub(crate) fn store(
    conn: &Connection,
    traj: i64,
    request: &Value,
    continues: bool,
) -> Result<StoredRequest, StoreError> {
    let split =
        request
            .as_object()
            .filter(|_| continues)
            .and_then(|body| match body.get("messages") {
                Some(Value::Array(messages)) if !messages.is_empty() => Some((body, messages)),
                _ => None,
            });
    let Some((body, messages)) = split else {
        return Ok(StoredRequest {
            text: request.to_string(),
            refs: None,
        });
    };
    let mut refs = Vec::with_capacity(8 * messages.len());
    for m in messages {
        let text = serde_json::to_string(m).map_err(json_error)?;
        refs.extend_from_slice(&message_id(conn, traj, &text)?.to_le_bytes());
    }
    Ok(StoredRequest {
        text: serde_json::to_string(&Shell(body)).map_err(json_error)?,
        refs: Some(refs),
    })
}

/// The id of message `text` in trajectory `traj`, inserted if new.
fn message_id(conn: &Connection, traj: i64, text: &str) -> Result<i64, StoreError> {
    let digest = Sha256::digest(text.as_bytes());
    let digest = digest.as_slice();
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
        let body: Value = serde_json::from_str(text).map_err(json_error)?;
        out.insert(row.get(0)?, body);
    }
    Ok(out)
}

/// The body a call was made with, from its stored `shell` and `refs`.
pub(crate) fn rebuild(
    mut shell: Value,
    refs: &[u8],
    messages: &HashMap<i64, Value>,
) -> Result<Value, StoreError> {
    let corrupt = |what: String| StoreError::Invalid(format!("stored request: {what}"));
    if refs.len() % 8 != 0 {
        return Err(corrupt(format!(
            "{} bytes of message ids is not a whole number of ids",
            refs.len()
        )));
    }
    let list = refs
        .chunks_exact(8)
        .map(|c| {
            let id = i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            messages
                .get(&id)
                .cloned()
                .ok_or_else(|| corrupt(format!("message {id} is not stored")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    match shell.get_mut("messages") {
        Some(slot) => *slot = Value::Array(list),
        None => return Err(corrupt("a body with message ids has no `messages`".into())),
    }
    Ok(shell)
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
                Err(StoreError::Invalid(_))
            ));
        }
        assert!(rebuild(json!({"model": "m"}), &one, &messages).is_err());
    }
}
