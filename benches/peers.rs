//! tito against three other gateways, side by side in one run, on the same
//! mock backend over loopback:
//!
//! - tito (`target/release/tito serve`): renders the Qwen3 chat template,
//!   tokenizes, calls the backend with token ids, decodes, records the call;
//! - `smg` (PyPI, Rust: the SGLang / Shepherd model gateway, with its
//!   `openai` backend): forwards the text chat request;
//! - `sglang-router` (PyPI, Rust): forwards the text chat request;
//! - LiteLLM proxy (PyPI, Python): forwards the text chat request;
//! - the bare hop (this bench's own binary, `common/bare_hop.rs`): tito's
//!   HTTP server and backend client forwarding the text chat request and
//!   doing nothing else, the floor under any gateway built on them.
//!
//! Each gateway's added latency is measured over a direct call to what it
//! calls: token-id `/v1/completions` for tito, text `/v1/chat/completions`
//! for the peers and the bare hop (both served by the same in-process
//! mock). Every request carries a distinct user message. Every process runs
//! with its default logging. The summary also gives tito's added p50 less
//! the bare hop's: what tito's own work adds, round by round tito's
//! throughput over smg's and sglang-router's and its added p50 (over the
//! same round's direct call), and tito's calls over each peer's summed over
//! all rounds (tito and smg trade places every other round).
//! Each row also gives the share of the machine's CPU time the host stole
//! during that cell (`/proc/stat`), and the last line the share over the
//! whole run: a figure measured under steal measures the host as much as
//! the gateway. Run (installs the peers into
//! `.bench-venv`, builds the release binary):
//!
//!     scripts/bench-peers.sh
//!
//! Environment: `TITO_PEERS_VENV` (default `.bench-venv`), `TITO_BIN`
//! (default `target/release/tito`), `TITO_PEERS_SECS` (seconds measured per
//! cell, default 2), `TITO_PEERS_ROUNDS` (interleaved rounds, median
//! reported, default 8), `TITO_PEERS_ONLY` (comma-separated target names to
//! load, e.g. `tito` while `perf record -p` watches it; the direct calls and
//! ratios are then skipped; `tito responses`, `tito messages`, `smg
//! responses` and `smg messages` post the same conversation to each
//! gateway's `/v1/responses` and `/v1/messages`), `TITO_PEERS_CONC` (in those rounds, the
//! concurrencies loaded, comma-separated, default `1,64`), `TITO_BIN_B` (a
//! second tito binary, e.g. the previous commit's, loaded beside `tito` in
//! the `TITO_PEERS_ONLY` rounds with the same config: an A/B in one run),
//! `TITO_STORE_B` (B's `[store]` table instead, e.g. `url = "memory://"`),
//! `TITO_LOAD_SPREAD` (set: each cell's latency percentiles to stderr, see
//! `common/load.rs`). Without the venv the bench says so and skips.

#[path = "common/bare_hop.rs"]
mod bare_hop;
#[path = "common/load.rs"]
mod load;
#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;
#[path = "common/procs.rs"]
mod procs;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use load::{
    cpu_time, env_or, median, ms, reply_ids, signed_ms, HostTicks, MakeRequest, Stats, Until,
};
use mock_vllm::{MockVllm, Scripted};
use procs::{free_port, spawn, Proc};
use serde_json::{json, Value};

const REPLY: &str = "Sure, here you go.";
const LITELLM_KEY: &str = "sk-tito-bench";
const USER: &str = "Write one short sentence about the sea.";
/// The user message in the chat body, the Responses body and the Messages
/// body.
const CHAT_USER: &str = "/messages/1/content";
const RESPONSES_USER: &str = "/input/0/content";
const MESSAGES_USER: &str = "/messages/0/content";

/// One target of the load: where to post, what, with which headers.
#[derive(Clone)]
struct Target {
    name: &'static str,
    url: String,
    body: Arc<Value>,
    bearer: Option<&'static str>,
    /// Where the user message is (a JSON pointer into `body`): numbered in
    /// every request, so that no gateway can answer from a cache of earlier
    /// prompts (tito tokenizes each one).
    vary: Option<&'static str>,
    /// The gateway's process, whose CPU time per request is measured.
    pid: Option<u32>,
}

/// One target's round, with CPU time per answered request (the gateway's
/// process, and this bench process: the load's client and the mock
/// backend) and the share of the machine's CPU time the host stole
/// meanwhile (another guest ran while this one had work: every process of
/// the round was slowed, whichever it was).
struct Cell {
    stats: Stats,
    gateway_cpu: Option<Duration>,
    bench_cpu: Option<Duration>,
    steal_pct: Option<f64>,
}

impl Cell {
    fn cpu_us(d: Option<Duration>) -> String {
        d.map(|d| format!("{:.0}", d.as_secs_f64() * 1e6))
            .unwrap_or_default()
    }
}

static SEQ: AtomicU64 = AtomicU64::new(0);

impl Target {
    /// The varied chat request, posted to a gateway's `/v1/chat/completions`
    /// on loopback `port`; `proc` is that gateway's process.
    fn gateway(name: &'static str, port: u16, proc: &Proc, body: &Arc<Value>) -> Target {
        Target {
            name,
            url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
            body: body.clone(),
            bearer: None,
            vary: Some(CHAT_USER),
            pid: Some(proc.child.id()),
        }
    }

    /// The same conversation as a Responses or a Messages request, posted
    /// to `path` on loopback `port`.
    fn surface(
        name: &'static str,
        port: u16,
        proc: &Proc,
        path: &str,
        body: &Arc<Value>,
        user: &'static str,
    ) -> Target {
        Target {
            url: format!("http://127.0.0.1:{port}{path}"),
            vary: Some(user),
            ..Target::gateway(name, port, proc, body)
        }
    }

    fn load(&self, client: &reqwest::Client) -> MakeRequest {
        let (target, client) = (self.clone(), client.clone());
        Arc::new(move || target.request(&client))
    }

    fn request(&self, client: &reqwest::Client) -> reqwest::RequestBuilder {
        let varied = self.vary.and_then(|at| {
            let mut body = (*self.body).clone();
            let n = SEQ.fetch_add(1, Ordering::Relaxed);
            *body.pointer_mut(at)? = json!(format!("{USER} (request {n})"));
            Some(body)
        });
        let mut r = match varied {
            Some(body) => client.post(&self.url).json(&body),
            None => client.post(&self.url).json(&*self.body),
        };
        if let Some(key) = self.bearer {
            r = r.bearer_auth(key);
        }
        r
    }
}

/// What [`interleaved`] measured: per target, in the order given, its
/// median round (by throughput) and every round's throughput and p50, in
/// the order run.
struct Rounds {
    median: Vec<Cell>,
    each: Vec<Vec<Round>>,
}

impl Rounds {
    /// `f` of target `a`'s round and target `b`'s, round by round. The two
    /// cells of a round ran back to back, so a slow spell of the host that
    /// lasts a round moves both (the median rounds of two targets may have
    /// run minutes apart).
    fn paired(&self, a: usize, b: usize, f: impl Fn(Round, Round) -> String) -> String {
        let r: Vec<String> = (self.each[a].iter().zip(&self.each[b]))
            .map(|(x, y)| f(*x, *y))
            .collect();
        r.join(", ")
    }

    /// Target `a`'s throughput over target `b`'s, round by round.
    fn ratios(&self, a: usize, b: usize) -> String {
        self.paired(a, b, |x, y| format!("{:.2}x", x.0 / y.0))
    }

    /// Target `a`'s throughput over target `b`'s, each summed over every
    /// round: as every round runs each target for the same time, `a`'s
    /// calls over `b`'s in the same spells of the host. A round's ratio moves
    /// with how fast the host ran during its two cells (0.66x to 1.58x in
    /// one run of 1 s rounds); the sum over rounds averages those spells
    /// out, as the median of three rounds cannot.
    fn over_all(&self, a: usize, b: usize) -> f64 {
        let sum = |t: usize| self.each[t].iter().map(|r| r.0).sum::<f64>();
        sum(a) / sum(b)
    }

    /// Target `a`'s p50 less target `b`'s, round by round, in ms.
    fn added_p50(&self, a: usize, b: usize) -> String {
        self.paired(a, b, |x, y| signed_ms(x.1, y.1))
    }
}

/// One round's throughput and p50.
type Round = (f64, Duration);

/// Loads each target `rounds` times, interleaved so that a slow spell of the
/// machine hits all of them, each round after a warm-up. Every other round
/// the two targets `swap` names trade places, so that each of the two runs
/// first as often as the other and after the same neighbours (a drift of
/// the host's speed within a round, or what a neighbour leaves running,
/// then favours neither over the rounds). The other targets keep their
/// places: LiteLLM's process, for one, may still be busy after its cell.
async fn interleaved(
    client: &reqwest::Client,
    targets: &[&Target],
    concurrency: usize,
    secs: f64,
    rounds: usize,
    swap: (usize, usize),
) -> Rounds {
    let mut cells: Vec<Vec<Cell>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if round % 2 == 1 {
            order.swap(swap.0, swap.1);
        }
        for i in order {
            let (t, cell) = (targets[i], &mut cells[i]);
            let make = t.load(client);
            let warm = Duration::from_secs_f64((secs / 5.0).max(0.5));
            load::run(&make, concurrency, Until::Elapsed(warm)).await;
            let host0 = HostTicks::now();
            let (gw0, me0) = (t.pid.and_then(|p| cpu_time(Some(p))), cpu_time(None));
            let stats = load::run(
                &make,
                concurrency,
                Until::Elapsed(Duration::from_secs_f64(secs)),
            )
            .await;
            let (gw1, me1) = (t.pid.and_then(|p| cpu_time(Some(p))), cpu_time(None));
            let steal_pct = HostTicks::steal_pct(host0, HostTicks::now());
            let per = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
                (Some(a), Some(b)) if stats.ok > 0 => Some(b.saturating_sub(a) / stats.ok as u32),
                _ => None,
            };
            cell.push(Cell {
                gateway_cpu: per(gw0, gw1),
                bench_cpu: per(me0, me1),
                steal_pct,
                stats,
            });
        }
    }
    let each = cells
        .iter()
        .map(|rounds| rounds.iter().map(|c| (c.stats.rps, c.stats.p50)).collect())
        .collect();
    let median = cells
        .into_iter()
        .map(|rounds| median(rounds, |c| &mut c.stats))
        .collect();
    Rounds { median, each }
}

/// One table row; `base` is the direct call the added latency is over.
fn row(concurrency: usize, name: &str, c: &Cell, base: Option<&Stats>) {
    let s = &c.stats;
    let (ap50, ap99) = base
        .map(|b| (signed_ms(s.p50, b.p50), signed_ms(s.p99, b.p99)))
        .unwrap_or_default();
    println!(
        "| {concurrency} | {name} | {:.0} | {} | {} | {ap50} | {ap99} | {} | {} | {} | {} |",
        s.rps,
        ms(s.p50),
        ms(s.p99),
        Cell::cpu_us(c.gateway_cpu),
        Cell::cpu_us(c.bench_cpu),
        c.steal_pct.map(|p| format!("{p:.1}")).unwrap_or_default(),
        s.errors
    );
}

/// sglang-router and smg each serve Prometheus metrics, on 0.0.0.0:29000
/// unless told otherwise: each gets a free loopback port of its own.
fn prometheus_on_loopback() -> [String; 4] {
    [
        "--prometheus-host".into(),
        "127.0.0.1".into(),
        "--prometheus-port".into(),
        free_port().to_string(),
    ]
}

/// Waits until the target answers a request with 200.
async fn wait_ready(client: &reqwest::Client, target: &Target, proc: &mut Proc) {
    procs::wait_ready(proc, || async {
        matches!(target.request(client).send().await, Ok(r) if r.status().is_success())
    })
    .await;
}

#[tokio::main]
async fn main() {
    if let Ok(backend) = std::env::var(bare_hop::BACKEND_VAR) {
        let port = std::env::var(bare_hop::PORT_VAR)
            .ok()
            .and_then(|p| p.parse().ok())
            .expect("the bare hop's port");
        return bare_hop::run(&backend, port).await;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = std::env::var_os("TITO_PEERS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".bench-venv"));
    let python = venv.join("bin/python");
    let litellm = venv.join("bin/litellm");
    let smg = venv.join("bin/smg");
    if !python.exists() || !litellm.exists() || !smg.exists() {
        println!(
            "peers bench skipped: no smg/sglang-router/LiteLLM venv at {} (scripts/bench-peers.sh installs it)",
            venv.display()
        );
        return;
    }
    let tito_bin = std::env::var_os("TITO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/tito"));
    assert!(
        tito_bin.exists(),
        "{} missing: cargo build --release --bin tito",
        tito_bin.display()
    );
    let tokenizer_dir = root.join(".cache/tokenizers/qwen3");
    assert!(
        tokenizer_dir.exists(),
        "{} missing: scripts/fetch-tokenizers.sh",
        tokenizer_dir.display()
    );
    // Eight rounds of 2 s rather than three of 5 s (the same time): the
    // sum over rounds pairs more spells of the host's speed.
    let secs: f64 = env_or("TITO_PEERS_SECS", 2.0);
    let rounds_n: usize = env_or("TITO_PEERS_ROUNDS", 8usize).max(1);

    let mock = MockVllm::start(Scripted::ids(reply_ids(&tokenizer_dir, REPLY))).await;
    mock.quiet();
    mock.set_chat_content(REPLY);
    let dir = tempfile::tempdir().expect("tempdir");

    // tito twice: the default `[store] ack = "committed"` (answer after the
    // commit) and `ack = "queued"` (answer once the commit is queued).
    let start_tito = |name: &'static str, ack: &str| {
        let store = format!(
            "url = \"sqlite://{}/spans-{ack}.db\"\nack = \"{ack}\"",
            dir.path().display()
        );
        procs::start_tito(
            &tito_bin,
            dir.path(),
            name,
            &tokenizer_dir,
            &mock.url(),
            &store,
        )
    };
    let (tito_port, mut tito) = start_tito("tito", "committed");
    let (tito_q_port, mut tito_q) = start_tito("tito-queued", "queued");
    // `TITO_BIN_B`: a second binary (say, the previous commit's) run beside
    // the first, for an A/B in one run; with the same config, or with
    // `TITO_STORE_B` as its `[store]` table (say, `url = "memory://"`).
    let tito_b = std::env::var_os("TITO_BIN_B").map(|bin| {
        let store = std::env::var("TITO_STORE_B")
            .unwrap_or_else(|_| format!("url = \"sqlite://{}/spans-b.db\"", dir.path().display()));
        procs::start_tito(
            &PathBuf::from(bin),
            dir.path(),
            "tito-b",
            &tokenizer_dir,
            &mock.url(),
            &store,
        )
    });

    let sgl_port = free_port();
    let mut sgl = spawn(
        "sglang-router",
        dir.path(),
        Command::new(&python)
            .args(["-m", "sglang_router.launch_router", "--host", "127.0.0.1"])
            .args(["--port", &sgl_port.to_string()])
            .args(["--worker-urls", &mock.url(), "--policy", "round_robin"])
            .args(prometheus_on_loopback()),
    );

    // Without `--backend openai` smg probes the worker for SGLang's own
    // endpoints and registers none behind a plain OpenAI server.
    let smg_port = free_port();
    let mut smg_proc = spawn(
        "smg",
        dir.path(),
        Command::new(&smg)
            .args([
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                &smg_port.to_string(),
            ])
            .args(["--worker-urls", &mock.url(), "--policy", "round_robin"])
            .args(["--backend", "openai", "--log-level", "warn"])
            .args(prometheus_on_loopback()),
    );

    let bare_port = free_port();
    let mut bare = spawn(
        "bare-hop",
        dir.path(),
        Command::new(std::env::current_exe().expect("this bench's binary"))
            .env(bare_hop::BACKEND_VAR, mock.url())
            .env(bare_hop::PORT_VAR, bare_port.to_string()),
    );

    let lite_port = free_port();
    let lite_cfg = dir.path().join("litellm.yaml");
    std::fs::write(
        &lite_cfg,
        format!(
            "model_list:\n  - model_name: m\n    litellm_params:\n      model: openai/m\n      \
             api_base: {}/v1\n      api_key: none\n\
             general_settings:\n  master_key: {LITELLM_KEY}\n\
             litellm_settings:\n  telemetry: false\n",
            mock.url()
        ),
    )
    .expect("litellm config");
    let mut lite = spawn(
        "litellm",
        dir.path(),
        Command::new(&litellm)
            .arg("--config")
            .arg(&lite_cfg)
            .args(["--host", "127.0.0.1", "--port", &lite_port.to_string()])
            // The cost map is otherwise fetched from GitHub at start-up.
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    );

    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": USER}
    ]);
    let chat = Arc::new(json!({"model": "m", "messages": messages, "max_tokens": 64}));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("client");

    let tito_t = Target::gateway("tito", tito_port, &tito, &chat);
    wait_ready(&client, &tito_t, &mut tito).await;
    let tito_q_t = Target::gateway("tito (ack queued)", tito_q_port, &tito_q, &chat);
    wait_ready(&client, &tito_q_t, &mut tito_q).await;
    let (tito_b_t, _tito_b_proc) = match tito_b {
        Some((port, mut proc)) => {
            let t = Target::gateway("tito B", port, &proc, &chat);
            wait_ready(&client, &t, &mut proc).await;
            (Some(t), Some(proc))
        }
        None => (None, None),
    };
    // The direct token-id call carries exactly the prompt tito sends.
    let prompt_ids = {
        let mut body = (*chat).clone();
        body["return_token_ids"] = json!(true);
        let r: Value = client
            .post(&tito_t.url)
            .json(&body)
            .send()
            .await
            .and_then(|r| r.error_for_status())
            .expect("tito answers")
            .json()
            .await
            .expect("tito json");
        r["prompt_token_ids"].clone()
    };
    assert!(prompt_ids.is_array(), "tito returns prompt_token_ids");
    let direct_ids = Target {
        name: "direct (token ids)",
        url: format!("{}/v1/completions", mock.url()),
        // As tito calls it: streamed, with the sampled token's logprob.
        body: Arc::new(json!({"model": "m", "prompt": prompt_ids, "max_tokens": 64,
            "return_token_ids": true, "skip_special_tokens": false, "logprobs": 0,
            "return_tokens_as_token_ids": true, "stream": true})),
        bearer: None,
        vary: None,
        pid: None,
    };
    let direct_text = Target {
        name: "direct (text chat)",
        url: format!("{}/v1/chat/completions", mock.url()),
        body: chat.clone(),
        bearer: None,
        vary: Some(CHAT_USER),
        pid: None,
    };
    let sgl_t = Target::gateway("sglang-router", sgl_port, &sgl, &chat);
    let smg_t = Target::gateway("smg", smg_port, &smg_proc, &chat);
    let lite_t = Target {
        bearer: Some(LITELLM_KEY),
        ..Target::gateway("litellm", lite_port, &lite, &chat)
    };
    let bare_t = Target::gateway("bare hop", bare_port, &bare, &chat);
    // The chat conversation over the Responses and the Messages API.
    let responses = Arc::new(json!({"model": "m", "instructions": messages[0]["content"],
        "input": [{"role": "user", "content": USER}], "max_output_tokens": 64}));
    let anthropic = Arc::new(json!({"model": "m", "system": messages[0]["content"],
        "messages": [{"role": "user", "content": USER}], "max_tokens": 64}));
    let surfaces = [
        (
            "tito responses",
            tito_port,
            &tito,
            "/v1/responses",
            &responses,
            RESPONSES_USER,
        ),
        (
            "tito messages",
            tito_port,
            &tito,
            "/v1/messages",
            &anthropic,
            MESSAGES_USER,
        ),
        (
            "smg responses",
            smg_port,
            &smg_proc,
            "/v1/responses",
            &responses,
            RESPONSES_USER,
        ),
        (
            "smg messages",
            smg_port,
            &smg_proc,
            "/v1/messages",
            &anthropic,
            MESSAGES_USER,
        ),
    ]
    .map(|(name, port, proc, path, body, user)| {
        Target::surface(name, port, proc, path, body, user)
    });
    wait_ready(&client, &bare_t, &mut bare).await;
    wait_ready(&client, &sgl_t, &mut sgl).await;
    wait_ready(&client, &smg_t, &mut smg_proc).await;
    wait_ready(&client, &lite_t, &mut lite).await;

    println!(
        "{secs} s per cell, median of {rounds_n} interleaved rounds; added = gateway minus the direct call it makes\n"
    );
    println!(
        "| concurrency | target | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | \
         gateway CPU µs/req | bench CPU µs/req | host steal % | errors |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let run_start = HostTicks::now();
    let only: Option<Vec<String>> = std::env::var("TITO_PEERS_ONLY")
        .ok()
        .map(|s| s.split(',').map(|n| n.trim().to_string()).collect());
    if let Some(only) = &only {
        let mut picked: Vec<&Target> = [&tito_t, &tito_q_t, &smg_t, &sgl_t, &lite_t, &bare_t]
            .into_iter()
            .chain(&surfaces)
            .filter(|t| only.iter().any(|n| n == t.name))
            .collect();
        picked.extend(tito_b_t.as_ref());
        // `TITO_PEERS_CONC=1` (or `64`) loads one concurrency only.
        let concurrencies: Vec<usize> = match std::env::var("TITO_PEERS_CONC") {
            Ok(s) => s.split(',').filter_map(|c| c.trim().parse().ok()).collect(),
            Err(_) => vec![1, 64],
        };
        for concurrency in concurrencies {
            let swap = (0, picked.len() - 1);
            let rounds = interleaved(&client, &picked, concurrency, secs, rounds_n, swap).await;
            let cells = &rounds.median;
            for (t, c) in picked.iter().zip(cells) {
                row(concurrency, t.name, c, None);
            }
            // Each loaded target's calls over the first's, summed over all
            // rounds (the same spells of the host for all of them).
            for (i, t) in picked.iter().enumerate().skip(1) {
                println!(
                    "concurrency {concurrency}: {} / {} over all rounds = {:.3}x",
                    t.name,
                    picked[0].name,
                    rounds.over_all(i, 0)
                );
            }
            if let (Some(b), Some(a), Some(_)) = (cells.last(), cells.first(), &tito_b_t) {
                println!(
                    "concurrency {concurrency}: tito B / {} = {:.3}x",
                    picked[0].name,
                    b.stats.rps / a.stats.rps
                );
                println!(
                    "concurrency {concurrency}: tito B / {} by round = {}",
                    picked[0].name,
                    rounds.ratios(picked.len() - 1, 0)
                );
                println!(
                    "concurrency {concurrency}: tito B / {} over all rounds = {:.3}x",
                    picked[0].name,
                    rounds.over_all(picked.len() - 1, 0)
                );
            }
        }
        print_run_steal(run_start);
        return;
    }
    let mut summary = Vec::new();
    let mut by_round = Vec::new();
    let mut own = Vec::new();
    for concurrency in [1usize, 64] {
        let targets = [
            &direct_ids,
            &direct_text,
            &tito_t,
            &tito_q_t,
            &smg_t,
            &sgl_t,
            &lite_t,
            &bare_t,
        ];
        const TITO: usize = 2;
        const SMG: usize = 4;
        const SGL: usize = 5;
        const BARE: usize = 7;
        // tito and smg trade places every other round.
        let rounds = interleaved(&client, &targets, concurrency, secs, rounds_n, (TITO, SMG)).await;
        let cells = &rounds.median;
        for (i, (t, c)) in targets.iter().zip(cells).enumerate() {
            // tito calls the token-id endpoint; the peers call the text one.
            let base = match i {
                2 | 3 => Some(&cells[0].stats),
                4..=7 => Some(&cells[1].stats),
                _ => None,
            };
            row(concurrency, t.name, c, base);
        }
        let rps = |i: usize| cells[i].stats.rps;
        summary.push((concurrency, rps(TITO), rps(3), rps(SMG), rps(SGL), rps(6)));
        by_round.push((
            concurrency,
            rounds.ratios(TITO, SMG),
            rounds.over_all(TITO, SMG),
            rounds.ratios(TITO, SGL),
            rounds.over_all(TITO, SGL),
            rounds.added_p50(TITO, 0),
        ));
        // tito's added p50 less the bare hop's: what its own work adds.
        let p50 = |i: usize| cells[i].stats.p50.as_secs_f64() * 1000.0;
        own.push((concurrency, (p50(TITO) - p50(0)) - (p50(BARE) - p50(1))));
    }
    println!();
    for (c, tito_rps, queued_rps, smg_rps, sgl_rps, lite_rps) in summary {
        println!(
            "concurrency {c}: tito / smg = {:.2}x, tito / sglang-router = {:.2}x, \
             tito / litellm = {:.1}x; with ack queued: {:.2}x, {:.2}x and {:.1}x",
            tito_rps / smg_rps,
            tito_rps / sgl_rps,
            tito_rps / lite_rps,
            queued_rps / smg_rps,
            queued_rps / sgl_rps,
            queued_rps / lite_rps
        );
    }
    for (c, smg_ratios, smg_all, sgl_ratios, sgl_all, added) in by_round {
        println!("concurrency {c}: tito / smg by round = {smg_ratios}");
        println!("concurrency {c}: tito / smg over all rounds = {smg_all:.3}x");
        println!("concurrency {c}: tito / sglang-router by round = {sgl_ratios}");
        println!("concurrency {c}: tito / sglang-router over all rounds = {sgl_all:.3}x");
        println!("concurrency {c}: tito's added p50 by round (ms) = {added}");
    }
    for (c, ms) in own {
        println!(
            "concurrency {c}: tito's added p50 less the bare hop's (its own work) = {ms:.3} ms"
        );
    }
    print_run_steal(run_start);
}

/// The host's steal over the whole run, from `start` on.
fn print_run_steal(start: Option<HostTicks>) {
    match HostTicks::steal_pct(start, HostTicks::now()) {
        Some(p) => println!("host steal over the measured run: {p:.1}% of all CPU time"),
        None => println!("host steal over the measured run: unknown (no /proc/stat)"),
    }
}
