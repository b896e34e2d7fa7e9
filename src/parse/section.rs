//! Marker-delimited call sections, as the DeepSeek and Kimi formats write
//! them: `BEGIN (CALL_BEGIN inner CALL_END)+ END`, whitespace allowed
//! between the markers, text before `BEGIN` and after `END` is content.
//! Owns the walk over the markers; each format reads its own `inner`.
//! Must not: accept a section without its closing markers.

use super::json::short;

/// The markers of one format. `begin` / `end` may list spelling variants.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    pub begin: &'static [&'static str],
    pub end: &'static [&'static str],
    pub call_begin: &'static str,
    pub call_end: &'static str,
}

/// The earliest occurrence of any of `markers`: (offset, marker length).
pub fn find_first(text: &str, markers: &[&str]) -> Option<(usize, usize)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, m.len())))
        .min()
}

/// The calls of the first section: `Ok(None)` when there is none, else the
/// text outside it and each call's `inner` read by `one`; `Err` says why the
/// section is malformed.
pub fn calls<T>(
    text: &str,
    m: &Markers,
    one: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<(String, Vec<T>)>, String> {
    let Some((start, len)) = find_first(text, m.begin) else {
        return Ok(None);
    };
    let begin = &text[start..start + len];
    let mut rest = &text[start + len..];
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if let Some(end) = m.end.iter().find(|e| rest.starts_with(**e)) {
            rest = &rest[end.len()..];
            break;
        }
        let Some(body) = rest.strip_prefix(m.call_begin) else {
            return Err(if rest.is_empty() {
                format!("unterminated {begin}")
            } else {
                format!(
                    "expected {} or {}, found {:?}",
                    m.call_begin,
                    m.end[0],
                    short(rest)
                )
            });
        };
        let Some((inner, after)) = body.split_once(m.call_end) else {
            return Err(format!(
                "call {}: unterminated {}",
                calls.len(),
                m.call_begin
            ));
        };
        calls.push(one(inner).map_err(|e| format!("call {}: {e}", calls.len()))?);
        rest = after;
    }
    if calls.is_empty() {
        return Err("no calls between the tool-call markers".into());
    }
    Ok(Some((format!("{}{}", &text[..start], rest), calls)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: Markers = Markers {
        begin: &["<B>", "<B2>"],
        end: &["<E>", "<E2>"],
        call_begin: "<c>",
        call_end: "</c>",
    };

    fn upper(s: &str) -> Result<String, String> {
        if s.is_empty() {
            Err("empty".into())
        } else {
            Ok(s.to_uppercase())
        }
    }

    #[test]
    fn walks_sections_and_variants() {
        let got = calls("hi <B2><c>a</c>\n <c>b</c><E> bye", &M, upper);
        assert_eq!(
            got,
            Ok(Some(("hi  bye".to_string(), vec!["A".into(), "B".into()])))
        );
        assert_eq!(calls("no section", &M, upper), Ok(None));
        assert_eq!(find_first("x<B2>y<B>", M.begin), Some((1, 4)));
        for (text, why) in [
            ("<B><c>a</c>", "unterminated <B>"),
            ("<B><c>a", "call 0: unterminated <c>"),
            ("<B><c></c><E>", "call 0: empty"),
            ("<B>junk<E>", "expected <c> or <E>"),
            ("<B><E>", "no calls"),
        ] {
            match calls(text, &M, upper) {
                Err(e) => assert!(e.contains(why), "{text}: {e}"),
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
