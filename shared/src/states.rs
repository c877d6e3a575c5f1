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
}

impl Outcome {
    /// The outcome's stored and wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Unknown => "unknown",
        }
    }

    /// Parses a stored or wire name.
    pub fn parse(s: &str) -> Option<Outcome> {
        match s {
            "succeeded" => Some(Outcome::Succeeded),
            "failed" => Some(Outcome::Failed),
            "unknown" => Some(Outcome::Unknown),
            _ => None,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
