//! A delivery's life, from acceptance to its last attempt: every SPEC §2 transition.
//!
//! Layout:
//! - `transition`: the SPEC §2 transition table and the one guarded update every transition uses.
//! - `accept`: acceptance, fan-out and startup repair.
//! - `approval`: approval before a turn runs: parking, decisions, expiry.
//! - `breaker_period`: the breaker's turns-per-period trigger.
//! - `batch`: many of the steps below in one request, each item answered alone.
//! - `claim`: claims (fences applied through `registry::fences`), order and fairness, holdings, and the holder's mirrored/ack/reject.
//! - `report`: attempt reports, and the retry a harness asks for (exit 75), and the breaker.
//! - `turns`: hub-confirmed starts (the start lease), cancel, the claim's cancel notices, operator retry and redrive.
//! - `operator`: the operator's delivery transitions: release, cancel, retire, requeue.
//! - `progress`: running turns' renewals and their progress events.
//! - `silence`: the claims of a silent instance returned to the queue.

pub mod accept;
pub mod approval;
pub mod batch;
pub mod breaker_period;
pub mod claim;
pub mod operator;
pub mod progress;
pub mod report;
pub mod silence;
pub mod transition;
pub mod turns;
