//! The Fenced lock server (being built).
