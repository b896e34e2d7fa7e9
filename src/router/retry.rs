//! How long a call waits before it tries another backend: exponential
//! backoff with jitter, never past the first-token deadline of the attempt
//! that failed.
//!
//! The n-th retry (n = 1 for the second attempt) waits a delay drawn
//! uniformly from `[d/2, d]`, where `d = min(initial · 2^(n-1), max)`
//! (`[router] retry_backoff_ms`, `retry_backoff_max_ms`). The random half
//! spreads the retries of calls that failed together (a backend that went
//! away under load) instead of sending them to the next backend in one
//! burst; the fixed half keeps each wait at least half its step. A wait
//! ends at the failed attempt's first-token deadline at the latest: an
//! attempt that failed fast leaves the rest of its window to the wait, one
//! that timed out leaves none, and the retry goes at once.

use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

/// The waits between attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The step before the first retry.
    pub initial: Duration,
    /// The largest step.
    pub max: Duration,
}

impl Backoff {
    /// The step before retry `n` (1-based), before jitter.
    pub fn step(&self, n: u32) -> Duration {
        let doublings = n.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// The wait before retry `n`: uniform in `[step/2, step]`.
    pub fn delay(&self, n: u32, rng: &mut impl Rng) -> Duration {
        let step = self.step(n);
        let half = step / 2;
        let spread = (step - half).as_nanos() as u64;
        half + Duration::from_nanos(rng.random_range(0..=spread))
    }

    /// Waits before retry `n`, until `deadline` at the latest.
    pub async fn pause(&self, n: u32, deadline: Instant) {
        let delay = self.delay(n, &mut rand::rng());
        tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(300),
        }
    }

    #[test]
    fn steps_double_up_to_the_max() {
        let b = backoff();
        let steps: Vec<u64> = (1..=6).map(|n| b.step(n).as_millis() as u64).collect();
        assert_eq!(steps, [50, 100, 200, 300, 300, 300]);
        // A huge retry count neither overflows nor passes the max.
        assert_eq!(b.step(u32::MAX), Duration::from_millis(300));
    }

    #[test]
    fn each_delay_lies_between_half_its_step_and_the_step() {
        let b = backoff();
        let mut rng = StdRng::seed_from_u64(7);
        for n in 1..=5 {
            let step = b.step(n);
            let delays: Vec<Duration> = (0..200).map(|_| b.delay(n, &mut rng)).collect();
            assert!(
                delays.iter().all(|d| *d >= step / 2 && *d <= step),
                "{n}: {delays:?}"
            );
            // Jittered: the 200 draws are not all one value.
            let first = delays[0];
            assert!(delays.iter().any(|d| *d != first), "retry {n}: no jitter");
        }
    }

    #[test]
    fn a_zero_backoff_retries_at_once() {
        let b = Backoff {
            initial: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert_eq!(b.delay(3, &mut rand::rng()), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_waits_its_delay() {
        let b = backoff();
        let t0 = Instant::now();
        b.pause(2, t0 + Duration::from_secs(10)).await;
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(50) && waited <= Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_ends_at_the_deadline_at_the_latest() {
        let b = backoff();
        let t0 = Instant::now();
        // Retry 3 waits at least 100 ms: a deadline 80 ms away cuts it.
        b.pause(3, t0 + Duration::from_millis(80)).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(80));
        // A deadline already passed: no wait at all.
        let t1 = Instant::now();
        b.pause(1, t0).await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }
}
