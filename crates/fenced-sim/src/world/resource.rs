//! The resource the clients write: its reads and writes, and the gate in front of it.

use super::*;

impl<'a, S: TraceSink> World<'a, S> {
    pub(super) fn on_resource(&mut self, client: u32, gen: u32, sent_ms: u64, msg: ResourceMsg) {
        let key = self.clients[client as usize].lock;
        let fenced = self.cfg.fencing;
        match msg {
            ResourceMsg::Read { held } => {
                let ok = !fenced || self.gate.admit(key, held, Op::Read).is_accepted();
                let value = self.values[key as usize];
                let version = self.versions[key as usize];
                let outcome = if ok { Outcome::Accepted } else { Outcome::Rejected };
                self.record(
                    Actor::Resource,
                    Kind::Read,
                    client,
                    held,
                    Some(sent_ms),
                    Detail::Read { fenced, value, accepted: ok },
                );
                self.history(client, EventKind::Read { held, fenced, value, outcome });
                self.reply(client, gen, ClientMsg::ReadReply { ok, value, version });
            }
            ResourceMsg::Write { held, value, version, id } => {
                if self.cfg.write_copies > 1 && !self.written.insert(id) {
                    // The idempotency key says: applied already. Nothing changes.
                    self.summary.duplicates_absorbed += 1;
                    self.record(Actor::Resource, Kind::Duplicate, client, held, Some(sent_ms), Detail::None);
                    return;
                }
                let value_before = self.values[key as usize];
                let ok = if self.occ() {
                    version == self.versions[key as usize]
                } else if fenced {
                    self.gate.admit(key, held, Op::Write).is_accepted()
                } else {
                    true
                };
                if ok {
                    self.values[key as usize] = value;
                    self.versions[key as usize] += 1;
                }
                let outcome = if ok { Outcome::Accepted } else { Outcome::Rejected };
                let checker = &self.checkers[key as usize];
                let (zombies_before, late_before) = (checker.report().zombie_writes, checker.report().late_writes);
                self.history(
                    client,
                    EventKind::Write { held, fenced, value, value_before: Some(value_before), outcome },
                );
                let report = self.checkers[key as usize].report();
                let zombie = report.zombie_writes > zombies_before;
                let late = report.late_writes > late_before;
                let seq = self.records;
                if zombie {
                    // This write's findings are the last few: late, zombie, lost update.
                    let kind = report
                        .findings
                        .iter()
                        .rev()
                        .take(3)
                        .map(|f| f.kind)
                        .find(|k| matches!(k, FindingKind::ZombieWrite { .. }));
                    if let Some(FindingKind::ZombieWrite { token, highest_seen, pause_ms }) = kind {
                        let m = &mut self.summary.zombie_pause_ms_min;
                        *m = Some(m.map_or(pause_ms, |m| m.min(pause_ms)));
                        if self.summary.zombies.len() < Summary::ZOMBIES_KEPT {
                            let (token, highest_seen) = (token.get(), highest_seen.get());
                            let proof = ZombieProof { t_ms: self.now, seq, client, token, highest_seen, pause_ms };
                            self.summary.zombies.push(proof);
                        }
                    }
                }
                if !ok && self.summary.first_rejection.is_none() {
                    self.summary.first_rejection = Some((self.now, seq));
                }
                let detail = Detail::Write { fenced, value, value_before, accepted: ok, late, zombie };
                self.record(Actor::Resource, Kind::Write, client, held, Some(sent_ms), detail);
                self.reply(client, gen, ClientMsg::WriteReply { ok });
            }
        }
    }
}
