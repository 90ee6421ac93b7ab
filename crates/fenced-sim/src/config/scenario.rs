//! The scenarios: the first seed's four runs, optimistic concurrency, and one per
//! misconception the seeds list.

/// The first seed's four runs, optimistic concurrency, and one run for every
/// misconception the seeds list.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scenario {
    /// Fencing off: zombie writes climb.
    Default,
    /// Same seed, fencing on: zero zombie writes, stale writes rejected.
    Fencing,
    /// Four times the lease, fencing off: rarer, never zero over enough seeds.
    LongLease,
    /// Renew at half the lease, fencing off: safe against pauses under half a lease.
    Renewal,
    /// No lock at all: a version check on the resource.
    Occ,
    /// No process pause: a write sent inside the lease is held in the network.
    NetworkDelay,
    /// Every write is idempotent (a retried copy changes nothing), computed from a
    /// stale read all the same.
    Idempotent,
    /// Each key owned by one worker: no lock at all.
    Partitioned,
    /// The lock service times leases on a wall clock that steps forward.
    ClockDrift,
    /// Chubby's lock-delay after an expiry.
    LockDelay,
    /// The lock service crashes and restarts from its snapshot and its log.
    ServiceCrash,
    /// A replicated lock service that fails over on a timeout, without a majority.
    SplitBrain,
}

impl Scenario {
    pub const ALL: [Scenario; 12] = [
        Scenario::Default,
        Scenario::Fencing,
        Scenario::LongLease,
        Scenario::Renewal,
        Scenario::Occ,
        Scenario::NetworkDelay,
        Scenario::Idempotent,
        Scenario::Partitioned,
        Scenario::ClockDrift,
        Scenario::LockDelay,
        Scenario::ServiceCrash,
        Scenario::SplitBrain,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Default => "default",
            Scenario::Fencing => "fencing",
            Scenario::LongLease => "long-lease",
            Scenario::Renewal => "renewal",
            Scenario::Occ => "occ",
            Scenario::NetworkDelay => "network-delay",
            Scenario::Idempotent => "idempotent",
            Scenario::Partitioned => "partitioned",
            Scenario::ClockDrift => "clock-drift",
            Scenario::LockDelay => "lock-delay",
            Scenario::ServiceCrash => "service-crash",
            Scenario::SplitBrain => "split-brain",
        }
    }

    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|x| x.name() == s)
    }

    /// One line for `--help` and the console.
    pub fn describe(self) -> &'static str {
        match self {
            Scenario::Default => "fencing off: a paused holder wakes up and writes; zombie writes climb",
            Scenario::Fencing => "same seed, fencing on: the resource refuses stale tokens; zero zombie writes",
            Scenario::LongLease => "four times the lease, fencing off: zombie writes rarer, never zero",
            Scenario::Renewal => "renew at half the lease, fencing off: safe only against pauses under half a lease",
            Scenario::Occ => "no lock: a version check on the resource; zero lost updates",
            Scenario::NetworkDelay => {
                "no pause at all: a write sent inside the lease is held in the network and lands after a newer holder's"
            }
            Scenario::Idempotent => {
                "every write idempotent (a retried copy changes nothing), yet computed from a stale read: still wrong"
            }
            Scenario::Partitioned => "no lock: each key owned by one worker; nothing lost, no lock on the path",
            Scenario::ClockDrift => {
                "the lock service times leases on a wall clock that steps forward: leases end early"
            }
            Scenario::LockDelay => "Chubby's lock-delay after an expiry, fencing off: zombie writes rarer, never zero",
            Scenario::ServiceCrash => {
                "the lock service crashes and restarts from its snapshot and log: tokens never go back"
            }
            Scenario::SplitBrain => {
                "a primary-backup lock service fails over on a timeout, without a majority: two holders, same tokens"
            }
        }
    }

    /// How many times the base lease this scenario runs with.
    /// True when clients take no lock (nothing to fence, renew or delay).
    pub fn lockless(self) -> bool {
        matches!(self, Scenario::Occ | Scenario::Partitioned)
    }

    pub fn lease_multiple(self) -> u64 {
        if self == Scenario::LongLease {
            4
        } else {
            1
        }
    }
}
