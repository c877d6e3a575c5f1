//! Delivery states and attempt outcomes, with their wire names.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Where a delivery is in its life (SPEC §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Committed, waiting for its host's node.
    Queued,
    /// Exactly one node instance took it.
    Claimed,
    /// The node committed its local copy and queued the execution.
    Mirrored,
    /// The node acked the durable handoff.
    Delivered,
    /// Parked by a hold fence until an operator releases it.
    Held,
    /// Refused for a stated reason. Terminal.
    Failed,
    /// The hub cannot tell whether the handoff completed. Terminal.
    Unknown,
}

impl DeliveryState {
    /// Every state, in table order.
    pub const ALL: [DeliveryState; 7] = [
        DeliveryState::Queued,
        DeliveryState::Claimed,
        DeliveryState::Mirrored,
        DeliveryState::Delivered,
        DeliveryState::Held,
        DeliveryState::Failed,
        DeliveryState::Unknown,
    ];

    /// The state's stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Queued => "queued",
            DeliveryState::Claimed => "claimed",
            DeliveryState::Mirrored => "mirrored",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Held => "held",
            DeliveryState::Failed => "failed",
            DeliveryState::Unknown => "unknown",
        }
    }

    /// Parses a stored or wire name.
    pub fn parse(s: &str) -> Option<DeliveryState> {
        DeliveryState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether no transition leaves this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, DeliveryState::Failed | DeliveryState::Unknown | DeliveryState::Delivered)
    }
}

impl fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an attempt (one execution of a delivered message) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The harness turn exited 0.
    Succeeded,
    /// The harness turn exited non-zero, timed out, or was stopped.
    Failed,
    /// The node cannot tell how the turn ended (it crashed mid-execution).
    Unknown,
    /// An operator or the producer cancelled the turn: it never started, or its process group
    /// was stopped (SIGTERM, then SIGKILL after the node's `cancel_grace`).
    Cancelled,
}

impl Outcome {
    /// The outcome's stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Unknown => "unknown",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// Parses a stored or wire name.
    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed),
            "unknown" => Some(Outcome::Unknown),
            "cancelled" => Some(Outcome::Cancelled),
            _ => None,
        }
    }
}

/// Why an attempt after the first one ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rerun {
    /// The harness asked for it (exit 75, attempts left): the hub requeued the delivery with a
    /// durable not-before time. It keeps the conversation's order (later turns wait for it).
    Retry,
    /// An operator re-ran a final delivery (`deliveries retry`, `redrive`): the only run ever
    /// allowed out of `seq` order.
    Redrive,
}

impl Rerun {
    /// The stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Rerun::Retry => "retry",
            Rerun::Redrive => "redrive",
        }
    }

    /// Parses a stored or wire name.
    pub fn parse(s: &str) -> Option<Rerun> {
        match s {
            "retry" => Some(Rerun::Retry),
            "redrive" => Some(Rerun::Redrive),
            _ => None,
        }
    }
}

/// Which of its message's bounds stopped a turn (a report's `stopped_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoppedBy {
    /// Its `deadline_ms` (or its node's `exec_timeout`, when shorter): final, never retried.
    /// The deadline is the producer's budget for the turn; a second run would spend it again
    /// and most likely overrun again.
    Deadline,
    /// Its `stall_ms`: retryable as exit 75 is. A stall is a step that hung (a model or tool
    /// call that never returned); running the turn again is the usual cure, and
    /// `max_attempts` bounds what it costs.
    Stall,
}

impl StoppedBy {
    /// The wire word.
    pub fn as_str(self) -> &'static str {
        match self {
            StoppedBy::Deadline => "deadline",
            StoppedBy::Stall => "stall",
        }
    }

    /// Parses the wire word.
    pub fn parse(s: &str) -> Option<StoppedBy> {
        [StoppedBy::Deadline, StoppedBy::Stall].into_iter().find(|b| b.as_str() == s)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
