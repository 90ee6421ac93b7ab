//! Integration tests of fenced-client against a real `fenced server` (and, for the
//! adapters, a real PostgreSQL and SQLite).

mod failover;
mod flood;
mod forward;
mod guard;
mod multi;
mod resources;
mod secure;
mod signed;
mod support;
mod watch;
mod wire;
