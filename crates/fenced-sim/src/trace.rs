//! The trace: one record per thing that happened, and its one wire format, JSON lines
//! (`t_ms, seq, actor, kind, ...`), shared by the CLI, the web console and the tests.

use std::io::{self, Write};

/// Who did it: a client (`c0`, `c1`, ...), the lock service or the resource.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Actor {
    Client(u32),
    Lock,
    Resource,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    /// A client sent an acquire.
    Acquire,
    /// The lock service granted the lock.
    Granted,
    /// A queued acquire timed out.
    WaitEnded,
    /// A keepalive reached the lock service (`ok` false: the lease was gone).
    Keepalive,
    /// The lock service expired the holder's lease.
    Expired,
    /// The holder released the lock.
    Released,
    /// A client stopped (or its packets were held) for `duration_ms`.
    Pause,
    /// A read reached the resource.
    Read,
    /// A write reached the resource.
    Write,
    /// A client that knew its lease was gone skipped its write.
    Aborted,
    Crash,
    Restart,
    /// A second copy of a write reached the resource, which had applied the first.
    Duplicate,
    /// The lock service's wall clock stepped forward by `step_ms`.
    ClockStep,
    /// The lock service crashed; everything it held in memory is gone.
    ServiceCrash,
    /// The lock service started again (from its snapshot and log, or from nothing).
    ServiceRestart,
    /// The replicas were cut apart, the clients with them (even ones stay with the
    /// leader of the moment, odd ones with the other replicas).
    Partition,
    /// A replica took over serving the clients on its side of the cut.
    Failover,
    /// The cut healed: the replicas follow one leader again.
    Heal,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Acquire => "acquire",
            Kind::Granted => "granted",
            Kind::WaitEnded => "wait_ended",
            Kind::Keepalive => "keepalive",
            Kind::Expired => "expired",
            Kind::Released => "released",
            Kind::Pause => "pause",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Aborted => "aborted",
            Kind::Crash => "crash",
            Kind::Restart => "restart",
            Kind::Duplicate => "duplicate",
            Kind::ClockStep => "clock_step",
            Kind::ServiceCrash => "service_crash",
            Kind::ServiceRestart => "service_restart",
            Kind::Partition => "partition",
            Kind::Failover => "failover",
            Kind::Heal => "heal",
        }
    }

    /// True for records about the lock service as a whole, not one client (their
    /// `client` and `lock` are 0).
    pub fn is_service_wide(self) -> bool {
        matches!(
            self,
            Kind::ClockStep | Kind::ServiceCrash | Kind::ServiceRestart | Kind::Partition | Kind::Failover | Kind::Heal
        )
    }
}

/// What only some kinds carry.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Detail {
    None,
    Pause {
        duration_ms: u64,
        cause: &'static str,
    },
    Keepalive {
        ok: bool,
    },
    Read {
        fenced: bool,
        value: u64,
        accepted: bool,
    },
    Write {
        fenced: bool,
        value: u64,
        value_before: u64,
        accepted: bool,
        late: bool,
        zombie: bool,
    },
    /// A wall-clock step.
    Step {
        step_ms: u64,
    },
    /// Which replica of a replicated lock service did it (grants, failovers).
    Replica {
        replica: u32,
    },
}

/// One line of the trace.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Record {
    pub t_ms: u64,
    /// Position in the trace, from 0.
    pub seq: u64,
    pub actor: Actor,
    pub kind: Kind,
    /// The client the record is about (the actor itself for client records).
    pub client: u32,
    pub lock: u32,
    /// The token the client holds (for reads and writes: whether or not it was sent).
    pub token: Option<u64>,
    /// When the message that caused this record was sent.
    pub sent_ms: Option<u64>,
    pub detail: Detail,
}

/// Where records go. The simulator is generic over it so that a run without a trace
/// pays nothing.
pub trait TraceSink {
    const ENABLED: bool = true;
    fn record(&mut self, r: &Record);
    /// True when the run should end now (its caller gave up, or the trace is over its
    /// size): checked every few thousand events, so a stopped run costs little more.
    fn stopped(&self) -> bool {
        false
    }
}

/// No trace, but a run that stops when `0` is set: for callers that may give up.
pub struct StopFlag<'a>(pub &'a std::sync::atomic::AtomicBool);

impl TraceSink for StopFlag<'_> {
    const ENABLED: bool = false;
    fn record(&mut self, _: &Record) {}
    fn stopped(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// No trace.
impl TraceSink for () {
    const ENABLED: bool = false;
    fn record(&mut self, _: &Record) {}
}

/// Keep everything in memory (the diagram, the tests, the web API).
impl TraceSink for Vec<Record> {
    fn record(&mut self, r: &Record) {
        self.push(*r);
    }
}

/// Kept in memory only when asked for (`--diagram` beside `--trace`).
impl TraceSink for Option<Vec<Record>> {
    fn record(&mut self, r: &Record) {
        if let Some(v) = self {
            v.push(*r);
        }
    }
}

/// Two sinks at once, so that one run can both write a trace and keep its records.
impl<A: TraceSink, B: TraceSink> TraceSink for (A, B) {
    const ENABLED: bool = A::ENABLED || B::ENABLED;
    fn record(&mut self, r: &Record) {
        self.0.record(r);
        self.1.record(r);
    }
}

/// JSON lines to a writer. IO errors are kept and reported once at the end.
pub struct JsonLines<W: Write> {
    out: W,
    line: String,
    error: Option<io::Error>,
}

impl<W: Write> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines { out, line: String::with_capacity(256), error: None }
    }

    pub fn finish(mut self) -> io::Result<W> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

impl<W: Write> TraceSink for JsonLines<W> {
    fn record(&mut self, r: &Record) {
        if self.error.is_some() {
            return;
        }
        self.line.clear();
        write_json(&mut self.line, r);
        self.line.push('\n');
        if let Err(e) = self.out.write_all(self.line.as_bytes()) {
            self.error = Some(e);
        }
    }
}

/// The record as one JSON object, fields in a fixed order (the same seed prints the
/// same bytes).
pub fn write_json(s: &mut String, r: &Record) {
    use std::fmt::Write as _;
    let actor = match r.actor {
        Actor::Client(c) => format!("c{c}"),
        Actor::Lock => "lock".into(),
        Actor::Resource => "resource".into(),
    };
    let _ = write!(
        s,
        r#"{{"t_ms":{},"seq":{},"actor":"{}","kind":"{}","client":{},"lock":{}"#,
        r.t_ms,
        r.seq,
        actor,
        r.kind.name(),
        r.client,
        r.lock
    );
    if let Some(t) = r.token {
        let _ = write!(s, r#","token":{t}"#);
    }
    if let Some(t) = r.sent_ms {
        let _ = write!(s, r#","sent_ms":{t}"#);
    }
    let outcome = |a: bool| if a { "accepted" } else { "rejected" };
    let _ = match r.detail {
        Detail::None => Ok(()),
        Detail::Pause { duration_ms, cause } => write!(s, r#","duration_ms":{duration_ms},"cause":"{cause}""#),
        Detail::Keepalive { ok } => write!(s, r#","ok":{ok}"#),
        Detail::Read { fenced, value, accepted } => {
            write!(s, r#","fenced":{fenced},"value":{value},"outcome":"{}""#, outcome(accepted))
        }
        Detail::Write { fenced, value, value_before, accepted, late, zombie } => write!(
            s,
            r#","fenced":{fenced},"value":{value},"value_before":{value_before},"outcome":"{}","late":{late},"zombie":{zombie}"#,
            outcome(accepted)
        ),
        Detail::Step { step_ms } => write!(s, r#","step_ms":{step_ms}"#),
        Detail::Replica { replica } => write!(s, r#","replica":{replica}"#),
    };
    s.push('}');
}
