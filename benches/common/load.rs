//! Closed-loop HTTP load shared by the end-to-end benches: `concurrency`
//! clients, each sending its next request when its last one finished.
//! With `TITO_LOAD_SPREAD` set, each run (warm-ups included, in the order
//! they run) also prints its latencies' mean and percentiles to stderr.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Builds one request (a fresh body each time if the caller wants).
pub type MakeRequest = Arc<dyn Fn() -> reqwest::RequestBuilder + Send + Sync>;

pub enum Until {
    /// This many requests in all, split evenly over the clients.
    Total(usize),
    /// Until this long has passed.
    Elapsed(Duration),
}

pub struct Stats {
    pub p50: Duration,
    pub p99: Duration,
    pub rps: f64,
    /// Requests that failed or answered a non-2xx status.
    pub errors: usize,
    /// Requests answered with success.
    pub ok: usize,
}

pub async fn run(make: &MakeRequest, concurrency: usize, until: Until) -> Stats {
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let make = make.clone();
            let (quota, end) = match until {
                Until::Total(n) => (n / concurrency, None),
                Until::Elapsed(d) => (usize::MAX, Some(start + d)),
            };
            tokio::spawn(async move {
                let (mut lat, mut errors) = (Vec::new(), 0usize);
                while lat.len() + errors < quota && end.is_none_or(|e| Instant::now() < e) {
                    let t = Instant::now();
                    match make().send().await {
                        Ok(r) if r.status().is_success() => match r.bytes().await {
                            Ok(_) => lat.push(t.elapsed()),
                            Err(_) => errors += 1,
                        },
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in tasks {
        if let Ok((lat, e)) = t.await {
            all.extend(lat);
            errors += e;
        }
    }
    let elapsed = start.elapsed();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    if std::env::var_os("TITO_LOAD_SPREAD").is_some() {
        print_spread(concurrency, &all, pct);
    }
    Stats {
        p50: pct(0.50),
        p99: pct(0.99),
        rps: all.len() as f64 / elapsed.as_secs_f64(),
        errors,
        ok: all.len(),
    }
}

/// The mean and percentiles of one run's latencies (`sorted`), to stderr:
/// at 1 concurrent call the throughput is one over the mean, which a tail
/// moves while p50 and p99 stay put.
fn print_spread(concurrency: usize, sorted: &[Duration], pct: impl Fn(f64) -> Duration) {
    let Some(n) = u32::try_from(sorted.len()).ok().filter(|&n| n > 0) else {
        return;
    };
    let mean = sorted.iter().sum::<Duration>() / n;
    let at: Vec<String> = [0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999]
        .iter()
        .map(|&p| format!("p{}={}", p * 100.0, ms(pct(p))))
        .collect();
    eprintln!(
        "spread c={concurrency} n={n} mean={} {}",
        ms(mean),
        at.join(" ")
    );
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// `a - b` in milliseconds, signed.
pub fn signed_ms(a: Duration, b: Duration) -> String {
    format!("{:.3}", (a.as_secs_f64() - b.as_secs_f64()) * 1000.0)
}

/// The round with the median throughput (its latencies, and whatever else
/// the round holds, with it); errors summed over all rounds. `stats` finds a
/// round's [`Stats`].
pub fn median<T>(mut rounds: Vec<T>, stats: impl Fn(&mut T) -> &mut Stats) -> T {
    let errors = rounds.iter_mut().map(|r| stats(r).errors).sum();
    let mut order: Vec<(f64, usize)> = rounds
        .iter_mut()
        .enumerate()
        .map(|(i, r)| (stats(r).rps, i))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut m = rounds.swap_remove(order[order.len() / 2].1);
    stats(&mut m).errors = errors;
    m
}

/// A number from the environment, or `default` when unset or unparsable.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// `text` as the Qwen3 tokenizer fixture splits it, then `<|im_end|>`: the
/// mock backend's reply.
pub fn reply_ids(tokenizer_dir: &std::path::Path, text: &str) -> Vec<u32> {
    let tok = tokenizers::Tokenizer::from_file(tokenizer_dir.join("tokenizer.json"))
        .expect("Qwen3 tokenizer.json");
    let mut ids = tok.encode(text, false).expect("encode").get_ids().to_vec();
    ids.push(
        tok.token_to_id("<|im_end|>")
            .expect("<|im_end|> in the vocabulary"),
    );
    ids
}

/// CPU time (user + system) used so far by process `pid`, or by this
/// process when `None`, from `/proc/PID/stat` (clock-tick resolution).
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".to_string(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the parenthesised command name; utime and stime are the
    // 14th and 15th fields of the whole line.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// The host's CPU counters for this whole machine, from the first line of
/// `/proc/stat`: jiffies stolen (the time a hypervisor ran other guests
/// while this one had work) and all jiffies, both since boot.
#[derive(Clone, Copy)]
pub struct HostTicks {
    steal: u64,
    total: u64,
}

impl HostTicks {
    /// `None` where `/proc/stat` is missing or has no steal column.
    pub fn now() -> Option<HostTicks> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
        let fields: Vec<u64> = cpu
            .split_whitespace()
            .map(|f| f.parse().ok())
            .collect::<Option<_>>()?;
        // user nice system idle iowait irq softirq steal guest guest_nice;
        // guest time is already counted in user and nice.
        let steal = *fields.get(7)?;
        Some(HostTicks {
            steal,
            total: fields.iter().take(8).sum(),
        })
    }

    /// The share of all CPU time between readings `a` and `b` that the host
    /// stole, in percent; `None` when either reading is missing or no tick
    /// passed.
    pub fn steal_pct(a: Option<Self>, b: Option<Self>) -> Option<f64> {
        let (a, b) = (a?, b?);
        let total = b.total.checked_sub(a.total).filter(|&t| t > 0)?;
        Some(100.0 * b.steal.saturating_sub(a.steal) as f64 / total as f64)
    }
}
