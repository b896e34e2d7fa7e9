//! The docs a reader follows, and what the repository says about itself.
//!
//! - Every relative link in README.md and docs/*.md resolves: a markdown
//!   link `[text](path)` or `[text](path#anchor)` (an anchor must name a
//!   heading of the target, by GitHub's slug rules), a reference definition
//!   `[label]: path`, a mention of `docs/NAME.EXT` anywhere in the text (read
//!   from the repository root), and a code span that is a path into the
//!   repository's own folders (`src/…`, `tests/…`, `scripts/…`, …).
//! - README.md and docs/*.md name no commit by its hash: the docs describe
//!   what exists, and git keeps how it came to be.
//! - No file in the repository numbers the sessions or rounds of work in
//!   which something was built or measured, cites the removed history
//!   pages, or tells who else was using the machine. A measurement's own
//!   rounds ("eight interleaved rounds of 2 s") and database, browser or
//!   sticky sessions are not development history and pass; an ordinal
//!   before "session" is always taken for history.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every docs/*.md, sorted.
fn doc_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

// ---------------------------------------------------------------------------
// Markdown: lines outside fenced code, code spans, links, heading slugs.

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let t = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| t.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => out.push((i + 1, line)),
            _ => {}
        }
    }
    out
}

/// Byte ranges of the code spans of one line (a run of N backticks up to the
/// next run of exactly N), the backticks excluded.
fn code_spans(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let run_at = |i: usize| b[i..].iter().take_while(|&&c| c == b'`').count();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'`' {
            i += 1;
            continue;
        }
        let n = run_at(i);
        let start = i + n;
        let mut j = start;
        let mut close = None;
        while j < b.len() {
            if b[j] == b'`' {
                let m = run_at(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                spans.push((start, end));
                i = end + n;
            }
            None => i = start,
        }
    }
    spans
}

fn in_spans(spans: &[(usize, usize)], at: usize) -> bool {
    spans
        .iter()
        .any(|&(s, e)| at >= s.saturating_sub(1) && at <= e)
}

/// The targets of the inline links and images of one line, outside code
/// spans: what stands between `](` and its closing `)`.
fn link_targets(line: &str) -> Vec<String> {
    let spans = code_spans(line);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(k) = line[from..].find("](") {
        let at = from + k;
        from = at + 2;
        if in_spans(&spans, at) || !line[..at].contains('[') {
            continue;
        }
        let rest = &line[at + 2..];
        let mut depth = 0usize;
        let mut end = None;
        for (i, c) in rest.char_indices() {
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        if let Some(end) = end {
            let target = rest[..end].trim();
            // A title after the target: `(path "title")`.
            let target = target.split_whitespace().next().unwrap_or("");
            out.push(target.trim_matches(['<', '>']).to_string());
        }
    }
    // A reference definition: `[label]: target`.
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(k) = t.find("]:") {
            if let Some(target) = t[k + 2..].split_whitespace().next() {
                out.push(target.to_string());
            }
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: markdown links reduced to their
/// text, lower case, every character that is not a letter, digit, space,
/// hyphen or underscore dropped, each space a hyphen.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor a markdown file's headings give, duplicates numbered as
/// GitHub numbers them (`name`, `name-1`, `name-2`).
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = HashSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.bytes().take_while(|&c| c == b'#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#').trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(match *n {
            0 => base.clone(),
            k => format!("{base}-{k}"),
        });
        *n += 1;
    }
    out
}

/// Mentions of `docs/NAME.EXT` in `line` (not part of a longer path), with
/// a sentence's final period left off.
fn docs_mentions(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(k) = line[from..].find("docs/") {
        let at = from + k;
        from = at + 5;
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || "./_-".contains(c)) {
            continue;
        }
        let path: String = line[at..]
            .chars()
            .take_while(|&c| c.is_ascii_alphanumeric() || "._-/".contains(c))
            .collect();
        let path = path.trim_end_matches('.');
        let is_file = path.rsplit_once('.').is_some_and(|(stem, ext)| {
            stem.len() > 5 && ext.chars().all(|c| c.is_ascii_alphanumeric())
        });
        if is_file {
            out.push(path.to_string());
        }
    }
    out
}

/// The repository's own top folders: a code span naming a path under one of
/// them is a reference to a file that must exist.
const REPO_DIRS: [&str; 9] = [
    "benches/",
    "docker/",
    "docs/",
    "examples/",
    "scripts/",
    "src/",
    "templates/",
    "tests/",
    "ui/",
];

/// Code spans of `line` that are a bare path into the repository.
fn path_spans(line: &str) -> Vec<String> {
    code_spans(line)
        .into_iter()
        .map(|(s, e)| &line[s..e])
        .filter(|t| REPO_DIRS.iter().any(|d| t.starts_with(d)))
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let mut anchor_cache: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut broken = Vec::new();
    for file in doc_files() {
        let text = read(&file);
        let dir = file.parent().expect("a folder").to_path_buf();
        for (n, line) in prose_lines(&text) {
            let place = format!("{}:{n}", relative(&file));
            for target in link_targets(line) {
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    dir.join(path)
                };
                if !resolved.exists() {
                    broken.push(format!("{place}: link to {target}: no such file"));
                    continue;
                }
                let is_md = resolved.extension().is_some_and(|e| e == "md");
                if !anchor.is_empty() && is_md {
                    let known = anchor_cache
                        .entry(resolved.clone())
                        .or_insert_with(|| anchors(&read(&resolved)));
                    if !known.contains(anchor) {
                        broken.push(format!("{place}: link to {target}: no heading #{anchor}"));
                    }
                }
            }
            for path in path_spans(line) {
                if !root.join(&path).exists() {
                    broken.push(format!("{place}: `{path}`: no such file"));
                }
            }
        }
        for (i, line) in text.lines().enumerate() {
            for path in docs_mentions(line) {
                if !root.join(&path).exists() {
                    broken.push(format!(
                        "{}:{}: {path}: no such file",
                        relative(&file),
                        i + 1
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken references:\n{}",
        broken.join("\n")
    );
}

/// A code span of 7 to 12 hexadecimal characters, digits and letters both:
/// an abbreviated commit hash.
fn commit_hashes(line: &str) -> Vec<String> {
    code_spans(line)
        .into_iter()
        .map(|(s, e)| &line[s..e])
        .filter(|t| {
            (7..=12).contains(&t.len())
                && t.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
                && t.chars().any(|c| c.is_ascii_digit())
                && t.chars().any(|c| c.is_ascii_alphabetic())
        })
        .map(str::to_string)
        .collect()
}

#[test]
fn the_docs_name_no_commit() {
    let mut found = Vec::new();
    for file in doc_files() {
        for (n, line) in prose_lines(&read(&file)) {
            for hash in commit_hashes(line) {
                found.push(format!("{}:{n}: `{hash}`", relative(&file)));
            }
        }
    }
    assert!(
        found.is_empty(),
        "commit hashes in the docs:\n{}",
        found.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Development history: the patterns.

/// One word of a file, lower case, with the line it is on.
struct Word {
    text: String,
    line: usize,
}

/// The words of `text`: runs of letters, digits, hyphens and apostrophes,
/// so that a phrase wrapped over two lines (or two comment lines) still
/// reads as one.
fn words(text: &str) -> Vec<Word> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut word = String::new();
        for c in line.chars().chain(std::iter::once(' ')) {
            if c.is_alphanumeric() || c == '-' || c == '\'' || c == '’' {
                word.push(if c == '’' { '\'' } else { c });
            } else if !word.is_empty() {
                let w = word
                    .trim_matches('-')
                    .trim_start_matches('\'')
                    .to_lowercase();
                if !w.is_empty() {
                    out.push(Word {
                        text: w,
                        line: i + 1,
                    });
                }
                word.clear();
            }
        }
    }
    out
}

/// `word` without a possessive ending (`session's`, `sessions'`).
fn bare(word: &str) -> &str {
    word.strip_suffix("'s")
        .or_else(|| word.strip_suffix('\''))
        .unwrap_or(word)
}

/// An ordinal: `first` … `nineteenth`, `twentieth` … `ninetieth`, a
/// compound such as `thirty-eighth`, or `38th`, `21st`, `2nd`, `3rd`.
fn is_ordinal(word: &str) -> bool {
    const UNITS: [&str; 9] = [
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    ];
    const TEENS: [&str; 10] = [
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
        "sixteenth",
        "seventeenth",
        "eighteenth",
        "nineteenth",
    ];
    const TENS: [&str; 8] = [
        "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    if UNITS.contains(&word) || TEENS.contains(&word) {
        return true;
    }
    if TENS
        .iter()
        .any(|t| word.strip_suffix("ieth") == t.strip_suffix('y'))
    {
        return true;
    }
    if let Some((tens, unit)) = word.split_once('-') {
        return TENS.contains(&tens) && UNITS.contains(&unit);
    }
    let digits = word.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &word[digits.len()..];
    !digits.is_empty()
        && digits.chars().all(|c| c.is_ascii_digit())
        && ["st", "nd", "rd", "th"].contains(&suffix)
}

fn is_session(word: &str) -> bool {
    matches!(bare(word), "session" | "sessions")
}

/// Words that, right before "session", place it in a line of work:
/// "this session", "the next session", "earlier sessions".
const SESSION_DEICTICS: [&str; 7] = [
    "this", "next", "previous", "earlier", "later", "last", "some",
];

/// What a round of development is called when it is not a measurement's.
const WORK: [&str; 6] = [
    "work",
    "development",
    "changes",
    "fixes",
    "review",
    "reviews",
];

/// Who else might be said to be using the machine.
const PEOPLE: [&str; 4] = ["engineer", "engineers", "developer", "developers"];

/// The phrases of `text` that narrate development history, as
/// (line, phrase).
fn history_phrases(text: &str) -> Vec<(usize, String)> {
    let w = words(text);
    let mut out = Vec::new();
    let phrase = |from: usize, to: usize| {
        w[from..=to]
            .iter()
            .map(|x| x.text.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    for i in 0..w.len() {
        let at = |k: usize| w.get(k).map(|x| x.text.as_str()).unwrap_or("");
        // An ordinal, or a list of them ("twenty-fifth to twenty-eighth"),
        // then "session(s)".
        if is_ordinal(at(i)) {
            let mut j = i + 1;
            while matches!(at(j), "to" | "and" | "or" | "through") && is_ordinal(at(j + 1)) {
                j += 2;
            }
            if is_session(at(j)) {
                out.push((w[i].line, phrase(i, j)));
            }
            // "the third round of work"
            if matches!(bare(at(i + 1)), "round" | "rounds")
                && at(i + 2) == "of"
                && WORK.contains(&at(i + 3))
            {
                out.push((w[i].line, phrase(i, i + 3)));
            }
        }
        // "this session", "earlier sessions'".
        if SESSION_DEICTICS.contains(&at(i)) && is_session(at(i + 1)) {
            out.push((w[i].line, phrase(i, i + 1)));
        }
        // "session 12", "sessions 29 to 37".
        if matches!(at(i), "session" | "sessions")
            && !at(i + 1).is_empty()
            && at(i + 1).chars().all(|c| c.is_ascii_digit())
        {
            out.push((w[i].line, phrase(i, i + 1)));
        }
        // "rounds of work", "a round of review".
        if matches!(at(i), "round" | "rounds") && at(i + 1) == "of" && WORK.contains(&at(i + 2)) {
            out.push((w[i].line, phrase(i, i + 2)));
        }
        // "another engineer's builds", "the other engineer".
        if matches!(at(i), "another" | "other" | "other's" | "others'")
            && PEOPLE.contains(&bare(at(i + 1)))
        {
            out.push((w[i].line, phrase(i, i + 1)));
        }
    }
    // The history pages, now removed, cited by name.
    for (i, line) in text.lines().enumerate() {
        if line.to_lowercase().contains("benchmarks-history") {
            out.push((i + 1, "benchmarks-history".to_string()));
        }
    }
    out.sort();
    out
}

/// Folders the walk does not enter: build output, fetched fixtures,
/// virtual environments, caches, and the store a local run leaves.
const SKIPPED_DIRS: [&str; 10] = [
    ".git",
    "target",
    ".cache",
    "models",
    "node_modules",
    ".venv",
    ".bench-venv",
    "tito-data",
    "__pycache__",
    ".pytest_cache",
];

/// Every text file under `dir` (symbolic links and binary files left out).
fn text_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry"))
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = fs::symlink_metadata(&path).expect("metadata").file_type();
        let name = entry.file_name();
        if kind.is_dir() {
            if !SKIPPED_DIRS.iter().any(|s| name == *s) {
                text_files(&path, out);
            }
        } else if kind.is_file() {
            out.push(path);
        }
    }
}

#[test]
fn no_file_narrates_rounds_of_work_or_who_used_the_machine() {
    let root = root();
    let this_file = root.join("tests").join("repo_docs.rs");
    let mut files = Vec::new();
    text_files(&root, &mut files);
    let mut found = Vec::new();
    let mut checked = 0;
    for file in files.iter().filter(|f| **f != this_file) {
        let bytes = fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if bytes.iter().take(8192).any(|&b| b == 0) {
            continue;
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        checked += 1;
        for (line, phrase) in history_phrases(&text) {
            found.push(format!("{}:{line}: {phrase}", relative(file)));
        }
    }
    assert!(
        checked > 100,
        "only {checked} text files found under {}",
        root.display()
    );
    assert!(
        found.is_empty(),
        "development history in {} places (say what the code does and why; \
         measurements belong in docs/benchmarks.md):\n{}",
        found.len(),
        found.join("\n")
    );
}

// ---------------------------------------------------------------------------
// The checks themselves.

#[test]
fn the_history_patterns_catch_narration_and_pass_measurements() {
    let caught = [
        "read 3.5% high (before the thirty-eighth session)",
        "Earlier sessions' sections: the twenty-fifth to twenty-eighth in",
        "the fifteenth and\n// sixteenth sessions measured it",
        "No GPU was lent to this session, so",
        "(an H100 or an H200, lent to some sessions)",
        "since the 38th session",
        "the runs of session 12",
        "sessions 29 to 37",
        "after the third round of work on the store",
        "rounds of review found it",
        "shared with another engineer's builds",
        "with the other engineer's builds running",
        "(docs/benchmarks-history-early.md, \"Release profile\")",
    ];
    for text in caught {
        assert!(!history_phrases(text).is_empty(), "not caught: {text}");
    }
    let passed = [
        "eight interleaved rounds of 2 s, each cell its median round",
        "round 3 ran tito first; in the second round sglang-router did",
        "the first round of each run is a warm-up",
        "another session holds the marks lock",
        "a sticky session had to move: the backend it moved from",
        "kept in the browser tab's sessionStorage, a browser session",
        "its session advisory lock, a plain session on the database",
        "EngineError::Load(\"no sequence\")",
        "a session's 2 connections",
        "the first-token timeout; the second call",
        "other engines' extensions stay ignored",
    ];
    for text in passed {
        assert_eq!(history_phrases(text), vec![], "caught: {text}");
    }
}

#[test]
fn the_link_reader_finds_links_and_github_anchors() {
    assert_eq!(
        link_targets("see [`docs/api.md`](docs/api.md#errors) and [x](y.md \"t\")"),
        vec!["docs/api.md#errors", "y.md"]
    );
    assert_eq!(
        link_targets("code `[a](b)` is not a link"),
        Vec::<String>::new()
    );
    assert_eq!(link_targets("[label]: ../x.md"), vec!["../x.md"]);
    assert_eq!(slug("`[auth]`"), "auth");
    assert_eq!(
        slug("Conformance with OpenAI's published specification"),
        "conformance-with-openais-published-specification"
    );
    assert_eq!(
        slug("Replay check (`POST /v1/trajectories/{id}/verify`)"),
        "replay-check-post-v1trajectoriesidverify"
    );
    assert_eq!(slug("Runs D and E: 30 minutes"), "runs-d-and-e-30-minutes");
    let a = anchors("# T\n## Figures\n```\n## not a heading\n```\n## Figures\n");
    assert!(a.contains("figures") && a.contains("figures-1") && !a.contains("not-a-heading"));
    assert_eq!(
        docs_mentions("in docs/export.md. And ../docs/x.md, mydocs/y.md"),
        vec!["docs/export.md"]
    );
    assert_eq!(
        path_spans("run `scripts/test.sh` or `cargo test`"),
        vec!["scripts/test.sh"]
    );
    assert_eq!(
        commit_hashes("at `d07c15d`, not `16777216` or `a_b`"),
        vec!["d07c15d"]
    );
}
