//! A minimal Server-Sent-Events reader over a byte stream: yields the `data:`
//! payload of each event. Used by the HTTP backend clients.

use bytes::{Buf, BytesMut};

/// Incremental SSE decoder. Feed bytes, take complete event payloads.
#[derive(Default)]
pub struct SseDecoder {
    buf: BytesMut,
    /// Bytes of `buf` already searched for an event's end: a long event
    /// (SGLang's cumulative output) arriving in many reads is scanned once,
    /// not from its start on every read.
    scanned: usize,
}

impl SseDecoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Next complete event's data (multi-line data joined with '\n'), or None
    /// if no complete event is buffered.
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            // A separator may straddle the last read: back up 3 bytes.
            let from = self.scanned.saturating_sub(3);
            let Some((at, sep_len)) = find_event_end(&self.buf[from..]) else {
                self.scanned = self.buf.len();
                return None;
            };
            let end = from + at;
            self.scanned = 0;
            let raw = self.buf.split_to(end);
            self.buf.advance(sep_len);
            let text = String::from_utf8_lossy(&raw);
            let mut data: Option<String> = None;
            for line in text.split('\n') {
                let line = line.strip_suffix('\r').unwrap_or(line);
                if let Some(rest) = line.strip_prefix("data:") {
                    let rest = rest.strip_prefix(' ').unwrap_or(rest);
                    match &mut data {
                        Some(d) => {
                            d.push('\n');
                            d.push_str(rest);
                        }
                        None => data = Some(rest.to_string()),
                    }
                }
            }
            if let Some(d) = data {
                return Some(d);
            }
            // Comment or keep-alive only: keep looking.
        }
    }
}

fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if buf.get(i..i + 4) == Some(b"\r\n\r\n") {
            return Some((i, 4));
        }
        i += 1;
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
        assert_eq!(d.next_event().as_deref(), Some("{\"a\":1}"));
        assert_eq!(d.next_event(), None);
        d.push(b"ta: [DONE]\r\n\r\n: keepalive\n\n");
        assert_eq!(d.next_event().as_deref(), Some("[DONE]"));
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
                assert_eq!(
                    d.next_event().as_deref(),
                    Some(x.as_str()),
                    "{sep:?} cut at {cut}"
                );
            }
        }
    }
}
