//! Finding where a tool-call region starts in a text that is still growing.
//! Owns [`Scan`] and the literal-marker search the formats share. Must not:
//! look at anything but the text (no parsing of the region itself).

/// Where a tool-call region starts, as far as the text so far tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scan {
    /// A region definitely starts at this byte offset.
    Start(usize),
    /// The text from this offset on might still become a region start.
    Partial(usize),
    /// No region starts anywhere in the scanned part.
    Clear,
}

/// The first position `>= from` where a marker occurs in full (`Start`) or
/// where the text's tail is a proper prefix of a marker (`Partial`).
pub fn scan_markers(text: &str, from: usize, markers: &[&str]) -> Scan {
    let bytes = text.as_bytes();
    let mut pos = from;
    while pos < bytes.len() {
        let b = bytes[pos];
        if text.is_char_boundary(pos) && markers.iter().any(|m| m.as_bytes().first() == Some(&b)) {
            let tail = &text[pos..];
            if markers.iter().any(|m| tail.starts_with(m)) {
                return Scan::Start(pos);
            }
            if markers.iter().any(|m| m.starts_with(tail)) {
                return Scan::Partial(pos);
            }
        }
        pos += 1;
    }
    Scan::Clear
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_partial_clear() {
        let m = ["<tool_call>"];
        assert_eq!(scan_markers("ab<tool_call>x", 0, &m), Scan::Start(2));
        assert_eq!(scan_markers("ab<tool", 0, &m), Scan::Partial(2));
        assert_eq!(scan_markers("a < b <tool", 0, &m), Scan::Partial(6));
        assert_eq!(scan_markers("a < b", 0, &m), Scan::Clear);
        assert_eq!(scan_markers("<tool_call>", 1, &m), Scan::Clear);
        assert_eq!(
            scan_markers("é<｜tool", 0, &["<｜tool▁calls▁begin｜>"]),
            Scan::Partial(2)
        );
    }
}
