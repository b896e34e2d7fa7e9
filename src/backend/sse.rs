//! A minimal Server-Sent-Events reader over a byte stream: yields the `data:`
//! payload of each event. Used by the HTTP backend clients.

use std::ops::Range;

use bytes::{Buf, BytesMut};

/// Incremental SSE decoder. Feed bytes, take complete event payloads.
#[derive(Default)]
pub struct SseDecoder {
    buf: BytesMut,
    /// Bytes of `buf` already searched for an event's end: a long event
    /// (SGLang's cumulative output) arriving in many reads is scanned once,
    /// not from its start on every read.
    scanned: usize,
    /// The last event taken from `buf`, whose one `data:` line
    /// [`SseDecoder::next_event`] lends without a copy.
    event: BytesMut,
    /// The last event's data when it is not one valid UTF-8 line of `event`:
    /// several `data:` lines joined, or invalid bytes replaced.
    joined: String,
}

/// Where an event's data is.
enum Data {
    /// The one `data:` line's payload, these bytes of the event.
    Line(Range<usize>),
    /// Several `data:` lines, joined in `joined`.
    Joined,
}

impl SseDecoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Next complete event's data (multi-line data joined with '\n', bytes
    /// that are not UTF-8 replaced by U+FFFD), or None if no complete event
    /// is buffered. The data lives until the next call.
    pub fn next_event(&mut self) -> Option<&str> {
        let data = loop {
            // A separator may straddle the last read: back up 3 bytes.
            let from = self.scanned.saturating_sub(3);
            let Some((at, sep_len)) = find_event_end(&self.buf[from..]) else {
                self.scanned = self.buf.len();
                return None;
            };
            self.scanned = 0;
            self.event = self.buf.split_to(from + at);
            self.buf.advance(sep_len);
            // No `data:` line (a comment or keep-alive): keep looking.
            if let Some(found) = locate_data(&self.event, &mut self.joined) {
                break found;
            }
        };
        Some(match data {
            Data::Line(range) => match std::str::from_utf8(&self.event[range.clone()]) {
                Ok(text) => text,
                Err(_) => {
                    self.joined = String::from_utf8_lossy(&self.event[range]).into_owned();
                    &self.joined
                }
            },
            Data::Joined => &self.joined,
        })
    }
}

/// Finds the `data:` lines of `event` (lines end in `\n` or `\r\n`; one
/// space after the colon is dropped); several are joined into `joined`.
/// `None` when there is none.
fn locate_data(event: &[u8], joined: &mut String) -> Option<Data> {
    let mut found = None;
    let mut start = 0;
    while start <= event.len() {
        let end = memchr::memchr(b'\n', &event[start..]).map_or(event.len(), |n| start + n);
        let line_start = start;
        start = end + 1;
        let line = &event[line_start..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(after) = line.strip_prefix(b"data:") else {
            continue;
        };
        let skip = usize::from(after.first() == Some(&b' '));
        let line_end = line_start + line.len();
        let payload = line_end - after.len() + skip..line_end;
        found = Some(match found {
            None => Data::Line(payload),
            Some(earlier) => {
                if let Data::Line(first) = earlier {
                    joined.clear();
                    joined.push_str(&String::from_utf8_lossy(&event[first]));
                }
                joined.push('\n');
                joined.push_str(&String::from_utf8_lossy(&event[payload]));
                Data::Joined
            }
        });
    }
    found
}

/// The first event separator (`\n\n` or `\r\n\r\n`) in `buf`: its start and
/// length.
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    for at in memchr::memchr_iter(b'\n', buf) {
        match buf.get(at + 1) {
            Some(b'\n') => return Some((at, 2)),
            Some(b'\r') if at > 0 && buf[at - 1] == b'\r' && buf.get(at + 2) == Some(&b'\n') => {
                return Some((at - 1, 4))
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_events_across_chunks() {
        let mut d = SseDecoder::default();
        d.push(b"data: {\"a\":1}\n\nda");
        assert_eq!(d.next_event(), Some("{\"a\":1}"));
        assert_eq!(d.next_event(), None);
        d.push(b"ta: [DONE]\r\n\r\n: keepalive\n\n");
        assert_eq!(d.next_event(), Some("[DONE]"));
        assert_eq!(d.next_event(), None);
    }

    /// A separator split over reads at every position, after a partial scan.
    #[test]
    fn finds_a_separator_split_across_reads() {
        let x = "x".repeat(40);
        for sep in ["\n\n", "\r\n\r\n"] {
            let event = format!("data: {x}{sep}");
            for cut in 1..event.len() {
                let mut d = SseDecoder::default();
                d.push(&event.as_bytes()[..cut]);
                assert_eq!(d.next_event(), None, "{sep:?} cut at {cut}");
                d.push(&event.as_bytes()[cut..]);
                assert_eq!(d.next_event(), Some(x.as_str()), "{sep:?} cut at {cut}");
            }
        }
    }

    /// Comments, `data:` without its space, several data lines, CRLF lines
    /// and bytes that are not UTF-8.
    #[test]
    fn reads_each_event_shape() {
        let mut d = SseDecoder::default();
        d.push(b": keepalive\n\nevent: x\ndata:a\r\ndata: b\n\ndata: \xffz\n\ndata:  two\n\n");
        assert_eq!(d.next_event(), Some("a\nb"));
        assert_eq!(d.next_event(), Some("\u{fffd}z"));
        assert_eq!(d.next_event(), Some(" two"));
        assert_eq!(d.next_event(), None);
    }

    /// The straightforward decoder: the whole buffered text made UTF-8,
    /// the first separator found by a plain scan, lines split on `\n`.
    fn reference(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = input;
        loop {
            let end = (0..buf.len()).find_map(|i| {
                if buf[i..].starts_with(b"\n\n") {
                    Some((i, 2))
                } else if buf[i..].starts_with(b"\r\n\r\n") {
                    Some((i, 4))
                } else {
                    None
                }
            });
            let Some((at, len)) = end else { return out };
            let text = String::from_utf8_lossy(&buf[..at]);
            let data: Vec<&str> = text
                .split('\n')
                .map(|l| l.strip_suffix('\r').unwrap_or(l))
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|l| l.strip_prefix(' ').unwrap_or(l))
                .collect();
            if !data.is_empty() {
                out.push(data.join("\n"));
            }
            buf = &buf[at + len..];
        }
    }

    /// Random streams over the bytes that matter, fed in random pieces,
    /// read as the reference reads them whole.
    #[test]
    fn matches_the_reference_on_random_streams_in_random_pieces() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let pieces: [&[u8]; 9] = [
            b"data:",
            b"data: ",
            b"\n",
            b"\r",
            b"\r\n",
            b"x",
            b":c",
            b"\xc3\xa9",
            b"\xe2",
        ];
        for _ in 0..3_000 {
            let mut input = Vec::new();
            for _ in 0..rng.random_range(1..30) {
                input.extend_from_slice(pieces[rng.random_range(0..pieces.len())]);
            }
            let mut d = SseDecoder::default();
            let mut got = Vec::new();
            let mut at = 0;
            while at < input.len() {
                let n = rng.random_range(1..=(input.len() - at).min(5));
                d.push(&input[at..at + n]);
                at += n;
                while let Some(e) = d.next_event() {
                    got.push(e.to_string());
                }
            }
            assert_eq!(
                got,
                reference(&input),
                "{:?}",
                String::from_utf8_lossy(&input)
            );
        }
    }
}
