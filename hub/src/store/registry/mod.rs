//! Who may do what: hosts and their certificates, node sessions, conversation members, producers, fences and the audit log.
//!
//! Layout:
//! - `hosts`: hosts and certificates (enroll, revoke, renew look-ups).
//! - `instances`: the one bound node instance per host, and what it holds.
//! - `sessions`: node sessions (a fencing epoch per node process) and their check.
//! - `members`: the membership registry (join/leave intervals per conversation and host), its door and views.
//! - `families`: memberships by pattern (`support-*`), adopted by conversations created later.
//! - `mentions`: mention grants: `to` may name a host that is not a member.
//! - `pools`: pools (named sets of hosts any of which may claim a pool delivery), kept by operators.
//! - `member_pools`: pools as members of a conversation (join/leave intervals per conversation and pool).
//! - `roster`: what every registry change checks (names, cursors, the member bound).
//! - `producers`: producers' publish scopes, quotas and approval rights.
//! - `fences`: the fence types, set/lift/list, and the one precedence rule claims apply.
//! - `audit`: the operator audit log: recording an operator event, and reading the log.

pub mod audit;
pub mod families;
pub mod fences;
pub mod hosts;
pub mod instances;
pub mod member_pools;
pub mod members;
pub mod mentions;
pub mod pools;
pub mod producers;
pub mod roster;
pub mod sessions;
