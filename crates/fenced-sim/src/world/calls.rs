//! The clients' calls to the lock service: each a command applied on the node it reaches,
//! the answer sent back, or refused while the service is down.

use super::*;

impl<'a, S: TraceSink> World<'a, S> {
    pub(super) fn on_service(&mut self, client: u32, lease_n: u32, sent_ms: u64, msg: ServiceMsg) {
        let Some(node) = self.route(client) else {
            return self.unavailable(client, lease_n, msg);
        };
        let lease = Self::lease_id(client, lease_n);
        let name = self.names[self.clients[client as usize].lock as usize].clone();
        match msg {
            ServiceMsg::Acquire => {
                // An implicit lease the client names (one per attempt), as the real
                // client acquires: it lives from the grant, and a retry names it again.
                let (wait_ms, lock_delay_ms) = (self.cfg.wait_ms, self.cfg.lock_delay_ms);
                let lease = LeaseRef::Implicit { id: lease, ttl_ms: self.cfg.lease_ms };
                let req = Acquire { name, lease, wait_ms, lock_delay_ms, holder: None };
                let (request, answer) = self.service(node, Command::Acquire(req));
                match answer {
                    None => drop(self.waiters.insert(request, (client, lease_n, node))),
                    // Grants, immediate or later, reach the client through the effects.
                    Some(Ok(Answer::Granted(_))) => {}
                    Some(_) => {
                        let gen = self.clients[client as usize].gen;
                        self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                    }
                }
            }
            ServiceMsg::Keepalive => {
                let ok = matches!(self.service(node, Command::Keepalive { lease }).1, Some(Ok(_)));
                if ok {
                    self.lease_alive_at[client as usize] = self.now;
                }
                let token = self.clients[client as usize].token;
                self.record(Actor::Lock, Kind::Keepalive, client, token, Some(sent_ms), Detail::Keepalive { ok });
                let gen = self.clients[client as usize].gen;
                self.reply(client, gen, ClientMsg::KeepaliveReply { lease_n, ok });
            }
            ServiceMsg::Release => {
                self.service(node, Command::Release { name, lease });
                self.service(node, Command::Revoke { lease });
                let gen = self.clients[client as usize].gen;
                self.reply(client, gen, ClientMsg::ReleaseAck);
            }
        }
        self.after_service_call(node);
    }

    /// No node serves this client now (the service is down, or the client is cut off
    /// from every replica that serves): its connection fails. An acquire is answered
    /// "not granted" (it tries again later), a release "done" (its lease ends anyway),
    /// a keepalive not at all (the client cannot tell whether its lease lives).
    pub(super) fn unavailable(&mut self, client: u32, lease_n: u32, msg: ServiceMsg) {
        let gen = self.clients[client as usize].gen;
        match msg {
            ServiceMsg::Acquire => self.reply(client, gen, ClientMsg::NotGranted { lease_n }),
            ServiceMsg::Release => self.reply(client, gen, ClientMsg::ReleaseAck),
            ServiceMsg::Keepalive => {}
        }
    }

    /// Applies one command to the lock service now: its effects and the answers to
    /// queued requests are kept for `after_service_call`; its request id and its own
    /// answer are returned (`None` while it waits).
    pub(super) fn service(&mut self, node: usize, cmd: Command) -> (RequestId, Option<Result<Answer, Error>>) {
        self.next_request += 1;
        let request = RequestId(self.next_request);
        let batch = Batch::one(request, cmd, self.node_now(node));
        if self.cfg.replication.is_some() {
            self.replicate(node, &batch);
        }
        self.nodes[node].append(&batch);
        let mut own = None;
        let (effects, answers) = (&mut self.effects, &mut self.answers);
        self.nodes[node].table.apply_batch(batch, &mut Output::default(), |out| {
            own = out.take_answer(request);
            effects.append(&mut out.effects);
            answers.append(&mut out.answers);
        });
        (request, own)
    }

    /// Carries out the effects of a node's table and re-arms its timer.
    pub(super) fn after_service_call(&mut self, node: usize) {
        let mut effects = std::mem::take(&mut self.effects);
        let answers = std::mem::take(&mut self.answers);
        for e in effects.drain(..) {
            match e {
                Effect::Granted { grant, request, .. } => {
                    if let Some(w) = request {
                        self.waiters.remove(&w);
                        let answer = answers.iter().find(|(r, _)| *r == w).map(|(_, a)| a);
                        if !matches!(answer, Some(Ok(Answer::Granted(_)))) {
                            // Lost again in the same tick: the table does not answer it
                            // as a grant, so neither does the network.
                            let (client, lease_n) = Self::client_of(grant.lease);
                            let token = grant.token;
                            self.granted(node, client, token);
                            let gen = self.clients[client as usize].gen;
                            self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                            continue;
                        }
                    }
                    let (client, lease_n) = Self::client_of(grant.lease);
                    if lease_n == self.clients[client as usize].lease_n {
                        // The implicit lease's TTL runs from its grant.
                        self.lease_alive_at[client as usize] = self.now;
                    }
                    self.summary.grants += 1;
                    let token = grant.token;
                    self.granted(node, client, token);
                    let gen = self.clients[client as usize].gen;
                    self.reply(client, gen, ClientMsg::Granted { lease_n, token });
                }
                Effect::Released { token, lease, reason, .. } => {
                    let (client, _) = Self::client_of(lease);
                    if reason == ReleaseReason::Expired {
                        if self.now < self.lease_alive_at[client as usize] + self.cfg.lease_ms {
                            self.summary.early_expiries += 1;
                        }
                        self.record(Actor::Lock, Kind::Expired, client, Some(token), None, Detail::None);
                        self.history(client, EventKind::LeaseExpired { token });
                    } else {
                        self.record(Actor::Lock, Kind::Released, client, Some(token), None, Detail::None);
                        self.history(client, EventKind::Released { token });
                    }
                }
                Effect::WaitEnded { request, .. } => {
                    // Timed out, or its lease ended: the client hears "not granted".
                    if let Some((client, lease_n, _)) = self.waiters.remove(&request) {
                        self.record(Actor::Lock, Kind::WaitEnded, client, None, None, Detail::None);
                        let gen = self.clients[client as usize].gen;
                        self.reply(client, gen, ClientMsg::NotGranted { lease_n });
                    }
                }
                Effect::LeaseExpired { .. } | Effect::StoreFenced { .. } => {}
            }
        }
        self.effects = effects;
        self.arm_timer(node);
    }

    /// A grant reached a client's history: the trace, the checker, and the count of
    /// tokens granted twice.
    pub(super) fn granted(&mut self, node: usize, client: u32, token: Token) {
        let detail =
            if self.cfg.replication.is_some() { Detail::Replica { replica: node as u32 } } else { Detail::None };
        self.record(Actor::Lock, Kind::Granted, client, Some(token), None, detail);
        self.history(client, EventKind::Granted { token });
        let lock = self.clients[client as usize].lock as usize;
        if let Some(seen) = self.granted_tokens.get_mut(lock) {
            if !seen.insert(token.get()) {
                self.summary.duplicate_tokens += 1;
            }
        }
    }

    pub(super) fn lease_id(client: u32, lease_n: u32) -> LeaseId {
        LeaseId(((client as u128) << 32) | lease_n as u128)
    }

    pub(super) fn client_of(lease: LeaseId) -> (u32, u32) {
        ((lease.0 >> 32) as u32, lease.0 as u32)
    }
}
