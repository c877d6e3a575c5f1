//! The node's session with the hub (SPEC §4): registered once per process after the startup
//! recovery and before any claim (`register_session`, which also takes the start lease the hub
//! grants), and ended at a clean shutdown (`end_session`) unless the session started turns the
//! hub may not know of.

use super::log_hub_error;
use crate::client::Hub;
use crate::limits::BACKOFF_BASE;
use crate::shared_state::Shared;
use crate::store::StoreError;
use baton_client::Backoff;
use baton_shared::error::ErrorCode;
use std::sync::Arc;
use std::time::Duration;

/// Registers this process's session with the hub, after the startup recovery and before any
/// claim or holdings call; retries (paced) while the hub is unreachable. Returns false when the
/// node stopped first (shutdown, or refused for good). A hub that does not know sessions (it
/// predates them) is worked with as before, without one.
pub(super) async fn register_session<H: Hub>(sh: &Arc<Shared<H>>) -> anyhow::Result<bool> {
    let mut backoff = Backoff::new(BACKOFF_BASE, sh.config.backoff_max);
    loop {
        if sh.shutdown.is_cancelled() {
            return Ok(false);
        }
        let sent = tokio::time::Instant::now();
        let answer = tokio::select! {
            r = sh.hub.register_session() => r,
            _ = sh.shutdown.cancelled() => return Ok(false),
        };
        match answer {
            Ok(r) => {
                let _ = sh.session.set(r.session);
                {
                    let mut lease = sh.start_lease();
                    lease.length = r.start_lease_ms.filter(|ms| *ms > 0).map(Duration::from_millis);
                    lease.granted(sent);
                }
                if r.start_lease_ms.is_none() {
                    tracing::warn!(
                        "the hub grants no start lease: turns start only when the hub records their start, never on \
                         this node's own while the hub cannot be reached"
                    );
                }
                match r.took_over {
                    Some(previous) => tracing::warn!(
                        session = r.session,
                        took_over = previous,
                        "registered session {} with the hub; it replaced session {previous}, which had not ended \
                         cleanly (a crash, or another process with this data directory still running)",
                        r.session
                    ),
                    None => tracing::info!(session = r.session, "registered session {} with the hub", r.session),
                }
                let now_ms = sh.now_ms();
                let previous = sh.store.call(|db| db.last_session()).await?;
                let own_crash = previous.is_some_and(|p| p.ended.is_none() && r.took_over == Some(p.session));
                let _ = sh.after_own_crash.set(own_crash);
                sh.store.call(move |db| db.record_session(r.session, r.took_over, now_ms)).await?;
                return Ok(true);
            }
            Err(e) if let Some(why) = e.refused_for_good() => {
                sh.finish(why);
                return Ok(false);
            }
            Err(e) if e.route_unknown() => {
                tracing::warn!("the hub does not know node sessions ({e}); running without one");
                return Ok(true);
            }
            Err(e) if e.code() == Some(ErrorCode::InstanceConflict) => {
                tracing::error!(
                    instance_id = %sh.instance_id,
                    "the hub refuses a session for this instance: another instance of this host still holds work \
                     ({e}); retrying every {}",
                    humantime::format_duration(sh.config.backoff_max)
                );
                sh.pause(sh.config.backoff_max).await;
            }
            Err(e) => {
                log_hub_error("session registration", &e);
                sh.pause(sh.retry_pause(&mut backoff, &e)).await;
            }
        }
    }
}

/// At a clean shutdown: tells the hub this session ended (best effort, bounded), and records it;
/// never for a session that started a turn without the hub's start record.
pub(super) async fn end_session<H: Hub>(sh: &Arc<Shared<H>>) -> Result<(), StoreError> {
    if sh.session.get().is_none() {
        return Ok(());
    }
    if sh.started_offline.load(std::sync::atomic::Ordering::Relaxed) {
        // The hub may not know every turn this session started: ending it cleanly would let the
        // next session start what this one acked. Left unended, the hub treats those runs as
        // possibly started (the next session reports them `unknown`).
        tracing::warn!(
            "not ending this session cleanly: it started turns while the hub could not be reached, so the next \
             session of this data directory reports the turns this one acked and did not start as unknown"
        );
        return Ok(());
    }
    match tokio::time::timeout(crate::limits::SESSION_END_WAIT, sh.hub.end_session()).await {
        Ok(Ok(())) => sh.store.call(|db| db.record_session_end("clean")).await,
        Ok(Err(e)) => {
            tracing::warn!("the hub did not record the end of this session: {e}");
            Ok(())
        }
        Err(_) => {
            tracing::warn!("the hub did not answer the end of this session in time");
            Ok(())
        }
    }
}
