//! The byte layout both durable stores use for token ids and logprobs:
//! little-endian u32 / f32 words, four bytes a token. A missing logprob is
//! written as a quiet NaN (no backend reports NaN as a logprob) and read back
//! as `None`.

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
