//! The float type every op is generic over, and the fixed-order reductions they share.
//!
//! Training runs in `f32`; the finite-difference tests run the very same code in `f64`. The trait is
//! deliberately small (no num-traits): the arithmetic operators plus the handful of functions the ops use.
//!
//! Determinism: every reduction in `ops` goes through [`LaneSums`] or a plain sequential loop, so the order in
//! which values are added is a function of the data length only — never of the thread count or the number
//! of envs. Rust never reassociates or contracts float arithmetic (no fast-math, no implicit FMA), and an
//! explicit [`Real::mul_add`] is exactly rounded everywhere, so the same source order gives the same bits
//! whatever SIMD width the compiler picks.

use std::cell::RefCell;
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

/// A real number type the ops run on: `f32` for training, `f64` for gradient checks.
pub trait Real:
    Copy
    + Send
    + Sync
    + Debug
    + Default
    + PartialOrd
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
{
    const ZERO: Self;
    const ONE: Self;
    const HALF: Self;

    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_usize(n: usize) -> Self {
        Self::from_f64(n as f64)
    }
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn tanh(self) -> Self;
    fn sqrt(self) -> Self;
    fn abs(self) -> Self;
    /// `self · a + b` with a single rounding (fused multiply-add). Exactly rounded on every platform (in
    /// hardware where the CPU has FMA, in software otherwise), so results do not depend on the machine.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// The larger of the two (IEEE `maxNum`: a NaN loses to a number).
    fn max(self, other: Self) -> Self;
    fn is_nan(self) -> bool;
    /// The smaller of the two (IEEE `minNum`).
    fn min(self, other: Self) -> Self;

    /// Runs `f` on this thread's reusable scratch buffer, grown to at least `len` elements.
    ///
    /// The contents are whatever the previous user left: callers must write before they read. The buffer
    /// lives as long as the thread (rayon's workers live as long as the pool), so after the first call of
    /// a given size no op allocates. Not re-entrant: `f` must not call another op that uses scratch.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

thread_local! {
    static SCRATCH_F32: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SCRATCH_F64: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

macro_rules! impl_real {
    ($t:ty, $scratch:ident) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const HALF: Self = 0.5;

            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline(always)]
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            #[inline(always)]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline(always)]
            fn min(self, other: Self) -> Self {
                <$t>::min(self, other)
            }
            fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
                $scratch.with(|cell| {
                    let mut buffer = cell.borrow_mut();
                    if buffer.len() < len {
                        buffer.resize(len, 0.0);
                    }
                    f(&mut buffer[..len])
                })
            }
        }
    };
}

impl_real!(f32, SCRATCH_F32);
impl_real!(f64, SCRATCH_F64);

/// `clamp(v, 0, 1)`.
#[inline(always)]
pub fn clamp01<T: Real>(v: T) -> T {
    v.max(T::ZERO).min(T::ONE)
}

/// Subgradient of [`clamp01`], PyTorch's convention: 1 on the closed interval `[0, 1]`, 0 outside.
#[inline(always)]
pub fn clamp01_grad<T: Real>(v: T) -> T {
    if v >= T::ZERO && v <= T::ONE { T::ONE } else { T::ZERO }
}

/// Number of interleaved partial sums in a fixed-order reduction (one AVX2 vector of f32).
pub const LANES: usize = 8;

/// A sum in a fixed order that still vectorises: element `i` of a stream goes to partial sum `i % LANES`
/// (counting from the start of every `add_*` call, so a call's length decides the order), and
/// [`LaneSums::total`] combines the partial sums in a fixed pairwise tree.
#[derive(Clone, Copy, Debug)]
pub struct LaneSums<T: Real> {
    pub lanes: [T; LANES],
}

impl<T: Real> Default for LaneSums<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Real> LaneSums<T> {
    #[inline(always)]
    pub fn new() -> Self {
        Self { lanes: [T::ZERO; LANES] }
    }

    /// Adds `f(a[i])` for every element.
    #[inline(always)]
    pub fn add_map(&mut self, a: &[T], f: impl Fn(T) -> T) {
        let mut chunks = a.chunks_exact(LANES);
        for chunk in &mut chunks {
            for l in 0..LANES {
                self.lanes[l] += f(chunk[l]);
            }
        }
        for (l, &v) in chunks.remainder().iter().enumerate() {
            self.lanes[l] += f(v);
        }
    }

    /// Adds `f(a[i], b[i])` for every element (`a` and `b` have the same length).
    #[inline(always)]
    pub fn add_zip(&mut self, a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
        assert_eq!(a.len(), b.len());
        let mut ca = a.chunks_exact(LANES);
        let mut cb = b.chunks_exact(LANES);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for l in 0..LANES {
                self.lanes[l] += f(x[l], y[l]);
            }
        }
        for (l, (&x, &y)) in ca.remainder().iter().zip(cb.remainder()).enumerate() {
            self.lanes[l] += f(x, y);
        }
    }

    /// Adds `f(a[i], b[i], c[i])` for every element (all three have the same length).
    #[inline(always)]
    pub fn add_zip3(&mut self, a: &[T], b: &[T], c: &[T], f: impl Fn(T, T, T) -> T) {
        assert!(a.len() == b.len() && a.len() == c.len());
        let (mut ca, mut cb, mut cc) = (a.chunks_exact(LANES), b.chunks_exact(LANES), c.chunks_exact(LANES));
        for ((x, y), z) in (&mut ca).zip(&mut cb).zip(&mut cc) {
            for l in 0..LANES {
                self.lanes[l] += f(x[l], y[l], z[l]);
            }
        }
        let rest = ca.remainder().iter().zip(cb.remainder()).zip(cc.remainder());
        for (l, ((&x, &y), &z)) in rest.enumerate() {
            self.lanes[l] += f(x, y, z);
        }
    }

    /// The total, combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
    #[inline(always)]
    pub fn total(&self) -> T {
        tree_sum(&self.lanes)
    }
}

/// Pairwise sum of `LANES` partial sums in a fixed tree.
#[inline(always)]
pub fn tree_sum<T: Real>(lanes: &[T; LANES]) -> T {
    let a = [lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6], lanes[3] + lanes[7]];
    let b = [a[0] + a[2], a[1] + a[3]];
    b[0] + b[1]
}

/// Fixed-order sum of a slice.
#[inline]
pub fn sum<T: Real>(a: &[T]) -> T {
    let mut s = LaneSums::new();
    s.add_map(a, |v| v);
    s.total()
}

/// Fixed-order dot product.
#[inline]
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut s = LaneSums::new();
    s.add_zip(a, b, |x, y| x * y);
    s.total()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_order_sum_matches_f64_sum_and_is_exact_on_integers() {
        let a: Vec<f64> = (0..37).map(|i| i as f64).collect();
        assert_eq!(sum(&a), 666.0);
        let b: Vec<f64> = (0..37).map(|i| (i % 5) as f64).collect();
        assert_eq!(dot(&a, &b), a.iter().zip(&b).map(|(x, y)| x * y).sum::<f64>());
    }

    #[test]
    fn clamp_and_its_subgradient() {
        assert_eq!(clamp01(-0.5f64), 0.0);
        assert_eq!(clamp01(0.25f64), 0.25);
        assert_eq!(clamp01(3.0f64), 1.0);
        assert_eq!(clamp01_grad(1.0f64), 1.0);
        assert_eq!(clamp01_grad(0.0f64), 1.0);
        assert_eq!(clamp01_grad(1.5f64), 0.0);
        assert_eq!(clamp01_grad(-0.1f64), 0.0);
    }

    #[test]
    fn scratch_grows_and_is_reused() {
        let p1 = f32::with_scratch(16, |s| {
            s.fill(1.0);
            s.as_ptr() as usize
        });
        let p2 = f32::with_scratch(8, |s| {
            assert_eq!(s.len(), 8);
            s.as_ptr() as usize
        });
        assert_eq!(p1, p2);
    }
}
