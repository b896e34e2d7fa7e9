//! Ranking a row of values, most likely first: the candidates of top-p and
//! the top logprobs the sampler reports.
//!
//! Owns: the order (value by `f32::total_cmp`, largest first; ties: lower
//! index first) and doing it fast on a whole vocabulary. Must not: know what
//! the values mean.

/// The first index of the largest value, and that value (`(0, -inf)` for a
/// row of `-inf` and NaN: a NaN is never the largest). The same answer as a
/// left-to-right scan keeping the first `v > best`, computed as eight such
/// scans over interleaved lanes (which the compiler vectorises) and a search
/// for the first entry equal to their largest. The value returned is that
/// entry's own (so `-0.0` and `0.0` come back as the row has them).
pub(crate) fn argmax(row: &[f32]) -> (usize, f32) {
    const LANES: usize = 8;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = if v > *m { v } else { *m };
        }
    }
    let mut max = f32::NEG_INFINITY;
    for &v in lanes.iter().chain(chunks.remainder()) {
        max = if v > max { v } else { max };
    }
    if max == f32::NEG_INFINITY {
        return (0, max);
    }
    // An entry equal to `max` exists: it was taken from the row.
    let i = row.iter().position(|&v| v == max).unwrap_or(0);
    (i, row[i])
}

/// Indices of the `k` largest values, largest first (ties: lower index first).
///
/// Each value is packed with its index into one `u64` whose integer order is
/// that order: the high half is the value's bits mapped so that unsigned
/// order is `f32::total_cmp` order, inverted for largest first; the low half
/// is the index. Integers select and sort several times faster than a
/// comparator that looks the values up; the whole row (a flat distribution's
/// top-p) is radix-sorted.
pub(crate) fn top_k_of(z: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(z.len());
    let mut keys: Vec<u64> = z
        .iter()
        .enumerate()
        .map(|(i, &v)| (u64::from(!total_order_key(v)) << 32) | i as u64)
        .collect();
    if k == keys.len() {
        // Built in index order, so sorting the high halves stably is
        // sorting the whole keys.
        radix_sort_high_halves(&mut keys);
    } else {
        if k > 0 {
            keys.select_nth_unstable(k - 1);
        }
        keys.truncate(k);
        keys.sort_unstable();
    }
    keys.into_iter().map(|key| key as u32).collect()
}

/// Sorts `keys` by their high 32 bits, stably (least significant byte
/// first, one counting pass per byte; a byte all keys share is skipped).
fn radix_sort_high_halves(keys: &mut Vec<u64>) {
    let mut spare = vec![0u64; keys.len()];
    for shift in [32u32, 40, 48, 56] {
        let mut starts = [0usize; 256];
        for &key in keys.iter() {
            starts[(key >> shift) as usize & 0xff] += 1;
        }
        if starts.contains(&keys.len()) {
            continue;
        }
        let mut next = 0;
        for slot in starts.iter_mut() {
            let count = *slot;
            *slot = next;
            next += count;
        }
        for &key in keys.iter() {
            let digit = (key >> shift) as usize & 0xff;
            spare[starts[digit]] = key;
            starts[digit] += 1;
        }
        std::mem::swap(keys, &mut spare);
    }
}

/// `f32` bits as a `u32` whose unsigned order is `f32::total_cmp`'s order.
fn total_order_key(v: f32) -> u32 {
    let bits = v.to_bits();
    if bits >> 31 == 1 {
        !bits
    } else {
        bits | 1 << 31
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan [`argmax`] must agree with.
    fn argmax_scan(row: &[f32]) -> (usize, f32) {
        row.iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 {
                    (i, v)
                } else {
                    best
                }
            })
    }

    #[test]
    fn argmax_is_the_first_largest_as_a_scan_finds_it() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let specials = [f32::NAN, f32::NEG_INFINITY, f32::INFINITY, 0.0, -0.0, 1.0];
        for case in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 70) as usize;
            let row: Vec<f32> = (0..len)
                .map(|i| {
                    let h = (x >> (i % 50)) ^ (i as u64).wrapping_mul(0x2545_f491);
                    match h % 11 {
                        0 => specials[(h / 11 % 6) as usize],
                        // Few distinct values, so ties are common.
                        k => (k % 4) as f32 - 2.0 + if case % 2 == 0 { 0.0 } else { 0.5 },
                    }
                })
                .collect();
            let (i, v) = argmax(&row);
            let (wi, wv) = argmax_scan(&row);
            assert_eq!((i, v.to_bits()), (wi, wv.to_bits()), "{row:?}");
        }
        assert_eq!(argmax(&[]), (0, f32::NEG_INFINITY));
        assert_eq!(argmax(&[f32::NAN; 9]).0, 0);
    }

    #[test]
    fn top_k_of_orders_by_value_then_index_as_total_cmp_does() {
        let z = [
            1.0f32,
            -0.0,
            0.0,
            f32::NEG_INFINITY,
            2.5,
            1.0,
            -3.0,
            f32::INFINITY,
            -0.0,
            f32::MIN_POSITIVE,
        ];
        let mut want: Vec<u32> = (0..z.len() as u32).collect();
        want.sort_by(|&a, &b| z[b as usize].total_cmp(&z[a as usize]).then(a.cmp(&b)));
        for k in 0..=z.len() {
            assert_eq!(top_k_of(&z, k), want[..k], "k = {k}");
        }
    }

    #[test]
    fn the_radix_sort_orders_keys_as_an_integer_sort_does() {
        // Keys in index order, with many equal high halves (ties) and
        // high halves that share bytes (skipped passes).
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for n in [0usize, 1, 2, 300, 5000] {
            let mut keys: Vec<u64> = (0..n as u64)
                .map(|i| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let high = 0x8000_0000u64 | ((x % 97) << 8) | ((x >> 40) % 3);
                    (high << 32) | i
                })
                .collect();
            let mut want = keys.clone();
            want.sort_unstable();
            radix_sort_high_halves(&mut keys);
            assert_eq!(keys, want, "n = {n}");
        }
    }
}
