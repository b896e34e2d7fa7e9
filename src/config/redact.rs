//! URLs for display: credentials and passwords become `***`.

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

#[cfg(test)]
mod tests {
    use super::*;

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
