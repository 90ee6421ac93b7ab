//! The client-side deadline of a lease: send time of the last successful acquire or
//! keepalive, plus the TTL, minus a safety margin, on the client's monotonic clock.

use std::time::Duration;

use tokio::time::Instant;

/// The default margin, as a fraction of the TTL: room for the server's timer
/// granularity and for the two clocks running at slightly different rates.
pub const MARGIN_DIVISOR: u32 = 10;

/// The margin kept below the TTL when the caller does not choose one.
pub fn default_margin(ttl: Duration) -> Duration {
    ttl / MARGIN_DIVISOR
}

/// The deadline for a lease whose last successful acquire or keepalive was *sent* at
/// `sent_at`. Measured from the send, not the answer: the server started (or renewed)
/// the lease at some moment after the send, so its expiry is no earlier than
/// `sent_at + ttl`. A margin at least the TTL leaves no validity at all.
pub fn valid_until(sent_at: Instant, ttl: Duration, margin: Duration) -> Instant {
    sent_at + ttl.saturating_sub(margin)
}

/// When the next keepalive goes out: a third of the TTL after the last successful
/// send, so two more tries fit before the deadline.
pub fn next_keepalive(sent_at: Instant, ttl: Duration) -> Instant {
    sent_at + ttl / 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_counts_from_the_send() {
        let t0 = Instant::now();
        let ttl = Duration::from_millis(10_000);
        assert_eq!(valid_until(t0, ttl, default_margin(ttl)), t0 + Duration::from_millis(9_000));
        assert_eq!(valid_until(t0, ttl, Duration::ZERO), t0 + ttl);
        // A margin as large as the TTL leaves nothing, never a deadline in the past of the send.
        assert_eq!(valid_until(t0, ttl, Duration::from_secs(60)), t0);
        assert_eq!(next_keepalive(t0, Duration::from_millis(9_000)), t0 + Duration::from_millis(3_000));
        // Two keepalive periods still leave the margin's worth of time before the deadline.
        assert!(next_keepalive(t0, ttl) + ttl / 3 < valid_until(t0, ttl, default_margin(ttl)));
    }
}
