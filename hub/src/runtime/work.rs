//! Who waits for claimable work: each waiting claim listens to its host's signal and to the one
//! for all hosts.

use tokio::sync::watch;

/// Wakes waiting claims: each waits on its own host's signal and on the one for all hosts, so a
/// change for one host wakes no other host's claims (no thundering herd).
#[derive(Debug)]
pub struct Work {
    /// Bumped for changes that may concern any host.
    all: watch::Sender<u64>,
    /// One signal per host with a waiting claim (dropped once nothing waits on it).
    hosts: std::sync::Mutex<std::collections::HashMap<String, watch::Sender<u64>>>,
}

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
    /// Starts listening for `host`: changes after this call are seen by `WorkWatch::changed`.
    pub fn watch(&self, host: &str) -> WorkWatch {
        let mut hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        let host = match hosts.get(host) {
            Some(tx) => tx.subscribe(),
            None => {
                // A new host's signal: forget those nobody waits on any more.
                hosts.retain(|_, tx| tx.receiver_count() > 0);
                let (tx, rx) = watch::channel(0u64);
                hosts.insert(host.to_string(), tx);
                rx
            }
        };
        WorkWatch { all: self.all.subscribe(), host }
    }

    /// Wakes the waiting claims of `host` only.
    pub fn host(&self, host: &str) {
        let hosts = self.hosts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = hosts.get(host) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Wakes every waiting claim.
    pub fn all(&self) {
        self.all.send_modify(|n| *n = n.wrapping_add(1));
    }
}
