//! URLs and config errors for display: credentials, passwords and tokens
//! become `***`.

/// A credential from the config file: kept out of `Debug` output (logs,
/// error reports), read only where it is sent.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The credential, or `None` when it is not set.
    pub fn get(&self) -> Option<&str> {
        (!self.0.is_empty()).then_some(self.0.as_str())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.get() {
            Some(t) => f.write_str(&redacted_token(t)),
            None => f.write_str("<unset>"),
        }
    }
}

/// A token is 8 to 4096 printable ASCII characters without spaces.
pub fn usable_token(t: &str) -> bool {
    (8..=4096).contains(&t.len()) && t.bytes().all(|b| b.is_ascii_graphic())
}

/// A token as it may appear in an error message.
pub fn redacted_token(t: &str) -> String {
    format!("<{} characters>", t.len())
}

/// `scheme://user:pass@host/...` → `scheme://***@host/...`: a backend URL
/// may carry credentials (sent as basic auth); they are never shown.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => url.to_string(),
    }
}

/// A `[store] url` for display: a postgres URL's credentials (everything
/// before the last `@` of its authority, which is where a password with an
/// unencoded `/`, `?` or `#` would end) and any `password=` parameter become
/// `***`; other URLs as [`redact_url`].
pub fn redact_store_url(url: &str) -> String {
    let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    else {
        return redact_url(url);
    };
    let scheme = &url[..url.len() - rest.len()];
    let (main, query) = match rest.rfind('?') {
        Some(q) if rest[..q].contains('@') || !rest[q..].contains('@') => rest.split_at(q),
        _ => (rest, ""),
    };
    let main = match main.rfind('@') {
        Some(at) => format!("***{}", &main[at..]),
        None => main.to_string(),
    };
    let query: Vec<String> = query
        .trim_start_matches('?')
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => p.to_string(),
        })
        .collect();
    if query.is_empty() {
        format!("{scheme}{main}")
    } else {
        format!("{scheme}{main}?{}", query.join("&"))
    }
}

/// A TOML parse error for display, without the secrets the parser's own
/// message can carry: its line, column and key, and its reason with every
/// quoted value masked (the parser quotes the offending value, and shows
/// the source line, which may be a token or a password).
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let mut out = String::new();
    if let Some(start) = e.span().map(|s| s.start) {
        let before = text.get(..start).unwrap_or(text);
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        out.push_str(&format!("line {line}, column {column}"));
        // The key of a `key = value` line; a line of a multi-line array
        // is a value, never shown.
        let key = text.lines().nth(line - 1).and_then(|l| l.split_once('='));
        let key = key.map(|(k, _)| k.trim()).filter(|k| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        });
        if let Some(key) = key {
            out.push_str(&format!(" (`{key}`)"));
        }
        out.push_str(": ");
    }
    out.push_str(&mask_quoted(e.message().trim_end()));
    out
}

/// Every double-quoted string (escapes included) as `"***"`.
fn mask_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            out.push(c);
            continue;
        }
        out.push_str("\"***\"");
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => break,
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_errors_name_the_place_and_key_but_not_the_secret() {
        let base = "[model]\ntokenizer = \"x\"\n";
        for (text, key) in [
            (
                format!("{base}[auth]\ntrainer_tokens = \"f3a9-very-secret\"\n"),
                "trainer_tokens",
            ),
            (
                format!("{base}[store]\nuri = \"postgres://u:f3a9-very-secret@db/t\"\n"),
                "uri",
            ),
        ] {
            let e = crate::config::Config::from_toml(&text)
                .expect_err("invalid")
                .to_string();
            assert!(!e.contains("f3a9-very-secret"), "{e}");
            assert!(
                e.contains("line 4") && e.contains(&format!("`{key}`")),
                "{e}"
            );
        }
        // A token on a line of its own in a list (a missing comma) is not
        // taken for a key; an escaped quote does not end the masking.
        let text = format!(
            "{base}[auth]\ntrainer_tokens = [\n  \"AAAA-secret-1\",\n  \"BBBB-secret-2\"\n  \"CCCC-secret-3\",\n]\n"
        );
        let e = crate::config::Config::from_toml(&text)
            .expect_err("invalid")
            .to_string();
        assert!(!e.contains("secret"), "{e}");
        assert_eq!(mask_quoted(r#"got "ab\"cd" here"#), r#"got "***" here"#);
    }

    #[test]
    fn store_urls_are_shown_without_passwords() {
        for (url, shown) in [
            (
                "postgres://tito:s3cret@db:5432/tito",
                "postgres://***@db:5432/tito",
            ),
            ("postgresql://u:a/b?c#d@db/tito", "postgresql://***@db/tito"),
            (
                "postgres://u:p@ss@db/tito?sslmode=disable",
                "postgres://***@db/tito?sslmode=disable",
            ),
            (
                "postgres://db/tito?user=u&password=s3cret",
                "postgres://db/tito?user=u&password=***",
            ),
            ("postgres://db/tito", "postgres://db/tito"),
            ("sqlite://tito-data/spans.db", "sqlite://tito-data/spans.db"),
        ] {
            assert_eq!(redact_store_url(url), shown, "{url}");
        }
    }
}
