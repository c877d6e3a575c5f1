//! The certificates' standing in the record, cached in memory so that a request does not read
//! the database to learn whether its caller's certificate is revoked.
//!
//! Invalidation: the cache is tied to the record-change counter that the wake socket bumps
//! (`wake`). Every changing CLI command (`revoke`, `renew --revoke-old`, `enroll`, ...) commits,
//! then connects to the wake socket and waits until the hub has bumped the counter; the next
//! lookup sees a new counter and drops everything cached. An entry is also dropped after
//! `CERT_CACHE_TTL`, so a change whose wake-up was lost (the socket missing) is still seen
//! within that time.
//!
//! Invariant: an entry read from the record is kept only when the counter did not move while it
//! was read, so a status read before a revocation is never cached after it.

use crate::store::registry::hosts::CertStatus;
use crate::store::{Store, StoreResult};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Longest time a cached standing is trusted without a record change being announced.
pub const CERT_CACHE_TTL: Duration = Duration::from_secs(10);
/// Most certificates cached at once; the cache starts over when it is full.
pub const CERT_CACHE_ENTRIES_MAX: usize = 4096;

/// What is cached, for one value of the record-change counter.
#[derive(Debug, Default)]
struct Entries {
    /// The counter's value the entries were read under.
    generation: u64,
    /// Serial → standing and when it was read.
    by_serial: HashMap<String, (CertStatus, Instant)>,
}

/// The certificates' standing, cached (see the module docs).
#[derive(Debug)]
pub struct CertCache {
    /// The record-change counter (bumped by the wake socket).
    changes: watch::Receiver<u64>,
    entries: Mutex<Entries>,
}

impl CertCache {
    /// A cache invalidated whenever `changes` moves.
    pub fn new(changes: watch::Receiver<u64>) -> CertCache {
        let generation = *changes.borrow();
        CertCache { changes, entries: Mutex::new(Entries { generation, by_serial: HashMap::new() }) }
    }

    /// The standing of the certificate `serial` (`None`: not in the record, which is never
    /// cached), from the cache or else from the record.
    pub async fn status(&self, store: &Store, serial: &str) -> StoreResult<Option<CertStatus>> {
        let generation = *self.changes.borrow();
        if let Some(found) = self.cached(generation, serial) {
            metrics::counter!("baton_hub_cert_cache_total", "result" => "hit").increment(1);
            return Ok(Some(found));
        }
        metrics::counter!("baton_hub_cert_cache_total", "result" => "miss").increment(1);
        let status = store.cert_status(serial.to_string()).await?;
        if let Some(s) = &status {
            self.keep(generation, serial, s.clone());
        }
        Ok(status)
    }

    /// The cached standing, if it was read under `generation` and is not too old.
    fn cached(&self, generation: u64, serial: &str) -> Option<CertStatus> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.generation != generation {
            entries.by_serial.clear();
            entries.generation = generation;
            return None;
        }
        match entries.by_serial.get(serial) {
            Some((s, at)) if at.elapsed() < CERT_CACHE_TTL => Some(s.clone()),
            Some(_) => {
                entries.by_serial.remove(serial);
                None
            }
            None => None,
        }
    }

    /// Keeps a standing read under `generation`, unless the record changed meanwhile.
    fn keep(&self, generation: u64, serial: &str, status: CertStatus) {
        if *self.changes.borrow() != generation {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.generation != generation {
            entries.by_serial.clear();
            entries.generation = generation;
        }
        if entries.by_serial.len() >= CERT_CACHE_ENTRIES_MAX {
            entries.by_serial.clear();
        }
        entries.by_serial.insert(serial.to_string(), (status, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(revoked: bool) -> CertStatus {
        CertStatus { role: baton_shared::ids::Role::Node, name: "h".into(), revoked }
    }

    /// An entry is served until the counter moves; a standing read while it moved is not kept.
    #[test]
    fn a_record_change_drops_what_is_cached() {
        let (tx, rx) = watch::channel(0u64);
        let cache = CertCache::new(rx);
        cache.keep(0, "a", status(false));
        assert_eq!(cache.cached(0, "a"), Some(status(false)));
        tx.send_modify(|n| *n += 1);
        assert_eq!(cache.cached(1, "a"), None, "dropped at the change");
        // Read under 1, but the counter moved to 2 before it was kept: not kept.
        tx.send_modify(|n| *n += 1);
        cache.keep(1, "a", status(false));
        assert_eq!(cache.cached(2, "a"), None);
        cache.keep(2, "a", status(true));
        assert_eq!(cache.cached(2, "a"), Some(status(true)));
    }
}
