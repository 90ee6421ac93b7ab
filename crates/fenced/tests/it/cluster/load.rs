//! The load the kill and backup tests run: threads that acquire, write the token to
//! the fenced store and release on whichever member leads, recording what was acknowledged.

use super::*;

/// Grants seen by the load: tokens in the order they were acknowledged, and the last
/// fenced-store write acknowledged per key.
#[derive(Default)]
pub(super) struct Grants {
    pub(super) tokens: Vec<u64>,
    pub(super) stored: BTreeMap<String, u64>,
}

/// Load threads on every member, until [`Load::finish`].
pub(super) struct Load {
    pub(super) grants: Arc<Mutex<Grants>>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) workers: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    pub(super) fn start(c: &Cluster, n: usize) -> Load {
        let grants = Arc::new(Mutex::new(Grants::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let addrs: Vec<SocketAddr> = c.members.iter().map(|m| m.addr).collect();
        let workers = (0..n)
            .map(|i| {
                let (g, s, a) = (grants.clone(), stop.clone(), addrs.clone());
                std::thread::spawn(move || load(a, i, &g, &s))
            })
            .collect();
        Load { grants, stop, workers }
    }

    pub(super) fn finish(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for w in std::mem::take(&mut self.workers) {
            w.join().unwrap();
        }
    }
}

impl Drop for Load {
    /// A test that gives up early stops its load too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One load thread: acquire, write the token to the fenced store under it, release,
/// over and over, on whichever member leads.
pub(super) fn load(addrs: Vec<SocketAddr>, i: usize, grants: &Mutex<Grants>, stop: &AtomicBool) {
    let mut at = 0;
    while !stop.load(Ordering::SeqCst) {
        let addr = addrs[at % addrs.len()];
        match call(addr, "POST", &format!("/v1/locks/load-{i}/acquire"), "{\"ttl_ms\":2000}", &[]) {
            Ok((200, g)) => {
                let token = g["token"].as_u64().unwrap();
                grants.lock().unwrap().tokens.push(token);
                let key = format!("load-{i}");
                let fence = [("fencing-token", token.to_string())];
                if let Ok((200, _)) = call(addr, "PUT", &format!("/v1/store/{key}"), &token.to_string(), &fence) {
                    grants.lock().unwrap().stored.insert(key, token);
                }
                let lease = g["lease_id"].as_str().unwrap();
                let _ = call(addr, "DELETE", &format!("/v1/leases/{lease}"), "", &[]);
            }
            _ => {
                at += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Waits until the load has `n` more grants, up to 20 s.
pub(super) fn progress(grants: &Mutex<Grants>, n: usize) -> Result<(), String> {
    let before = grants.lock().unwrap().tokens.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while grants.lock().unwrap().tokens.len() < before + n {
        if Instant::now() > deadline {
            return Err(format!(
                "the load made no progress ({} grants in 20 s)",
                grants.lock().unwrap().tokens.len() - before
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
