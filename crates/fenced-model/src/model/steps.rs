//! The model's steps for stateright: its initial states, the actions each state allows,
//! the state each leads to, and the properties checked over all of them.

use super::*;

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let log = vec![Entry::new(1, 0, Cmd::Init)];
        let follower = Replica {
            term: 1,
            log: log.clone(),
            role: Role::Follower,
            commit: 0,
            due_at: None,
            renewals: NONE_RENEWED,
        };
        // Replica 0 leads term 1, anchored at 0 and serving; the leases are committed.
        let due_at = replay(&log, self.config.ttl_ms).0.poll_timeout();
        let leader = Replica {
            role: Role::Leader { anchor: Some((0, 0)), serving: true },
            commit: 1,
            due_at,
            ..follower.clone()
        };
        let client = Client {
            valid_until: self.config.ttl_ms,
            token: None,
            lease_gone: false,
            pending: None,
            sent: 0,
            grace_until: 0,
        };
        vec![State {
            now: 0,
            replicas: [leader, follower.clone(), follower],
            clients: [client.clone(), client],
            leader_changes: 0,
            gate_mark: None,
            history: History { committed_len: 1, ..History::default() },
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.config.time_max {
            actions.push(Action::Advance);
        }
        for l in 0..REPLICAS {
            let r = &s.replicas[l];
            if !matches!(r.role, Role::Leader { .. }) {
                continue;
            }
            for to in (0..REPLICAS).filter(|&to| to != l && s.replicas[to].log != r.log || s.replicas[to].term > r.term)
            {
                actions.push(Action::Sync { leader: l as u8, to: to as u8 });
            }
            if !Self::serving(r) || r.log.len() >= self.config.log_max {
                continue;
            }
            for (c, client) in s.clients.iter().enumerate() {
                if client.pending.is_some() || client.lease_gone || client.sent >= self.config.requests_max[c] {
                    continue;
                }
                actions.push(Action::Request { client: c as u8, to: l as u8, kind: Kind::Keepalive });
                if client.token.is_none() {
                    actions.push(Action::Request { client: c as u8, to: l as u8, kind: Kind::Acquire });
                }
            }
        }
        for l in 0..REPLICAS {
            let waiting = s.clients.iter().any(|c| c.pending.is_some_and(|p| p.confirming && p.leader as usize == l));
            if waiting {
                for voter in (0..REPLICAS).filter(|&v| v != l) {
                    actions.push(Action::Confirm { leader: l as u8, voter: voter as u8 });
                }
            }
        }
        if s.leader_changes < self.config.leader_changes_max {
            for candidate in 0..REPLICAS {
                for voter in (0..REPLICAS).filter(|&v| v != candidate) {
                    let fit = self.config.variant == Variant::StaleLeader
                        || Self::up_to_date(&s.replicas[candidate].log, &s.replicas[voter].log);
                    if fit {
                        actions.push(Action::Elect { candidate: candidate as u8, voter: voter as u8 });
                    }
                }
            }
        }
        for (c, client) in s.clients.iter().enumerate() {
            if client.token.is_some_and(|t| s.gate_mark.is_some_and(|mark| t < mark)) {
                actions.push(Action::ZombieWrite { client: c as u8 });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Advance => s.now += 1,
            Action::Request { client, to, kind: Kind::Keepalive }
                if self.answers_from_memory(&s, to as usize, client as usize) =>
            {
                self.keepalive_from_memory(&mut s, client as usize, to as usize);
            }
            Action::Request { client, to, kind } => {
                let (c, l) = (client as usize, to as usize);
                let index = s.replicas[l].log.len();
                let cmd = match kind {
                    Kind::Keepalive => Cmd::Keepalive(client),
                    Kind::Acquire => Cmd::Acquire(client),
                };
                let now_ms = self.stamp(&s, l);
                Self::append(&mut s, l, now_ms, cmd);
                s.clients[c].sent += 1;
                if self.config.variant == Variant::AckBeforeCommit {
                    let (_, outputs) = replay(&s.replicas[l].log, self.config.ttl_ms);
                    let answer = outputs[index].answers.iter().find(|(r, _)| *r == request_of(index));
                    let answer = answer.map(|(_, a)| a.clone());
                    let now = s.now;
                    self.answer(&mut s, c, kind, now, answer);
                } else {
                    let term = s.replicas[l].term;
                    let pending = Pending { kind, sent_at: s.now, leader: to, term, index, confirming: false };
                    s.clients[c].pending = Some(pending);
                }
            }
            Action::Sync { leader, to } => {
                let (l, f) = (leader as usize, to as usize);
                if s.replicas[f].term > s.replicas[l].term {
                    let term = s.replicas[f].term;
                    Self::step_down(&mut s, l, term);
                    return Some(s);
                }
                if matches!(s.replicas[f].role, Role::Leader { .. }) {
                    let term = s.replicas[l].term;
                    Self::step_down(&mut s, f, term);
                }
                let leader_replica = s.replicas[l].clone();
                let follower = &mut s.replicas[f];
                follower.term = leader_replica.term;
                follower.log = leader_replica.log;
                let to = Self::commit_index(&s, l);
                if to > s.replicas[l].commit {
                    self.committed(&mut s, l, to);
                }
            }
            Action::Elect { candidate, voter } => {
                let (c, v) = (candidate as usize, voter as usize);
                let term = s.replicas.iter().map(|r| r.term).max().unwrap_or(0) + 1;
                for who in [c, v] {
                    Self::step_down(&mut s, who, term);
                }
                let r = &mut s.replicas[c];
                r.role = Role::Leader { anchor: None, serving: false };
                r.log.push(Entry::new(term, 0, Cmd::Blank));
                s.leader_changes += 1;
            }
            Action::ZombieWrite { client } => {
                let token = s.clients[client as usize].token.expect("only a client with a token writes");
                self.gate_write(&mut s, token);
            }
            Action::Confirm { leader, voter } => self.confirm(&mut s, leader as usize, voter as usize),
        }
        self.timers(&mut s);
        s.forget_past();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        use names::*;
        vec![
            Property::always(LEASE_OUTLIVES_KEEPALIVE, |_, s: &State| !s.history.expired_early),
            Property::always(FAILOVER_GRACE, |_, s: &State| !s.history.expired_in_failover),
            Property::always(TOKENS_RISE, |_, s: &State| !s.history.token_regressed),
            Property::always(GATE_MONOTONIC, |_, s: &State| !s.history.gate_regressed),
            Property::always(MUTUAL_EXCLUSION, |_, s: &State| {
                let holds = |c: &Client| c.token.is_some() && s.now < c.valid_until;
                !s.clients.iter().all(holds)
            }),
            Property::sometimes(SOME_GRANT, |_, s: &State| s.history.last_token.is_some()),
            Property::sometimes(SOME_LEADER_CHANGE, |_, s: &State| s.leader_changes >= 1),
            Property::sometimes(SOME_TWO_LEADER_CHANGES, |_, s: &State| s.leader_changes >= 2),
            Property::sometimes(SOME_EXPIRY, |_, s: &State| s.history.expired),
            Property::sometimes(SOME_GATE_REFUSAL, |_, s: &State| s.history.gate_refused),
            Property::sometimes(SOME_KEEPALIVE_FROM_MEMORY, |_, s: &State| s.history.answered_from_memory),
            Property::sometimes(SOME_RENEWAL_LOGGED, |_, s: &State| {
                let committed = |r: &Replica| r.log[..r.commit].iter().any(|e| e.renewed.iter().any(Option::is_some));
                s.replicas.iter().any(committed)
            }),
            Property::sometimes(SOME_REQUEST_TO_DEPOSED, |_, s: &State| {
                let newest = s.replicas.iter().map(|r| r.term).max().unwrap_or(0);
                s.clients.iter().any(|c| c.pending.is_some_and(|p| p.term < newest))
            }),
        ]
    }
}
