//! A delivery's life, from acceptance to its last attempt: every SPEC §2 transition.
//!
//! Layout:
//! - `transition`: the SPEC §2 transition table and the one guarded update every transition uses.
//! - `accept`: acceptance, fan-out and startup repair.
//! - `approval`: approval before a turn runs: parking, decisions, expiry.
//! - `breaker_period`: the breaker's turns-per-period trigger.
//! - `batch`: many of the steps below in one request, each item answered alone.
//! - `claim`: the claim transaction and its door (certificate, standing, instance, fences).
//! - `scan`: one claim's walk over the host's conversation queues and its pools': order and fairness.
//! - `pool_flight`: a pool conversation's flight: the host its turns are bound to, the last host.
//! - `handoff`: the holder's holdings, mirrored, ack, handoff and reject.
//! - `report`: attempt reports, and the retry a harness asks for (exit 75), and the breaker.
//! - `replay`: a report's identity: its request hash, and a report seen again.
//! - `turns`: hub-confirmed starts (the start lease), cancel, the claim's cancel notices, operator retry and redrive.
//! - `operator`: the operator's delivery transitions: release, cancel, retire, requeue.
//! - `progress`: running turns' renewals and their progress events.
//! - `settle`: when a message settles (`settled_at`), decided by the change that may make it so.
//! - `silence`: the claims of a silent instance returned to the queue.

pub mod accept;
pub mod approval;
pub mod batch;
pub mod breaker_period;
pub mod claim;
pub mod handoff;
pub mod operator;
pub mod pool_flight;
pub mod progress;
pub mod replay;
pub mod report;
pub mod scan;
pub mod settle;
pub mod silence;
pub mod transition;
pub mod turns;
