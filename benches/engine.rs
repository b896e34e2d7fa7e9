//! Bundled engine, three measurements in one run:
//!
//! 1. Throughput: prefill and decode tokens/s and time to first token at 1,
//!    4, 8 and 16 concurrent requests, with `batch_invariant` on and off,
//!    against llama.cpp driven directly: one sequence in a plain decode loop,
//!    and 16 sequences decoding together (one `llama_decode` a step), a
//!    reference for the engine's decode at 16 concurrent, with the cache
//!    unified as the engine's and again split per sequence (`kv_unified`
//!    off: each sequence's attention reads only its own cells). Each round at 16
//!    concurrent also prints the engine's mean step: in `llama_decode`,
//!    sampling, and the rest (`EngineStats`).
//! 2. Batch invariance: 8 prompts alone, then all at once; the largest
//!    |difference| between a token's logprob alone and batched, per mode.
//! 3. Multi-turn KV reuse: a 10-turn conversation (about 200 new prompt
//!    tokens a turn), each turn's latency with `kv_reuse` on and off.
//!
//! First it times the sampler alone on one row of the model's vocabulary
//! width: the CPU work each sequence costs per step, whatever device runs
//! the model; then a step's sampling for 16 sequences, on one thread and on
//! the engine's threads (as the engine spreads it).
//!
//! Run: `cargo bench --bench engine` (needs scripts/fetch-model.sh first).
//! Env: TITO_BENCH_PROMPT (prompt tokens, default 128), TITO_BENCH_GEN
//! (generated tokens per request, default 64), TITO_BENCH_THREADS (default 2),
//! TITO_BENCH_REPS (default 3: every throughput figure is the best of that
//! many runs, direct and both engine modes interleaved, so a noisy shared
//! machine penalises all sides alike), TITO_BENCH_TURNS (default 10),
//! TITO_BENCH_MODEL (default the repository's SmolLM2-135M-Instruct Q4_1),
//! TITO_BENCH_DEVICE (`cpu`, default, or `cuda`: the engine and the direct
//! loop with every layer on the GPU, `batch_invariant = false` only, since
//! the invariant mode is CPU-only; adds a CPU-against-GPU logprob check).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tito::backend::{Backend, GenEvent, GenerateRequest, SamplingParams};
use tito::config::{Device, EngineConfig};
use tito::engine::direct::argmax;
use tito::engine::EngineBackend;

fn env_usize(key: &str, default: usize) -> usize {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A deterministic prompt of `n` ordinary tokens, different per request.
fn prompt(n: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| 300 + ((i * 7919 + salt * 104_729) % 20_000) as u32)
        .collect()
}

/// prefill tok/s, per-stream decode tok/s while every stream decodes
/// ([`full_batch_rate`]; NaN when no such window), aggregate tok/s, TTFT
/// mean ms, TTFT max ms.
type Row = (f64, f64, f64, f64, f64);

struct Run {
    ttft: Vec<Duration>,
    wall: Duration,
    /// Time until every request had its first token.
    all_first: Duration,
    /// Each stream's decode rate while every stream was decoding (from the
    /// last first token to the first stream's last token, so the batch
    /// stays full), averaged over the streams; `None` when that window is
    /// empty.
    full_batch_rate: Option<f64>,
    generated: usize,
    prompt_tokens: usize,
}

/// The mean per-stream rate in the window where every stream decodes:
/// `times[s]` are stream `s`'s token arrivals (one entry per token).
fn full_batch_rate(times: &[Vec<Duration>]) -> Option<f64> {
    let from = times.iter().map(|t| t.first().copied()).max()??;
    let to = times.iter().map(|t| t.last().copied()).min()??;
    let window = to.checked_sub(from).filter(|w| !w.is_zero())?;
    let tokens: usize = times
        .iter()
        .map(|t| t.iter().filter(|&&x| x > from && x <= to).count())
        .sum();
    Some(tokens as f64 / times.len() as f64 / window.as_secs_f64())
}

async fn run_engine(
    engine: &Arc<EngineBackend>,
    conc: usize,
    p: usize,
    gen: usize,
    salt: usize,
) -> Run {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..conc {
        let engine = engine.clone();
        let req = GenerateRequest {
            request_id: format!("bench-{i}"),
            prompt_ids: Arc::new(prompt(p, salt + i)),
            params: SamplingParams {
                max_tokens: gen as u32,
                temperature: Some(0.0),
                ignore_eos: true,
                ..Default::default()
            },
            images: None,
            adapter: None,
        };
        tasks.push(tokio::spawn(async move {
            let mut s = engine.generate(req).await.expect("accepted");
            let mut times = Vec::with_capacity(gen);
            while let Some(ev) = s.next().await {
                if let GenEvent::Tokens { ids, .. } = ev.expect("no error") {
                    let at = t0.elapsed();
                    times.extend(ids.iter().map(|_| at));
                }
            }
            times
        }));
    }
    let mut times = Vec::new();
    for t in tasks {
        times.push(t.await.expect("task"));
    }
    let wall = t0.elapsed();
    let ttft: Vec<Duration> = times
        .iter()
        .map(|t| t.first().copied().unwrap_or_default())
        .collect();
    Run {
        all_first: ttft.iter().copied().max().unwrap_or_default(),
        ttft,
        wall,
        full_batch_rate: full_batch_rate(&times),
        generated: times.iter().map(Vec::len).sum(),
        prompt_tokens: conc * p,
    }
}

fn direct(cfg: &EngineConfig, p: usize, gen: usize) -> (f64, f64) {
    tito::engine::direct::with_direct(&cfg.model, cfg.device, 2048, 512, cfg.threads, |d| {
        let toks = prompt(p, 0);
        let t0 = Instant::now();
        let mut logits = d.feed(&toks).expect("prefill");
        let prefill = t0.elapsed();
        let t1 = Instant::now();
        for _ in 0..gen {
            logits = d.feed(&[argmax(&logits)]).expect("decode");
        }
        let decode = t1.elapsed();
        d.reset();
        (
            p as f64 / prefill.as_secs_f64(),
            gen as f64 / decode.as_secs_f64(),
        )
    })
    .expect("direct llama.cpp")
}

/// llama.cpp driven directly with `n` sequences decoding together (one
/// `llama_decode` a step, a greedy argmax per row on this thread, timed
/// apart): a reference for the engine's decode at `n` concurrent, with
/// the cache unified as the engine's or, `unified` false, split per
/// sequence. Returns the aggregate decode tok/s, the
/// mean step in ms and the mean ms of a step's argmaxes; the first
/// `WARM_STEPS` steps (a new context's) are not timed.
fn direct_batched(
    cfg: &EngineConfig,
    p: usize,
    gen: usize,
    n: usize,
    unified: bool,
) -> (f64, f64, f64) {
    const WARM_STEPS: usize = 2;
    let cells = (n * (p + WARM_STEPS + gen + 1)) as u32;
    tito::engine::direct::with_direct_seqs(
        &cfg.model,
        cfg.device,
        cells,
        512,
        n as u32,
        unified,
        cfg.threads,
        |d| {
            let mut next: Vec<u32> = (0..n)
                .map(|seq| argmax(&d.feed_seq(seq, &prompt(p, seq)).expect("prefill")))
                .collect();
            let mut picking = Duration::ZERO;
            let mut t0 = Instant::now();
            for step in 0..WARM_STEPS + gen {
                if step == WARM_STEPS {
                    (picking, t0) = (Duration::ZERO, Instant::now());
                }
                let mut drawn = next.clone();
                d.decode_each(&next, |seq, logits| {
                    let t = Instant::now();
                    drawn[seq] = argmax(logits);
                    picking += t.elapsed();
                })
                .expect("decode");
                next = drawn;
            }
            let took = t0.elapsed().as_secs_f64();
            d.reset();
            let per_step = |secs: f64| secs * 1000.0 / gen as f64;
            (
                (n * gen) as f64 / took,
                per_step(took),
                per_step(picking.as_secs_f64()),
            )
        },
    )
    .expect("direct llama.cpp")
}

fn engine_config(
    model: &std::path::Path,
    device: Device,
    threads: u32,
    invariant: bool,
    reuse: bool,
) -> EngineConfig {
    EngineConfig {
        model: model.to_path_buf(),
        device,
        max_batch: 16,
        n_ctx: 8192,
        threads,
        batch_invariant: invariant,
        kv_reuse: reuse,
        ..Default::default()
    }
}

/// The engine's step counters: steps, and nanoseconds in all, in
/// `llama_decode`, sampling.
fn step_counters(engine: &EngineBackend) -> [u64; 4] {
    use std::sync::atomic::Ordering::Relaxed;
    let s = engine.stats();
    [
        s.steps.load(Relaxed),
        s.step_ns.load(Relaxed),
        s.decode_ns.load(Relaxed),
        s.sample_ns.load(Relaxed),
    ]
}

/// One throughput round at each concurrency: the best row so far is kept.
/// At [`BATCHED`] concurrent it prints where the engine's steps went.
async fn throughput_round(
    (invariant, engine): &(bool, Arc<EngineBackend>),
    best: &mut [Option<Row>],
    p: usize,
    gen: usize,
    salt: usize,
) {
    for (k, conc) in CONCURRENCY.into_iter().enumerate() {
        let before = step_counters(engine);
        let r = run_engine(engine, conc, p, gen, salt + 1000 * (k + 1)).await;
        if conc == BATCHED {
            let after = step_counters(engine);
            let [steps, all, decode, sample] = [0, 1, 2, 3].map(|i| after[i] - before[i]);
            let ms = |ns: u64| ns as f64 / 1e6 / steps.max(1) as f64;
            println!(
                "batch_invariant = {invariant}, {conc} concurrent: {steps} steps, {:.2} ms a step (a mean over the round, prefills and the thinning batch included): llama_decode {:.2}, sampling {:.2}, the rest {:.2}",
                ms(all),
                ms(decode),
                ms(sample),
                ms(all.saturating_sub(decode + sample))
            );
        }
        let prefill = r.prompt_tokens as f64 / r.all_first.as_secs_f64();
        let per_stream = r.full_batch_rate.unwrap_or(f64::NAN);
        let aggregate = r.generated as f64 / r.wall.as_secs_f64();
        let mean = r.ttft.iter().map(|d| d.as_secs_f64()).sum::<f64>() / r.ttft.len() as f64;
        let row = (
            prefill,
            per_stream,
            aggregate,
            mean * 1000.0,
            r.all_first.as_secs_f64() * 1000.0,
        );
        if best[k].is_none_or(|b| row.2 > b.2) {
            best[k] = Some(row);
        }
    }
}

const CONCURRENCY: [usize; 4] = [1, 4, 8, 16];
/// The direct batched reference's sequences: the engine's highest
/// concurrency here (and its `max_batch`).
const BATCHED: usize = 16;

fn print_table(title: &str, best: &[Option<Row>], d_prefill: f64, d_decode: f64) {
    println!("\n{title}");
    let single = best[0].map_or(1.0, |b| b.2);
    if let Some((prefill, per_stream, ..)) = best[0] {
        println!(
            "single stream vs direct: prefill {:.2}x, decode {:.2}x",
            prefill / d_prefill,
            per_stream / d_decode
        );
    }
    println!("| concurrent | prefill tok/s | decode tok/s per stream, the batch full | aggregate output tok/s | TTFT mean / max (ms) |");
    println!("|---|---|---|---|---|");
    for (k, conc) in CONCURRENCY.into_iter().enumerate() {
        if let Some((prefill, per_stream, aggregate, mean, max)) = best[k] {
            println!(
                "| {conc} | {prefill:.0} | {per_stream:.1} | {aggregate:.1} ({:.2}x single) | {mean:.0} / {max:.0} |",
                aggregate / single
            );
        }
    }
}

/// Generates `prompts` one at a time, then all at once; returns the largest
/// |logprob difference| over the steps where both runs sampled the same
/// tokens so far, and how many sequences sampled other tokens.
async fn invariance(engine: &Arc<EngineBackend>, prompts: &[Vec<u32>], gen: u32) -> (f32, usize) {
    let one_by_one = alone(engine, prompts, gen).await;
    let mut tasks = Vec::new();
    for p in prompts {
        let (engine, p) = (engine.clone(), p.clone());
        tasks.push(tokio::spawn(async move {
            alone(&engine, std::slice::from_ref(&p), gen)
                .await
                .remove(0)
        }));
    }
    let mut batched = Vec::new();
    for t in tasks {
        batched.push(t.await.expect("task"));
    }
    compare(&one_by_one, &batched)
}

/// Sampled ids with their logprobs.
async fn generate(
    engine: &EngineBackend,
    prompt: &[u32],
    params: SamplingParams,
) -> Vec<(u32, f32)> {
    let req = GenerateRequest {
        request_id: "bench".into(),
        prompt_ids: Arc::new(prompt.to_vec()),
        params,
        images: None,
        adapter: None,
    };
    let mut s = engine.generate(req).await.expect("accepted");
    let mut out = Vec::new();
    while let Some(ev) = s.next().await {
        if let GenEvent::Tokens { ids, logprobs } = ev.expect("no error") {
            for (id, lp) in ids.into_iter().zip(logprobs) {
                out.push((id, lp.logprob.unwrap_or(f32::NAN)));
            }
        }
    }
    out
}

/// A `turns`-turn conversation: each turn appends ~150 new prompt tokens and
/// the previous answer (50 tokens). Returns each turn's latency.
async fn conversation(engine: &Arc<EngineBackend>, turns: usize) -> Vec<Duration> {
    let params = SamplingParams {
        max_tokens: 50,
        temperature: Some(0.0),
        ignore_eos: true,
        ..Default::default()
    };
    let mut prompt = Vec::new();
    let mut times = Vec::new();
    for t in 0..turns {
        prompt.extend(self::prompt(150, 7000 + t));
        let t0 = Instant::now();
        let out = generate(engine, &prompt, params.clone()).await;
        times.push(t0.elapsed());
        prompt.extend(out.iter().map(|(id, _)| *id));
    }
    times
}

/// A raw-logprobs sampler, as the engine makes one for a request.
fn sampler(temperature: f32, top_p: f32, seed: i64) -> tito::engine::sampler::Sampler {
    let params = SamplingParams {
        temperature: Some(temperature),
        top_p: Some(top_p),
        seed: Some(seed),
        ..Default::default()
    };
    tito::engine::sampler::Sampler::new(&params, &[], tito::config::LogprobsMode::RawLogprobs)
}

/// Mean µs of one `Sampler::sample` on `row`: greedy, temperature 1 (what
/// RL rollouts use), and temperature 1 with top-p 0.9.
fn sampling_cost(row: &[f32]) -> [f64; 3] {
    let time = |temperature: f32, top_p: f32| {
        let mut s = sampler(temperature, top_p, 1);
        let rows = 2000;
        let t0 = Instant::now();
        for _ in 0..rows {
            std::hint::black_box(s.sample(std::hint::black_box(row)));
        }
        t0.elapsed().as_secs_f64() * 1e6 / rows as f64
    };
    [time(0.0, 1.0), time(1.0, 1.0), time(1.0, 0.9)]
}

/// Mean µs of one step's sampling for `n` sequences at temperature 1, each
/// with its own sampler, on 1 thread and on `threads` threads.
fn step_sampling_cost(row: &[f32], n: usize, threads: usize) -> (f64, f64) {
    use tito::engine::step_sample::{Row, Sampling};
    let time = |threads: usize| {
        let sampling = Sampling::new(threads);
        let mut samplers: Vec<_> = (0..n).map(|i| sampler(1.0, 1.0, i as i64)).collect();
        let steps = 200;
        let t0 = Instant::now();
        for _ in 0..steps {
            let mut rows: Vec<Row<'_>> = samplers
                .iter_mut()
                .map(|sampler| Row {
                    sampler,
                    logits: row,
                    allowed: None,
                    out: None,
                })
                .collect();
            sampling.run(&mut rows);
            std::hint::black_box(&rows);
        }
        t0.elapsed().as_secs_f64() * 1e6 / steps as f64
    };
    (time(1), time(threads))
}

/// Sampled ids and logprobs of each prompt, generated one at a time.
async fn alone(
    engine: &Arc<EngineBackend>,
    prompts: &[Vec<u32>],
    gen: u32,
) -> Vec<Vec<(u32, f32)>> {
    let params = SamplingParams {
        max_tokens: gen,
        temperature: Some(0.0),
        ignore_eos: true,
        logprobs: Some(0),
        ..Default::default()
    };
    let mut out = Vec::new();
    for p in prompts {
        out.push(generate(engine, p, params.clone()).await);
    }
    out
}

/// Largest |logprob a - b| over the steps before the first token where they
/// differ, and how many sequences differ in a token.
fn compare(a: &[Vec<(u32, f32)>], b: &[Vec<(u32, f32)>]) -> (f32, usize) {
    let (mut max_diff, mut diverged) = (0.0f32, 0);
    for (x, y) in a.iter().zip(b) {
        for ((ix, lx), (iy, ly)) in x.iter().zip(y) {
            if ix != iy {
                diverged += 1;
                break;
            }
            max_diff = max_diff.max((lx - ly).abs());
        }
    }
    (max_diff, diverged)
}

fn main() {
    let model = std::env::var_os("TITO_BENCH_MODEL").map_or_else(
        || {
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        },
        std::path::PathBuf::from,
    );
    if !model.is_file() {
        eprintln!(
            "{} is missing: run scripts/fetch-model.sh first",
            model.display()
        );
        std::process::exit(1);
    }
    let p = env_usize("TITO_BENCH_PROMPT", 128);
    let gen = env_usize("TITO_BENCH_GEN", 64);
    let threads = env_usize("TITO_BENCH_THREADS", 2) as u32;
    let reps = env_usize("TITO_BENCH_REPS", 3).max(1);
    let turns = env_usize("TITO_BENCH_TURNS", 10).max(1);
    let device = match std::env::var("TITO_BENCH_DEVICE").as_deref() {
        Ok("cuda") => Device::Cuda,
        Ok("cpu") | Err(_) => Device::Cpu,
        Ok(other) => {
            eprintln!("TITO_BENCH_DEVICE={other}: expected cpu or cuda");
            std::process::exit(2);
        }
    };
    let cuda = device == Device::Cuda;
    // The batch-invariant mode runs ggml's CPU kernels only.
    let modes: &[bool] = if cuda { &[false] } else { &[true, false] };
    let cfg = engine_config(&model, device, threads, !cuda, false);
    let _ = direct(&cfg, p, 8); // warm-up

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    // Throughput without prefix reuse, so every mode computes every token.
    let engines: Vec<(bool, Arc<EngineBackend>)> = modes
        .iter()
        .map(|&inv| {
            let e = EngineBackend::start(&engine_config(&model, device, threads, inv, false));
            (inv, e.expect("engine"))
        })
        .collect();
    println!("llama.cpp: {}", tito::engine::kernels::system_info());
    println!("llama.cpp devices: {}", tito::engine::device_names());
    // The model's own next-token row after a prompt, on the CPU.
    let row = tito::engine::direct::with_direct(&model, Device::Cpu, 2048, 512, threads, |d| {
        d.feed(&prompt(p, 0)).expect("prefill")
    })
    .expect("direct llama.cpp");
    let [greedy, t1, top_p] = sampling_cost(&row);
    println!(
        "sampler, one token from the model's {} logits (per sequence per step): greedy {greedy:.0} µs, temperature 1 {t1:.0} µs, temperature 1 top-p 0.9 {top_p:.0} µs",
        row.len()
    );
    let (one, many) = step_sampling_cost(&row, 16, threads as usize);
    println!(
        "a step's sampling for 16 sequences at temperature 1: {one:.0} µs on 1 thread, {many:.0} µs on {threads} threads ({:.2}x)",
        one / many
    );
    rt.block_on(async {
        for (_, engine) in &engines {
            let _ = run_engine(engine, 1, p, 8, 999).await; // warm-up
        }
        let (mut d_prefill, mut d_decode) = (0.0f64, 0.0f64);
        // Per cache layout (unified, as the engine's; split): the best
        // round's tok/s, ms a step, ms of it the argmaxes.
        let mut batched = [(0.0f64, f64::INFINITY, 0.0f64); 2];
        let mut best: Vec<Vec<Option<Row>>> = vec![vec![None; CONCURRENCY.len()]; engines.len()];
        for rep in 0..reps {
            let (dp, dd) = direct(&cfg, p, gen);
            d_prefill = d_prefill.max(dp);
            d_decode = d_decode.max(dd);
            for (best, unified) in batched.iter_mut().zip([true, false]) {
                let round = direct_batched(&cfg, p, gen, BATCHED, unified);
                if round.0 > best.0 {
                    *best = round;
                }
            }
            for (engine, best) in engines.iter().zip(&mut best) {
                throughput_round(engine, best, p, gen, 100 * rep).await;
            }
        }
        println!("device {device:?}: prompt {p} tokens, {gen} generated per request, {threads} threads, best of {reps}");
        println!("direct llama.cpp (1 sequence): prefill {d_prefill:.0} tok/s, decode {d_decode:.1} tok/s");
        for ((agg, step, pick), cache) in batched.iter().zip(["unified cache, as the engine's", "kv_unified off"]) {
            // llama_decode's own rate: BATCHED tokens a step over the step less its argmaxes.
            let decode = BATCHED as f64 * 1000.0 / (step - pick);
            println!("direct llama.cpp ({BATCHED} sequences decoding together, {cache}): {agg:.0} tok/s, {step:.2} ms a step ({pick:.2} ms of it the argmaxes), {:.1} tok/s per sequence; without the argmaxes {decode:.0} tok/s", agg / BATCHED as f64);
        }
        let (batched, batched_step, batched_pick) = batched[0];
        let batched_decode = BATCHED as f64 * 1000.0 / (batched_step - batched_pick);
        for ((inv, _), best) in engines.iter().zip(&best) {
            print_table(&format!("batch_invariant = {inv}"), best, d_prefill, d_decode);
            let row = CONCURRENCY.iter().position(|&c| c == BATCHED);
            if let Some(Some((_, per_stream, ..))) = row.map(|k| best[k]) {
                let engine = per_stream * BATCHED as f64;
                println!(
                    "{BATCHED} concurrent vs direct {BATCHED} sequences, per-stream decode: {:.2}x (argmaxes counted), {:.2}x of llama_decode alone",
                    engine / batched,
                    engine / batched_decode
                );
            }
        }
        if let [on, off] = &best[..] {
            for k in 0..CONCURRENCY.len() {
                if let (Some(on), Some(off)) = (on[k], off[k]) {
                    println!(
                        "{} concurrent: invariant / fast aggregate = {:.2}, prefill = {:.2}",
                        CONCURRENCY[k],
                        on.2 / off.2,
                        on.0 / off.0
                    );
                }
            }
        }

        let prompts: Vec<Vec<u32>> = (0..8).map(|i| prompt(40 + 60 * i, 500 + i)).collect();
        println!("\nbatch invariance: 8 prompts of 40..460 tokens, 32 greedy tokens, alone then all at once");
        for (inv, engine) in &engines {
            let (diff, diverged) = invariance(engine, &prompts, 32).await;
            println!("batch_invariant = {inv}: max |logprob alone - batched| = {diff:e} nats; {diverged} of 8 sequences sampled other tokens");
        }
        if cuda {
            let cpu = EngineBackend::start(&engine_config(&model, Device::Cpu, threads, true, false))
                .expect("cpu engine");
            let on_cpu = alone(&cpu, &prompts, 32).await;
            let on_gpu = alone(&engines[0].1, &prompts, 32).await;
            let (diff, diverged) = compare(&on_cpu, &on_gpu);
            println!("cpu (batch_invariant) against cuda, each prompt alone: max |logprob cpu - cuda| = {diff:e} nats; {diverged} of 8 sequences sampled other tokens");
        }
    });
    drop(engines);

    rt.block_on(async {
        println!("\n{turns}-turn conversation (~200 new prompt tokens a turn, 50 generated), batch_invariant = {}", !cuda);
        let with = EngineBackend::start(&engine_config(&model, device, threads, !cuda, true)).expect("engine");
        let without = EngineBackend::start(&engine_config(&model, device, threads, !cuda, false)).expect("engine");
        let a = conversation(&with, turns).await;
        let b = conversation(&without, turns).await;
        let reused = with.stats().reused_tokens.load(std::sync::atomic::Ordering::Relaxed);
        let fed = with.stats().prefill_tokens.load(std::sync::atomic::Ordering::Relaxed);
        println!("| turn | kv_reuse on (ms) | kv_reuse off (ms) | speed-up |");
        println!("|---|---|---|---|");
        for (t, (x, y)) in a.iter().zip(&b).enumerate() {
            println!(
                "| {} | {:.0} | {:.0} | {:.2}x |",
                t + 1,
                x.as_secs_f64() * 1000.0,
                y.as_secs_f64() * 1000.0,
                y.as_secs_f64() / x.as_secs_f64()
            );
        }
        println!("kv_reuse on: {reused} prompt tokens taken from cache, {fed} computed");
    });
}
