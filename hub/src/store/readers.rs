//! The pool of read connections: at most `READERS_MAX`, opened once and kept for the hub's life
//! (each with its prepared-statement cache, so a burst of reads parses no schema and prepares
//! no statement again); a read waits for a free connection rather than opening another, and
//! runs in one read transaction inside `spawn_blocking`, never on an async worker.

use super::writer::{Opener, OwnedDb, panic_message};
use super::{StoreError, StoreResult};
use crate::store::engine::Db;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Most read connections open at once; each is kept once opened.
pub const READERS_MAX: usize = 8;

/// A pool of long-lived read connections, used only inside `spawn_blocking`.
pub struct Readers {
    open: Opener,
    idle: Mutex<Vec<OwnedDb>>,
    /// One permit per connection that may be in use: at most `READERS_MAX`.
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    /// Connections opened so far.
    opened: AtomicUsize,
}

impl Readers {
    /// A pool reading the database at `path`.
    pub fn new(path: PathBuf) -> Readers {
        Readers::with_opener(Box::new(move || {
            let conn = super::open_read(&path).map_err(|e| StoreError::Storage(e.to_string()))?;
            Ok(Box::new(conn) as OwnedDb)
        }))
    }

    /// A pool whose connections `open` makes.
    pub fn with_opener(open: Opener) -> Readers {
        Readers {
            open,
            idle: Mutex::new(Vec::new()),
            permits: std::sync::Arc::new(tokio::sync::Semaphore::new(READERS_MAX)),
            opened: AtomicUsize::new(0),
        }
    }

    /// How many read connections the pool has opened (each is kept; a failed one is replaced).
    pub fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    fn take(&self) -> StoreResult<OwnedDb> {
        let pooled = self.idle.lock().map_err(|_| StoreError::Storage("reader pool poisoned".into()))?.pop();
        match pooled {
            Some(c) => Ok(c),
            None => {
                let conn = (self.open)()?;
                self.opened.fetch_add(1, Ordering::Relaxed);
                Ok(conn)
            }
        }
    }

    fn give_back(&self, conn: OwnedDb) {
        // Never more than `READERS_MAX`: each one in use holds a permit.
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(conn);
        }
    }

    /// Runs a read-only `f` on a pooled connection off the async threads, waiting for a free
    /// connection when all `READERS_MAX` are in use.
    pub async fn read<R, F>(self: &std::sync::Arc<Self>, f: F) -> StoreResult<R>
    where
        R: Send + 'static,
        F: FnOnce(&dyn Db) -> StoreResult<R> + Send + 'static,
    {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Storage("the reader pool is closed".into()))?;
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let conn = this.take()?;
            // One read transaction: every query in `f` sees the same snapshot.
            conn.begin_read()?;
            let r = f(conn.as_ref());
            // A read ends with a rollback: it changed nothing, and on PostgreSQL a failed
            // statement leaves the transaction unable to commit.
            if conn.control("ROLLBACK").is_ok() && !conn.broken() {
                this.give_back(conn);
            }
            r
        })
        .await
        .map_err(|e| match e.try_into_panic() {
            Ok(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(panic = %message, "a read job panicked");
                StoreError::Internal(message)
            }
            Err(_) => StoreError::Storage("the read task was cancelled".into()),
        })?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton_shared::sqlite::Synchronous;

    /// A burst of reads far wider than the pool opens no more than `READERS_MAX` connections,
    /// and later bursts reuse them: no connection (schema, statements) is built per burst.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_connections_are_bounded_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hub.db");
        drop(crate::store::open_write(&path, Synchronous::Normal).unwrap());
        let readers = std::sync::Arc::new(Readers::new(path));
        for _ in 0..3 {
            let mut reads = Vec::new();
            for _ in 0..64 {
                let readers = readers.clone();
                reads.push(tokio::spawn(async move {
                    readers
                        .read(|c| {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            Ok(c.query_row("SELECT count(*) FROM deliveries", [], |r| r.get::<_, i64>(0))?)
                        })
                        .await
                }));
            }
            for r in reads {
                assert_eq!(r.await.unwrap().unwrap(), 0);
            }
        }
        let opened = readers.opened();
        assert!((1..=READERS_MAX).contains(&opened), "opened {opened}");
    }
}
