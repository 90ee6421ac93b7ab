//! End-to-end tests of `fenced exec`.
