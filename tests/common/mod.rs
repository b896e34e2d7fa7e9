//! Shared test harness: the gateway on port 0 over mock backends.

#![allow(dead_code)]

pub mod mock_vllm;
pub mod process;
pub mod tls;
pub mod two_policies;
pub mod versioned;
pub mod watched_store;

use std::net::SocketAddr;
use std::sync::Arc;

use tito::render::testing::chatml_renderer;
use tito::render::Renderer;
use tito::{build_app, AppState, Config};

pub struct Gateway {
    pub addr: SocketAddr,
    pub renderer: Arc<Renderer>,
    pub client: reqwest::Client,
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("gateway reachable")
    }

    /// POST JSON, asserting nothing about the status: the body as JSON.
    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        self.post(path, body).await.json().await.expect("JSON body")
    }

    /// A one-message chat call on `path`, sent from a task of its own (it
    /// may wait for admission): its status when it is answered.
    pub fn spawn_chat(&self, path: &str) -> tokio::task::JoinHandle<reqwest::StatusCode> {
        let (client, url) = (self.client.clone(), self.url(path));
        tokio::spawn(async move {
            client
                .post(url)
                .json(&serde_json::json!({"messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .expect("send")
                .status()
        })
    }

    /// GET a path, asserting nothing about the status: the body as text.
    pub async fn get_text(&self, path: &str) -> String {
        self.client
            .get(self.url(path))
            .send()
            .await
            .expect("gateway reachable")
            .text()
            .await
            .expect("body")
    }

    /// GET a path whose body is JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        serde_json::from_str(&self.get_text(path).await).expect("JSON body")
    }

    /// `GET path` as the bearer of `token`, as JSON.
    pub async fn get_json_as(&self, path: &str, token: &str) -> serde_json::Value {
        self.client
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("JSON body")
    }

    /// `GET /v1/export?format=jsonl&{query}`, one JSON value per row.
    pub async fn export_jsonl(&self, query: &str) -> Vec<serde_json::Value> {
        self.get_text(&format!("/v1/export?format=jsonl&{query}"))
            .await
            .lines()
            .map(|l| serde_json::from_str(l).expect("jsonl row"))
            .collect()
    }
}

/// The directory of a tokenizer fetched by scripts/fetch-tokenizers.sh
/// (`.cache/tokenizers/{name}`).
pub fn tokenizer_dir(name: &str) -> std::path::PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(".cache/tokenizers")
        .join(name);
    assert!(
        dir.join("tokenizer.json").is_file(),
        "{} is missing: run scripts/fetch-tokenizers.sh",
        dir.display()
    );
    dir
}

/// A real tokenizer fetched by scripts/fetch-tokenizers.sh
/// (`.cache/tokenizers/{name}`), with a shipped or file `template` (empty:
/// the tokenizer's own).
pub fn real_renderer(name: &str, template: &str) -> Arc<Renderer> {
    let dir = tokenizer_dir(name);
    let model = tito::config::ModelConfig {
        tokenizer: dir,
        chat_template: std::path::PathBuf::from(template),
        ..Default::default()
    };
    Renderer::load(&model).expect("tokenizer and template load")
}

/// Config for the gateway in front of `backend_urls` (vLLM kind), plus `extra` TOML.
pub fn config(backend_urls: &[String], extra: &str) -> Config {
    let mut text = String::from(
        "[model]\nname = \"test-model\"\ntokenizer = \"unused\"\nmax_model_len = 512\n",
    );
    for u in backend_urls {
        text.push_str(&format!("[[backends]]\nurl = \"{u}\"\nkind = \"vllm\"\n"));
    }
    text.push_str(extra);
    if !extra.contains("[store]") {
        text.push_str("\n[store]\nurl = \"memory://\"\n");
    }
    Config::from_toml(&text).expect("test config is valid")
}

/// Starts the gateway with the built-in ChatML test tokenizer.
pub async fn start_gateway(config: Config) -> Gateway {
    start_gateway_with(config, chatml_renderer()).await
}

pub async fn start_gateway_with(config: Config, renderer: Arc<Renderer>) -> Gateway {
    let options = tito::store::StoreOptions::from(&config.store);
    let store = tito::store::open_with_options(&config.store.url, &options).expect("store opens");
    start_gateway_on(config, renderer, store).await
}

/// A gateway over a given span store (e.g. one shared with another gateway,
/// as after a restart).
pub async fn start_gateway_on(
    config: Config,
    renderer: Arc<Renderer>,
    store: tito::store::DynStore,
) -> Gateway {
    start_gateway_state(config, renderer, store).await.0
}

/// A gateway whose router probes its backends as `tito serve`'s does; the
/// probes stop when the task is dropped.
pub async fn start_gateway_probing(config: Config) -> (Gateway, tito::router::HealthTask) {
    let options = tito::store::StoreOptions::from(&config.store);
    let store = tito::store::open_with_options(&config.store.url, &options).expect("store opens");
    let (g, state) = start_gateway_state(config, chatml_renderer(), store).await;
    (g, state.router.start_health_checks())
}

async fn start_gateway_state(
    config: Config,
    renderer: Arc<Renderer>,
    store: tito::store::DynStore,
) -> (Gateway, AppState) {
    let backends = tito::api::build_backends(&config).expect("backends");
    let state = AppState::new(config, renderer.clone(), backends, store).expect("state");
    state.restore().await.expect("restore");
    let app_state = state.clone();
    let addr = serve_app(build_app(state)).await;
    let g = Gateway {
        addr,
        renderer,
        client: reqwest::Client::new(),
    };
    (g, app_state)
}

/// Starts the gateway on every model of `config` (`[[models]]`), each
/// with the tokenizer its table names; the harness's `renderer` is the
/// first model's.
pub async fn start_models(config: Config, store: tito::store::DynStore) -> Gateway {
    let mut built = Vec::new();
    for view in config.served() {
        let renderer = Renderer::load(&view.model).expect("tokenizer loads");
        let backends = tito::api::build_backends(&view).expect("backends");
        built.push((renderer, backends));
    }
    let renderer = built[0].0.clone();
    let gateway = tito::api::Gateway::new(&config, built, store).expect("gateway");
    let addr = serve_app(build_app(gateway)).await;
    Gateway {
        addr,
        renderer,
        client: reqwest::Client::new(),
    }
}

/// Serves `app` on a free loopback port until the test ends.
async fn serve_app(app: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(tito::server::serve(
        listener,
        tito::config::DEFAULT_MAX_CONNECTIONS,
        app,
        std::future::pending(),
    ));
    addr
}

/// Reads an SSE response into its `data:` payloads.
pub async fn sse_events(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.expect("body");
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data:").map(|d| d.trim_start()))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}
