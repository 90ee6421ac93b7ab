//! Sans-IO core of Fenced: the lock table, the fence gate and the history checker.
//!
//! Nothing here reads a clock, spawns, does IO or uses OS randomness. Time comes in as
//! `now_ms` (milliseconds on the caller's monotonic clock), lease ids come in from the
//! caller, and effects (grants, expiries, waiter time-outs) go out as values. The server
//! and the simulator drive the very same code.

pub mod checker;
pub mod command;
mod error;
pub mod gate;
pub mod replica;
pub mod store;
pub mod table;
mod types;
pub mod xorshift;

pub use command::{
    Acquire, AcquireAll, Answer, Command, LeaseRef, Output, RequestId, HOLDER_BYTES_MAX, LOCK_NAMES_MAX,
};
pub use error::Error;
pub use gate::{Admission, FenceGate, Op};
pub use replica::Batch;
pub use store::{Quota, Quotas, Record, Store, StoreAnswer, StoreCommand};
pub use table::{Effect, Grant, LeaseInfo, Limits, LockInfo, LockTable, ReleaseReason, Resume, StoreOutcome, WaitEnd};
pub use types::{duration_ms, grant_message, hex, unhex, LeaseId, LockName, NameError, Token};
