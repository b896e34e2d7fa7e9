//! The crate's top-level modules depend on each other in one direction:
//! each uses only the modules that `src/lib.rs`'s layout list puts before
//! it. Every `crate::NAME` path in code (comments aside) is checked against
//! that list, so a lower module that reaches up fails here by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The layout list of `src/lib.rs`: `//! N. [`name`]: ...` (or `` `name` ``
/// for a module behind a feature), in order.
fn layout_order() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let mut order = Vec::new();
    for line in lib.lines() {
        let Some(item) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((num, rest)) = item.split_once(". ") else {
            continue;
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let name = rest
            .trim_start_matches('[')
            .trim_start_matches('`')
            .split('`')
            .next()
            .expect("a module name");
        order.push(name.to_string());
    }
    order
}

/// `pub mod NAME;` lines of `src/lib.rs`.
fn declared_modules() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    lib.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The files of top-level module `name`: `src/name.rs` or `src/name/**`.
fn files_of(name: &str) -> Vec<PathBuf> {
    let file = src().join(format!("{name}.rs"));
    if file.exists() {
        return vec![file];
    }
    let mut out = Vec::new();
    rust_files(&src().join(name), &mut out);
    out
}

/// Each `crate::NAME` in `text` outside comments, with its line number.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut in_block = false;
    for (n, line) in text.lines().enumerate() {
        let mut code = String::new();
        let mut rest = line;
        loop {
            if in_block {
                match rest.find("*/") {
                    Some(end) => {
                        rest = &rest[end + 2..];
                        in_block = false;
                    }
                    None => break,
                }
            } else {
                let line_comment = rest.find("//");
                let block = rest.find("/*");
                match (line_comment, block) {
                    (Some(l), Some(b)) if b < l => {
                        code.push_str(&rest[..b]);
                        rest = &rest[b + 2..];
                        in_block = true;
                    }
                    (Some(l), _) => {
                        code.push_str(&rest[..l]);
                        break;
                    }
                    (None, Some(b)) => {
                        code.push_str(&rest[..b]);
                        rest = &rest[b + 2..];
                        in_block = true;
                    }
                    (None, None) => {
                        code.push_str(rest);
                        break;
                    }
                }
            }
        }
        let mut at = 0;
        while let Some(i) = code[at..].find("crate::") {
            let start = at + i + "crate::".len();
            let before = code[..at + i].chars().next_back();
            // `tito_crate::x` or `$crate::x` are other paths.
            let standalone = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
            let name: String = code[start..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if standalone && !name.is_empty() {
                found.push((n + 1, name.clone()));
            }
            // `use crate::{a, b}`: every name in the braces.
            if standalone && name.is_empty() && code[start..].starts_with('{') {
                let inner = code[start + 1..].split('}').next().unwrap_or("");
                for part in inner.split(',') {
                    let head: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if !head.is_empty() {
                        found.push((n + 1, head));
                    }
                }
            }
            at = start;
        }
    }
    found
}

#[test]
fn the_layout_list_names_every_module_once() {
    let order = layout_order();
    let mut declared = declared_modules();
    declared.sort();
    let mut listed = order.clone();
    listed.sort();
    assert_eq!(
        listed, declared,
        "src/lib.rs: the layout list and the `pub mod`s differ"
    );
}

#[test]
fn no_module_uses_one_above_it() {
    let order = layout_order();
    let rank: BTreeMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    let mut wrong = Vec::new();
    for module in &order {
        let own = rank[module.as_str()];
        for file in files_of(module) {
            let text = std::fs::read_to_string(&file).expect("read");
            for (line, used) in crate_paths(&text) {
                let Some(&r) = rank.get(used.as_str()) else {
                    continue;
                };
                if r > own {
                    let shown = file
                        .strip_prefix(src())
                        .unwrap_or(&file)
                        .display()
                        .to_string();
                    wrong.push(format!(
                        "src/{shown}:{line}: `{module}` uses `{used}`, listed after it"
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "lower modules reaching up:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_path_scanner_sees_uses_and_skips_comments() {
    let text = "use crate::api::x;\n// crate::store is a comment\nlet a = crate::call::f(); /* crate::engine */\nuse crate::{render, router::Route};\n";
    let found: Vec<String> = crate_paths(text).into_iter().map(|(_, m)| m).collect();
    assert_eq!(found, ["api", "call", "render", "router"]);
}
