//! The command line explains itself: every option of `tito` and of every
//! subcommand has a description in `--help`, and a flag that takes one of a
//! fixed set of values rejects another value by listing the set.

use std::process::{Command, Output};

fn tito(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tito"))
        .args(args)
        .env_remove("TITO_LOG_FORMAT")
        .env_remove("TITO_CONFIG")
        .output()
        .expect("run tito")
}

fn help(args: &[&str]) -> String {
    let out = tito(args);
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The lines of a `Heading:` section, up to the next heading.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .collect()
}

/// The subcommands `tito --help` lists (but `help`).
fn subcommands() -> Vec<String> {
    let text = help(&["--help"]);
    let names: Vec<String> = section(&text, "Commands:")
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 4, "{text}");
    names
}

/// Each option of a `--help` text with its description: what follows the
/// option's signature, less clap's own annotations (`[default: ..]`,
/// `[env: ..]`) and the list of possible values.
fn options(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in section(text, "Options:") {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if trimmed.starts_with('-') && indent <= 6 {
            let (sig, rest) = trimmed.split_once("  ").unwrap_or((trimmed, ""));
            out.push((sig.trim().to_string(), rest.trim().to_string()));
        } else if let Some((_, desc)) = out.last_mut() {
            let annotation = trimmed.starts_with('[')
                || trimmed.starts_with("Possible values:")
                || trimmed.starts_with("- ");
            if !annotation {
                desc.push(' ');
                desc.push_str(trimmed);
            }
        }
    }
    for (_, desc) in &mut out {
        // A one-line entry keeps its annotations on the same line.
        if let Some(at) = desc.find(" [").filter(|_| desc.ends_with(']')) {
            desc.truncate(at);
        }
        if desc.starts_with('[') {
            desc.clear();
        }
        *desc = desc.trim().to_string();
    }
    out
}

#[test]
fn every_option_of_every_command_has_a_description() {
    let mut pages = vec![(String::from("tito"), help(&["--help"]))];
    for cmd in subcommands() {
        pages.push((format!("tito {cmd}"), help(&[&cmd, "--help"])));
    }
    for (what, text) in &pages {
        let opts = options(text);
        assert!(
            opts.iter().any(|(sig, _)| sig.contains("--help")),
            "{what}: {opts:?}"
        );
        let bare: Vec<&String> = opts
            .iter()
            .filter(|(_, desc)| desc.is_empty())
            .map(|(sig, _)| sig)
            .collect();
        assert!(
            bare.is_empty(),
            "{what}: no description for {bare:?}\n{text}"
        );
    }
}

#[test]
fn the_description_parser_sees_a_missing_one() {
    // clap's long form (description below) and short form (on the line).
    let text = "Options:\n      --listen <LISTEN>\n          [default: x]\n\n  \
                -h, --help\n          Print help\n";
    assert_eq!(
        options(text),
        [
            ("--listen <LISTEN>".to_string(), String::new()),
            ("-h, --help".to_string(), "Print help".to_string()),
        ]
    );
    let text = "Options:\n      --listen <LISTEN>  [default: x]\n      \
                --max-batch <N>  Most sequences [default: 16]\n";
    assert_eq!(
        options(text),
        [
            ("--listen <LISTEN>".to_string(), String::new()),
            ("--max-batch <N>".to_string(), "Most sequences".to_string()),
        ]
    );
}

#[test]
fn a_value_outside_the_set_is_rejected_with_the_set() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["export", "--format", "xml", "--out", "x"],
            "[possible values: jsonl, parquet]",
        ),
        (
            &[
                "export", "--format", "jsonl", "--layout", "rows", "--out", "x",
            ],
            "[possible values: trajectory, per_call, verl]",
        ),
        (
            &[
                "export", "--format", "jsonl", "--status", "done", "--out", "x",
            ],
            "[possible values: active, finished]",
        ),
        (
            &["serve", "--log-format", "yaml"],
            "[possible values: text, json]",
        ),
    ];
    for (args, expected) in cases {
        let out = tito(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid value"), "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// `tito engine` takes the `[engine]` keys a stand-alone engine needs (a
/// CUDA build included), each explained; out-of-range values are refused.
#[cfg(feature = "engine")]
#[test]
fn engine_help_lists_the_engine_flags() {
    let text = help(&["engine", "--help"]);
    let opts = options(&text);
    for flag in [
        "--model",
        "--listen",
        "--device",
        "--max-batch",
        "--ctx",
        "--prefill-chunk",
        "--threads",
        "--max-queue",
    ] {
        assert!(
            opts.iter()
                .any(|(sig, desc)| sig.starts_with(&format!("{flag} ")) && !desc.is_empty()),
            "{flag} missing or undescribed:\n{text}"
        );
    }
    assert!(
        text.contains("- cpu:") && text.contains("- cuda:"),
        "{text}"
    );
    assert!(
        text.contains("--n-ctx"),
        "the old spelling still works:\n{text}"
    );
    for args in [
        ["--device", "tpu"],
        ["--max-batch", "0"],
        ["--prefill-chunk", "8"],
    ] {
        let out = tito(&[&["engine", "--model", "m.gguf"][..], &args[..]].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(args[0]),
            "{args:?}: {out:?}"
        );
    }
}
