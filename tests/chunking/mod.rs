//! Chunkings for the streaming tests of `tito::parse`: a small seeded PRNG,
//! a text's char boundaries, a text split at given points, and the order
//! every delta stream must keep.

#![allow(dead_code)]

use tito::parse::DeltaEvent;

/// splitmix64: a small deterministic PRNG (no crate needed).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

pub fn boundaries(text: &str) -> Vec<usize> {
    (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect()
}

pub fn split_at_points<'a>(text: &'a str, points: &[usize]) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut last = 0;
    for &p in points {
        out.push(&text[last..p]);
        last = p;
    }
    out.push(&text[last..]);
    out
}

/// Events must open each call (index 0, 1, ...) before its arguments.
pub fn check_event_order(events: &[DeltaEvent], ctx: &str) {
    let mut opened = 0usize;
    for ev in events {
        match ev {
            DeltaEvent::ToolCallStart { index, id, name } => {
                assert_eq!(*index, opened, "{ctx}: call indices in order");
                assert!(!id.is_empty() && !name.is_empty(), "{ctx}");
                opened += 1;
            }
            DeltaEvent::ToolCallArguments { index, .. } => {
                assert!(*index < opened, "{ctx}: arguments before id/name")
            }
            DeltaEvent::Content(s) | DeltaEvent::Reasoning(s) => {
                assert!(!s.is_empty(), "{ctx}: empty delta")
            }
        }
    }
}
