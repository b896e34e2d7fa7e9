//! llama.cpp's and ggml's own log lines, routed into `tracing` under the
//! target `llama_cpp`: errors at `error`, everything else (model loading,
//! context set-up, warnings about unused capacity) at `debug`, so a gateway
//! at the default `info` level prints none of it. Ask for them with
//! `RUST_LOG=info,llama_cpp=debug`.
//!
//! llama.cpp writes a line in pieces (`GGML_LOG_LEVEL_CONT` continues the
//! previous message, the progress dots of a model load are one piece each):
//! pieces are joined per thread until a newline ends the line.
//!
//! Owns: the C log callback. Must not: panic (it is called from C).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};

use llama_cpp_sys_2::{ggml_log_level, GGML_LOG_LEVEL_CONT, GGML_LOG_LEVEL_ERROR};

/// The `tracing` target of llama.cpp's lines.
pub const TARGET: &str = "llama_cpp";

/// Routes llama.cpp's and ggml's log callbacks here. Call once, before the
/// backend is initialised (it logs from then on).
pub fn install() {
    // SAFETY: `callback` is a plain function valid for the whole process and
    // ignores its user data, which may therefore be null.
    unsafe {
        llama_cpp_sys_2::llama_log_set(Some(callback), std::ptr::null_mut());
        llama_cpp_sys_2::ggml_log_set(Some(callback), std::ptr::null_mut());
    }
}

/// A line being assembled on this thread: its level and text so far.
struct Pending {
    level: ggml_log_level,
    text: String,
}

thread_local! {
    static PENDING: RefCell<Pending> = const {
        RefCell::new(Pending { level: 0, text: String::new() })
    };
}

unsafe extern "C" fn callback(level: ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let piece = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let _ = PENDING.try_with(|cell| {
        if let Ok(mut p) = cell.try_borrow_mut() {
            take(&mut p, level, &piece, &mut emit);
        }
    });
}

/// Adds a piece to the pending line and emits every line it completes. A
/// new message (not CONT) first ends an unterminated one.
fn take(
    p: &mut Pending,
    level: ggml_log_level,
    piece: &str,
    emit: &mut impl FnMut(ggml_log_level, &str),
) {
    if level != GGML_LOG_LEVEL_CONT {
        if !p.text.is_empty() {
            emit(p.level, &p.text);
            p.text.clear();
        }
        p.level = level;
    }
    p.text.push_str(piece);
    while let Some(end) = p.text.find('\n') {
        emit(p.level, &p.text[..end]);
        p.text.drain(..=end);
    }
}

fn emit(level: ggml_log_level, line: &str) {
    let line = line.trim_end();
    if line.is_empty() {
        return;
    }
    if level == GGML_LOG_LEVEL_ERROR {
        tracing::error!(target: TARGET, "{line}");
    } else {
        tracing::debug!(target: TARGET, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_cpp_sys_2::{GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN};

    #[test]
    fn pieces_join_into_lines() {
        let mut p = Pending {
            level: 0,
            text: String::new(),
        };
        let mut lines = Vec::new();
        let mut feed = |level, piece: &str| {
            take(&mut p, level, piece, &mut |l, t: &str| {
                lines.push((l, t.to_string()))
            })
        };
        feed(GGML_LOG_LEVEL_INFO, "loading");
        feed(GGML_LOG_LEVEL_CONT, ".");
        feed(GGML_LOG_LEVEL_CONT, ".\nnext");
        // A new message ends the unterminated one and takes its own level.
        feed(GGML_LOG_LEVEL_WARN, "careful\nnow\n");
        assert_eq!(
            lines,
            [
                (GGML_LOG_LEVEL_INFO, "loading..".to_string()),
                (GGML_LOG_LEVEL_INFO, "next".to_string()),
                (GGML_LOG_LEVEL_WARN, "careful".to_string()),
                (GGML_LOG_LEVEL_WARN, "now".to_string()),
            ]
        );
        assert!(p.text.is_empty());
    }
}
