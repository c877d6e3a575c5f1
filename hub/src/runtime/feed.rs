//! The events feeds' horizon on PostgreSQL (`store::views::feed`): the highest position a barrier
//! transaction proved no later commit can go below, shared by every feed reader of this hub, and
//! the one barrier in flight.

use crate::store::{Store, StoreResult};
use std::sync::atomic::{AtomicI64, Ordering};

/// The horizon barriers gave this hub (PostgreSQL), and the one barrier in flight.
#[derive(Debug, Default)]
pub struct FeedHorizon {
    /// Every position at or below it has ended (committed or not at all).
    known: AtomicI64,
    /// Held while a barrier runs: readers that need one wait for it and use its result.
    running: tokio::sync::Mutex<()>,
}

impl FeedHorizon {
    /// The highest horizon a barrier gave.
    pub fn known(&self) -> i64 {
        self.known.load(Ordering::Acquire)
    }

    /// Moves the horizon past `seen` (a position read above it): one barrier, unless another
    /// one finished meanwhile that moved it that far.
    pub async fn move_past(&self, store: &Store, seen: i64) -> StoreResult<()> {
        let _one = self.running.lock().await;
        if self.known() > seen {
            return Ok(());
        }
        let at = store.feed_barrier().await?;
        self.known.fetch_max(at, Ordering::AcqRel);
        Ok(())
    }
}
