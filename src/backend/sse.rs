//! A minimal Server-Sent-Events reader over a byte stream: yields the `data:`
//! payload of each event. Used by the HTTP backend clients.

use bytes::{Buf, BytesMut};

/// Incremental SSE decoder. Feed bytes, take complete event payloads.
#[derive(Default)]
pub struct SseDecoder {
    buf: BytesMut,
}

impl SseDecoder {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Next complete event's data (multi-line data joined with '\n'), or None
    /// if no complete event is buffered.
    pub fn next_event(&mut self) -> Option<String> {
        loop {
            let (end, sep_len) = find_event_end(&self.buf)?;
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
}
