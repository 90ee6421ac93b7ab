//! The Fenced client (being built).
