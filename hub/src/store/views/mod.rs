//! Read-only views of the record for producers, operators, the status page and the metrics.
//!
//! Layout:
//! - `read`: the message and delivery views producers and operators read.
//! - `overview`: backlogs per host and conversation, outcome counts and recent trouble.
//! - `explain`: why a delivery is where it is (`deliveries explain`).
//! - `listing`: `deliveries list` with its filters and cursor.
//! - `gauges`: what the hub's periodic gauges read, in one snapshot.
//! - `feed`: the producers' events feeds from a cursor, their positions and horizon.
//! - `fleet`: hosts, their sessions and silence, for `hosts list|show` and `status`.
//! - `pool_standing`: a pool's members' standing and a pool conversation's binding, for
//!   `deliveries explain`, `pools list|show` and the status page.
//! - `replay`: a producer's own messages of a conversation, a page at a time from a `seq`.

pub mod explain;
pub mod feed;
pub mod fleet;
pub mod gauges;
pub mod listing;
pub mod overview;
pub mod pool_standing;
pub mod read;
pub mod replay;
