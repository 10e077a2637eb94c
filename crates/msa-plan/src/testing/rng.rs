//! A tiny deterministic generator (SplitMix64) for seed-derived test data.

/// SplitMix64: a full-period 64-bit generator; good enough for test data and reproducible.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `[0, n)`; panics if `n == 0`.
    pub fn below(&mut self, n: usize) -> usize {
        assert!(n > 0, "below(0) has no values");
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: usize, den: usize) -> bool {
        self.below(den) < num
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_hits_every_value() {
        let mut r = SplitMix64::new(7);
        let mut seen = [0usize; 5];
        for _ in 0..1000 {
            seen[r.below(5)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 150), "{seen:?}");
        assert_eq!(SplitMix64::new(7).next_u64(), SplitMix64::new(7).next_u64());
    }
}
