//! `[[models]]` and `[model]`: both forms load (the single table is a
//! one-element list), and each refusal at start-up names its key.

use tito::config::ModelsForm;
use tito::Config;

const SINGLE: &str = r#"
[model]
name = "m"
tokenizer = "x"
[[model.adapters]]
name = "m-lora"
path = "/loras/a"
[[backends]]
url = "http://127.0.0.1:8001"
kind = "vllm"
"#;

/// Two models: the first with an inline backend, the second naming a
/// top-level `[[backends]]` entry.
const LIST: &str = r#"
[[models]]
name = "planner"
tokenizer = "x"
[[models.adapters]]
name = "planner-lora"
path = "/loras/p"
[[models.backends]]
url = "http://127.0.0.1:8001"
kind = "vllm"

[[models]]
name = "coder"
tokenizer = "y"
default_max_tokens = 64
backends = ["gpu-2"]

[[backends]]
name = "gpu-2"
url = "http://127.0.0.1:8002"
kind = "sglang"
"#;

fn refused(text: &str) -> String {
    Config::from_toml(text)
        .expect_err("refused at start-up")
        .to_string()
}

#[test]
fn the_single_table_is_a_one_model_list() {
    let c = Config::from_toml(SINGLE).expect("valid");
    assert_eq!(c.models_form(), ModelsForm::Single);
    let views = c.served();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].model.name, "m");
    assert_eq!(views[0].model.adapters[0].name, "m-lora");
    assert_eq!(views[0].backends[0].url, "http://127.0.0.1:8001");
}

#[test]
fn each_listed_model_gets_its_own_table_and_backends() {
    let c = Config::from_toml(LIST).expect("valid");
    assert_eq!(c.models_form(), ModelsForm::List);
    // A request naming no model is the first model's.
    assert_eq!(c.model.name, "planner");
    assert_eq!(c.backends.len(), 1);
    let views = c.served();
    let names: Vec<_> = views.iter().map(|v| v.model.name.as_str()).collect();
    assert_eq!(names, ["planner", "coder"]);
    assert_eq!(views[0].model.tokenizer, std::path::Path::new("x"));
    assert_eq!(views[0].backends[0].url, "http://127.0.0.1:8001");
    assert_eq!(views[1].model.tokenizer, std::path::Path::new("y"));
    assert_eq!(views[1].model.default_max_tokens, 64);
    assert_eq!(views[1].backends.len(), 1);
    assert_eq!(views[1].backends[0].name, "gpu-2");
    assert_eq!(views[1].backends[0].url, "http://127.0.0.1:8002");
    assert!(views[1].model.adapters.is_empty());
}

#[test]
fn duplicate_ids_are_refused_naming_the_key() {
    let err = refused(&LIST.replace("name = \"coder\"", "name = \"planner\""));
    assert!(
        err.contains("models[1].name") && err.contains("planner"),
        "{err}"
    );
    // An adapter may not take a model's id, in its own or another entry.
    let err = refused(&LIST.replace("name = \"planner-lora\"", "name = \"coder\""));
    assert!(
        err.contains("models[1].name") && err.contains("coder"),
        "{err}"
    );
    let err = refused(&LIST.replace("name = \"planner-lora\"", "name = \"planner\""));
    assert!(err.contains("models[0].adapters[0].name"), "{err}");
    let err = refused(&SINGLE.replace("name = \"m-lora\"", "name = \"m\""));
    assert!(err.contains("model.adapters[0].name"), "{err}");
}

#[test]
fn a_model_without_backends_is_refused_naming_the_key() {
    let err = refused(&LIST.replace("backends = [\"gpu-2\"]", ""));
    assert!(err.contains("models[1].backends"), "{err}");
    let err = refused(&LIST.replace("backends = [\"gpu-2\"]", "backends = []"));
    assert!(err.contains("models[1].backends"), "{err}");
    // The one-model form may start with an empty fleet (backends are added
    // by POST /admin/backends); a listed model may not.
    let single = SINGLE.replace(
        "[[backends]]\nurl = \"http://127.0.0.1:8001\"\nkind = \"vllm\"\n",
        "",
    );
    assert!(Config::from_toml(&single)
        .expect("valid")
        .backends
        .is_empty());
}

#[test]
fn an_adapter_without_a_base_model_is_refused_naming_the_key() {
    // Adapters live under the model that is their base; a top-level list
    // has none.
    let err = refused(&format!(
        "{LIST}\n[[adapters]]\nname = \"loose\"\npath = \"/loras/l\"\n"
    ));
    assert!(err.contains("adapters"), "{err}");
    // `[[models.adapters]]` before any `[[models]]` has no entry to
    // belong to.
    let orphan = format!("[[models.adapters]]\nname = \"loose\"\npath = \"/l\"\n{LIST}");
    let err = refused(&orphan);
    assert!(err.contains("models"), "{err}");
    // An adapter needs a path its base's backends load it from.
    let err = refused(&LIST.replace("path = \"/loras/p\"", "path = \"\""));
    assert!(err.contains("models[0].adapters[0].path"), "{err}");
}

#[test]
fn backend_references_are_checked() {
    let err = refused(&LIST.replace("backends = [\"gpu-2\"]", "backends = [\"gpu-9\"]"));
    assert!(
        err.contains("models[1].backends[0]") && err.contains("gpu-9"),
        "{err}"
    );
    // A named backend serves one model.
    let twice = LIST
        .replace(
            "[[models.backends]]\nurl = \"http://127.0.0.1:8001\"\nkind = \"vllm\"\n",
            "",
        )
        .replace(
            "name = \"planner\"\n",
            "name = \"planner\"\nbackends = [\"gpu-2\"]\n",
        );
    let err = refused(&twice);
    assert!(err.contains("models[1].backends[0]"), "{err}");
    // A `[[backends]]` entry no model names would serve nothing.
    let unused = format!("{LIST}\n[[backends]]\nname = \"gpu-3\"\nurl = \"http://127.0.0.1:8003\"\nkind = \"vllm\"\n");
    let err = refused(&unused);
    assert!(
        err.contains("backends[1]") && err.contains("gpu-3"),
        "{err}"
    );
    // Per-model backends belong to `[[models]]`.
    let err = refused(&SINGLE.replace(
        "[[backends]]",
        "[[model.backends]]\nurl = \"http://127.0.0.1:8009\"\nkind = \"vllm\"\n[[backends]]",
    ));
    assert!(err.contains("model.backends"), "{err}");
    // A per-model backend is checked as a top-level one is, under its key.
    let err = refused(&LIST.replace("http://127.0.0.1:8001", "127.0.0.1:8001"));
    assert!(err.contains("models[0].backends[0].url"), "{err}");
}

#[test]
fn the_two_forms_do_not_mix() {
    let both = format!("[model]\nname = \"m\"\ntokenizer = \"x\"\n{LIST}");
    let err = refused(&both);
    assert!(err.contains("[model] table or a [[models]] list"), "{err}");
}
