//! Crash points: named places where a test build can abort the process on purpose.
//!
//! Compiled in only with the `crash-points` feature; otherwise `crash_point` is an empty
//! inline function. With the feature, the environment variable `BATON_CRASH_POINT` names one
//! point (`hub.accept.after_commit`), optionally with the hit on which to fire
//! (`hub.accept.after_commit@3`, default 1). When that hit comes, the process writes one line
//! to stderr and aborts: no destructors, no flush, exactly as a power cut or SIGKILL would
//! leave it (a panic would not do, since a panic in a tokio task does not end the process).

/// The environment variable that arms a crash point.
pub const CRASH_POINT_ENV: &str = "BATON_CRASH_POINT";

/// Marks a crash point. Aborts the process when this point is armed and its hit comes.
#[inline(always)]
pub fn crash_point(name: &'static str) {
    #[cfg(feature = "crash-points")]
    armed::hit(name);
    #[cfg(not(feature = "crash-points"))]
    let _ = name;
}

/// The environment variable that switches off one named safety rule in a test build
/// (`node.start.ignore_lease`), so that a mutation test can show its check catches the rule's
/// absence. Read only with the `crash-points` feature; release builds carry no switch.
pub const MUTATION_ENV: &str = "BATON_MUTATION";

/// Whether the safety rule `name` is switched off (`BATON_MUTATION` names it, in a build with
/// crash points); always false otherwise.
#[inline(always)]
pub fn mutation(name: &'static str) -> bool {
    #[cfg(feature = "crash-points")]
    {
        static NAMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        NAMED.get_or_init(|| std::env::var(MUTATION_ENV).ok()).as_deref() == Some(name)
    }
    #[cfg(not(feature = "crash-points"))]
    {
        let _ = name;
        false
    }
}

/// Whether crash points are compiled into this build.
pub const fn crash_points_enabled() -> bool {
    cfg!(feature = "crash-points")
}

#[cfg(feature = "crash-points")]
mod armed {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    static HITS: AtomicU64 = AtomicU64::new(0);

    fn armed() -> &'static Option<(String, u64)> {
        ARMED.get_or_init(|| {
            let v = std::env::var(super::CRASH_POINT_ENV).ok()?;
            let (name, nth) = match v.split_once('@') {
                Some((n, k)) => (n.to_string(), k.parse().unwrap_or(1)),
                None => (v, 1),
            };
            Some((name, nth.max(1)))
        })
    }

    pub(super) fn hit(name: &'static str) {
        let Some((armed, nth)) = armed() else { return };
        if armed != name {
            return;
        }
        let n = HITS.fetch_add(1, Ordering::SeqCst) + 1;
        if n == *nth {
            let _ = writeln!(std::io::stderr(), "crash point {name} reached (hit {n}); aborting");
            std::process::abort();
        }
    }
}
