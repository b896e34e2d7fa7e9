//! `exp(v - max)` over a row of logits, the sampler's inner loop.
//!
//! Every sampled token's logprob needs `ln(sum(exp(v - max)))` over the
//! whole vocabulary (49,152 entries for SmolLM2, 151,936 for Qwen3), and a
//! draw needs the weights themselves. The standard library's `exp` is a call
//! per entry that the compiler cannot vectorise; [`exp_le0`] is plain
//! arithmetic (no branches, no tables) that it can, with the same result on
//! every path: each lane does the same IEEE operations in the same order,
//! and Rust never fuses a multiply and an add, so the AVX2 build of the loop
//! and the plain one give the same bits.
//!
//! Accuracy (`cargo test --lib engine::exp`): within 1 ulp of the standard
//! library's `exp` for every `x` in `[-708, 0]`; below -708 (a weight under
//! 3.3e-308 beside the row's largest, which is 1) it is 0.
//!
//! Owns: the arithmetic and the one way a whole row's weights are summed
//! ([`sum_weights`], [`sum_exp`]: the same number for the same weights).

/// `1.5 * 2^52`: adding it rounds a double in `(-2^51, 2^51)` to an integer
/// kept in the low bits of the sum's mantissa.
const SHIFTER: f64 = 6_755_399_441_055_744.0;
/// `ln 2` in two parts; the first has 21 trailing zero bits, so `n * LN2_HI`
/// is exact for the `|n| <= 1022` used here (Cody and Waite's reduction).
const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
/// Below this the scale `2^n` would leave the normal range.
const UNDERFLOW: f64 = -708.0;
/// `1 / k!` for k = 13 down to 2: Taylor's series of `exp(r)` on
/// `|r| <= ln(2) / 2`, whose remainder past degree 13 is under 5e-18.
const INV_FACT: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    1.0 / 2.0,
];

/// `exp(x)` for `x <= 0` (and `-inf`, giving 0; NaN gives NaN).
#[inline(always)]
fn exp_le0(x: f64) -> f64 {
    // x = n ln2 + r, n the integer nearest x / ln2.
    let t = x * std::f64::consts::LOG2_E + SHIFTER;
    let n = t - SHIFTER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = INV_FACT[0];
    for c in &INV_FACT[1..] {
        p = p * r + c;
    }
    p = p * r + 1.0;
    p = p * r + 1.0;
    // 2^n from the integer in t's low bits: (n + 1023) as the exponent.
    let n_bits = t.to_bits().wrapping_sub(SHIFTER.to_bits());
    let scale = f64::from_bits(n_bits.wrapping_add(1023) << 52);
    let y = p * scale;
    if x < UNDERFLOW {
        0.0
    } else {
        y
    }
}

/// `out[i] = exp(f64::from(row[i] - max))` for a `max` at least every
/// finite entry of `row`.
pub(crate) fn exp_into(row: &[f32], max: f32, out: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, the one feature the function enables.
        unsafe { exp_into_avx2(row, max, out) };
        return;
    }
    exp_into_plain(row, max, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_into_avx2(row: &[f32], max: f32, out: &mut [f64]) {
    exp_into_plain(row, max, out);
}

#[inline(always)]
fn exp_into_plain(row: &[f32], max: f32, out: &mut [f64]) {
    for (o, &v) in out.iter_mut().zip(row) {
        *o = exp_le0(f64::from(v - max));
    }
}

/// Partial sums a sum of weights keeps: entry `i` goes to lane `i % 4`.
const LANES: usize = 4;

/// Adds `w` to `lanes`, entry `i` to lane `i % LANES` (`w` starts at a
/// multiple of `LANES` in the whole).
#[inline(always)]
fn add_lanes(lanes: &mut [f64; LANES], w: &[f64]) {
    let mut chunks = w.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l += x;
        }
    }
    for (l, &x) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += x;
    }
}

#[inline(always)]
fn total(lanes: [f64; LANES]) -> f64 {
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// The sum of the weights `w` (finite or `+inf`, or NaN), as every sum of a
/// whole row's weights is taken: four interleaved partial sums, so that the
/// additions do not wait on each other. A sum in row order is another
/// rounding of the same number (within `n` ulps for `n` entries).
pub(crate) fn sum_weights(w: &[f64]) -> f64 {
    let mut lanes = [0.0f64; LANES];
    add_lanes(&mut lanes, w);
    total(lanes)
}

/// `sum_weights` of [`exp_into`]'s output, without keeping it.
pub(crate) fn sum_exp(row: &[f32], max: f32) -> f64 {
    let mut buf = [0.0f64; 256];
    let mut lanes = [0.0f64; LANES];
    for chunk in row.chunks(buf.len()) {
        let out = &mut buf[..chunk.len()];
        exp_into(chunk, max, out);
        add_lanes(&mut lanes, out);
    }
    total(lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distance in units in the last place between two finite doubles of
    /// the same sign.
    fn ulps(a: f64, b: f64) -> u64 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn within_one_ulp_of_the_standard_library_on_the_whole_range() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut worst = (0u64, 0.0f64);
        let mut differ = 0usize;
        let n = 2_000_000;
        for i in 0..n {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Half the points on [-708, 0], half on [-20, 0] where the
            // weights that matter lie.
            let span = if i % 2 == 0 { 708.0 } else { 20.0 };
            let v = -span * (x >> 11) as f64 / (1u64 << 53) as f64;
            let d = ulps(exp_le0(v), v.exp());
            differ += usize::from(d > 0);
            if d > worst.0 {
                worst = (d, v);
            }
        }
        assert!(worst.0 <= 1, "{} ulps at x = {:e}", worst.0, worst.1);
        eprintln!("{differ} of {n} differ from std by 1 ulp");
        for v in [0.0, -0.0, -1e-300, -0.5, -1.0, -700.0, -708.0] {
            assert!(ulps(exp_le0(v), v.exp()) <= 1, "x = {v}");
        }
        assert_eq!(exp_le0(0.0), 1.0);
        assert_eq!(exp_le0(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp_le0(-708.5), 0.0);
        assert!(exp_le0(f64::NAN).is_nan());
    }

    #[test]
    fn the_vector_and_plain_loops_and_the_sum_agree_bit_for_bit() {
        let row: Vec<f32> = (0..5000)
            .map(|i| match i % 997 {
                0 => f32::NEG_INFINITY,
                k => ((i * 7919) % 3001) as f32 / 100.0 - 15.0 + k as f32 * 1e-3,
            })
            .collect();
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut fast = vec![0.0; row.len()];
        exp_into(&row, max, &mut fast);
        let mut plain = vec![0.0; row.len()];
        exp_into_plain(&row, max, &mut plain);
        let scalar: Vec<f64> = row.iter().map(|&v| exp_le0(f64::from(v - max))).collect();
        assert_eq!(fast, scalar);
        assert_eq!(plain, scalar);
        let mut lanes = [0.0f64; 4];
        for (i, &w) in scalar.iter().enumerate() {
            lanes[i % 4] += w;
        }
        let want = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
        assert_eq!(sum_weights(&scalar).to_bits(), want.to_bits());
        // Chunks of the row, and a length that is not a multiple of four.
        assert_eq!(sum_exp(&row, max).to_bits(), want.to_bits());
        let odd = &row[..4099];
        assert_eq!(
            sum_exp(odd, max).to_bits(),
            sum_weights(&scalar[..4099]).to_bits()
        );
        // Another rounding of the same sum: each of the two is within
        // (n - 1) ulps of the exact sum of positive terms.
        let in_order = scalar.iter().fold(0.0f64, |s, &w| s + w);
        let bound = 2.0 * row.len() as f64 * f64::EPSILON * in_order;
        assert!((want - in_order).abs() <= bound);
        eprintln!(
            "lanes against row order: {:e} relative",
            (want - in_order).abs() / in_order
        );
    }
}
