//! The byte layout both durable stores use for token ids and logprobs:
//! little-endian u32 / f32 words, four bytes a token. A missing logprob is
//! written as a quiet NaN (no backend reports NaN as a logprob) and read back
//! as `None`. And how both keep a call's request body ([`SplitRequest`]).

use crate::store::StoreError;

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
/// distinct messages once). Any other body is kept whole.
pub(crate) struct SplitRequest {
    pub text: String,
    /// Each message's JSON text and SHA-256, in order; `None`: kept whole.
    pub messages: Option<Vec<(String, [u8; 32])>>,
}

/// The body with the value of its `messages` written as null.
struct Shell<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl serde::Serialize for Shell<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
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

/// Splits `request` for storage (see [`SplitRequest`]); `continues`: the
/// call continues another (a root call's body is kept whole: most
/// trajectories of one call never send a history, and a continuation
/// stores the root's messages the first time it sends them).
pub(crate) fn split_request(
    request: &serde_json::Value,
    continues: bool,
) -> Result<SplitRequest, StoreError> {
    use sha2::{Digest, Sha256};
    let split =
        request
            .as_object()
            .filter(|_| continues)
            .and_then(|body| match body.get("messages") {
                Some(serde_json::Value::Array(m)) if !m.is_empty() => Some((body, m)),
                _ => None,
            });
    let Some((body, messages)) = split else {
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
        text: serde_json::to_string(&Shell(body)).map_err(json_error)?,
        messages: Some(messages),
    })
}

/// The body a call was made with, from its stored text (`messages` null)
/// and `refs`, its messages' keys in order, `width` bytes each, which
/// `message` looks up among the trajectory's stored messages.
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
    match shell.get_mut("messages") {
        Some(slot) => *slot = serde_json::Value::Array(list),
        None => {
            return Err(corrupt(
                "a body whose messages are stored apart has no `messages`".into(),
            ))
        }
    }
    Ok(shell)
}
