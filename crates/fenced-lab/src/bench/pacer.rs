//! The open loops' clock. tokio's timers wake on millisecond ticks, about a millisecond
//! late, and an open loop counts every latency from the operation's due time, so the
//! runtime's lateness would be charged to the server. A pacer thread instead sleeps to
//! each due time on the operating system's timer (tens of microseconds late) and rings
//! the bell of the client whose operation is due; the client waits for its bell.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How early an operation may go when its bell rings (the pacer and the client read
/// the clock a few microseconds apart).
const SLACK: Duration = Duration::from_micros(50);

/// Client `i`'s operations are due at `first + k * every` for k = 0, 1, .. while
/// before the end. The thread ends by itself at the end (a bell rung after a failed
/// run wakes nobody).
pub struct Pacer {
    bells: Vec<Arc<Notify>>,
}

impl Pacer {
    /// Starts the thread for one `(first, every)` schedule per client.
    pub fn start(schedules: &[(Instant, Duration)], end: Instant) -> Pacer {
        let bells: Vec<Arc<Notify>> = schedules.iter().map(|_| Arc::new(Notify::new())).collect();
        let ring = bells.clone();
        let end = end.into_std();
        let mut next: BinaryHeap<Reverse<(std::time::Instant, usize)>> =
            schedules.iter().enumerate().map(|(i, (first, _))| Reverse((first.into_std(), i))).collect();
        let every: Vec<Duration> = schedules.iter().map(|&(_, e)| e.max(Duration::from_nanos(1))).collect();
        std::thread::spawn(move || {
            while let Some(Reverse((due, i))) = next.pop() {
                if due >= end {
                    continue;
                }
                if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                    std::thread::sleep(wait);
                }
                ring[i].notify_one();
                next.push(Reverse((due + every[i], i)));
            }
        });
        Pacer { bells }
    }

    /// Client `i`'s bell.
    pub fn bell(&self, i: usize) -> Arc<Notify> {
        self.bells[i].clone()
    }
}

/// Waits on `bell` until `due`. A ring left over from an operation that went late (the
/// client was still busy when it rang) is early for this one: wait on.
pub async fn until(bell: &Notify, due: Instant) {
    while Instant::now() + SLACK < due {
        bell.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rings_each_client_on_its_own_schedule() {
        let t0 = Instant::now() + Duration::from_millis(20);
        let every = [Duration::from_millis(3), Duration::from_millis(7)];
        let end = t0 + Duration::from_millis(100);
        let pacer = Pacer::start(&[(t0, every[0]), (t0 + Duration::from_millis(1), every[1])], end);
        let mut handles = Vec::new();
        for (i, &e) in every.iter().enumerate() {
            let bell = pacer.bell(i);
            let first = t0 + Duration::from_millis(i as u64);
            handles.push(tokio::spawn(async move {
                let mut k = 0;
                loop {
                    let due = first + e * k;
                    if due >= end {
                        return k;
                    }
                    until(&bell, due).await;
                    let now = Instant::now();
                    assert!(now + SLACK >= due, "woken {:?} early", due - now);
                    k += 1;
                }
            }));
        }
        let fast = handles.remove(0).await.unwrap();
        let slow = handles.remove(0).await.unwrap();
        // Every due time before the end was served, none early (how late is the machine's).
        assert_eq!((fast, slow), (34, 15));
    }
}
