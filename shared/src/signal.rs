//! The one shutdown path both binaries use: SIGTERM or SIGINT cancels a `CancellationToken`
//! that every task holds a clone of (mini-redis's `Shutdown`, passed down).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Installs the SIGTERM and SIGINT handlers and returns a token that is cancelled when either
/// arrives. Fails (instead of silently never shutting down) when a handler cannot be
/// installed. Call inside a tokio runtime.
pub fn shutdown_token() -> std::io::Result<CancellationToken> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        cancel.cancel();
    });
    Ok(token)
}

/// A stream of SIGHUP arrivals (reload requests). Fails when the handler cannot be installed.
pub fn hangups() -> std::io::Result<tokio::signal::unix::Signal> {
    signal(SignalKind::hangup())
}
