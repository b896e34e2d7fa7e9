//! OpenAI logprob shapes (chat and legacy completions) built from sampled
//! ids. Token text comes from the tokenizer; `bytes` are the token's exact
//! bytes where the tokenizer is byte-level or has byte-fallback tokens.

use serde_json::{json, Value as Json};

use crate::backend::TokenLogprob;
use crate::render::bytelevel::char_to_byte;
use crate::render::Renderer;

/// The exact bytes a token stands for, when they can be known.
pub fn token_bytes(renderer: &Renderer, id: u32) -> Vec<u8> {
    let Some(piece) = renderer.id_to_token(id) else {
        return Vec::new();
    };
    // SentencePiece byte fallback: "<0xE2>".
    if piece.len() == 6 && piece.starts_with("<0x") && piece.ends_with('>') {
        if let Ok(b) = u8::from_str_radix(&piece[3..5], 16) {
            return vec![b];
        }
    }
    if !renderer.byte_level() {
        // A SentencePiece piece is text, with `▁` for a space.
        return piece.replace('\u{2581}', " ").into_bytes();
    }
    // Byte-level BPE: every char maps back to one byte.
    let mut out = Vec::with_capacity(piece.len());
    for c in piece.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                return renderer
                    .decode(&[id], false)
                    .unwrap_or_default()
                    .into_bytes()
            }
        }
    }
    out
}

fn token_text(renderer: &Renderer, id: u32) -> String {
    String::from_utf8_lossy(&token_bytes(renderer, id)).into_owned()
}

/// A logprob for a client. JSON has no -inf: OpenAI itself writes -9999.0
/// for such tokens. A logprob the backend did not report is null.
fn clamp(lp: Option<f32>) -> Json {
    match lp {
        Some(lp) if lp.is_finite() => json!(f64::from(lp)),
        Some(_) => json!(-9999.0),
        None => Json::Null,
    }
}

/// `choices[i].logprobs` for chat completions.
pub fn chat_logprobs(renderer: &Renderer, ids: &[u32], lps: &[TokenLogprob]) -> Json {
    let entry = |id: u32, lp: Option<f32>| {
        let bytes = token_bytes(renderer, id);
        json!({
            "token": String::from_utf8_lossy(&bytes),
            "logprob": clamp(lp),
            "bytes": bytes,
        })
    };
    let content: Vec<Json> = ids
        .iter()
        .zip(lps)
        .map(|(id, lp)| {
            let mut e = entry(*id, lp.logprob);
            e["top_logprobs"] =
                Json::Array(lp.top.iter().map(|(t, l)| entry(*t, Some(*l))).collect());
            e
        })
        .collect();
    // OpenAI's shape has both lists; tito never refuses.
    json!({ "content": content, "refusal": Json::Null })
}

/// `choices[i].logprobs` for legacy completions; `text_offset` counts bytes
/// from the start of the completion.
pub fn completion_logprobs(
    renderer: &Renderer,
    ids: &[u32],
    lps: &[TokenLogprob],
    offset0: usize,
) -> Json {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    let mut offset = offset0;
    for (id, lp) in ids.iter().zip(lps) {
        let bytes = token_bytes(renderer, *id);
        offsets.push(offset);
        // Exact bytes: a token holding part of a character still moves the
        // offset by its own bytes, not by its lossy text's.
        offset += bytes.len();
        tokens.push(String::from_utf8_lossy(&bytes).into_owned());
        token_logprobs.push(clamp(lp.logprob));
        let mut m = serde_json::Map::new();
        for (t, l) in &lp.top {
            m.insert(token_text(renderer, *t), clamp(Some(*l)));
        }
        top.push(Json::Object(m));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::testing::chatml_renderer;

    #[test]
    fn token_bytes_of_partial_utf8() {
        let r = chatml_renderer();
        let ids = r.encode("é").expect("encodes");
        assert_eq!(ids.len(), 2);
        let bytes: Vec<u8> = ids.iter().flat_map(|id| token_bytes(&r, *id)).collect();
        assert_eq!(bytes, "é".as_bytes());
    }
}
