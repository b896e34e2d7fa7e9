//! The `tito` binary: parses the command line and hands off to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tito",
    version,
    about = "Token-in, token-out gateway for agentic RL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        #[arg(long, default_value = "config.toml", env = "TITO_CONFIG")]
        config: PathBuf,
    },
    /// Run the bundled llama.cpp engine alone, as a vLLM/SGLang-compatible server.
    Engine {
        /// GGUF model file.
        #[arg(long)]
        model: PathBuf,
        #[arg(long, default_value = "127.0.0.1:8001")]
        listen: std::net::SocketAddr,
        /// Most sequences decoded together.
        #[arg(long, default_value_t = 16)]
        max_batch: u32,
        /// KV-cache cells shared by all sequences (0 = model's context, capped at 8192).
        #[arg(long, default_value_t = 0)]
        n_ctx: u32,
        /// CPU threads (0 = all cores).
        #[arg(long, default_value_t = 0)]
        threads: u32,
        /// Requests waiting for a slot before new ones get 503.
        #[arg(long, default_value_t = 256)]
        max_queue: u32,
    },
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    let result = match cli.command {
        Command::Serve { config } => run_serve(&config).await,
        Command::Engine {
            model,
            listen,
            max_batch,
            n_ctx,
            threads,
            max_queue,
        } => {
            let cfg = tito::config::EngineConfig {
                model,
                max_batch,
                n_ctx,
                threads,
                max_queue,
                ..Default::default()
            };
            tito::engine::server::serve(&cfg, listen, shutdown_signal()).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tito: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run_serve(path: &std::path::Path) -> anyhow::Result<()> {
    let config = tito::Config::load(path)?;
    tito::serve(config, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
