//! The real `tito` binary's log output: `--log-format json` writes one JSON
//! object per line on stdout and stderr, and llama.cpp's own lines are
//! debug-level (absent at the default level, there when asked for).

mod engine_support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// How long a process may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `tito` whose stdout and stderr lines are read as they come.
struct Tito {
    child: Child,
    lines: mpsc::Receiver<(&'static str, String)>,
    seen: Vec<(&'static str, String)>,
}

impl Tito {
    fn spawn(args: &[&str], rust_log: Option<&str>) -> Tito {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tito"));
        cmd.args(args)
            .env_remove("TITO_LOG_FORMAT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        let mut child = cmd.spawn().expect("run tito");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        for (name, pipe) in [
            ("stdout", Box::new(out) as Box<dyn std::io::Read + Send>),
            ("stderr", Box::new(err)),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((name, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Tito {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one (as JSON) has this message; returns it.
    fn wait_for(&mut self, message: &str) -> Value {
        loop {
            let (stream, line) = self
                .lines
                .recv_timeout(START_TIMEOUT)
                .unwrap_or_else(|_| panic!("no {message:?} line; got so far: {:#?}", self.seen));
            self.seen.push((stream, line.clone()));
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["message"] == message {
                    return v;
                }
            }
        }
    }

    /// Stops the process and returns every line it wrote.
    fn stop(&mut self) -> Vec<(&'static str, String)> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Both pipes close with the process: the readers end, the channel too.
        let rest: Vec<_> = self.lines.iter().collect();
        self.seen.extend(rest);
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Tito {
    /// A failed test does not leave the process running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
