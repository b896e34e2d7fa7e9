//! The sampler's unit tests (`sampler.rs` would pass 800 lines with them).

use super::*;

const RAW: LogprobsMode = LogprobsMode::RawLogprobs;
const PROCESSED: LogprobsMode = LogprobsMode::ProcessedLogprobs;

/// `log_softmax(row)` in f64, as a reference.
fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = f64::from(max)
        + row
            .iter()
            .map(|&v| f64::from(v - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&v| (f64::from(v) - lse) as f32).collect()
}

/// Raw-mode and processed-mode samples of the same steps (same seed).
fn both(p: &SamplingParams, prompt: &[u32], logits: &[f32]) -> (Sampled, Sampled) {
    let raw = Sampler::new(p, prompt, RAW).sample(logits).expect("row");
    let processed = Sampler::new(p, prompt, PROCESSED)
        .sample(logits)
        .expect("row");
    (raw, processed)
}

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        max_tokens: 8,
        temperature: Some(temperature),
        seed: Some(7),
        logprobs: Some(2),
        ..Default::default()
    }
}

/// The vectorised `exp` and the sums in lanes are another rounding of
/// the same log-sum-exp: against the sampler's formula before them (the
/// standard library's `exp`, summed in row order), a logprob (an f32) is
/// the same bits or one ulp away.
#[test]
fn logprobs_match_a_row_order_std_exp_reference_within_one_f32_ulp() {
    let log_softmax = |row: &[f32]| -> Vec<f32> {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
        let lse = max + sum.ln() as f32;
        row.iter().map(|&v| v - lse).collect()
    };
    let mut x = 0x0123_4567_89ab_cdefu64;
    let (mut same, mut one_ulp, mut worst) = (0usize, 0usize, 0u32);
    for case in 0..60 {
        // Flat rows (a random prompt) and peaked ones (text), at the
        // vocabulary widths of SmolLM2 and Qwen3.
        let n = if case % 2 == 0 { 49_152 } else { 151_936 };
        let spread = [2.0f32, 8.0, 30.0][case % 3];
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let u = (x >> 40) as f32 / (1u64 << 24) as f32;
                spread * u * u * u - 5.0
            })
            .collect();
        let want = log_softmax(&logits);
        let mut p = params(0.0);
        p.logprobs = Some(20);
        let out = Sampler::new(&p, &[], RAW).sample(&logits).expect("row");
        let got = std::iter::once((out.token, out.logprob)).chain(out.top);
        for (id, l) in got {
            let d = l.to_bits().abs_diff(want[id as usize].to_bits());
            worst = worst.max(d);
            same += usize::from(d == 0);
            one_ulp += usize::from(d == 1);
        }
    }
    eprintln!("{same} logprobs the same bits, {one_ulp} one ulp away, worst {worst} ulps");
    assert!(worst <= 1, "{worst} ulps");
}

#[test]
fn a_draw_past_the_walks_total_takes_the_last_token_with_weight() {
    let w = [(0, 0.25), (2, 0.5), (3, 0.25), (5, 0.0)];
    assert_eq!(walk_to(0.1, w.into_iter()), Some(0));
    assert_eq!(walk_to(0.25, w.into_iter()), Some(2));
    assert_eq!(walk_to(0.9, w.into_iter()), Some(3));
    // A total summed in another order may exceed the walk's by an ulp.
    assert_eq!(walk_to(1.0, w.into_iter()), Some(3));
    assert_eq!(walk_to(0.5, [(1, 0.0), (4, 0.0)].into_iter()), None);
    // A NaN weight (a NaN logit) never passes: the argmax, as before.
    let nan = [(0, 1.0), (1, f64::NAN), (2, 0.5)];
    assert_eq!(walk_to(0.7, nan.into_iter()), Some(0));
    assert_eq!(walk_to(1.2, nan.into_iter()), None);
}

#[test]
fn a_constraint_whose_tokens_the_model_rules_out_is_a_dead_end_not_token_0() {
    let mut logits = vec![1.0f32; 10];
    logits[4] = f32::NEG_INFINITY;
    logits[7] = f32::NEG_INFINITY;
    let mut allowed = vec![false; 10];
    allowed[4] = true;
    allowed[7] = true;
    for t in [0.0, 1.0] {
        let mut s = Sampler::new(&params(t), &[], RAW);
        assert_eq!(s.sample_allowed(&logits, Some(&allowed)), None, "T = {t}");
        assert_eq!(s.sample_allowed(&logits, Some(&[false; 10])), None);
        // One allowed token with probability is drawn, whatever its rank.
        allowed[2] = true;
        let out = s.sample_allowed(&logits, Some(&allowed)).expect("row");
        assert_eq!(out.token, 2);
        allowed[2] = false;
    }
}

#[test]
fn a_nan_logit_draws_the_argmax_as_it_did() {
    let mut logits = vec![-20.0f32; 100];
    logits[0] = 5.0;
    logits[1] = f32::NAN;
    for seed in 0..20 {
        let mut p = params(1.0);
        p.seed = Some(seed);
        let out = Sampler::new(&p, &[], RAW).sample(&logits).expect("row");
        assert_eq!(out.token, 0, "seed {seed}");
    }
}

#[test]
fn greedy_takes_argmax_and_logprob_is_log_softmax() {
    let logits = [0.5f32, 2.0, -1.0, 1.0];
    let mut s = Sampler::new(&params(0.0), &[], RAW);
    let out = s.sample(&logits).expect("non-empty");
    assert_eq!(out.token, 1);
    let lse = logits.iter().map(|v| (*v as f64).exp()).sum::<f64>().ln() as f32;
    assert!((out.logprob - (2.0 - lse)).abs() < 1e-6);
    assert_eq!(out.top.len(), 2);
    assert_eq!(out.top[0].0, 1);
    assert_eq!(out.top[1].0, 3);
}

#[test]
fn same_seed_same_draws_and_top_k_one_is_greedy() {
    let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 50) as f32 * 0.1).collect();
    let run = |p: &SamplingParams| {
        let mut s = Sampler::new(p, &[], RAW);
        (0..20)
            .map(|_| s.sample(&logits).expect("row").token)
            .collect::<Vec<_>>()
    };
    assert_eq!(run(&params(1.0)), run(&params(1.0)));
    let mut k1 = params(1.0);
    k1.top_k = Some(1);
    let greedy = run(&params(0.0));
    assert_eq!(run(&k1), greedy);
    let mut p_small = params(1.0);
    p_small.top_p = Some(1e-6);
    assert_eq!(run(&p_small), greedy);
    let mut m = params(1.0);
    m.min_p = Some(1.0);
    assert_eq!(run(&m), greedy);
}

#[test]
fn penalties_change_the_distribution() {
    let logits = [1.0f32, 1.0, 0.0];
    let mut p = params(0.0);
    p.frequency_penalty = Some(2.0);
    let mut s = Sampler::new(&p, &[], PROCESSED);
    s.observe(0);
    assert_eq!(s.sample(&logits).expect("row").token, 1);
    let mut p = params(0.0);
    p.repetition_penalty = Some(4.0);
    let mut s = Sampler::new(&p, &[1], PROCESSED);
    assert_eq!(s.sample(&logits).expect("row").token, 0);
}

#[test]
fn raw_and_processed_differ_under_temperature() {
    let logits = [0.5f32, 2.0, -1.0, 1.0, 1.5];
    let (raw, processed) = both(&params(0.5), &[], &logits);
    assert_eq!(
        raw.token, processed.token,
        "the draw never depends on the mode"
    );
    let t = raw.token as usize;
    assert!((raw.logprob - log_softmax(&logits)[t]).abs() < 1e-6);
    let z: Vec<f32> = logits.iter().map(|l| l / 0.5).collect();
    assert!((processed.logprob - log_softmax(&z)[t]).abs() < 1e-6);
    assert!((raw.logprob - processed.logprob).abs() > 1e-3);
    assert_ne!(raw.top[0].1, processed.top[0].1);
}

#[test]
fn raw_and_processed_differ_under_a_repetition_penalty() {
    let logits = [1.0f32, 1.2, 0.0];
    let mut p = params(0.0);
    p.repetition_penalty = Some(4.0);
    // Token 1 is in the prompt: 1.2 / 4 = 0.3, so greedy picks token 0.
    let (raw, processed) = both(&p, &[1], &logits);
    assert_eq!((raw.token, processed.token), (0, 0));
    assert!((raw.logprob - log_softmax(&logits)[0]).abs() < 1e-6);
    assert!((processed.logprob - log_softmax(&[1.0, 0.3, 0.0])[0]).abs() < 1e-6);
    assert!((raw.logprob - processed.logprob).abs() > 1e-3);
    // Top alternatives are chosen by the distribution that reports them.
    assert_eq!(raw.top[0].0, 1);
    assert_eq!(processed.top[0].0, 0);
}

#[test]
fn raw_equals_processed_at_temperature_one_without_penalties() {
    let logits: Vec<f32> = (0..64).map(|i| ((i * 29) % 64) as f32 * 0.07).collect();
    let mut raw = Sampler::new(&params(1.0), &[], RAW);
    let mut processed = Sampler::new(&params(1.0), &[], PROCESSED);
    for _ in 0..20 {
        let a = raw.sample(&logits).expect("row");
        let b = processed.sample(&logits).expect("row");
        assert_eq!(a, b);
        raw.observe(a.token);
        processed.observe(b.token);
    }
    // Greedy (temperature 0) leaves the row unchanged too.
    assert_eq!(
        both(&params(0.0), &[], &logits).0,
        both(&params(0.0), &[], &logits).1
    );
}

#[test]
fn raw_is_log_softmax_of_the_logits_under_every_processing() {
    let logits: Vec<f32> = (0..200)
        .map(|i| ((i * 71) % 200) as f32 * 0.05 - 4.0)
        .collect();
    let want = log_softmax(&logits);
    let mut p = params(0.7);
    p.logprobs = Some(5);
    p.repetition_penalty = Some(1.3);
    p.frequency_penalty = Some(0.5);
    p.presence_penalty = Some(0.2);
    p.top_k = Some(40);
    p.top_p = Some(0.9);
    let mut s = Sampler::new(&p, &[3, 17, 199], RAW);
    let mut sorted: Vec<(u32, f32)> = want
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l))
        .collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for _ in 0..30 {
        let out = s.sample(&logits).expect("row");
        let t = out.token as usize;
        assert!(
            (out.logprob - want[t]).abs() < 1e-6,
            "{} vs {}",
            out.logprob,
            want[t]
        );
        assert_eq!(out.top.len(), 5);
        for ((id, l), (wid, wl)) in out.top.iter().zip(&sorted) {
            assert_eq!(id, wid);
            assert!((l - wl).abs() < 1e-6);
        }
        s.observe(out.token);
    }
}

/// The tokens a truncated step may draw: the finite entries of `z`.
fn kept_after(p: &SamplingParams, logits: &[f32]) -> Vec<u32> {
    let sampler = Sampler::new(p, &[], PROCESSED);
    let mut s = Scratch::default();
    sampler.process(&mut s, logits);
    let (_, max, sum) = max_and_weights(&s.z, &mut s.weights);
    sampler.truncate(&mut s, max, sum);
    (0..logits.len() as u32)
        .filter(|&i| s.z[i as usize].is_finite())
        .collect()
}

/// vLLM's top-p by full sort: kept while the mass above is < p.
fn top_p_reference(logits: &[f32], p: f64) -> usize {
    let mut w: Vec<f64> = logits.iter().map(|&v| f64::from(v).exp()).collect();
    w.sort_by(|a, b| b.total_cmp(a));
    let total: f64 = w.iter().sum();
    let mut above = 0.0;
    w.iter()
        .take_while(|&&x| {
            let keep = above < p * total;
            above += x;
            keep
        })
        .count()
}

#[test]
fn top_p_cuts_at_p_of_the_whole_mass_even_when_the_fast_path_holds_it() {
    // 300 close tokens: the top 256 hold more than 80% of the mass, so
    // the cut falls inside the fast path's candidates.
    let logits: Vec<f32> = (0..1000)
        .map(|i| if i < 300 { -0.001 * i as f32 } else { -1e4 })
        .collect();
    let mut p = params(1.0);
    p.top_p = Some(0.8);
    let want = top_p_reference(&logits, 0.8);
    assert_eq!(want, 233);
    assert_eq!(
        kept_after(&p, &logits),
        (0..want as u32).collect::<Vec<_>>()
    );
    // Past the first stage: the full sort gives the same rule.
    p.top_p = Some(0.95);
    let want = top_p_reference(&logits, 0.95);
    assert!(want > TOP_P_STAGES[0]);
    assert_eq!(kept_after(&p, &logits).len(), want);
}

#[test]
fn top_p_cuts_the_same_in_every_stage_and_after_the_whole_sort() {
    // 6,000 close tokens: top-p 0.03 cuts in the first stage, 0.5 in
    // the second, 0.9 only once the whole row is sorted.
    let logits: Vec<f32> = (0..8000)
        .map(|i| if i < 6000 { -1e-5 * i as f32 } else { -1e4 })
        .collect();
    let bounds = [0, TOP_P_STAGES[0], TOP_P_STAGES[1], logits.len()];
    for (stage, top_p) in [0.03f32, 0.5, 0.9].into_iter().enumerate() {
        let mut p = params(1.0);
        p.top_p = Some(top_p);
        let want = top_p_reference(&logits, f64::from(top_p));
        assert!(
            want > bounds[stage] && want <= bounds[stage + 1],
            "top-p {top_p}: {want} kept, not in stage {stage}"
        );
        assert_eq!(
            kept_after(&p, &logits),
            (0..want as u32).collect::<Vec<_>>(),
            "top-p {top_p}"
        );
    }
}

#[test]
fn processed_logprobs_are_of_the_truncated_distribution() {
    let logits = [2.0f32, 1.0, 0.0, -1.0];
    let mut p = params(1.0);
    p.top_k = Some(2);
    p.logprobs = Some(4);
    for seed in 0..20 {
        p.seed = Some(seed);
        let (raw, processed) = both(&p, &[], &logits);
        let t = processed.token as usize;
        assert!(t < 2, "top-k 2 draws one of the two most likely");
        assert!((processed.logprob - log_softmax(&[2.0, 1.0])[t]).abs() < 1e-6);
        assert_eq!(
            processed.top.len(),
            2,
            "excluded tokens are not alternatives"
        );
        assert!((raw.logprob - log_softmax(&logits)[t]).abs() < 1e-6);
        assert_eq!(raw.top.len(), 4);
    }
}

#[test]
fn min_p_cuts_before_top_p_and_top_k_keeps_ties() {
    // p = 0.45, 0.30 and 25 x 0.01: min-p 0.1 leaves the first two,
    // and top-p 0.55 of their 0.75 keeps only the first.
    let mut logits = vec![0.45f32.ln(), 0.30f32.ln()];
    logits.extend([0.01f32.ln(); 25]);
    let mut p = params(1.0);
    p.min_p = Some(0.1);
    p.top_p = Some(0.55);
    assert_eq!(kept_after(&p, &logits), vec![0]);
    let mut p = params(1.0);
    p.top_k = Some(2);
    assert_eq!(kept_after(&p, &[1.0, 1.0, 1.0, 0.0]), vec![0, 1, 2]);
    // top_p = 0 keeps the most likely token (and its ties), not all.
    let mut p = params(1.0);
    p.top_p = Some(0.0);
    assert_eq!(kept_after(&p, &[0.5, 2.0, 1.0]), vec![1]);
}

#[test]
fn a_tiny_temperature_is_clamped_not_overflowed() {
    let logits = [0.0f32, 1.0, 0.5];
    for t in [1e-39f32, 1e-6] {
        let (raw, processed) = both(&params(t), &[], &logits);
        assert_eq!(processed.token, 1);
        assert!(processed.logprob.is_finite(), "T = {t}: {processed:?}");
        let z: Vec<f32> = logits.iter().map(|l| l / MIN_TEMPERATURE).collect();
        assert!((processed.logprob - log_softmax(&z)[1]).abs() < 1e-5);
        assert!((raw.logprob - log_softmax(&logits)[1]).abs() < 1e-6);
    }
}

/// The scratch rows are the thread's, shared by every sequence sampled on
/// it: a sequence's tokens and logprobs must not depend on what another
/// sequence (a longer or shorter row, other top-k and top-p cuts,
/// penalties) left in them. Each of two sequences is sampled alone, then
/// the two in turn on one thread.
#[test]
fn sequences_sharing_a_thread_scratch_sample_as_if_alone() {
    let row = |n: usize, step: usize| -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + step * 104_729) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    };
    let a_params = SamplingParams {
        top_p: Some(0.8),
        top_k: Some(50),
        ..params(0.9)
    };
    let b_params = SamplingParams {
        top_k: Some(5),
        top_p: Some(0.9),
        frequency_penalty: Some(0.5),
        repetition_penalty: Some(1.3),
        seed: Some(11),
        ..params(1.2)
    };
    let a_new = || Sampler::new(&a_params, &[1, 2, 3], PROCESSED);
    let b_new = || Sampler::new(&b_params, &[4, 5], RAW);
    let a_row = |t: usize| row(500, t);
    let b_row = |t: usize| row(2000, t + 100);
    let step = |s: &mut Sampler, logits: &[f32]| {
        let out = s.sample(logits).expect("row");
        s.observe(out.token);
        out
    };
    let steps = 12;
    let mut a = a_new();
    let a_alone: Vec<_> = (0..steps).map(|t| step(&mut a, &a_row(t))).collect();
    let mut b = b_new();
    let b_alone: Vec<_> = (0..steps).map(|t| step(&mut b, &b_row(t))).collect();
    let (mut a, mut b) = (a_new(), b_new());
    for t in 0..steps {
        assert_eq!(step(&mut b, &b_row(t)), b_alone[t], "b, step {t}");
        assert_eq!(step(&mut a, &a_row(t)), a_alone[t], "a, step {t}");
    }
}
