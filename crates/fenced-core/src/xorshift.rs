//! A small deterministic generator (Marsaglia's xorshift64) for seeded workloads and
//! tests: the same seed gives the same numbers on every machine, so a failing seed
//! replays. Not random enough for anything an adversary sees.

/// The generator's state; any seed but 0 (which stays 0 forever).
#[derive(Clone, Debug)]
pub struct XorShift(pub u64);

impl XorShift {
    /// The next number.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number below `n` (0 for `n` of 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
