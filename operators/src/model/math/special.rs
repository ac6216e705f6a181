//! Special functions the likelihoods need, to ~1e-15 relative accuracy,
//! hand-written for the scaled forms (log Φ with its Mills ratio far in the
//! tails, log-sigmoid split into parts) that no crate gives to that accuracy.
#![allow(clippy::excessive_precision)] // published coefficients kept verbatim

use std::f64::consts::{FRAC_1_SQRT_2, PI};

const FRAC_1_SQRT_PI: f64 = 0.564_189_583_547_756_286_948_079_451_560_772_585_844;
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_677_939_946_059_934_381_868_476;
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_355_879_892_119_868_763_736_951;
const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_741_780_329_736_405_617_639_861;

/// `log Γ(x)`: Lanczos (g = 7, 9 terms) for `x ≥ ½`, reflection below.
pub(crate) fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_93,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_13,
        -176.615_029_162_140_59,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_571_6e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Γ(x) Γ(1 − x) = π / sin(πx); infinite at the poles x = 0, −1, ….
        return (PI / (PI * x).sin().abs()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + G + 0.5;
    let series = C[1..]
        .iter()
        .enumerate()
        .fold(C[0], |acc, (i, c)| acc + c / (x + (i + 1) as f64));
    LN_SQRT_2PI + (x + 0.5) * t.ln() - t + series.ln()
}

/// `ψ(x) = d log Γ / dx`: recurrence up to `x ≥ 10`, then the asymptotic series.
pub(crate) fn digamma(x: f64) -> f64 {
    if x <= 0.0 {
        if x == x.floor() {
            return f64::NAN;
        }
        // ψ(1 − x) − ψ(x) = π cot(πx).
        return digamma(1.0 - x) - PI / (PI * x).tan();
    }
    let (mut x, mut acc) = (x, 0.0);
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let w = 1.0 / (x * x);
    // −Σ B_2k / (2k x^2k), k = 1..6.
    let tail = w
        * (1.0 / 12.0
            - w * (1.0 / 120.0 - w * (1.0 / 252.0 - w * (1.0 / 240.0 - w * (1.0 / 132.0 - w * 691.0 / 32760.0)))));
    acc + x.ln() - 0.5 / x - tail
}

/// `exp(z²) erfc(z)` for `z ≥ 0` (W. J. Cody's rational Chebyshev approximations).
pub(crate) fn erfcx(z: f64) -> f64 {
    debug_assert!(z >= 0.0 || z.is_nan());
    const A: [f64; 5] = [
        3.16112374387056560e00,
        1.13864154151050156e02,
        3.77485237685302021e02,
        3.20937758913846947e03,
        1.85777706184603153e-1,
    ];
    const B: [f64; 4] = [
        2.36012909523441209e01,
        2.44024637934444173e02,
        1.28261652607737228e03,
        2.84423683343917062e03,
    ];
    const C: [f64; 9] = [
        5.64188496988670089e-1,
        8.88314979438837594e00,
        6.61191906371416295e01,
        2.98635138197400131e02,
        8.81952221241769090e02,
        1.71204761263407058e03,
        2.05107837782607147e03,
        1.23033935479799725e03,
        2.15311535474403846e-8,
    ];
    const D: [f64; 8] = [
        1.57449261107098347e01,
        1.17693950891312499e02,
        5.37181101862009858e02,
        1.62138957456669019e03,
        3.29079923573345963e03,
        4.36261909014324716e03,
        3.43936767414372164e03,
        1.23033935480374942e03,
    ];
    const P: [f64; 6] = [
        3.05326634961232344e-1,
        3.60344899949804439e-1,
        1.25781726111229246e-1,
        1.60837851487422766e-2,
        6.58749161529837803e-4,
        1.63153871373020978e-2,
    ];
    const Q: [f64; 5] = [
        2.56852019228982242e00,
        1.87295284992346047e00,
        5.27905102951428412e-1,
        6.05183413124413191e-2,
        2.33520497626869185e-3,
    ];
    if z <= 0.46875 {
        let zz = z * z;
        zz.exp() * (1.0 - erf_small(z, zz, &A, &B))
    } else if z <= 4.0 {
        let (mut num, mut den) = (C[8] * z, z);
        for i in 0..7 {
            num = (num + C[i]) * z;
            den = (den + D[i]) * z;
        }
        (num + C[7]) / (den + D[7])
    } else if z >= 6.71e7 {
        FRAC_1_SQRT_PI / z
    } else {
        let w = 1.0 / (z * z);
        let (mut num, mut den) = (P[5] * w, w);
        for i in 0..4 {
            num = (num + P[i]) * w;
            den = (den + Q[i]) * w;
        }
        (FRAC_1_SQRT_PI - w * (num + P[4]) / (den + Q[4])) / z
    }
}

/// `erf(z)` for `|z| ≤ 0.46875` (Cody's first interval).
fn erf_small(z: f64, zz: f64, a: &[f64; 5], b: &[f64; 4]) -> f64 {
    let (mut num, mut den) = (a[4] * zz, zz);
    for i in 0..3 {
        num = (num + a[i]) * zz;
        den = (den + b[i]) * zz;
    }
    z * (num + a[3]) / (den + b[3])
}

/// `erfc(z)` for `z ≥ 0`; `exp(−z²)` is split as Cody does to keep
/// relative accuracy in the far tail.
pub(crate) fn erfc(z: f64) -> f64 {
    let head = (z * 16.0).trunc() / 16.0;
    let del = (z - head) * (z + head);
    (-head * head).exp() * (-del).exp() * erfcx(z)
}

/// Standard normal CDF `Φ(x)`.
pub(crate) fn ndtr(x: f64) -> f64 {
    if x < 0.0 {
        0.5 * erfc(-x * FRAC_1_SQRT_2)
    } else {
        1.0 - 0.5 * erfc(x * FRAC_1_SQRT_2)
    }
}

/// `(log Φ(x), φ(x)/Φ(x))`, finite for all finite `x`: for `x < 0` both
/// come from `erfcx`, so nothing underflows even at `x = −40`.
pub(crate) fn log_ndtr_and_mills(x: f64) -> (f64, f64) {
    if x < 0.0 {
        let s = erfcx(-x * FRAC_1_SQRT_2);
        (-0.5 * x * x + (0.5 * s).ln(), SQRT_2_OVER_PI / s)
    } else {
        // One exp serves both the density and the upper tail (hot path).
        let gauss = (-0.5 * x * x).exp();
        let upper = 0.5 * gauss * erfcx(x * FRAC_1_SQRT_2);
        ((-upper).ln_1p(), FRAC_1_SQRT_2PI * gauss / (1.0 - upper))
    }
}

pub(crate) fn log_ndtr(x: f64) -> f64 {
    log_ndtr_and_mills(x).0
}

/// `log(1 + eˣ)` without overflow or loss for large `|x|`.
pub(crate) fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// `(log σ(x), σ(−x), σ(x) σ(−x))` from a single exp, accurate in both tails.
pub(crate) fn log_sigmoid_parts(x: f64) -> (f64, f64, f64) {
    let e = (-x.abs()).exp();
    let complement = if x >= 0.0 { e / (1.0 + e) } else { 1.0 / (1.0 + e) };
    (x.min(0.0) - e.ln_1p(), complement, e / ((1.0 + e) * (1.0 + e)))
}

/// `1 / (1 + e⁻ˣ)` without overflow.
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}
