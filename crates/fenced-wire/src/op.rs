//! Request operation codes (also the answer's kind on success).

/// Payload: the bearer token. Answer: empty.
pub const AUTH: u8 = 1;
/// Payload: `ttl_ms u64`. Answer: `lease u128, ttl_ms u64`.
pub const CREATE_LEASE: u8 = 2;
/// Payload: `lease u128`. Answer: `lease u128, ttl_ms u64`.
pub const KEEPALIVE: u8 = 3;
/// Payload: `lease u128`. Answer: empty; the lease's locks are released.
pub const REVOKE: u8 = 4;
/// Payload: `flags u8` (1: lease given, 2: ttl given; exactly one), `lease u128`,
/// `ttl_ms u64`, `wait_ms u64`, `lock_delay_ms u64`, then the name (the rest).
/// Answer: `token u64, lease u128, ttl_ms u64`, then, when the service signs its
/// grants, the 64-byte Ed25519 signature (what HTTP's `signature` holds, in binary).
pub const ACQUIRE: u8 = 5;
/// Payload: `lease u128`, then the name. Answer: `token u64`.
pub const RELEASE: u8 = 6;
/// Payload: `token u64`, then the name. Answer: `current u8, token u64` (0: none).
pub const CHECK: u8 = 7;
/// Payload: `token u64` (0: none), `key_len u16`, key, then the value (the rest).
/// Answer: `token u64, highest_seen u64`.
pub const PUT: u8 = 8;
/// Payload: `token u64` (0: a plain read), then the key. Answer: `highest_seen u64`
/// (0: none), then the value (the rest).
pub const GET: u8 = 9;
/// Payload: `target u32`, the id of a request in flight (a waiting acquire) to
/// withdraw. No answer of its own: the target is answered `cancelled` unless it
/// was answered already.
pub const CANCEL: u8 = 10;
/// Several locks at once, all or none. Payload: ACQUIRE's fixed fields and holder,
/// then `count u8` (1 to 64) and `count` names, each `len u16` and its bytes.
/// Answer: `lease u128, ttl_ms u64, count u8`, then per lock (in the names' sorted
/// order) `token u64, len u16` and its name; then, when the service signs its
/// grants, one 64-byte signature per lock in the same order.
pub const ACQUIRE_ALL: u8 = 11;
/// A watch of the events of lock names and store keys that start with a prefix, as
/// `GET /v1/events`. Payload: `flags u8` (1: `since` given, 2: `tail` given; not
/// both), `since u64`, `tail u32`, then the prefix (the rest, UTF-8). Answered by a
/// stream of frames with the watch's id: events (this kind: `index u64`, then the
/// event's JSON object, as the HTTP stream's `data:`), [`WATCH_MARK`] and
/// [`WATCH_LAGGED`], until an error frame ends it (`compacted` with `oldest_index`
/// at the start, `cancelled` after a CANCEL of the watch, `shutting_down`).
pub const WATCH: u8 = 12;
/// A watch's position marker: `index u64`, every position up to it was read.
pub const WATCH_MARK: u8 = 13;
/// A watch fell behind what the member holds: `missed u64` positions at least.
/// The stream goes on after the gap; a client that must miss nothing resumes from
/// its last position elsewhere, or reads the state again.
pub const WATCH_LAGGED: u8 = 14;
/// The answer kind of an error: `code_len u8`, the code (snake_case ASCII),
/// `message_len u16`, the message, `count u8` and that many typed fields
/// ([`crate::error_frame`]; version 2: the code, then the HTTP API's JSON error body).
pub const ERROR: u8 = 0;
