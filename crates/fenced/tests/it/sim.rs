//! End-to-end tests of `fenced sim`.
