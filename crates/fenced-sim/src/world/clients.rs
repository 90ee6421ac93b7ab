//! The simulated clients: what each does when it wakes, and when an answer reaches it.

use super::*;

impl<'a, S: TraceSink> World<'a, S> {
    pub(super) fn on_wake(&mut self, client: u32, what: Wake) {
        let c = &self.clients[client as usize];
        match what {
            Wake::Acquire if self.lockless() => {
                self.clients[client as usize].phase = Phase::Reading;
                self.send_resource(client, ResourceMsg::Read { held: None });
            }
            Wake::Acquire => {
                let c = &mut self.clients[client as usize];
                c.lease_n += 1;
                c.phase = Phase::Acquiring;
                c.token = None;
                c.lost = false;
                self.record(Actor::Client(client), Kind::Acquire, client, None, None, Detail::None);
                self.send_service(client, ServiceMsg::Acquire);
                // While queued, the client library keeps the lease alive.
                self.wake(client, (self.cfg.lease_ms / 3).max(1), Wake::Renew);
            }
            Wake::Renew => {
                let interval = match c.phase {
                    Phase::Acquiring => (self.cfg.lease_ms / 3).max(1),
                    Phase::Reading | Phase::Working | Phase::Writing => match self.cfg.renew_fraction {
                        Some(f) => ((self.cfg.lease_ms as f64 * f) as u64).max(1),
                        None => return,
                    },
                    _ => return,
                };
                self.send_service(client, ServiceMsg::Keepalive);
                self.wake(client, interval, Wake::Renew);
            }
            Wake::WriteDue => {
                if c.phase != Phase::Working {
                    return;
                }
                if c.lost {
                    // It knows: a renewing client heard "lease not found" in time.
                    self.summary.writes_aborted += 1;
                    let token = c.token;
                    self.record(Actor::Client(client), Kind::Aborted, client, token, None, Detail::None);
                    self.release(client);
                    return;
                }
                let held = if self.lockless() { None } else { c.token };
                let id = self.next_write;
                self.next_write += 1;
                let msg = ResourceMsg::Write { held, value: c.read_value + 1, version: c.read_version, id };
                self.clients[client as usize].phase = Phase::Writing;
                // An at-least-once client sends a write again when it cannot tell whether
                // the first copy arrived (`idempotent`): both copies carry the same key.
                for _ in 0..self.cfg.write_copies {
                    self.send_resource(client, msg);
                }
            }
        }
    }

    pub(super) fn release(&mut self, client: u32) {
        self.clients[client as usize].phase = Phase::Releasing;
        self.send_service(client, ServiceMsg::Release);
    }

    pub(super) fn think(&mut self, client: u32) {
        let c = &mut self.clients[client as usize];
        c.phase = Phase::Thinking;
        c.gen += 1; // no renewal timer outlives the attempt
        let t = self.rng.between(self.cfg.think_ms.0, self.cfg.think_ms.1);
        self.wake(client, t, Wake::Acquire);
    }

    pub(super) fn on_client_msg(&mut self, client: u32, msg: ClientMsg) {
        let c = &mut self.clients[client as usize];
        match msg {
            ClientMsg::Granted { lease_n, token } => {
                if c.phase != Phase::Acquiring || c.lease_n != lease_n {
                    return; // a grant for an attempt it gave up; the lease will expire
                }
                c.phase = Phase::Reading;
                c.token = Some(token);
                let held = Some(token);
                self.send_resource(client, ResourceMsg::Read { held });
            }
            ClientMsg::NotGranted { lease_n } => {
                if c.phase == Phase::Acquiring && c.lease_n == lease_n {
                    self.think(client);
                }
            }
            ClientMsg::KeepaliveReply { lease_n, ok } => {
                if !ok && c.lease_n == lease_n {
                    c.lost = true;
                }
            }
            ClientMsg::ReleaseAck => {
                if c.phase == Phase::Releasing {
                    self.think(client);
                }
            }
            ClientMsg::ReadReply { ok, value, version } => {
                if c.phase != Phase::Reading {
                    return;
                }
                if !ok {
                    self.release(client); // a newer holder got there first
                    return;
                }
                c.read_value = value;
                c.read_version = version;
                c.phase = Phase::Working;
                self.start_work(client);
            }
            ClientMsg::WriteReply { ok } => {
                if c.phase != Phase::Writing {
                    return;
                }
                if ok {
                    self.summary.acknowledged += 1;
                }
                if self.lockless() {
                    if ok {
                        self.think(client);
                    } else {
                        self.clients[client as usize].phase = Phase::Reading; // lost the race: read again
                        self.send_resource(client, ResourceMsg::Read { held: None });
                    }
                } else {
                    self.release(client);
                }
            }
        }
    }

    /// The critical section: work for a while, maybe pause, maybe crash, then write.
    pub(super) fn start_work(&mut self, client: u32) {
        let work = self.rng.between(self.cfg.work_ms.0, self.cfg.work_ms.1);
        let gen = self.clients[client as usize].gen;
        if self.rng.chance(self.cfg.pause_chance) {
            if let Some((cause, duration_ms)) = pauses::draw(self.cfg.pauses, &mut self.rng) {
                let at = self.now + self.rng.between(0, work);
                self.push(at, Ev::Pause { client, gen, cause, duration_ms });
            }
        }
        if self.rng.chance(self.cfg.crash_chance) {
            let at = self.now + self.rng.between(0, work);
            self.push(at, Ev::Crash { client, gen });
        }
        self.wake(client, work, Wake::WriteDue);
    }
}
