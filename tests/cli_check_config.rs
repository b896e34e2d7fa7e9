//! `tito check-config`: exits 0 on a config `serve` would take, and 1 with a
//! message naming the key on one it would refuse; nothing is started.

use std::path::PathBuf;
use std::process::Command;

fn check(config: &str) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.toml");
    std::fs::write(&path, config).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_tito"))
        .args(["check-config", "--config"])
        .arg(&path)
        .env_remove("TITO_CONFIG")
        .output()
        .expect("run tito");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn config(server: &str, tokenizer: &str) -> String {
    format!(
        "[server]\n{server}\n[model]\nname = \"m\"\ntokenizer = \"{tokenizer}\"\n\
         [[backends]]\nurl = \"http://127.0.0.1:9\"\nkind = \"vllm\"\n"
    )
}

#[test]
fn a_good_config_passes_and_each_refusal_names_its_cause() {
    // A tokenizer directory from scripts/fetch-tokenizers.sh (no engine
    // needed: the test runs in a build without it too).
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/tokenizers/qwen3");
    let model = dir.display().to_string();
    let (code, out) = check(&config("listen = \"127.0.0.1:8000\"", &model));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(": ok (listen 127.0.0.1:8000, model m"),
        "{out}"
    );

    let (code, out) = check(&config("max_concurrent_requests = 0", &model));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("server.max_concurrent_requests"), "{out}");

    // Exposed without trainer / admin tokens: refused as `serve` refuses it.
    let (code, out) = check(&config("listen = \"0.0.0.0:8000\"", &model));
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("admin_tokens") && out.contains("trainer_tokens"),
        "{out}"
    );

    let (code, out) = check(&config("", "/nonexistent/tokenizer"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("model.tokenizer"), "{out}");
}

#[test]
fn the_check_says_which_models_form_is_used() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/tokenizers");
    let (qwen, llama) = (dir.join("qwen3"), dir.join("llama3_1"));
    let (code, out) = check(&config("", &qwen.display().to_string()));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("; [model] form)"), "{out}");

    let list = format!(
        "[[models]]\nname = \"planner\"\ntokenizer = \"{}\"\n\
         [[models.backends]]\nurl = \"http://127.0.0.1:9\"\nkind = \"vllm\"\n\
         [[models]]\nname = \"coder\"\ntokenizer = \"{}\"\n\
         [[models.backends]]\nurl = \"http://127.0.0.1:10\"\nkind = \"vllm\"\n",
        qwen.display(),
        llama.display()
    );
    let (code, out) = check(&list);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("model planner with a ") && out.contains("model coder with a "),
        "{out}"
    );
    assert!(out.contains("; [[models]] form)"), "{out}");

    // A second model's tokenizer that does not load is named by its entry.
    let (code, out) = check(&list.replace(&llama.display().to_string(), "/nonexistent/tok"));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("models[1].tokenizer"), "{out}");
}
