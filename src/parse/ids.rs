//! Tool-call ids. Owns the id shapes and a small seedable generator, so a
//! streamed and a non-streamed parse seeded alike give the same ids. Must
//! not: be used for anything security-relevant (ids are labels, not secrets).

const ALPHANUMERIC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

/// The id shape a chat template accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdStyle {
    /// `call_` + 24 alphanumerics, like OpenAI.
    OpenAi,
    /// 9 alphanumerics: Mistral templates reject any other id.
    Mistral9,
}

/// Generates tool-call ids in order (splitmix64 under the hood).
#[derive(Debug, Clone)]
pub struct IdGen {
    state: u64,
    style: IdStyle,
}

impl IdGen {
    /// Deterministic: the same seed and style give the same ids.
    pub fn seeded(seed: u64, style: IdStyle) -> Self {
        IdGen { state: seed, style }
    }

    /// Seeded from the thread RNG (what requests use).
    pub fn random(style: IdStyle) -> Self {
        Self::seeded(rand::random::<u64>(), style)
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn alnum(&mut self, n: usize) -> String {
        (0..n)
            .map(|_| {
                let i = (self.next_u64() % ALPHANUMERIC.len() as u64) as usize;
                char::from(ALPHANUMERIC.get(i).copied().unwrap_or(b'0'))
            })
            .collect()
    }

    /// The next id.
    pub fn next_id(&mut self) -> String {
        match self.style {
            IdStyle::OpenAi => format!("call_{}", self.alnum(24)),
            IdStyle::Mistral9 => self.alnum(9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_determinism() {
        let mut a = IdGen::seeded(7, IdStyle::OpenAi);
        let mut b = IdGen::seeded(7, IdStyle::OpenAi);
        let (x, y) = (a.next_id(), a.next_id());
        assert_eq!(x, b.next_id());
        assert_ne!(x, y);
        assert!(x.starts_with("call_") && x.len() == 29);
        assert!(x[5..].chars().all(|c| c.is_ascii_alphanumeric()));
        let m = IdGen::seeded(7, IdStyle::Mistral9).next_id();
        assert!(m.len() == 9 && m.chars().all(|c| c.is_ascii_alphanumeric()));
    }
}
