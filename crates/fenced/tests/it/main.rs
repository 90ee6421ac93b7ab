//! End-to-end tests of the `fenced` binary: one integration-test binary, a module per
//! subcommand family.

mod bench;
mod cluster;
mod console;
mod demo;
mod exec;
mod exec_foreign;
mod nemesis;
mod openapi;
mod peer_clusters;
mod security;
mod server;
mod sim;
mod support;
mod torture;
