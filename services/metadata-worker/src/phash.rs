//! A 64-bit perceptual hash (DCT pHash): the image as 32×32 grey levels, its 2-D DCT-II, and one
//! bit per coefficient of the 8×8 lowest frequencies, set when the coefficient is above their
//! median (the variant of the Python `imagehash.phash`). Similar images have hashes a few bits
//! apart; rescaling, recompression and brightness changes move few bits.

use std::f64::consts::PI;

use image::DynamicImage;
use image::imageops::FilterType;

const SIZE: usize = 32;
const LOW: usize = 8;
/// Coefficients within this of zero count as zero, so rounding noise cannot flip bits.
const EPSILON: f64 = 1e-9;

/// The perceptual hash of `image`. Bit 63 is the DC coefficient, then row by row (vertical
/// frequency `v`, horizontal frequency `u`): bit `63 - (8v + u)`.
pub fn phash(image: &DynamicImage) -> u64 {
    let grey = image.resize_exact(SIZE as u32, SIZE as u32, FilterType::Triangle).into_luma8();
    let pixels: Vec<f64> = grey.pixels().map(|p| f64::from(p.0[0])).collect();
    hash_of(&dct_low(&pixels))
}

/// The hash as 16 lowercase hex digits.
pub fn to_hex(hash: u64) -> String {
    format!("{hash:016x}")
}

/// The 8×8 lowest-frequency coefficients (row-major by vertical frequency) of the orthonormal
/// 2-D DCT-II of a 32×32 grid.
fn dct_low(pixels: &[f64]) -> [f64; LOW * LOW] {
    let basis = |k: usize, n: usize| {
        let scale = if k == 0 { (1.0 / SIZE as f64).sqrt() } else { (2.0 / SIZE as f64).sqrt() };
        scale * (PI * (2 * n + 1) as f64 * k as f64 / (2 * SIZE) as f64).cos()
    };
    let table: Vec<[f64; SIZE]> = (0..LOW).map(|k| std::array::from_fn(|n| basis(k, n))).collect();

    // Rows first: for each row y, its 8 horizontal coefficients.
    let mut rows = [[0.0; LOW]; SIZE];
    for (y, row) in rows.iter_mut().enumerate() {
        for (u, coefficient) in row.iter_mut().enumerate() {
            *coefficient = (0..SIZE).map(|x| pixels[y * SIZE + x] * table[u][x]).sum();
        }
    }
    let mut low = [0.0; LOW * LOW];
    for v in 0..LOW {
        for u in 0..LOW {
            let value: f64 = (0..SIZE).map(|y| rows[y][u] * table[v][y]).sum();
            low[v * LOW + u] = if value.abs() < EPSILON { 0.0 } else { value };
        }
    }
    low
}

fn hash_of(coefficients: &[f64; LOW * LOW]) -> u64 {
    let mut sorted = *coefficients;
    sorted.sort_by(f64::total_cmp);
    let median = (sorted[LOW * LOW / 2 - 1] + sorted[LOW * LOW / 2]) / 2.0;
    coefficients.iter().enumerate().filter(|(_, c)| **c > median).fold(0, |hash, (i, _)| hash | (1 << (63 - i)))
}

#[cfg(test)]
mod tests {
    use image::{GrayImage, Luma};

    use super::*;

    fn distance(a: u64, b: u64) -> u32 {
        (a ^ b).count_ones()
    }

    fn grey(width: u32, height: u32, f: impl Fn(f64, f64) -> f64) -> DynamicImage {
        let image = GrayImage::from_fn(width, height, |x, y| {
            let v = f(f64::from(x) / f64::from(width), f64::from(y) / f64::from(height));
            Luma([(v * 255.0).round().clamp(0.0, 255.0) as u8])
        });
        DynamicImage::ImageLuma8(image)
    }

    /// Bit of coefficient (vertical `v`, horizontal `u`).
    fn bit(hash: u64, v: usize, u: usize) -> bool {
        hash & (1 << (63 - (v * LOW + u))) != 0
    }

    #[test]
    fn a_left_right_step_sets_only_dc_and_odd_horizontal_bits() {
        // Dark left half, bright right half: the DCT is zero off the first row and at even u > 0;
        // on the first row, odd u alternate in sign starting negative (u = 1: cosine is positive
        // on the dark side), so of them u = 3 and u = 7 are set.
        let step = phash(&grey(256, 256, |x, _| if x < 0.5 { 0.0 } else { 1.0 }));
        let set: Vec<(usize, usize)> =
            (0..LOW).flat_map(|v| (0..LOW).map(move |u| (v, u))).filter(|&(v, u)| bit(step, v, u)).collect();
        assert_eq!(set, [(0, 0), (0, 3), (0, 7)], "{}", to_hex(step));
        assert_eq!(to_hex(step), "9100000000000000");

        // Mirrored, the odd coefficients change sign: u = 1 and u = 5 instead.
        let mirrored = phash(&grey(256, 256, |x, _| if x < 0.5 { 1.0 } else { 0.0 }));
        assert_eq!(to_hex(mirrored), "c400000000000000");
        // Turned a quarter, the pattern moves to the first column.
        let turned = phash(&grey(256, 256, |_, y| if y < 0.5 { 0.0 } else { 1.0 }));
        assert!(bit(turned, 3, 0) && bit(turned, 7, 0) && !bit(turned, 0, 3));
    }

    #[test]
    fn rescaling_and_brightening_keep_the_hash_close() {
        let scene = |x: f64, y: f64| {
            0.5 + 0.2 * (5.0 * x + 1.0).sin() * (3.0 * y).cos() + 0.15 * (x - y) + 0.1 * (11.0 * x * y).sin()
        };
        let original = phash(&grey(640, 480, scene));
        let smaller = phash(&grey(160, 120, scene));
        let brighter = phash(&grey(640, 480, |x, y| scene(x, y) + 0.08));
        let other = phash(&grey(640, 480, |x, y| 0.5 + 0.4 * (9.0 * y).sin() * (2.0 * x + 1.0).cos()));
        assert!(distance(original, smaller) <= 4, "{} vs {}", to_hex(original), to_hex(smaller));
        assert!(distance(original, brighter) <= 4, "{} vs {}", to_hex(original), to_hex(brighter));
        assert!(distance(original, other) >= 20, "{} vs {}", to_hex(original), to_hex(other));
    }

    #[test]
    fn hex_has_sixteen_digits() {
        assert_eq!(to_hex(1), "0000000000000001");
        assert_eq!(to_hex(u64::MAX), "ffffffffffffffff");
    }
}
