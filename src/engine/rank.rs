//! Ranking a row of values, most likely first: the candidates of top-p and
//! the top logprobs the sampler reports.
//!
//! Owns: the order (value by `f32::total_cmp`, largest first; ties: lower
//! index first) and doing it fast on a whole vocabulary. Must not: know what
//! the values mean.

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
