//! One tito replica against two, each behind the shipped front balancer
//! (`docker/nginx.conf`), both on one PostgreSQL store and one mock vLLM
//! backend over loopback; plus one replica called directly, for what nginx
//! itself costs. Closed-loop load at 64 concurrent clients, every request a
//! new single-turn trajectory with its own user message (nginx hashes it on
//! its request id, so it spreads over the replicas). Rounds interleave the
//! targets; each cell reports its median round. Run:
//!
//!     scripts/bench-replicas.sh
//!
//! Environment: `TITO_BENCH_POSTGRES` (a cluster's base URL; the script
//! starts a throwaway one), `TITO_BIN` (default `target/release/tito`),
//! `TITO_REPLICAS_SECS` (seconds per cell, default 5), `TITO_REPLICAS_ROUNDS`
//! (default 3). Everything shares the machine's cores: on 2 cores the point
//! is the shape of the scaling, not its size.

#[path = "common/load.rs"]
mod load;
#[path = "../tests/common/mock_vllm.rs"]
mod mock_vllm;
#[path = "common/procs.rs"]
mod procs;
#[path = "../tests/store_support/mod.rs"]
mod store_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use load::{env_or, median, ms, reply_ids, MakeRequest, Stats, Until};
use mock_vllm::{MockVllm, Scripted};
use procs::{free_port, Proc};
use serde_json::json;

const NGINX: &str = "/usr/sbin/nginx";
const REPLY: &str = "Sure, here you go.";

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A daemonized nginx, stopped by its PID when dropped.
struct Nginx {
    pid: i32,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: nginx's fast shutdown, workers included.
        unsafe {
            libc::kill(self.pid, libc::SIGTERM);
        }
    }
}

/// The shipped nginx config balancing over `replicas` (ports), listening on
/// a free port; nginx returns once its socket is bound.
fn start_nginx(root: &Path, dir: &Path, name: &str, replicas: &[u16]) -> (Nginx, u16) {
    let shipped = std::fs::read_to_string(root.join("docker/nginx.conf")).expect("nginx.conf");
    let mut lines = Vec::new();
    for line in shipped.lines() {
        let t = line.trim_start();
        if let Some(n) = t
            .strip_prefix("server tito-")
            .and_then(|r| r.split(':').next())
            .and_then(|n| n.parse::<usize>().ok())
        {
            // `server tito-N:8000 ...;` -> the N-th replica, or dropped.
            if let Some(port) = replicas.get(n - 1) {
                lines.push(line.replace(&format!("tito-{n}:8000"), &format!("127.0.0.1:{port}")));
            }
            continue;
        }
        lines.push(line.to_string());
    }
    let port = free_port();
    let prefix = dir.join(name);
    std::fs::create_dir_all(prefix.join("logs")).expect("nginx dir");
    let conf = lines
        .join("\n")
        .replace("listen 8000;", &format!("listen 127.0.0.1:{port};"))
        .replace(
            "access_log /dev/stdout tito;",
            &format!("access_log {}/logs/access.log tito;", prefix.display()),
        );
    std::fs::write(prefix.join("nginx.conf"), conf).expect("nginx conf");
    let user = if unsafe { libc::getuid() } == 0 {
        "user root;"
    } else {
        ""
    };
    let globals = format!(
        "{user} pid {0}/nginx.pid; error_log {0}/logs/error.log;",
        prefix.display()
    );
    let status = Command::new(NGINX)
        .arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(prefix.join("nginx.conf"))
        .args(["-g", &globals])
        .status()
        .expect("run nginx");
    assert!(
        status.success(),
        "nginx did not start: see {}",
        prefix.display()
    );
    let pid = std::fs::read_to_string(prefix.join("nginx.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .expect("nginx pid");
    (Nginx { pid }, port)
}

fn chat(client: &reqwest::Client, port: u16) -> MakeRequest {
    let client = client.clone();
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    Arc::new(move || {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        client.post(&url).json(&json!({
            "model": "m",
            "messages": [{"role": "user", "content": format!("One sentence about the sea ({n}).")}],
            "max_tokens": 64,
        }))
    })
}

#[tokio::main]
async fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let Ok(base) = std::env::var("TITO_BENCH_POSTGRES") else {
        println!(
            "replicas bench skipped: TITO_BENCH_POSTGRES unset (scripts/bench-replicas.sh sets it)"
        );
        return;
    };
    assert!(
        Path::new(NGINX).exists(),
        "{NGINX} missing: apt-get install nginx-light"
    );
    let tito_bin = std::env::var_os("TITO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/tito"));
    assert!(tito_bin.exists(), "{} missing", tito_bin.display());
    let tokenizer_dir = root.join(".cache/tokenizers/qwen3");
    let secs: f64 = env_or("TITO_REPLICAS_SECS", 5.0);
    let rounds_n: usize = env_or("TITO_REPLICAS_ROUNDS", 3usize).max(1);

    let mock = MockVllm::start(Scripted::ids(reply_ids(&tokenizer_dir, REPLY))).await;
    mock.quiet();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_support::postgres_database(&base);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .expect("client");

    let mut replicas: Vec<(u16, Proc)> = Vec::new();
    for name in ["tito-1", "tito-2"] {
        let store_toml = format!("url = \"{store}\"");
        let (port, mut proc) = procs::start_tito(
            &tito_bin,
            dir.path(),
            name,
            &tokenizer_dir,
            &mock.url(),
            &store_toml,
        );
        let make = chat(&client, port);
        procs::wait_ready(&mut proc, || async {
            matches!(make().send().await, Ok(r) if r.status().is_success())
        })
        .await;
        replicas.push((port, proc));
    }
    let ports: Vec<u16> = replicas.iter().map(|(p, _)| *p).collect();
    let (_one, one_port) = start_nginx(&root, dir.path(), "nginx-1", &ports[..1]);
    let (_two, two_port) = start_nginx(&root, dir.path(), "nginx-2", &ports);

    let targets = [
        ("1 replica, direct", chat(&client, ports[0])),
        ("1 replica behind nginx", chat(&client, one_port)),
        ("2 replicas behind nginx", chat(&client, two_port)),
    ];
    let concurrency = 64;
    println!("{secs} s per cell, median of {rounds_n} interleaved rounds, {concurrency} concurrent clients, store {}\n",
        tito::config::redact_store_url(&store));
    let mut rounds: Vec<Vec<Stats>> = targets.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds_n {
        for ((_, make), cell) in targets.iter().zip(rounds.iter_mut()) {
            let warm = Duration::from_secs_f64((secs / 5.0).max(0.5));
            load::run(make, concurrency, Until::Elapsed(warm)).await;
            let d = Duration::from_secs_f64(secs);
            cell.push(load::run(make, concurrency, Until::Elapsed(d)).await);
        }
    }
    println!("| target | req/s | p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|");
    let stats: Vec<Stats> = rounds.into_iter().map(|r| median(r, |s| s)).collect();
    for ((name, _), s) in targets.iter().zip(&stats) {
        println!(
            "| {name} | {:.0} | {} | {} | {} |",
            s.rps,
            ms(s.p50),
            ms(s.p99),
            s.errors
        );
    }
    println!(
        "\n2 replicas / 1 replica behind nginx = {:.2}x; nginx / direct (1 replica) = {:.2}x",
        stats[2].rps / stats[1].rps,
        stats[1].rps / stats[0].rps
    );
}
