//! Counter-based random streams.
//!
//! Every random draw in esper-ecs comes from a stream keyed by what it is for — (run seed, round, env,
//! purpose) — and indexed by a counter (the step, the batch, the element). Nothing is drawn from a global
//! generator, so one env's draws never depend on how many envs run beside it or on thread timing
//! (DESIGN §7). The mixer is SplitMix64's finaliser, applied to the key and then to key ⊕ counter: cheap,
//! stateless, and good enough for data order, augmentation and initialisation.

/// What a stream is used for. Part of the key, so two purposes never share draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Purpose {
    DataOrder = 1,
    Augmentation = 2,
    HostInit = 3,
    SeedInit = 4,
    SyntheticData = 5,
    Policy = 6,
    Test = 7,
    /// The learned policy's initial weights.
    PolicyInit = 8,
}

/// The identity of one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct StreamKey {
    pub seed: u64,
    pub round: u64,
    pub env: u64,
    pub purpose: Purpose,
}

#[inline]
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl StreamKey {
    pub fn new(seed: u64, round: u64, env: u64, purpose: Purpose) -> Self {
        Self { seed, round, env, purpose }
    }

    /// A 64-bit digest of the key; two different keys give unrelated digests.
    pub fn digest(&self) -> u64 {
        let mut h = mix64(self.seed);
        h = mix64(h ^ self.round.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        h = mix64(h ^ self.env.wrapping_mul(0xA076_1D64_78BD_642F));
        mix64(h ^ (self.purpose as u64).wrapping_mul(0xE703_7ED1_A0B4_28DB))
    }

    /// A sequential reader of this stream starting at `counter`.
    pub fn stream(&self, counter: u64) -> Stream {
        Stream { base: self.digest(), counter }
    }
}

/// A position in a keyed stream. `Clone` it to fork a reader; draws are a pure function of
/// (key, counter), so the same position always gives the same numbers.
#[derive(Clone, Debug)]
pub struct Stream {
    base: u64,
    counter: u64,
}

impl Stream {
    /// The draw at an absolute counter, without moving the reader.
    #[inline]
    pub fn at(&self, counter: u64) -> u64 {
        mix64(self.base ^ mix64(counter))
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let v = self.at(self.counter);
        self.counter = self.counter.wrapping_add(1);
        v
    }

    /// Uniform in [0, 1) with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, 1) with 24 random bits.
    #[inline]
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// Uniform in [lo, hi).
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }

    /// Uniform integer in [0, n) (Lemire's multiply-shift; the bias is below 2^-32 for n < 2^32).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller, one value per two uniforms; no cached second value, so the
    /// stream position after a draw is always +2).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Fisher–Yates shuffle of `items`.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_key_and_counter_give_same_draws() {
        let k = StreamKey::new(7, 1, 3, Purpose::Test);
        let a: Vec<u64> = {
            let mut s = k.stream(10);
            (0..5).map(|_| s.next_u64()).collect()
        };
        let s = k.stream(0);
        let b: Vec<u64> = (10..15).map(|c| s.at(c)).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn different_keys_give_different_draws() {
        let base = StreamKey::new(7, 1, 3, Purpose::Test);
        let variants = [
            StreamKey { seed: 8, ..base },
            StreamKey { round: 2, ..base },
            StreamKey { env: 4, ..base },
            StreamKey { purpose: Purpose::DataOrder, ..base },
        ];
        let first = base.stream(0).next_u64();
        for v in variants {
            assert_ne!(v.stream(0).next_u64(), first, "{v:?}");
        }
    }

    #[test]
    fn uniform_draws_have_the_right_moments() {
        let mut s = StreamKey::new(1, 0, 0, Purpose::Test).stream(0);
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|_| s.next_f64()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.005, "var {var}");
        let mut counts = [0u32; 10];
        for _ in 0..n {
            counts[s.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((c as f64 - 10_000.0).abs() < 500.0, "{counts:?}");
        }
    }

    #[test]
    fn normal_draws_have_unit_variance() {
        let mut s = StreamKey::new(2, 0, 0, Purpose::Test).stream(0);
        let n = 100_000;
        let xs: Vec<f64> = (0..n).map(|_| s.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "var {var}");
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut s = StreamKey::new(3, 0, 0, Purpose::Test).stream(0);
        let mut v: Vec<u32> = (0..1000).collect();
        s.shuffle(&mut v);
        assert_ne!(v, (0..1000).collect::<Vec<_>>());
        v.sort_unstable();
        assert_eq!(v, (0..1000).collect::<Vec<_>>());
    }
}
