//! The real `tito` binary's log output: `--log-format json` writes one JSON
//! object per line on stdout and stderr, an HTTP call's lines carry its
//! request id, and llama.cpp's own lines are debug-level (absent at the
//! default level, there when asked for).
#![cfg(feature = "engine")]

mod common;
mod engine_support;

use common::mock_vllm::{MockVllm, Scripted};
use common::process::Tito;
use serde_json::{json, Value};
use std::process::Command;

/// Every line parsed as a JSON object with the fields a log line has.
fn parse_all(lines: &[(&'static str, String)]) -> Vec<Value> {
    lines
        .iter()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(stream, l)| {
            let v: Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{stream} line is not JSON ({e}): {l:?}"));
            for key in ["timestamp", "level", "target"] {
                assert!(v.get(key).is_some(), "{stream} line without {key}: {l}");
            }
            v
        })
        .collect()
}

/// The request id of the span a log line was written in, if any.
fn request_id(line: &Value) -> Option<&str> {
    line["spans"]
        .as_array()?
        .iter()
        .find_map(|s| s["request_id"].as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_writes_json_lines_that_carry_the_request_id() {
    // SmolLM2's <|im_end|> is id 2; the GGUF is the gateway's tokenizer.
    let mock = MockVllm::start(Scripted::ids(vec![28, 2])).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\n[model]\nname = \"m\"\ntokenizer = \"{}\"\n\
             [[backends]]\nurl = \"{}\"\nkind = \"vllm\"\n[store]\nurl = \"memory://\"\n",
            engine_support::model_path().display(),
            mock.url()
        ),
    )
    .expect("write config");
    let cfg = cfg.to_str().expect("utf-8").to_string();
    let mut tito = Tito::spawn(
        &["serve", "--config", &cfg, "--log-format", "json"],
        Some("info,tito=debug"),
    );
    let listening = tokio::task::block_in_place(|| tito.wait_for("tito listening"));
    let addr = listening["addr"].as_str().expect("addr field").to_string();

    let client = reqwest::Client::new();
    let call = |id: &'static str| {
        client
            .post(format!("http://{addr}/v1/chat/completions"))
            .header("x-request-id", id)
            .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let ok = call("cli-ok-1").await.expect("reachable");
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["x-request-id"], "cli-ok-1");
    mock.push(Scripted {
        error: Some((500, "boom".into())),
        ..Default::default()
    });
    let failed = call("cli-fail-2").await.expect("reachable");
    assert!(failed.status().is_server_error(), "{}", failed.status());
    assert_eq!(failed.headers()["x-request-id"], "cli-fail-2");

    // A 5xx on a group's trajectory path names the trajectory in its line.
    mock.push(Scripted {
        error: Some((500, "boom".into())),
        ..Default::default()
    });
    let grouped = client
        .post(format!(
            "http://{addr}/g/grp-3/t/traj-g3/v1/chat/completions"
        ))
        .header("x-request-id", "cli-fail-3")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("reachable");
    assert!(grouped.status().is_server_error(), "{}", grouped.status());

    let lines = tokio::task::block_in_place(|| tito.stop());
    let parsed = parse_all(&lines);
    let of = |id: &str| -> Vec<&Value> {
        parsed
            .iter()
            .filter(|l| request_id(l) == Some(id))
            .collect()
    };
    let ok_lines = of("cli-ok-1");
    assert!(
        ok_lines.iter().any(|l| l["message"] == "request answered"),
        "{ok_lines:#?}"
    );
    let fail_lines = of("cli-fail-2");
    assert!(
        fail_lines
            .iter()
            .any(|l| l["level"] == "ERROR" && l["message"] == "request failed"),
        "the 5xx is logged at the default level, with its id: {fail_lines:#?}"
    );
    let grouped_lines = of("cli-fail-3");
    assert!(
        grouped_lines
            .iter()
            .any(|l| l["message"] == "request failed"
                && (l["trajectory"] == "traj-g3" || l["fields"]["trajectory"] == "traj-g3")),
        "{grouped_lines:#?}"
    );
}

/// `tito engine` on the fetched model until it listens: every line it
/// wrote, as JSON.
fn engine_lines(rust_log: Option<&str>) -> Vec<Value> {
    let model = engine_support::model_path().display().to_string();
    let mut tito = Tito::spawn(
        &[
            "engine",
            "--model",
            &model,
            "--listen",
            "127.0.0.1:0",
            "--threads",
            "2",
            "--n-ctx",
            "512",
            "--log-format",
            "json",
        ],
        rust_log,
    );
    tito.wait_for("tito engine listening");
    parse_all(&tito.stop())
}

#[test]
fn llama_cpp_lines_are_debug_level() {
    let from_llama = |l: &&Value| l["target"] == "llama_cpp";
    // At the default level only tito's own lines (llama.cpp prints many
    // while it loads a model).
    let quiet = engine_lines(None);
    let foreign: Vec<&Value> = quiet
        .iter()
        .filter(|l| !l["target"].as_str().is_some_and(|t| t.starts_with("tito")))
        .collect();
    assert!(foreign.is_empty(), "at the default level: {foreign:#?}");
    assert!(quiet.iter().any(|l| l["message"] == "bundled engine ready"));

    let asked = engine_lines(Some("info,llama_cpp=debug"));
    let llama: Vec<&Value> = asked.iter().filter(from_llama).collect();
    assert!(
        llama.iter().any(|l| l["message"]
            .as_str()
            .is_some_and(|m| m.contains("llama_model_loader"))),
        "llama.cpp's model-load lines when asked: {asked:#?}"
    );
    assert!(
        llama.iter().all(|l| l["level"] == "DEBUG"),
        "{:#?}",
        llama
            .iter()
            .filter(|l| l["level"] != "DEBUG")
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_failed_start_ends_with_a_json_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_tito"))
        .args([
            "serve",
            "--config",
            "/nonexistent/tito.toml",
            "--log-format",
            "json",
        ])
        .env_remove("RUST_LOG")
        .output()
        .expect("run tito");
    assert!(!out.status.success());
    let lines: Vec<(&'static str, String)> = [("stdout", &out.stdout), ("stderr", &out.stderr)]
        .into_iter()
        .flat_map(|(name, bytes)| {
            String::from_utf8_lossy(bytes)
                .lines()
                .map(|l| (name, l.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    let parsed = parse_all(&lines);
    let last = parsed.last().expect("a line");
    assert_eq!(last["message"], "tito failed");
    assert_eq!(last["level"], "ERROR");
    assert!(
        last["error"]
            .as_str()
            .is_some_and(|e| e.contains("/nonexistent/tito.toml")),
        "{last}"
    );
}
