//! The in-memory half of turn control: node sessions' last contact and the cancel notices each
//! instance's claims were already answered with.

/// In-memory turn-control bookkeeping: when each node session was last heard from (written to
/// `node_sessions.last_contact_at` every `CONTACT_FLUSH_INTERVAL`, so no read opens a write
/// transaction for it), and which cancel notices each instance's claims were already answered
/// with (a waiting claim returns at once only for a new one).
#[derive(Debug, Default)]
pub struct TurnState {
    contacts: std::sync::Mutex<std::collections::HashMap<(String, u64), i64>>,
    announced: std::sync::Mutex<std::collections::HashMap<String, std::collections::HashSet<(String, u32)>>>,
}

/// How often the last contact of node sessions is written to the record.
pub const CONTACT_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

impl TurnState {
    /// Notes that `host`'s session `session` was heard from at `now_ms`.
    pub fn contact(&self, host: &str, session: Option<u64>, now_ms: i64) {
        let Some(session) = session else { return };
        if let Ok(mut c) = self.contacts.lock() {
            let at = c.entry((host.to_string(), session)).or_insert(now_ms);
            *at = (*at).max(now_ms);
        }
    }

    /// Takes the contacts noted since the last call.
    pub fn take_contacts(&self) -> Vec<(String, u64, i64)> {
        match self.contacts.lock() {
            Ok(mut c) => c.drain().map(|((h, s), at)| (h, s, at)).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Records that `instance`'s claim is answered with `cancels`; returns whether any of them
    /// was not in an earlier answer. Notices no longer pending are forgotten.
    pub fn announce(&self, instance: &str, cancels: &[baton_shared::wire::CancelNotice]) -> bool {
        let Ok(mut all) = self.announced.lock() else { return !cancels.is_empty() };
        let now: std::collections::HashSet<(String, u32)> =
            cancels.iter().map(|c| (c.delivery_id.clone(), c.attempt)).collect();
        let seen = all.entry(instance.to_string()).or_default();
        let fresh = now.iter().any(|k| !seen.contains(k));
        *seen = now;
        if seen.is_empty() {
            all.remove(instance);
        }
        fresh
    }
}

#[cfg(test)]
mod turn_state_tests {
    use super::*;
    use baton_shared::wire::CancelNotice;

    fn notice(id: &str) -> CancelNotice {
        CancelNotice { delivery_id: id.into(), attempt: 1, reason: "r".into() }
    }

    /// A waiting claim returns early only for a notice its instance was not answered with yet;
    /// a notice that stops being pending is forgotten.
    #[test]
    fn only_a_new_cancel_notice_is_fresh() {
        let t = TurnState::default();
        assert!(!t.announce("i", &[]));
        assert!(t.announce("i", &[notice("a")]));
        assert!(!t.announce("i", &[notice("a")]), "already answered with it");
        assert!(t.announce("j", &[notice("a")]), "per instance");
        assert!(t.announce("i", &[notice("a"), notice("b")]));
        assert!(!t.announce("i", &[notice("b")]));
        assert!(t.announce("i", &[notice("a")]), "a gone and back again is new");
        t.contact("host", Some(1), 5);
        t.contact("host", Some(1), 3);
        t.contact("host", None, 9);
        assert_eq!(t.take_contacts(), vec![("host".to_string(), 1, 5)]);
        assert!(t.take_contacts().is_empty());
    }
}
