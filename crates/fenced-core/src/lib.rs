//! Sans-IO core of Fenced: the lock table, the fence gate and the history checker.
//!
//! Nothing here reads a clock, spawns, does IO or uses OS randomness. Time comes in as
//! `now_ms` (milliseconds on the caller's monotonic clock), lease ids come in from the
//! caller, and effects (grants, expiries, waiter time-outs) go out as values. The server
//! and the simulator drive the very same code.

pub mod checker;
pub mod gate;
pub mod table;
mod types;

pub use gate::{Admission, FenceGate, Op};
pub use table::{
    AcquireError, AcquireOutcome, Effect, Grant, LeaseError, LeaseInfo, Limits, LockInfo, LockTable, ReleaseError,
    WaiterId,
};
pub use types::{LeaseId, LockName, NameError, Token};
