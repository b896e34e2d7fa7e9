//! The byte layout both durable stores use for token ids and logprobs:
//! little-endian u32 / f32 words, four bytes a token. A missing logprob is
//! written as a quiet NaN (no backend reports NaN as a logprob) and read back
//! as `None`. How both keep a call's request body ([`SplitRequest`]), and
//! its image references (JSON text, [`images_text`]).

use crate::store::{CallImage, StoreError};

/// A call's image references as the JSON text of its `images` column;
/// `None` (SQL NULL) when it has none.
pub(crate) fn images_text(images: &[CallImage]) -> Result<Option<String>, StoreError> {
    if images.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(images)
        .map(Some)
        .map_err(|e| StoreError::Invalid(e.to_string()))
}

pub(crate) fn ids_to_bytes(ids: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ids.len() * 4);
    for id in ids {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out
}

pub(crate) fn logprobs_to_bytes(xs: &[Option<f32>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(xs.len() * 4);
    for x in xs {
        out.extend_from_slice(&x.unwrap_or(f32::NAN).to_le_bytes());
    }
    out
}

fn words(bytes: &[u8]) -> Result<impl Iterator<Item = [u8; 4]> + '_, String> {
    if bytes.len() % 4 != 0 {
        return Err(format!(
            "{} bytes is not a whole number of 4-byte words",
            bytes.len()
        ));
    }
    Ok(bytes.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]))
}

pub(crate) fn ids_from_bytes(bytes: &[u8]) -> Result<Vec<u32>, String> {
    Ok(words(bytes)?.map(u32::from_le_bytes).collect())
}

pub(crate) fn logprobs_from_bytes(bytes: &[u8]) -> Result<Vec<Option<f32>>, String> {
    Ok(words(bytes)?
        .map(|w| Some(f32::from_le_bytes(w)).filter(|x| !x.is_nan()))
        .collect())
}

/// A call's request body as the durable stores keep it: an agent sends its
/// whole history with every call, so bodies stored whole grow with the
/// square of a trajectory's turns. A body that continues another call and
/// has a non-empty `messages` list is kept as its text with `messages`
/// written as null (the key keeps its place) and each message apart, known
/// by the SHA-256 of its JSON text (each store keeps a trajectory's
/// distinct messages once). A body without a `messages` key whose `input`
/// is a non-empty list (a Responses request carries its history there) is
/// kept the same way on `input`. Any other body is kept whole.
pub(crate) struct SplitRequest {
    pub text: String,
    /// Each message's JSON text and SHA-256, in order; `None`: kept whole.
    pub messages: Option<Vec<(String, [u8; 32])>>,
}

/// The key a body's list is split on: `messages`, or `input` in a body
/// without `messages`. A stored shell says which by the same rule, so no
/// other record of it is kept.
fn list_key(body: &serde_json::Map<String, serde_json::Value>) -> &'static str {
    if body.contains_key("messages") {
        "messages"
    } else {
        "input"
    }
}

/// The body with the value of its key `.1` written as null.
struct Shell<'a>(&'a serde_json::Map<String, serde_json::Value>, &'a str);

impl serde::Serialize for Shell<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            if k == self.1 {
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

/// Splits `request` for storage (see [`SplitRequest`]); `continues`: the
/// call continues another (a root call's body is kept whole: most
/// trajectories of one call never send a history, and a continuation
/// stores the root's messages the first time it sends them).
pub(crate) fn split_request(
    request: &serde_json::Value,
    continues: bool,
) -> Result<SplitRequest, StoreError> {
    use sha2::{Digest, Sha256};
    let split = request.as_object().filter(|_| continues).and_then(|body| {
        let key = list_key(body);
        match body.get(key) {
            Some(serde_json::Value::Array(m)) if !m.is_empty() => Some((body, key, m)),
            _ => None,
        }
    });
    let Some((body, key, messages)) = split else {
        return Ok(SplitRequest {
            text: request.to_string(),
            messages: None,
        });
    };
    let messages = messages
        .iter()
        .map(|m| {
            let text = serde_json::to_string(m).map_err(json_error)?;
            let digest: [u8; 32] = Sha256::digest(text.as_bytes()).into();
            Ok((text, digest))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok(SplitRequest {
        text: serde_json::to_string(&Shell(body, key)).map_err(json_error)?,
        messages: Some(messages),
    })
}

/// The body a call was made with, from its stored text (`messages`, or
/// `input` in a body without `messages`, null) and `refs`, its messages'
/// keys in order, `width` bytes each, which `message` looks up among the
/// trajectory's stored messages.
pub(crate) fn join_request<'m>(
    mut shell: serde_json::Value,
    refs: &[u8],
    width: usize,
    message: impl Fn(&[u8]) -> Option<&'m serde_json::Value>,
) -> Result<serde_json::Value, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("stored request: {what}"));
    if width == 0 || refs.len() % width != 0 {
        return Err(corrupt(format!(
            "{} bytes of message keys is not a whole number of {width}-byte keys",
            refs.len()
        )));
    }
    let list = refs
        .chunks_exact(width)
        .map(|key| {
            message(key)
                .cloned()
                .ok_or_else(|| corrupt(format!("message {key:02x?} is not stored")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let slot = shell.as_object_mut().and_then(|body| {
        let key = list_key(body);
        body.get_mut(key)
    });
    match slot {
        Some(slot) => *slot = serde_json::Value::Array(list),
        None => {
            return Err(corrupt(
                "a body whose messages are stored apart has no `messages` or `input`".into(),
            ))
        }
    }
    Ok(shell)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::{json, Value};

    use super::*;

    /// `request` split as a continuing call's body, then joined back from
    /// its stored text and digests.
    fn round_trip(request: &Value) -> (SplitRequest, Value) {
        let split = split_request(request, true).expect("split");
        let shell: Value = serde_json::from_str(&split.text).expect("shell parses");
        let Some(items) = &split.messages else {
            return (split, shell);
        };
        let stored: HashMap<[u8; 32], Value> = items
            .iter()
            .map(|(text, d)| (*d, serde_json::from_str(text).expect("item parses")))
            .collect();
        let refs: Vec<u8> = items.iter().flat_map(|(_, d)| *d).collect();
        let joined = join_request(shell, &refs, 32, |k| {
            stored.get(<&[u8; 32]>::try_from(k).ok()?)
        })
        .expect("join");
        (split, joined)
    }

    #[test]
    fn an_input_list_is_split_like_messages_and_joined_byte_for_byte() {
        let text = r#"{"model":"m","instructions":"be brief","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},{"type":"function_call_output","call_id":"c1","output":"2"}],"store":true,"tools":[]}"#;
        let request: Value = serde_json::from_str(text).expect("body");
        let (split, joined) = round_trip(&request);
        assert_eq!(
            split.text,
            r#"{"model":"m","instructions":"be brief","input":null,"store":true,"tools":[]}"#
        );
        let items = split.messages.as_ref().expect("split on input");
        assert_eq!(items.len(), 3);
        assert_eq!(
            items[1].0,
            r#"{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"}"#
        );
        assert_eq!(joined.to_string(), text);
    }

    #[test]
    fn a_messages_body_splits_as_before_and_input_never_takes_its_place() {
        let text = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"input":[{"role":"user","content":"x"}],"n":1}"#;
        let request: Value = serde_json::from_str(text).expect("body");
        let (split, joined) = round_trip(&request);
        assert_eq!(
            split.text,
            r#"{"model":"m","messages":null,"input":[{"role":"user","content":"x"}],"n":1}"#
        );
        let items = split.messages.as_ref().expect("split on messages");
        assert_eq!(items[0].0, r#"{"role":"user","content":"a"}"#);
        assert_eq!(joined.to_string(), text);
        // The shell a `messages` body was stored with before `input` bodies
        // were split reads back the same.
        let plain = r#"{"messages":[{"role":"user","content":"a"}],"temperature":1.0}"#;
        let (split, joined) = round_trip(&serde_json::from_str(plain).expect("body"));
        assert_eq!(split.text, r#"{"messages":null,"temperature":1.0}"#);
        assert_eq!(joined.to_string(), plain);
    }

    #[test]
    fn bodies_without_a_list_to_split_are_kept_whole() {
        for body in [
            json!({"model": "m", "input": "a string, not items"}),
            json!({"model": "m", "input": []}),
            json!({"model": "m", "messages": [], "input": [{"role": "user", "content": "x"}]}),
            json!({"model": "m", "messages": "odd", "input": [{"role": "user", "content": "x"}]}),
            json!({"model": "m", "messages": null, "input": [{"role": "user", "content": "x"}]}),
            json!({"model": "m", "prompt": "text"}),
            json!(["not", "an", "object"]),
        ] {
            let split = split_request(&body, true).expect("split");
            assert!(split.messages.is_none(), "{body}");
            assert_eq!(split.text, body.to_string());
        }
        // A root call's body is kept whole, `input` or `messages`.
        let root = json!({"input": [{"role": "user", "content": "x"}]});
        let split = split_request(&root, false).expect("split");
        assert!(split.messages.is_none());
        assert_eq!(split.text, root.to_string());
    }

    #[test]
    fn a_shell_with_neither_key_or_a_missing_item_is_corrupt() {
        let none = |_: &[u8]| None::<&Value>;
        for shell in [json!({"model": "m"}), json!("text")] {
            assert!(matches!(
                join_request(shell, &[0; 32], 32, none),
                Err(StoreError::Corrupt(_))
            ));
        }
        assert!(matches!(
            join_request(json!({"input": null}), &[0; 32], 32, none),
            Err(StoreError::Corrupt(_))
        ));
    }
}
