//! `exp` over a slice of non-positive numbers, in a form the compiler
//! vectorises: the softmax's Monte Carlo draws spend most of their time in
//! `exp` (10 classes × 128 draws a point), and libm's is one value at a time.
//!
//! `2^n · e^r` with `n` the nearest integer to `x / ln 2` and `|r| ≤ ln2 / 2`,
//! `e^r` by its Taylor series to degree 13 (truncation below 4e-18),
//! evaluated as a shallow tree of fused multiply–adds: within 3e-16 of the
//! correctly rounded value. Every operation is correctly rounded IEEE
//! arithmetic (`mul_add` is one rounding on every machine: FMA where the
//! CPU has it, libm's `fma` where not), so the vector path and the
//! portable one give the same bits: results do not depend on the machine's
//! vector width.
#![allow(clippy::excessive_precision)]

use std::f64::consts::LOG2_E;

/// `ln 2` split so that `n · LN2_HI` is exact for every `n` used here.
const LN2_HI: f64 = 6.931_471_803_691_238_164_90e-01;
const LN2_LO: f64 = 1.908_214_929_270_587_700_02e-10;
/// `1.5 · 2⁵²`: adding it rounds to an integer held in the low mantissa bits.
const ROUNDER: f64 = 6_755_399_441_055_744.0;
/// Below this `e^x` is subnormal; such values count as `e^−708 ≈ 3e−308`.
const LOWEST: f64 = -708.0;

/// `e^x`, `x ≤ 0` (larger `x` would overflow the scale); NaN stays NaN.
/// Inlined, so that a caller compiled for AVX2 takes it four at a time.
#[inline(always)]
pub fn exp_nonpositive(x: f64) -> f64 {
    let x = if x < LOWEST { LOWEST } else { x };
    let shifted = x * LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    // 1 + r + r²·t(r) with t = Σ r^(k−2)/k! for k = 2 … 13, t by Estrin's
    // scheme: its terms in pairs, then pairs of pairs, four deep. Horner's
    // 13 dependent steps kept the kernel's profile waiting on latency (this
    // tree took `K(Z, X)` to two thirds of its time); the last steps stay
    // Horner's, which keeps the rounding near half an ulp.
    const C: [f64; 12] = [
        1.0 / 2.0,
        1.0 / 6.0,
        1.0 / 24.0,
        1.0 / 120.0,
        1.0 / 720.0,
        1.0 / 5_040.0,
        1.0 / 40_320.0,
        1.0 / 362_880.0,
        1.0 / 3_628_800.0,
        1.0 / 39_916_800.0,
        1.0 / 479_001_600.0,
        1.0 / 6_227_020_800.0,
    ];
    let r2 = r * r;
    let r4 = r2 * r2;
    let r8 = r4 * r4;
    let pair = |k: usize| C[k + 1].mul_add(r, C[k]);
    let low = pair(6).mul_add(r2, pair(4)).mul_add(r4, pair(2).mul_add(r2, pair(0)));
    let high = pair(10).mul_add(r2, pair(8));
    let t = high.mul_add(r8, low);
    let series = 1.0 + r2.mul_add(t, r);
    // 2^n from n's bits: the exponent field is n + 1023.
    let n_bits = shifted.to_bits().wrapping_sub(ROUNDER.to_bits());
    series * f64::from_bits(n_bits.wrapping_add(1023) << 52)
}

/// Whether the CPU runs code compiled for `avx2,fma`: what every vector
/// path around [`exp_nonpositive`] is compiled for (its multiply–adds fused).
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// `x ← e^x` for every `x ≤ 0` of `xs`.
pub fn exp_nonpositive_in_place(xs: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA, checked just above.
        unsafe { exp_in_place_avx2(xs) };
        return;
    }
    exp_in_place(xs);
}

fn exp_in_place(xs: &mut [f64]) {
    for x in xs {
        *x = exp_nonpositive(*x);
    }
}

/// The same loop, compiled for four lanes at a time with fused multiply–adds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_in_place_avx2(xs: &mut [f64]) {
    for x in xs {
        *x = exp_nonpositive(*x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_libm_to_the_last_bits() {
        let xs: Vec<f64> = (0..200_000).map(|i| -(i as f64) * 0.003_541_7).collect();
        let mut got = xs.clone();
        exp_nonpositive_in_place(&mut got);
        for (&x, &e) in xs.iter().zip(&got) {
            let want = x.exp();
            if want > 1e-300 {
                assert!(((e - want) / want).abs() < 3e-16, "exp({x}) = {e}, libm {want}");
            }
        }
        let mut edges = [0.0, -0.0, -1e-300, -745.0, f64::NEG_INFINITY, f64::NAN];
        exp_nonpositive_in_place(&mut edges);
        assert_eq!(&edges[..3], &[1.0, 1.0, 1.0]);
        assert!(edges[3..5].iter().all(|&e| (0.0..1e-307).contains(&e)), "{edges:?}");
        assert!(edges[5].is_nan(), "a NaN must not pass for a probability");
    }

    #[test]
    fn every_path_gives_the_same_bits() {
        let xs: Vec<f64> = (0..4099).map(|i| -((i * 7919) % 40_000) as f64 / 97.0).collect();
        let (mut dispatched, mut portable) = (xs.clone(), xs);
        exp_nonpositive_in_place(&mut dispatched);
        exp_in_place(&mut portable);
        assert!(dispatched
            .iter()
            .zip(&portable)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
