//! The knobs of a run that name a model: where pauses come from, the service's clock,
//! what a crashed service restarts from, how it is replicated.

/// Where pauses come from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PauseModel {
    Mixed,
    Gc,
    Vm,
    Cgroup,
    Network,
    None,
}

impl PauseModel {
    pub const ALL: [PauseModel; 6] =
        [PauseModel::Mixed, PauseModel::Gc, PauseModel::Vm, PauseModel::Cgroup, PauseModel::Network, PauseModel::None];

    pub fn name(self) -> &'static str {
        match self {
            PauseModel::Mixed => "mixed",
            PauseModel::Gc => "gc",
            PauseModel::Vm => "vm",
            PauseModel::Cgroup => "cgroup",
            PauseModel::Network => "network",
            PauseModel::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<PauseModel> {
        PauseModel::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// The clock the lock service times leases on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ServiceClock {
    /// What the design requires: time since start, never stepped.
    Monotonic,
    /// Wall-clock time, which NTP or a resumed VM steps forward now and then.
    Wall,
}

impl ServiceClock {
    pub const ALL: [ServiceClock; 2] = [ServiceClock::Monotonic, ServiceClock::Wall];

    pub fn name(self) -> &'static str {
        match self {
            ServiceClock::Monotonic => "monotonic",
            ServiceClock::Wall => "wall",
        }
    }

    pub fn parse(s: &str) -> Option<ServiceClock> {
        ServiceClock::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// What a crashed lock service restarts from.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ServiceRestart {
    /// Its durable state, as the server restarts: the last snapshot of its table, the
    /// log after it applied again, then `Command::Promote`.
    Durable,
    /// Nothing, as if its disk were lost: the negative control, tokens start again.
    Empty,
}

impl ServiceRestart {
    pub const ALL: [ServiceRestart; 2] = [ServiceRestart::Durable, ServiceRestart::Empty];

    pub fn name(self) -> &'static str {
        match self {
            ServiceRestart::Durable => "durable",
            ServiceRestart::Empty => "empty",
        }
    }

    pub fn parse(s: &str) -> Option<ServiceRestart> {
        ServiceRestart::ALL.into_iter().find(|x| x.name() == s)
    }
}

/// How a replicated lock service decides who serves.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Replication {
    /// Two replicas; the backup promotes itself when it has not heard the primary for
    /// a timeout, with no majority to ask.
    PrimaryBackup,
    /// Three replicas; only a leader with a majority commits, and a new leader starts
    /// from every committed entry (Raft's rule).
    Majority,
}

impl Replication {
    pub const ALL: [Replication; 2] = [Replication::PrimaryBackup, Replication::Majority];

    pub fn name(self) -> &'static str {
        match self {
            Replication::PrimaryBackup => "primary-backup",
            Replication::Majority => "majority",
        }
    }

    pub fn parse(s: &str) -> Option<Replication> {
        Replication::ALL.into_iter().find(|x| x.name() == s)
    }
}
