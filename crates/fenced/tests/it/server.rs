//! End-to-end tests of `fenced server`.
