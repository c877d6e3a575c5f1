//! Inspecting and steering deliveries: `deliveries list|show|cancel`, `held list|release`,
//! `retire HOST` (which also ends its memberships) and `requeue --instance ID`.

use super::args::{DeliveriesCmd, HeldCmd};
use super::{CliError, CliResult, Context, output};
use crate::store::fences::{self, FenceKind};
use crate::store::operator::{self, Selector};
use crate::store::read::{self, DeliveryFilter};
use crate::store::{StoreError, in_write_txn, members};
use baton_shared::exit;
use baton_shared::states::DeliveryState;

/// Most held deliveries `held list` prints.
const HELD_LISTED_MAX: u32 = 100_000;

/// Runs one `deliveries` subcommand.
pub(super) fn run(ctx: &Context, d: &DeliveriesCmd) -> CliResult {
    match d {
        DeliveriesCmd::List { state, host, conversation, limit, json } => {
            let state = match state {
                None => None,
                Some(s) => Some(DeliveryState::parse(s).ok_or_else(|| {
                    CliError::usage(format!(
                        "--state {s:?} is not one of queued, claimed, mirrored, delivered, held, failed, unknown"
                    ))
                })?),
            };
            let f = DeliveryFilter { state, host: host.clone(), conversation: conversation.clone(), limit: *limit };
            output::deliveries(&read::list_deliveries(&ctx.open_read()?, &f)?, *json)
        }
        DeliveriesCmd::Show { id, json } => output::detail(&read::delivery_detail(&ctx.open_read()?, id)?, *json),
        DeliveriesCmd::Cancel { id, why } => {
            let conn = ctx.open_write()?;
            in_write_txn(&conn, |c| operator::cancel(c, id, &ctx.operator, &why.reason, ctx.now_ms()))?;
            ctx.wake_hub();
            output::line(format!("cancelled {id}"))
        }
    }
}

/// Runs one `held` subcommand.
pub(super) fn held(ctx: &Context, h: &HeldCmd) -> CliResult {
    match h {
        HeldCmd::List { conversation, json } => {
            let f = DeliveryFilter {
                state: Some(DeliveryState::Held),
                conversation: conversation.clone(),
                limit: HELD_LISTED_MAX,
                ..Default::default()
            };
            output::deliveries(&read::list_deliveries(&ctx.open_read()?, &f)?, *json)
        }
        HeldCmd::Release { id, conversation, force, why } => {
            let sel = match (id, conversation) {
                (Some(id), _) => Selector::Delivery(id),
                (None, Some(c)) => Selector::Conversation(c),
                (None, None) => return Err(CliError::usage("give a delivery id or --conversation")),
            };
            let conn = ctx.open_write()?;
            let now_ms = ctx.now_ms();
            let ids = in_write_txn(&conn, |c| {
                fences::lift_expired(c, now_ms)?;
                if !force && let Some(refusal) = would_hold_again(c, sel)? {
                    return Ok(Err(refusal));
                }
                operator::release(c, sel, &ctx.operator, &why.reason, now_ms).map(Ok)
            })??;
            if ids.is_empty() {
                return Err(CliError::new(exit::NOTHING, "nothing to do: nothing was held"));
            }
            ctx.wake_hub();
            output::line(format!("released {} deliveries", ids.len()))
        }
    }
}

/// The refusal of a release that an active hold or block fence would undo at the next claim
/// (held again, or failed), naming the fences; `None` when the release would stick.
fn would_hold_again(conn: &rusqlite::Connection, sel: Selector<'_>) -> Result<Option<CliError>, StoreError> {
    let active = fences::active(conn)?;
    let mut named: Vec<String> = Vec::new();
    for (conversation, host) in operator::held_targets(conn, sel)? {
        if let Some(f) = fences::strongest(&active, &conversation, &host)
            && f.kind != FenceKind::Pause
        {
            let d = f.describe();
            if !named.contains(&d) {
                named.push(d);
            }
        }
    }
    if named.is_empty() {
        return Ok(None);
    }
    Ok(Some(CliError::usage(format!(
        "an active fence would catch the release again at the next claim: {}; lift it first, or release with --force",
        output::esc(&named.join("; "))
    ))))
}

/// `retire HOST`: its pending work is swept and it leaves every conversation, in one
/// transaction, so no post after the retirement counts it as a member.
pub(super) fn retire(ctx: &Context, host: &str, reason: &str) -> CliResult {
    let conn = ctx.open_write()?;
    let (swept, left) = in_write_txn(&conn, |c| {
        let swept = operator::retire(c, host, &ctx.operator, reason, ctx.now_ms())?;
        let left = members::leave_all(c, host, &ctx.operator, reason, ctx.now_ms())?;
        Ok((swept, left))
    })?;
    ctx.wake_hub();
    output::line(format!(
        "retired {host}: {} failed, {} unknown, {} delivered without outcome marked unknown; left {} conversation(s){}",
        swept.failed.len(),
        swept.unknown.len(),
        swept.outcome_unknown.len(),
        left.len(),
        if left.is_empty() { String::new() } else { format!(": {}", left.join(", ")) }
    ))
}

/// `requeue --instance ID`.
pub(super) fn requeue(ctx: &Context, instance: &str, reason: &str) -> CliResult {
    let conn = ctx.open_write()?;
    let swept = in_write_txn(&conn, |c| operator::requeue_instance(c, instance, &ctx.operator, reason, ctx.now_ms()))?;
    ctx.wake_hub();
    if swept.requeued.is_empty() && swept.outcome_unknown.is_empty() {
        return Err(CliError::new(
            exit::NOTHING,
            format!("nothing to do: instance {} holds nothing", output::esc(instance)),
        ));
    }
    output::line(format!(
        "instance {instance}: {} requeued, {} delivered without outcome marked unknown",
        swept.requeued.len(),
        swept.outcome_unknown.len()
    ))
}
