//! How a message's deliveries ended, as the exit status `wait` and `watch` end with.

use baton_shared::exit;
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::wire::{DeliveryView, MessageView};

/// How a delivery ended: `Some(true)` succeeded, `Some(false)` failed, cancelled or unknown,
/// `None` not yet (the hub's "settled": failed, unknown, or delivered with an attempt of its
/// current run).
pub(crate) fn ended(d: &DeliveryView) -> Option<bool> {
    match d.state {
        DeliveryState::Failed | DeliveryState::Unknown => Some(false),
        DeliveryState::Delivered => {
            d.attempts.iter().rev().find(|a| a.attempt == d.attempt).map(|a| a.outcome == Outcome::Succeeded)
        }
        DeliveryState::Queued | DeliveryState::Claimed | DeliveryState::Mirrored | DeliveryState::Held => None,
    }
}

/// The exit status `wait` ends with for `view`, or `None` while a delivery has not ended.
pub(crate) fn verdict(view: &MessageView) -> Option<u8> {
    let ends: Option<Vec<bool>> = view.deliveries.iter().map(ended).collect();
    ends.map(|ends| if ends.iter().all(|ok| *ok) { exit::OK } else { exit::NOT_SUCCEEDED })
}
