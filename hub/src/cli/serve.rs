//! `serve`: load the layered configuration, take the data directory's lock, open and repair
//! the store, bind, announce the address, and serve until SIGTERM or SIGINT.

use super::{CliError, CliResult, Context, output};
use crate::config::Flags;
use crate::lock::LockError;
use crate::server::Hub;
use baton_shared::exit;
use baton_shared::logging;
use std::path::Path;

/// Runs the hub in the foreground.
pub(super) fn serve(ctx: &Context, file: Option<&Path>, flags: &Flags) -> CliResult {
    let dir = &ctx.dir;
    let config = ctx.config_with(file, flags)?;
    logging::init(config.log_format);
    // On PostgreSQL the record is not in the data directory; its files (CA, certificate) are.
    let record_missing = config.database_url.is_none() && !dir.db().exists();
    if record_missing || !dir.ca_cert().exists() {
        return Err(CliError::new(
            exit::REFUSED,
            format!("{} is not initialised; run `baton-hub init` first", dir.root().display()),
        ));
    }
    let mut hub = Hub::open(dir.clone(), config.clone(), ctx.clock.clone()).map_err(|e| {
        let refused = e.chain().any(|c| c.downcast_ref::<baton_shared::sqlite::OpenError>().is_some());
        let held = e.chain().any(|c| matches!(c.downcast_ref::<LockError>(), Some(LockError::Held { .. })));
        let pg =
            e.chain().find_map(|c| c.downcast_ref::<crate::store::engine::postgres::PgError>()).map(|p| p.exit_code());
        let files = e.chain().any(|c| c.downcast_ref::<crate::fds::FileLimitError>().is_some());
        let code = match pg {
            _ if files => exit::USAGE,
            Some(code) if !held => code,
            _ if refused && !held => exit::REFUSED,
            _ => exit::FAILURE,
        };
        CliError::new(code, format!("{e:#}"))
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::failure(format!("starting the async runtime: {e}")))?;
    rt.block_on(async move {
        let shutdown = baton_shared::signal::shutdown_token()
            .map_err(|e| CliError::failure(format!("cannot install the SIGTERM/SIGINT handlers: {e}")))?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| CliError::failure(format!("cannot listen on {}: {e}", config.listen)))?;
        let addr = listener.local_addr()?;
        hub.announce(addr).map_err(|e| CliError::failure(format!("{e:#}")))?;
        output::line(format!("listening on {addr}"))?;
        // Startup repair ran in `Hub::open` and the listener is bound: only now is the hub ready.
        systemd::ready_then_watch(&shutdown);
        hub.serve(listener, shutdown).await.map_err(|e| CliError::failure(format!("{e:#}")))
    })
}

/// The hub as a systemd service (`Type=notify`, see `hub/pkg/`), through `sd-notify`, which
/// does nothing when `NOTIFY_SOCKET` is not set (a hub started by hand or by the tests).
mod systemd {
    use sd_notify::NotifyState;
    use tokio_util::sync::CancellationToken;

    /// Sends `states`; a failure is logged, never fatal (the hub works without systemd).
    fn notify(states: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(states) {
            tracing::warn!(error = %e, "could not notify systemd");
        }
    }

    /// Sends READY=1, then, from a task, feeds the watchdog at half its interval (`WatchdogSec=`;
    /// a wedged runtime stops feeding it and systemd restarts the hub) until `shutdown` fires,
    /// and sends STOPPING=1 as the drain begins.
    pub(super) fn ready_then_watch(shutdown: &CancellationToken) {
        notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
        let interval = sd_notify::watchdog_enabled().map(|d| d / 2).filter(|d| !d.is_zero());
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            match interval {
                Some(every) => loop {
                    notify(&[NotifyState::Watchdog]);
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(every) => {}
                    }
                },
                None => shutdown.cancelled().await,
            }
            notify(&[NotifyState::Stopping]);
        });
    }
}
