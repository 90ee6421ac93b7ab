//! Sweeps (being built).
