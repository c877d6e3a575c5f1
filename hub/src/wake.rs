//! Waking the running hub after a CLI change, so waiting long-polls see new work at once.
//!
//! The hub listens on a Unix socket in its data directory; the CLI, after committing a change
//! that can make work claimable (a lift, a release, a send, a requeue), connects and closes.
//! Each connection bumps the hub's change counter. When the hub is not running the connect
//! fails and nothing is lost: the change is committed, and the next claim sees it.
//!
//! Only the hub that holds the data directory's lock (`lock`) listens, replacing a socket file a
//! crashed hub left; a refused second hub never reaches this. `status` does not connect here (a
//! connection wakes every waiting long-poll); it reads the lock.

use std::path::Path;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Listens on `path` and bumps `changes` for every connection, until `shutdown`.
pub async fn listen(path: &Path, changes: watch::Sender<u64>, shutdown: CancellationToken) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    let path = path.to_path_buf();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = listener.accept() => {
                    if r.is_ok() {
                        changes.send_modify(|n| *n += 1);
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

/// Tells a running hub that something changed. Returns whether a hub was listening.
pub fn notify(path: &Path) -> bool {
    std::os::unix::net::UnixStream::connect(path).is_ok()
}
