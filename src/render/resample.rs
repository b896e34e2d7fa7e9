//! Bicubic resize of an 8-bit RGB image that gives the bytes Pillow's
//! `Image.resize(size, BICUBIC)` gives (Pillow 13, `src/libImaging/Resample.c`):
//! a separable convolution whose support grows with the downscale factor,
//! weights computed in f64, normalised to sum 1, then rounded to fixed
//! point with 22 fractional bits (`PRECISION_BITS = 32 - 8 - 2`); each pass
//! rounds and clips to u8. Written from that algorithm, not ported code.
//!
//! The u8 rounding between the passes makes their order visible, so it is
//! Pillow's ([`resize_bicubic`]).

/// Fractional bits of the fixed-point weights.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Pillow's bicubic kernel (Keys, a = -0.5).
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The taps of one output sample: the first input index and its weights.
struct Taps {
    first: usize,
    weights: Vec<i32>,
}

/// Fixed-point weights for resampling `input` samples to `output` ones, in
/// Pillow's arithmetic (the same f64 operations in the same order).
fn taps(input: usize, output: usize) -> Vec<Taps> {
    let scale = input as f64 / output as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let inv = 1.0 / filterscale;
    (0..output)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // C's `(int)` truncates toward zero; both ends are clamped.
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(input as i64).max(0) as usize;
            let hi = hi.max(lo);
            let raw: Vec<f64> = (lo..hi)
                .map(|x| bicubic((x as f64 - center + 0.5) * inv))
                .collect();
            let mut total = 0.0;
            for w in &raw {
                total += w;
            }
            let one = f64::from(1u32 << PRECISION_BITS);
            let weights = raw
                .iter()
                .map(|&w| {
                    let w = if total != 0.0 { w / total } else { w };
                    if w < 0.0 {
                        (-0.5 + w * one) as i32
                    } else {
                        (0.5 + w * one) as i32
                    }
                })
                .collect();
            Taps { first: lo, weights }
        })
        .collect()
}

/// Rounds a fixed-point sum back to a byte, clipping as Pillow does.
fn clip(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// An RGB image, 3 bytes a pixel, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Resamples each row to `width` pixels.
fn horizontal(src: &Rgb8, width: usize) -> Rgb8 {
    let taps = taps(src.width, width);
    let mut data = Vec::with_capacity(width * src.height * 3);
    for row in src.data.chunks_exact(src.width * 3) {
        for t in &taps {
            let mut sum = [1i32 << (PRECISION_BITS - 1); 3];
            for (i, &w) in t.weights.iter().enumerate() {
                let px = &row[(t.first + i) * 3..(t.first + i) * 3 + 3];
                for c in 0..3 {
                    sum[c] += i32::from(px[c]) * w;
                }
            }
            data.extend(sum.map(clip));
        }
    }
    Rgb8 {
        width,
        height: src.height,
        data,
    }
}

/// Resamples each column to `height` pixels.
fn vertical(src: &Rgb8, height: usize) -> Rgb8 {
    let taps = taps(src.height, height);
    let stride = src.width * 3;
    let mut data = Vec::with_capacity(stride * height);
    let mut sums = vec![0i32; stride];
    for t in &taps {
        sums.fill(1 << (PRECISION_BITS - 1));
        for (i, &w) in t.weights.iter().enumerate() {
            let row = &src.data[(t.first + i) * stride..(t.first + i + 1) * stride];
            for (s, &v) in sums.iter_mut().zip(row) {
                *s += i32::from(v) * w;
            }
        }
        data.extend(sums.iter().map(|&s| clip(s)));
    }
    Rgb8 {
        width: src.width,
        height,
        data,
    }
}

/// `src` resized to `width` x `height` as Pillow's bicubic resize does; the
/// same size is a copy. Both sizes must be positive.
pub fn resize_bicubic(src: &Rgb8, width: usize, height: usize) -> Rgb8 {
    let mut out = std::borrow::Cow::Borrowed(src);
    let horizontal_pass = width != src.width;
    let vertical_pass = height != src.height;
    if vertical_first(src.width, src.height, width, height) {
        out = std::borrow::Cow::Owned(vertical(&out, height));
        if horizontal_pass {
            out = std::borrow::Cow::Owned(horizontal(&out, width));
        }
    } else {
        if horizontal_pass {
            out = std::borrow::Cow::Owned(horizontal(&out, width));
        }
        if vertical_pass {
            out = std::borrow::Cow::Owned(vertical(&out, height));
        }
    }
    out.into_owned()
}

/// Pillow 13.0.0's pass order (src/libImaging/Resample.c, lines 863-867 in
/// `ImagingResampleInner`): the vertical pass first when the height loses
/// rows and loses more than twice as many as the width loses columns (a
/// width that grows loses a negative number); otherwise horizontal first.
/// Each pass runs only when its size changes (lines 860-861).
fn vertical_first(w_in: usize, h_in: usize, w: usize, h: usize) -> bool {
    let lost_rows = h_in as i64 - h as i64;
    let lost_columns = w_in as i64 - w as i64;
    lost_rows > 0 && lost_rows > 2 * lost_columns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(10, 3), (3, 10), (1000, 28), (7, 7), (1, 56)] {
            for t in taps(i, o) {
                let sum: i32 = t.weights.iter().sum();
                // Rounding each weight moves the sum by at most half a unit each.
                assert!((sum - (1 << PRECISION_BITS)).abs() <= t.weights.len() as i32);
                assert!(t.first + t.weights.len() <= i);
            }
        }
    }

    /// A noisy `w` x `h` image, so rounding between the passes shows.
    fn noise(w: usize, h: usize) -> Rgb8 {
        let mut x = 12345u32;
        let data = (0..w * h * 3)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                (x >> 16) as u8
            })
            .collect();
        Rgb8 {
            width: w,
            height: h,
            data,
        }
    }

    #[test]
    fn the_pass_order_switches_past_twice_the_lost_columns() {
        // 285 -> 280 loses 5 columns; 234 -> 224 loses 10 rows, exactly
        // twice: horizontal first. 235 -> 224 loses 11: vertical first.
        for (h_in, vertical_wins) in [(234, false), (235, true)] {
            let src = noise(285, h_in);
            let h_first = vertical(&horizontal(&src, 280), 224);
            let v_first = horizontal(&vertical(&src, 224), 280);
            assert_ne!(
                h_first, v_first,
                "the orders must differ for the test to tell"
            );
            let want = if vertical_wins { v_first } else { h_first };
            assert_eq!(resize_bicubic(&src, 280, 224), want, "height {h_in}");
        }
        // A height that grows never goes first; one that shrinks does when
        // the width grows (it loses a negative number of columns).
        assert!(!vertical_first(10, 10, 10, 20));
        assert!(!vertical_first(10, 10, 5, 20));
        assert!(vertical_first(10, 20, 30, 19));
        assert!(vertical_first(100, 3000, 56, 2436));
    }

    #[test]
    fn same_size_and_flat_images_are_kept() {
        let flat = Rgb8 {
            width: 5,
            height: 3,
            data: [10u8, 200, 30].repeat(15),
        };
        assert_eq!(resize_bicubic(&flat, 5, 3), flat);
        let big = resize_bicubic(&flat, 56, 28);
        assert_eq!(big.data, [10u8, 200, 30].repeat(56 * 28));
        let small = resize_bicubic(&flat, 2, 1);
        assert_eq!(small.data, [10u8, 200, 30].repeat(2));
    }
}
