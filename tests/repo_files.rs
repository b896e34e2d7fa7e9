//! Files a newcomer meets first: the README's first request answers fast
//! (it bounds `max_tokens`) and works against the gateway as written; the
//! LICENSE file is the license Cargo.toml names.

mod common;

use common::mock_vllm::{MockVllm, Scripted};
use common::{config, start_gateway};
use serde_json::Value;
use tito::render::testing::IM_END;

fn repo_file(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The path and JSON body of the README's first `curl` command.
fn first_curl() -> (String, Value) {
    let readme = repo_file("README.md");
    let start = readme.find("curl ").expect("a curl command in README.md");
    // The command runs to the end of its (backslash-continued) lines.
    let mut cmd = String::new();
    for line in readme[start..].lines() {
        match line.strip_suffix('\\') {
            Some(part) => cmd.push_str(part),
            None => {
                cmd.push_str(line);
                break;
            }
        }
    }
    let url = cmd
        .split_whitespace()
        .find(|w| w.contains("/v1/"))
        .expect("a URL");
    let path = url[url.find("/v1/").expect("path")..].to_string();
    let body = cmd
        .split_once("-d '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(b, _)| b)
        .expect("a -d '...' body");
    (path, serde_json::from_str(body).expect("the body is JSON"))
}

#[tokio::test]
async fn the_readme_first_request_is_short_and_works() {
    let (path, body) = first_curl();
    let max = body["max_tokens"].as_u64().expect("max_tokens is set");
    assert!((1..=64).contains(&max), "max_tokens {max}");

    let mock = MockVllm::start(Scripted::ids(vec![b'h' as u32, b'i' as u32, IM_END])).await;
    let g = start_gateway(config(&[mock.url()], "")).await;
    let resp = g.post(&path, body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["choices"][0]["message"]["content"], "hi");
    assert_eq!(mock.last_request()["max_tokens"], max);
}

#[test]
fn the_license_file_is_the_license_cargo_names() {
    let manifest: toml::Value = repo_file("Cargo.toml").parse().expect("Cargo.toml");
    assert_eq!(manifest["package"]["license"].as_str(), Some("Apache-2.0"));
    let license = repo_file("LICENSE");
    let words: Vec<&str> = license.split_whitespace().take(5).collect();
    assert_eq!(words, ["Apache", "License", "Version", "2.0,", "January"]);
    assert!(license.contains("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION"));
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
}
