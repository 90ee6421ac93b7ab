//! The simulator's only source of randomness: ChaCha8 from one seed, plus the few
//! distributions the pause models need, written out so that they are the same on
//! every platform and every version of every crate.

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng as _, SeedableRng};

pub(crate) struct Rng(ChaCha8Rng);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform integer in [lo, hi].
    pub(crate) fn between(&mut self, lo: u64, hi: u64) -> u64 {
        debug_assert!(lo <= hi);
        let span = hi - lo + 1;
        lo + self.0.next_u64() % span
    }

    /// Log-uniform in [lo, hi]: as many pauses between 10 and 100 ms as between 100
    /// and 1000 ms.
    pub(crate) fn log_uniform(&mut self, lo: f64, hi: f64) -> u64 {
        (lo * (hi / lo).powf(self.unit())).round() as u64
    }

    /// Exponential with this mean: the time to the next of events that come at random
    /// (a crash, a clock step), at least 1.
    pub(crate) fn exponential(&mut self, mean: f64) -> u64 {
        let u = 1.0 - self.unit(); // (0, 1]
        ((-u.ln()) * mean).round().max(1.0) as u64
    }

    /// Pareto with scale `x_min` and shape `alpha`: heavy-tailed, capped at `cap`.
    pub(crate) fn pareto(&mut self, x_min: f64, alpha: f64, cap: f64) -> u64 {
        let u = 1.0 - self.unit(); // (0, 1]
        (x_min / u.powf(1.0 / alpha)).min(cap).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_numbers() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.between(0, 1_000), b.between(0, 1_000));
        }
        assert_ne!(Rng::new(7).between(0, u64::MAX - 1), Rng::new(8).between(0, u64::MAX - 1));
    }

    #[test]
    fn distributions_stay_in_range() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            assert!((5..=9).contains(&r.between(5, 9)));
            assert!((10..=1_000).contains(&r.log_uniform(10.0, 1_000.0)));
            assert!((50..=5_000).contains(&r.pareto(50.0, 1.2, 5_000.0)));
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
