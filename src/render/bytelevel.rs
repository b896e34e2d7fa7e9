//! GPT-2's reversible byte ↔ printable-char map, which byte-level BPE
//! vocabularies (GPT-2, Qwen, Llama 3, DeepSeek) are written in: printable
//! Latin-1 bytes stand for themselves, the other 68 bytes map, in order, to
//! U+0100..U+0143.

const fn printable(b: u32) -> bool {
    (33 <= b && b <= 126) || (161 <= b && b <= 172) || (174 <= b && b <= 255)
}

/// The byte each char below U+0144 stands for (-1: none), by code point;
/// every char of the map lies below U+0144.
const CHAR_BYTES: [i16; 0x144] = {
    let mut table = [-1i16; 0x144];
    let (mut b, mut rank) = (0u32, 0u32);
    while b < 256 {
        let c = if printable(b) {
            b
        } else {
            rank += 1;
            255 + rank
        };
        table[c as usize] = b as i16;
        b += 1;
    }
    table
};

/// The char that stands for byte `b` in a byte-level vocabulary.
pub fn byte_to_char(b: u8) -> char {
    let b = u32::from(b);
    if printable(b) {
        return char::from_u32(b).unwrap_or('?');
    }
    let rank = (0..b).filter(|x| !printable(*x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// The byte a vocabulary char stands for; None if `c` is not one of them.
pub fn char_to_byte(c: char) -> Option<u8> {
    let b = *CHAR_BYTES.get(u32::from(c) as usize)?;
    u8::try_from(b).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips_and_nothing_else_maps() {
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('日'), None);
    }
}
