//! The `tito` binary: parses the command line and hands off to the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

// mimalloc: a request makes many small, short-lived allocations across the
// runtime's threads, which its thread-local free lists serve cheaply.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "tito",
    version,
    about = "Token-in, token-out gateway for agentic RL"
)]
struct Cli {
    /// Log lines as human-readable text or as one JSON object per line
    /// (level filter: RUST_LOG, default info).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t = LogFormat::Text,
        env = "TITO_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// The configuration file (docs/configuration.md).
        #[arg(long, default_value = "config.toml", env = "TITO_CONFIG")]
        config: PathBuf,
        /// Serve a non-loopback address although the trainer or admin role
        /// has no token (anyone reaching the port can read all data).
        #[arg(long)]
        insecure_open: bool,
    },
    /// Export trajectories from the span store to a file (offline).
    Export(ExportArgs),
    /// Replay recorded samples against a backend (teacher-forced) and report
    /// how far the recorded logprobs are from the backend's: one JSON line per
    /// sample on stdout, then a summary line; progress on stderr.
    Verify {
        /// The configuration file: its [store], [[backends]] and [verify] are read.
        #[arg(long, default_value = "config.toml", env = "TITO_CONFIG")]
        config: PathBuf,
        /// The trajectory to check.
        #[arg(long, conflicts_with = "since", required_unless_present = "since")]
        trajectory: Option<String>,
        /// Check every trajectory finished at or after this time (unix ms or RFC 3339).
        #[arg(long)]
        since: Option<String>,
        /// |Δ| in nats above which positions are listed (default: [verify] threshold).
        #[arg(long)]
        threshold: Option<f64>,
        /// Replay on this backend, by name (default: [verify] backend, else the router's choice).
        #[arg(long)]
        backend: Option<String>,
    },
    /// Validate a configuration and exit: every key, the token files, the
    /// exposure rule of `serve`, and the tokenizer; nothing is started.
    CheckConfig {
        /// The configuration file (docs/configuration.md).
        #[arg(long, default_value = "config.toml", env = "TITO_CONFIG")]
        config: PathBuf,
        /// Check as `serve --insecure-open` would run.
        #[arg(long)]
        insecure_open: bool,
    },
    /// Run the bundled llama.cpp engine alone, as a vLLM/SGLang-compatible server.
    #[cfg(feature = "engine")]
    Engine(EngineArgs),
}

/// `tito engine`: each flag sets the `[engine]` key of the same name
/// (docs/configuration.md); unset keys keep their config defaults.
#[cfg(feature = "engine")]
#[derive(clap::Args)]
struct EngineArgs {
    /// GGUF model file.
    #[arg(long)]
    model: PathBuf,
    /// Address to bind (host:port; port 0 picks a free port, logged).
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: std::net::SocketAddr,
    /// Where the model runs (`cuda` needs a build with `--features cuda`).
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    device: DeviceArg,
    /// Most sequences decoded together in one batch (1..=255).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=255))]
    max_batch: u32,
    /// KV-cache cells shared by all sequences (0 = model's context, capped at 8192).
    #[arg(long = "ctx", visible_alias = "n-ctx", default_value_t = 0)]
    n_ctx: u32,
    /// Most prompt tokens prefilled per engine step; longer prompts are fed
    /// in chunks between decode steps (16..=8192).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(16..=8192))]
    prefill_chunk: u32,
    /// CPU threads (0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: u32,
    /// Requests waiting for a slot before new ones get 503 (at least 1).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_queue: u32,
    /// ggml's reference CPU kernels: a sequence's output is bitwise the same
    /// alone or batched (`false` to run on cuda).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    batch_invariant: bool,
}

#[cfg(feature = "engine")]
impl EngineArgs {
    fn config(self) -> tito::config::EngineConfig {
        tito::config::EngineConfig {
            model: self.model,
            device: match self.device {
                DeviceArg::Cpu => tito::config::Device::Cpu,
                DeviceArg::Cuda => tito::config::Device::Cuda,
            },
            max_batch: self.max_batch,
            n_ctx: self.n_ctx,
            prefill_chunk: self.prefill_chunk,
            threads: self.threads,
            max_queue: self.max_queue,
            batch_invariant: self.batch_invariant,
            ..Default::default()
        }
    }
}

/// `tito engine --device`.
#[cfg(feature = "engine")]
#[derive(Clone, Copy, ValueEnum)]
enum DeviceArg {
    /// llama.cpp's CPU kernels.
    Cpu,
    /// Every layer on the GPU (CUDA).
    Cuda,
}

/// `--log-format`.
#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    /// Human-readable lines, coloured on a terminal unless NO_COLOR is set.
    Text,
    /// One JSON object per line.
    Json,
}

/// `tito export --format`.
#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    /// One JSON object per row.
    Jsonl,
    /// Apache Parquet.
    Parquet,
}

/// `tito export --layout`.
#[derive(Clone, Copy, ValueEnum)]
enum LayoutArg {
    /// One row per sample (a root-to-leaf path of calls).
    Trajectory,
    /// One row per LLM call.
    #[value(name = "per_call")]
    PerCall,
    /// One row per sample with verl's padded DataProto keys.
    Verl,
}

/// `tito export --status`.
#[derive(Clone, Copy, ValueEnum)]
enum StatusArg {
    /// Still taking calls.
    Active,
    /// Finished (POST /v1/trajectories/{id}/finish).
    Finished,
}

impl From<LogFormat> for tito::logging::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Text => tito::logging::LogFormat::Text,
            LogFormat::Json => tito::logging::LogFormat::Json,
        }
    }
}

impl From<FormatArg> for tito::export::Format {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::Jsonl => tito::export::Format::Jsonl,
            FormatArg::Parquet => tito::export::Format::Parquet,
        }
    }
}

impl From<LayoutArg> for tito::export::Layout {
    fn from(l: LayoutArg) -> Self {
        match l {
            LayoutArg::Trajectory => tito::export::Layout::Trajectory,
            LayoutArg::PerCall => tito::export::Layout::PerCall,
            LayoutArg::Verl => tito::export::Layout::Verl,
        }
    }
}

impl From<StatusArg> for tito::store::TrajectoryStatus {
    fn from(s: StatusArg) -> Self {
        match s {
            StatusArg::Active => tito::store::TrajectoryStatus::Active,
            StatusArg::Finished => tito::store::TrajectoryStatus::Finished,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // `tito verify` writes its results to stdout: its logs go to stderr.
    let to_stderr = matches!(cli.command, Command::Verify { .. });
    let log_format = cli.log_format;
    tito::logging::init(log_format.into(), to_stderr);
    let result = match cli.command {
        Command::Serve {
            config,
            insecure_open,
        } => run_serve(&config, insecure_open).await,
        Command::CheckConfig {
            config,
            insecure_open,
        } => check_config(&config, insecure_open),
        Command::Export(args) => tokio::task::spawn_blocking(move || run_export(args))
            .await
            .map_err(anyhow::Error::from)
            .and_then(|r| r),
        Command::Verify {
            config,
            trajectory,
            since,
            threshold,
            backend,
        } => {
            let args = VerifyArgs {
                config,
                trajectory,
                since,
                threshold,
                backend,
            };
            run_verify(args).await
        }
        #[cfg(feature = "engine")]
        Command::Engine(args) => {
            let listen = args.listen;
            tito::engine::server::serve(&args.config(), listen, shutdown_signal()).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            match log_format {
                // A log pipeline reads the reason as one more JSON line.
                LogFormat::Json => tracing::error!(error = format!("{e:#}"), "tito failed"),
                LogFormat::Text => eprintln!("tito: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

/// `tito check-config`: what `serve` checks before it binds anything.
fn check_config(path: &std::path::Path, insecure_open: bool) -> anyhow::Result<()> {
    let mut config = tito::Config::load(path)?;
    config.insecure_open = insecure_open;
    let auth = tito::api::auth::Auth::from_config(&config)?;
    tito::api::auth::check_exposure(&config, &auth)?;
    let mut served = Vec::new();
    for (i, view) in config.served().iter().enumerate() {
        let key = match config.models_form() {
            tito::config::ModelsForm::Single => "model.tokenizer".to_string(),
            tito::config::ModelsForm::List => format!("models[{i}].tokenizer"),
        };
        let renderer =
            tito::render::Renderer::load(&view.model).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
        served.push(format!(
            "model {} with a {}-token vocabulary, {} backend(s)",
            view.model.name,
            renderer.vocab_size(),
            view.backends.len(),
        ));
    }
    println!(
        "{}: ok (listen {}, {}, store {}; {} form)",
        path.display(),
        config.server.listen,
        served.join(", "),
        tito::config::redact_store_url(&config.store.url),
        config.models_form().as_str(),
    );
    Ok(())
}

async fn run_serve(path: &std::path::Path, insecure_open: bool) -> anyhow::Result<()> {
    let mut config = tito::Config::load(path)?;
    config.insecure_open = insecure_open;
    tito::serve(config, shutdown_signal()).await
}

#[derive(clap::Args)]
struct ExportArgs {
    /// The configuration file: its [store] url is read.
    #[arg(long, default_value = "config.toml", env = "TITO_CONFIG")]
    config: PathBuf,
    /// File format.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Row layout (docs/export.md).
    #[arg(long, value_enum, default_value_t = LayoutArg::Trajectory)]
    layout: LayoutArg,
    /// Only trajectories in this state.
    #[arg(long, value_enum)]
    status: Option<StatusArg>,
    /// Only trajectories updated at or after this time (unix ms or RFC 3339).
    #[arg(long)]
    since: Option<String>,
    /// Prompt tokens per row: longer prompts are skipped; the verl layout
    /// left-pads to it (required there).
    #[arg(long)]
    prompt_length: Option<usize>,
    /// Response tokens per row: longer responses are cut and marked
    /// truncated; the verl layout right-pads to it (required there).
    #[arg(long)]
    response_length: Option<usize>,
    /// Only trajectories of this group.
    #[arg(long)]
    group: Option<String>,
    /// Only trajectories whose group is complete (every member finished).
    #[arg(long)]
    complete_groups: bool,
    /// Padding id of the verl layout (default: the tokenizer's pad token, else EOS).
    #[arg(long)]
    pad_id: Option<u32>,
    /// Only rows whose oldest token version has at least this sequence number.
    #[arg(long)]
    min_version_seq: Option<u64>,
    /// Only rows at most this many versions behind the newest registered one.
    #[arg(long)]
    max_staleness: Option<u64>,
    /// Each row carries its images' pixel values (a vision model's; see
    /// docs/export.md).
    #[arg(long)]
    pixel_values: bool,
    /// Only this model's rows; alone, its own calls (no adapter). The mask
    /// is 1 only on the tokens the chosen policy sampled.
    #[arg(long)]
    model: Option<String>,
    /// Only this LoRA adapter's rows.
    #[arg(long)]
    adapter: Option<String>,
    /// The file to write.
    #[arg(long)]
    out: PathBuf,
}

/// `tito export`: reads the store named by `[store] url` (also while a
/// gateway runs on it: WAL readers do not block the writer) with a progress bar.
fn run_export(a: ExportArgs) -> anyhow::Result<()> {
    use anyhow::anyhow;
    use tito::export::{ExportOptions, Layout};
    use tito::store::TrajectoryFilter;

    let config = tito::Config::load(&a.config)?;
    let layout = Layout::from(a.layout);
    let mut opts = ExportOptions::new(a.format.into(), layout);
    opts.prompt_length = a.prompt_length;
    opts.response_length = a.response_length;
    opts.versions.min_version_seq = a.min_version_seq;
    opts.versions.max_staleness = a.max_staleness;
    if a.model.is_some() || a.adapter.is_some() {
        opts.policy = Some(tito::store::Policy {
            model: a.model,
            adapter: a.adapter,
        });
    }
    if a.pixel_values {
        use tito::render::{pixel_values::PixelConfig, vision};
        let family = vision::VisionFamily::parse(config.model.vision.as_str())
            .ok_or_else(|| anyhow!("--pixel-values needs a vision model ([model] vision)"))?;
        let dir = &config.model.tokenizer;
        let grid = vision::VisionConfig::from_model_dir(family, dir)?;
        opts.pixel_values = Some(PixelConfig::from_model_dir(grid, dir)?);
    }
    opts.validate()?;
    opts.pad_id = match a.pad_id {
        Some(id) => id,
        None if layout == Layout::Verl => tito::render::Renderer::load(&config.model)?
            .pad_token_id()
            .ok_or_else(|| anyhow!("the tokenizer has no pad or EOS token: pass --pad-id"))?,
        None => 0,
    };
    opts.validate()?;
    let status = a.status.map(Into::into);
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(match s.parse::<i64>() {
            Ok(ms) => ms,
            Err(_) => chrono::DateTime::parse_from_rfc3339(s)
                .map_err(|_| anyhow!("--since: expected unix milliseconds or RFC 3339"))?
                .timestamp_millis(),
        }),
    };
    let filter = TrajectoryFilter {
        status,
        since,
        group: a.group,
        complete_groups: a.complete_groups,
        group_size: None,
    };
    let store = open_persisted_store(&config.store.url, "export")?;
    if opts.versions.max_staleness.is_some() {
        // On a blocking thread of the runtime (`main`).
        let versions = tokio::runtime::Handle::current().block_on(store.versions())?;
        opts.versions.newest = versions.last().map(|v| v.seq);
    }
    let total = store.count(&filter)?;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} trajectories  {msg}  [{elapsed_precise}, eta {eta}]",
    )?);
    let stats = tito::export::to_file(store.as_ref(), &filter, &opts, &a.out, &mut |s| {
        bar.set_position(s.trajectories);
        bar.set_message(format!("{} rows, {} tokens", s.rows, s.tokens));
    })?;
    bar.finish();
    eprintln!(
        "wrote {}: {} trajectories, {} rows, {} tokens; {} skipped (prompt too long), {} skipped \
         (version), {} truncated",
        a.out.display(),
        stats.trajectories,
        stats.rows,
        stats.tokens,
        stats.skipped_long_prompt,
        stats.skipped_version,
        stats.truncated_responses
    );
    Ok(())
}

/// The store an offline command reads: never `memory://`, and a SQLite
/// file must exist (opening would create an empty one).
fn open_persisted_store(url: &str, what: &str) -> anyhow::Result<tito::store::DynStore> {
    if url == "memory://" {
        anyhow::bail!("store.url is memory://: nothing persisted to {what}");
    }
    if url.starts_with("sqlite://") {
        let path = tito::store::sqlite::SqliteUrl::parse(url)?.path;
        if !path.exists() {
            anyhow::bail!("no span store at {} (store.url = {url})", path.display());
        }
    }
    Ok(tito::store::open(url)?)
}

struct VerifyArgs {
    config: PathBuf,
    trajectory: Option<String>,
    since: Option<String>,
    threshold: Option<f64>,
    backend: Option<String>,
}

/// `tito verify`: the replay check over the store named by `[store] url`,
/// on the configured backends (the engine is started in-process for
/// `url = "engine"`); results are stored with their trajectories.
async fn run_verify(a: VerifyArgs) -> anyhow::Result<()> {
    use anyhow::{anyhow, bail};
    use tito::store::{ListQuery, TrajectoryFilter, TrajectoryStatus};
    use tito::verify::{sample_json, Options, Summary};

    let config = tito::Config::load(&a.config)?;
    if config.backends.is_empty() {
        bail!(
            "{}: tito verify replays on the configured backends and [[backends]] is empty",
            a.config.display()
        );
    }
    let max_len = (config.model.max_model_len > 0).then_some(config.model.max_model_len as usize);
    let mut opts = Options::from_config(&config.verify, max_len);
    if let Some(t) = a.threshold {
        if !(t.is_finite() && t >= 0.0) {
            bail!("--threshold: expected a non-negative number of nats, got {t}");
        }
        opts.threshold = t;
    }
    if let Some(b) = a.backend {
        opts.backend = Some(b);
    }
    let since = match a.since.as_deref() {
        None => None,
        Some(s) => Some(
            parse_time(s)
                .ok_or_else(|| anyhow!("--since: expected unix milliseconds or RFC 3339"))?,
        ),
    };
    // Opening a SQLite store migrates its file: off the runtime's threads.
    let url = config.store.url.clone();
    let store = tokio::task::spawn_blocking(move || open_persisted_store(&url, "verify")).await??;
    // A router per served model: each policy is replayed on its own.
    let mut routers = Vec::new();
    for view in config.served() {
        let v = view.clone();
        let backends = tokio::task::spawn_blocking(move || tito::api::build_backends(&v)).await??;
        let router = tito::router::Router::new(&view.router);
        for (b, c) in backends.into_iter().zip(&view.backends) {
            router.add_backend(b, c.url.clone())?;
        }
        routers.push((view.model.name.clone(), router));
    }
    let scope = tito::verify::Scope {
        served: routers.iter().map(|(m, r)| (m.as_str(), &**r)).collect(),
        primary: true,
        whole: true,
    };
    let ids = match a.trajectory {
        Some(id) => vec![id],
        None => {
            let mut query = ListQuery {
                filter: TrajectoryFilter {
                    status: Some(TrajectoryStatus::Finished),
                    since,
                    ..Default::default()
                },
                limit: 1000,
                cursor: None,
            };
            let mut ids = Vec::new();
            loop {
                let page = store.list_trajectories(&query).await?;
                ids.extend(page.items.into_iter().map(|m| m.id));
                match page.next_cursor {
                    Some(c) => query.cursor = Some(c),
                    None => break,
                }
            }
            ids
        }
    };
    let bar = indicatif::ProgressBar::new(ids.len() as u64);
    bar.set_style(indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} trajectories  {msg}  [{elapsed_precise}, eta {eta}]",
    )?);
    let mut summary = Summary::default();
    for id in &ids {
        match tito::verify::verify_trajectory(&scope, &store, id, &opts).await {
            Ok(report) => {
                for c in &report.samples {
                    let mut line = sample_json(c);
                    line["trajectory_id"] = serde_json::json!(id);
                    bar.suspend(|| println!("{line}"));
                }
                summary.add(&report);
            }
            Err(e) => {
                summary.failed += 1;
                bar.suspend(|| eprintln!("trajectory {id}: {e}"));
            }
        }
        bar.inc(1);
        bar.set_message(format!(
            "{} samples, {} tokens compared",
            summary.samples, summary.compared
        ));
    }
    bar.finish_and_clear();
    println!("{}", summary.to_json());
    if summary.failed > 0 {
        bail!(
            "{} of {} trajectories could not be verified",
            summary.failed,
            ids.len()
        );
    }
    Ok(())
}

/// Unix milliseconds or an RFC 3339 time, as unix milliseconds.
fn parse_time(s: &str) -> Option<i64> {
    s.parse::<i64>().ok().or_else(|| {
        chrono::DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.timestamp_millis())
    })
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
