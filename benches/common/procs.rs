//! Child processes of the end-to-end benches: started with their output in
//! a log file, killed when the bench ends whatever way it ends, and polled
//! until they answer.

#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed when dropped.
pub struct Proc {
    pub name: &'static str,
    pub child: Child,
    pub log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub fn spawn(name: &'static str, dir: &Path, cmd: &mut Command) -> Proc {
    let log = dir.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).expect("log file");
    let err = out.try_clone().expect("log file");
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"));
    Proc { name, child, log }
}

/// `tito serve` on a free loopback port in front of one vLLM-kind backend,
/// with the Qwen3 tokenizer fixture and `store` (TOML lines of its `[store]`
/// table); its config and log in `dir`. Returns the port and the process.
pub fn start_tito(
    bin: &Path,
    dir: &Path,
    name: &'static str,
    tokenizer_dir: &Path,
    backend: &str,
    store: &str,
) -> (u16, Proc) {
    let port = free_port();
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\
             [model]\nname = \"m\"\ntokenizer = \"{}\"\n\
             [[backends]]\nurl = \"{backend}\"\nkind = \"vllm\"\n\
             [store]\n{store}\n",
            tokenizer_dir.display(),
        ),
    )
    .expect("tito config");
    let proc = spawn(
        name,
        dir,
        Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config)
            .env("NO_COLOR", "1"),
    );
    (port, proc)
}

/// Polls `ready` until it says yes (gateways load tokenizers, discover
/// workers, import Python modules first); panics with the process's log if
/// it exits or takes over 180 s.
pub async fn wait_ready<F, Fut>(proc: &mut Proc, mut ready: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut pause = Duration::from_millis(50);
    loop {
        if ready().await {
            return;
        }
        if let Ok(Some(status)) = proc.child.try_wait() {
            let log = std::fs::read_to_string(&proc.log).unwrap_or_default();
            panic!(
                "{} exited ({status}) before it was ready:\n{log}",
                proc.name
            );
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&proc.log).unwrap_or_default();
            panic!("{} not ready after 180 s:\n{log}", proc.name);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
