//! The int8 dot product every cosine comes from, written so the compiler vectorises it on the
//! baseline target (SSE2's `pmaddwd`: bytes widened to i16, pairs of products summed into i32).

/// Components multiplied per step; a multiple of every vector width up to 256 bits.
const LANES: usize = 32;

/// `a · b`; `a` and `b` have the same length. Exact: 1,280 products of at most 128² stay far
/// below `i32::MAX`. Indexed loops rather than iterator chains, so that unoptimised test builds
/// stay quick too.
#[allow(clippy::needless_range_loop)]
pub(crate) fn dot(a: &[i8], b: &[i8]) -> i32 {
    debug_assert_eq!(a.len(), b.len());
    let whole = a.len() / LANES * LANES;
    let mut total = 0;
    for i in whole..a.len() {
        total += product(a[i], b[i]);
    }
    if whole == 0 {
        return total;
    }
    let mut sums = [0i32; LANES];
    for start in (0..whole).step_by(LANES) {
        let (x, y) = (&a[start..start + LANES], &b[start..start + LANES]);
        for i in 0..LANES {
            sums[i] += product(x[i], y[i]);
        }
    }
    for sum in sums {
        total += sum;
    }
    total
}

/// One product, through i16 as `pmaddwd` computes it (128² fits).
#[inline(always)]
fn product(x: i8, y: i8) -> i32 {
    i32::from(i16::from(x) * i16::from(y))
}

/// The sum of the squared components, for a vector's norm.
pub(crate) fn norm_squared(a: &[i8]) -> i64 {
    a.iter().map(|&x| i64::from(x) * i64::from(x)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[i8], b: &[i8]) -> i32 {
        a.iter().zip(b).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum()
    }

    #[test]
    fn dot_matches_the_naive_sum_at_every_length_and_extreme() {
        for len in [0, 1, 31, 32, 33, 64, 100, 1280, 1283] {
            let a: Vec<i8> = (0..len).map(|i| ((i * 37 + 11) % 256) as u8 as i8).collect();
            let b: Vec<i8> = (0..len).map(|i| ((i * 91 + 5) % 256) as u8 as i8).collect();
            assert_eq!(dot(&a, &b), naive(&a, &b), "len {len}");
        }
        let lowest = vec![i8::MIN; 1280];
        assert_eq!(dot(&lowest, &lowest), 1280 * 128 * 128);
        assert_eq!(norm_squared(&lowest), 1280 * 128 * 128);
    }
}
