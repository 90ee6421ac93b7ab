//! End-to-end tests of the server over real sockets on 127.0.0.1: the server runs
//! in-process on its own runtime thread, the tests speak HTTP/1.1 over std sockets.

mod api;
mod edge;
mod harness;
mod identities;
mod input;
mod limits;
mod multi;
mod openapi;
mod restart;
mod rules;
mod signing;
mod tls;
mod unfenced;
mod watch;
mod wire;
