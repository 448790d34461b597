//! How a GPU multiplies the convolutions' matrices (`--precision`): f32 (the CPU's arithmetic, the
//! default), TF32 (cuBLAS's tensor-core mode for f32 data: inputs rounded to a 10-bit mantissa inside
//! the multiply) or bf16 (inputs stored as bfloat16, products summed in f32). Everything else — the
//! weights the optimizer keeps, the gradients, the norms, the losses — stays f32, so there is no loss
//! scaler to tune. The CPU always computes in f32.
//!
//! [`round_to_bf16`] is the CPU twin of the device's rounding (`round_to_bf16` in `kernels/cuda/conv.cu`),
//! with which the selftest builds the exact inputs a bf16 GEMM multiplies; [`round_to_tf32`] the twin
//! of `tf32_round` there (`cvt.rna.tf32.f32`), which the tensor-core 3×3 convolutions apply to their
//! inputs as they stage them.

/// The convolutions' matrix precision on a GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Tf32,
    Bf16,
}

impl Precision {
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::Tf32, Precision::Bf16];

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
        }
    }

    /// `f32`, `tf32` or `bf16`.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| format!("unknown precision '{name}' (known: f32, tf32, bf16)"))
    }
}

/// `x` rounded to the nearest bfloat16 (ties to even), as the f32 it widens back to: the upper 16 bits
/// of the rounded value. NaN stays NaN (quiet), infinities stay, values past bf16's largest finite
/// value round to infinity, as IEEE rounding does.
pub fn round_to_bf16(x: f32) -> f32 {
    f32::from_bits((bf16_bits(x) as u32) << 16)
}

/// The bfloat16 bit pattern nearest `x` (see [`round_to_bf16`]).
pub fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 0x0040) as u16;
    }
    let rounded = u.wrapping_add(0x7fff + ((u >> 16) & 1));
    (rounded >> 16) as u16
}

/// `x` rounded to TF32 as `cvt.rna.tf32.f32` rounds it: to 10 stored mantissa bits, to nearest, ties
/// away from zero (half a TF32 step added to the magnitude, the low 13 bits cleared). The carry may
/// run into the exponent, up to infinity. NaN and infinities pass through (the device may clear a
/// NaN's low payload bits, which can turn it into an infinity: non-finite either way; the selftest
/// compares finite inputs).
pub fn round_to_tf32(x: f32) -> f32 {
    let u = x.to_bits();
    if u & 0x7f80_0000 == 0x7f80_0000 {
        return x;
    }
    f32::from_bits(u.wrapping_add(0x1000) & !0x1fff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_names_parse_back_and_unknown_ones_are_refused() {
        for p in Precision::ALL {
            assert_eq!(Precision::parse(p.name()), Ok(p));
        }
        assert_eq!(Precision::default(), Precision::F32);
        let err = Precision::parse("fp16").unwrap_err();
        assert!(err.contains("'fp16'") && err.contains("bf16"), "{err}");
    }

    /// Hand-derived: bf16 keeps 8 significant bits (7 stored), so between 1 and 2 its step is 2⁻⁷.
    #[test]
    fn bf16_rounds_to_nearest_with_ties_to_even() {
        let step = 2f32.powi(-7);
        // Exactly representable values pass through.
        for x in [0.0f32, -0.0, 1.0, -2.5, 1.0 + step, 3.0 * 2f32.powi(-100)] {
            assert_eq!(round_to_bf16(x).to_bits(), x.to_bits(), "{x}");
        }
        // Below half a step rounds down, above rounds up.
        assert_eq!(round_to_bf16(1.0 + 0.49 * step), 1.0);
        assert_eq!(round_to_bf16(1.0 + 0.51 * step), 1.0 + step);
        // Ties go to the even neighbour: 1 + ½ step → 1 (even), 1 + 1½ steps → 1 + 2 steps (even).
        assert_eq!(round_to_bf16(1.0 + 0.5 * step), 1.0);
        assert_eq!(round_to_bf16(1.0 + 1.5 * step), 1.0 + 2.0 * step);
        assert_eq!(round_to_bf16(-(1.0 + 1.5 * step)), -(1.0 + 2.0 * step));
        // The carry runs into the exponent: just below 2 rounds to 2.
        assert_eq!(round_to_bf16(2.0 - 0.25 * step), 2.0);
        // Specials: infinities stay, NaN stays NaN, f32's largest finite value overflows to infinity.
        assert_eq!(round_to_bf16(f32::INFINITY), f32::INFINITY);
        assert_eq!(round_to_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(round_to_bf16(f32::NAN).is_nan());
        assert!(
            round_to_bf16(f32::from_bits(0x7f80_0001)).is_nan(),
            "a NaN whose payload is in the low bits"
        );
        assert_eq!(round_to_bf16(f32::MAX), f32::INFINITY);
        // The relative error is at most half a step of the value's binade.
        let mut x = 0.1f32;
        for _ in 0..1000 {
            let r = round_to_bf16(x);
            assert!(((r - x) / x).abs() <= 2f32.powi(-8), "{x} → {r}");
            x *= 1.0137;
        }
    }

    /// Hand-derived: TF32 keeps 11 significant bits (10 stored), so between 1 and 2 its step is 2⁻¹⁰;
    /// halves go away from zero (not to even, as bf16's do).
    #[test]
    fn tf32_rounds_to_nearest_with_ties_away_from_zero() {
        let step = 2f32.powi(-10);
        for x in [0.0f32, -0.0, 1.0, -2.5, 1.0 + step, 3.0 * 2f32.powi(-100)] {
            assert_eq!(round_to_tf32(x).to_bits(), x.to_bits(), "{x}");
        }
        assert_eq!(round_to_tf32(1.0 + 0.49 * step), 1.0);
        assert_eq!(round_to_tf32(1.0 + 0.51 * step), 1.0 + step);
        // Ties: 1 + ½ step → 1 + step (away from zero, though 1 is the even neighbour), and the same
        // below zero; 1 + 1½ steps → 1 + 2 steps.
        assert_eq!(round_to_tf32(1.0 + 0.5 * step), 1.0 + step);
        assert_eq!(round_to_tf32(-(1.0 + 0.5 * step)), -(1.0 + step));
        assert_eq!(round_to_tf32(1.0 + 1.5 * step), 1.0 + 2.0 * step);
        assert_eq!(round_to_tf32(2.0 - 0.25 * step), 2.0);
        assert_eq!(round_to_tf32(f32::INFINITY), f32::INFINITY);
        assert!(round_to_tf32(f32::NAN).is_nan());
        assert_eq!(round_to_tf32(f32::MAX), f32::INFINITY);
        let mut x = 0.1f32;
        for _ in 0..1000 {
            let r = round_to_tf32(x);
            assert!(((r - x) / x).abs() <= 2f32.powi(-11), "{x} → {r}");
            assert_eq!(r.to_bits() & 0x1fff, 0, "{x} → {r}: low bits left");
            x *= 1.0137;
        }
    }
}
