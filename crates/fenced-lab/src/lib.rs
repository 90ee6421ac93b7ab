//! Real processes, real pauses, real peers.
//!
//! The laboratory (`fenced-sim`) tells the seeds' story in virtual time; this crate
//! tells it with processes: services started on free loopback ports ([`peers`]), a
//! proxy that holds packets ([`proxy`]), the systems under test driven as their users
//! drive them ([`target`]; etcd through `fenced_client::etcd`, its JSON gateway), the torture
//! harness ([`torture`], [`worker`], [`history`]) judged by the core's checker.

pub mod bench;
pub mod cluster;
pub mod ensemble;
pub mod history;
pub mod http;
pub mod nemesis;
pub mod peers;
pub mod proxy;
pub mod reader;
pub mod target;
pub mod torture;
pub mod worker;
