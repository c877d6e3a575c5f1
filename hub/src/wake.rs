//! Waking the running hub after a CLI change, so waiting long-polls see new work at once.
//!
//! The hub listens on a Unix socket in its data directory; the CLI, after committing a change
//! that can make work claimable (a lift, a release, a send, a requeue), connects and closes.
//! Each connection bumps the hub's change counter, and only then is answered (one byte when the
//! socket takes it at once) and closed: the CLI waits for that answer or the close (at most
//! `WAKE_ACK_WAIT`), so when a command such as `revoke` returns, the hub has already seen the
//! change (its certificate cache is emptied, see `runtime::certs`). When the hub is not running the connect fails and nothing is lost: the
//! change is committed, and the next claim sees it.
//!
//! Only the hub that holds the data directory's lock (`lock`) listens, replacing a socket file a
//! crashed hub left; a refused second hub never reaches this. `status` does not connect here (a
//! connection wakes every waiting long-poll); it reads the lock.

use std::io::Read;
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Listens on `path` and bumps `changes` for every connection, until `shutdown`.
pub async fn listen(
    path: &Path,
    changes: std::sync::Arc<watch::Sender<u64>>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    let path = path.to_path_buf();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = listener.accept() => {
                    if let Ok((stream, _)) = r {
                        changes.send_modify(|n| *n = n.wrapping_add(1));
                        // The change is seen; tell the waiting command (it may have gone).
                        // Dropping the stream closes it, which the command also takes as the
                        // answer.
                        let _ = stream.try_write(&[1]);
                        drop(stream);
                    }
                }
                _ = shutdown.cancelled() => break,
            }
        }
        let _ = std::fs::remove_file(&path);
    });
    Ok(())
}

/// Longest wait of `notify` for the hub to confirm it saw the change.
pub const WAKE_ACK_WAIT: Duration = Duration::from_secs(2);

/// Tells a running hub that something changed, and waits (at most `WAKE_ACK_WAIT`) until it
/// has taken the change in (it answers or closes the connection only after that). Returns
/// whether a hub was listening.
pub fn notify(path: &Path) -> bool {
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(path) else { return false };
    // A hub that does not answer in time (or closes without answering) still got the wake-up.
    if stream.set_read_timeout(Some(WAKE_ACK_WAIT)).is_ok() {
        let _ = stream.read(&mut [0u8; 1]);
    }
    true
}
