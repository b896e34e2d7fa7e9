use super::*;

const MINIMAL: &str = r#"
[model]
tokenizer = "x"
[[backends]]
url = "http://127.0.0.1:8001"
kind = "vllm"
"#;

#[test]
fn backend_urls_are_shown_without_credentials() {
    assert_eq!(
        redact_url("https://user:s3cret@gpu-1:8000/v1?x=a@b"),
        "https://***@gpu-1:8000/v1?x=a@b"
    );
    assert_eq!(redact_url("http://tok@gpu-1"), "http://***@gpu-1");
    assert_eq!(
        redact_url("http://gpu-1:8000/p@th"),
        "http://gpu-1:8000/p@th"
    );
    assert_eq!(redact_url("engine"), "engine");
    let b = BackendConfig {
        url: "http://u:p@h:1".into(),
        kind: BackendKind::Vllm,
        name: String::new(),
        model: String::new(),
        ca_file: Default::default(),
        api_key: Default::default(),
        admin_api_key: Default::default(),
        vllm_api: Default::default(),
    };
    assert_eq!(b.display_name(), "http://***@h:1");
}

#[test]
fn minimal_config_parses_with_defaults() {
    let c = Config::from_toml(MINIMAL).expect("valid");
    assert_eq!(c.server.listen, "127.0.0.1:8000");
    assert_eq!(c.router.policy, PolicyKind::LeastRequests);
    assert_eq!(c.trajectory.history, HistoryMode::Exact);
}

#[test]
fn engine_limits_the_llama_context_cannot_hold_are_refused() {
    for (table, key) in [
        ("max_batch = 256", "engine.max_batch"),
        ("max_queue = 0", "engine.max_queue"),
    ] {
        let text = format!("{MINIMAL}\n[engine]\n{table}\n");
        let err = Config::from_toml(&text).expect_err(table);
        assert!(err.to_string().contains(key), "{err}");
    }
    let text = format!("{MINIMAL}\n[engine]\nmax_batch = 255\nmax_queue = 1\n");
    Config::from_toml(&text).expect("the largest batch, the smallest queue");
}

#[test]
fn unknown_key_is_named() {
    let text = format!("{MINIMAL}\n[router]\npolcy = \"round_robin\"\n");
    let err = Config::from_toml(&text).expect_err("unknown key");
    assert!(err.to_string().contains("polcy"), "{err}");
}

#[test]
fn bad_values_name_the_key() {
    let text = MINIMAL.replace("kind = \"vllm\"", "kind = \"tgi\"");
    assert!(Config::from_toml(&text).is_err());
    let text = format!("{MINIMAL}\n[server]\nlisten = \"nope\"\n");
    let err = Config::from_toml(&text).expect_err("bad listen");
    assert!(err.to_string().contains("server.listen"), "{err}");
    let text = MINIMAL.replace("http://127.0.0.1:8001", "127.0.0.1:8001");
    let err = Config::from_toml(&text).expect_err("bad url");
    assert!(err.to_string().contains("backends[0].url"), "{err}");
}

#[test]
fn reasoning_parser_names() {
    let with = |name: &str| {
        let line = format!("tokenizer = \"x\"\nreasoning_parser = \"{name}\"");
        Config::from_toml(&MINIMAL.replace("tokenizer = \"x\"", &line))
    };
    for name in [
        "",
        "none",
        "think",
        "deepseek_r1",
        "glm45",
        "kimi_k2",
        "gpt_oss",
    ] {
        with(name).expect(name);
    }
    let err = with("qwen3").expect_err("unknown name");
    let msg = err.to_string();
    assert!(msg.contains("model.reasoning_parser"), "{msg}");
    for name in [
        "think",
        "deepseek_r1",
        "glm45",
        "kimi_k2",
        "gpt_oss",
        "none",
    ] {
        assert!(msg.contains(name), "{name} missing in: {msg}");
    }
}

#[test]
fn verify_section_is_strict() {
    let c = Config::from_toml(MINIMAL).expect("valid");
    assert_eq!(c.verify.fraction, 0.0, "off by default");
    assert_eq!(c.verify.threshold, DEFAULT_VERIFY_THRESHOLD);
    let ok = format!("{MINIMAL}\n[verify]\nfraction = 0.01\nthreshold = 0.5\nbackend = \"http://127.0.0.1:8001\"\n");
    let c = Config::from_toml(&ok).expect("valid [verify]");
    assert_eq!(c.verify.fraction, 0.01);
    for (text, key, value) in [
        ("fraction = 1.5", "verify.fraction", "1.5"),
        ("fraction = -0.1", "verify.fraction", "-0.1"),
        ("fraction = nan", "verify.fraction", "NaN"),
        ("threshold = -1.0", "verify.threshold", "-1.0"),
        ("threshold = inf", "verify.threshold", "inf"),
        ("backend = \"nope\"", "verify.backend", "nope"),
    ] {
        let err = Config::from_toml(&format!("{MINIMAL}\n[verify]\n{text}\n"))
            .expect_err(text)
            .to_string();
        assert!(err.contains(key) && err.contains(value), "{text}: {err}");
    }
    let err = Config::from_toml(&format!("{MINIMAL}\n[verify]\nfracton = 0.1\n"))
        .expect_err("unknown key");
    assert!(err.to_string().contains("fracton"), "{err}");
}

#[cfg(feature = "engine")]
#[test]
fn repo_default_config_is_valid() {
    let text = include_str!("../../config.toml");
    let c = Config::from_toml(text).expect("default config.toml must be valid");
    assert!(c.uses_engine());
}

/// A gateway-only build refuses the default config (the engine) at
/// start, naming the key and the cargo feature.
#[cfg(not(feature = "engine"))]
#[test]
fn engine_backend_needs_the_engine_feature() {
    let err = Config::from_toml(include_str!("../../config.toml"))
        .expect_err("no engine in this build")
        .to_string();
    assert!(err.contains("backends[0].url"), "{err}");
    assert!(err.contains("`engine` cargo feature"), "{err}");
    assert!(
        Config::from_toml(MINIMAL).is_ok(),
        "HTTP backends still work"
    );
}
