//! Who waits for claimable work: each waiting claim listens to its host's signal and to the one
//! for all hosts; work for a pool signals the hosts of its members that wait.

use tokio::sync::watch;

/// Wakes waiting claims: each waits on its own host's signal and on the one for all hosts, so a
/// change for one host wakes no other host's claims (no thundering herd).
#[derive(Debug)]
pub struct Work {
    /// Bumped for changes that may concern any host.
    all: watch::Sender<u64>,
    /// One signal per host with a waiting claim (dropped once nothing waits on it), with the
    /// pools the host belonged to when its last claim began waiting.
    hosts: std::sync::Mutex<std::collections::HashMap<String, Waiting>>,
}

/// A host's signal and the pools it belonged to when its last claim began waiting.
type Waiting = (watch::Sender<u64>, Vec<String>);

impl Default for Work {
    fn default() -> Self {
        Work { all: watch::channel(0).0, hosts: Default::default() }
    }
}

/// What one waiting claim listens to: its host's signal and the one for all hosts.
#[derive(Debug)]
pub struct WorkWatch {
    all: watch::Receiver<u64>,
    host: watch::Receiver<u64>,
}

impl WorkWatch {
    /// Returns when work may have become claimable for the host (or the hub is going away).
    pub async fn changed(&mut self) {
        tokio::select! {
            _ = self.all.changed() => {}
            _ = self.host.changed() => {}
        }
    }
}

impl Work {
    /// Starts listening for `host`, a member of `pools` (as read before this call: a host
    /// added to a pool later is woken by that change itself): changes after this call are seen
    /// by `WorkWatch::changed`.
    pub fn watch(&self, host: &str, pools: Vec<String>) -> WorkWatch {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let host = match hosts.get_mut(host) {
            Some((tx, known)) => {
                *known = pools;
                tx.subscribe()
            }
            None => {
                // A new host's signal: forget those nobody waits on any more.
                hosts.retain(|_, (tx, _)| tx.receiver_count() > 0);
                let (tx, rx) = watch::channel(0u64);
                hosts.insert(host.to_string(), (tx, pools));
                rx
            }
        };
        WorkWatch { all: self.all.subscribe(), host }
    }

    /// Wakes the waiting claims of `host` only.
    pub fn host(&self, host: &str) {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((tx, _)) = hosts.get(host) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes the waiting claims of the members of `pool` (no other host's).
    pub fn pool(&self, pool: &str) {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        for (tx, pools) in hosts.values() {
            if pools.iter().any(|p| p == pool) {
                tx.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Wakes every waiting claim.
    pub fn all(&self) {
        self.all.send_modify(|n| *n = n.wrapping_add(1));
    }
}
