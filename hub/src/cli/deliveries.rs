//! Inspecting and steering deliveries: `deliveries list|show|explain` (cancel and retry are in `turns`), `held list|release`,
//! `retire HOST` (which also ends its memberships) and `requeue --instance ID`.

use super::args::{DeliveriesCmd, HeldCmd};
use super::output::ListedDelivery;
use super::{CliError, CliResult, Context, output};
use crate::store::explain::{self, Explainer};
use crate::store::fences::{self, FenceKind};
use crate::store::listing::{self, ListQuery, Resolved};
use crate::store::operator::{self, Selector};
use crate::store::read::{self, DeliveryRow};
use crate::store::{StoreError, hosts, in_write_txn, members};
use baton_shared::states::{DeliveryState, Outcome};
use baton_shared::{duration, exit};
use std::io::IsTerminal;

/// Runs one `deliveries` subcommand.
pub(super) fn run(ctx: &Context, d: &DeliveriesCmd) -> CliResult {
    match d {
        DeliveriesCmd::List { .. } => list(ctx, d),
        DeliveriesCmd::Show { id, json } => {
            let conn = ctx.open_read()?;
            let id = resolve_id(&conn, id)?;
            output::detail(&read::delivery_detail(&conn, &id)?, *json)
        }
        DeliveriesCmd::Explain { id, json } => {
            let silence_ms = silence_warn_ms(ctx)?;
            let conn = ctx.open_read()?;
            let id = resolve_id(&conn, id)?;
            let now_ms = ctx.now_ms();
            output::explanation(&explain::explain_id(&conn, &id, now_ms, silence_ms)?, now_ms, *json)
        }
        DeliveriesCmd::Cancel(a) => super::turns::cancel(ctx, a),
        DeliveriesCmd::Retry(a) => super::turns::retry(ctx, a),
    }
}

/// The hub's `host_silence_warn` (ms), against which liveness is told.
fn silence_warn_ms(ctx: &Context) -> Result<i64, CliError> {
    Ok(i64::try_from(ctx.config(None)?.host_silence_warn.as_millis()).unwrap_or(i64::MAX))
}

/// A page of rows, each that is not final with its one-line reason.
fn with_reasons(
    ctx: &Context,
    conn: &rusqlite::Connection,
    rows: Vec<DeliveryRow>,
) -> Result<Vec<ListedDelivery>, CliError> {
    let mut explainer = Explainer::new(conn, ctx.now_ms(), silence_warn_ms(ctx)?)?;
    let mut listed = Vec::with_capacity(rows.len());
    for r in rows {
        let why = explainer.reason(&r)?;
        listed.push((r, why));
    }
    Ok(listed)
}

/// The delivery an id or a unique prefix names: exit 1 when none, exit 2 listing the matches
/// when several.
pub(super) fn resolve_id(conn: &rusqlite::Connection, prefix: &str) -> Result<String, CliError> {
    match listing::resolve_delivery(conn, prefix)? {
        Resolved::One(id) => Ok(id),
        Resolved::Nothing => Err(CliError::new(exit::NOTHING, format!("no delivery {}", output::esc(prefix)))),
        Resolved::Many(ids) => Err(CliError::usage(format!(
            "{} is the start of several delivery ids: {}{}; give more of it",
            output::esc(prefix),
            ids.join(", "),
            if ids.len() >= listing::PREFIX_MATCHES_SHOWN_MAX { ", …" } else { "" }
        ))),
    }
}

/// A moment from `--since`/`--until`: a time, or a duration meaning that long before now.
fn moment_ms(ctx: &Context, flag: &str, text: &str) -> Result<i64, CliError> {
    if let Ok(ago) = duration::parse(flag, text) {
        return Ok(ctx.now_ms().saturating_sub(i64::try_from(ago.as_millis()).unwrap_or(i64::MAX)));
    }
    duration::parse_time_ms(flag, text).map_err(CliError::usage)
}

/// `deliveries list`: one page, its cursor on stderr when more remain.
fn list(ctx: &Context, d: &DeliveriesCmd) -> CliResult {
    let DeliveriesCmd::List { state, outcome, host, conversation, since, until, newest, oldest, limit, after, json } =
        d
    else {
        return Err(CliError::failure("not a list command"));
    };
    let state = match state {
        None => None,
        Some(s) => Some(DeliveryState::parse(s).ok_or_else(|| {
            CliError::usage(format!(
                "--state {s:?} is not one of queued, claimed, mirrored, delivered, held, failed, unknown{}",
                if Outcome::parse(s).is_some() {
                    format!(" ({s} is an outcome: --outcome {s})")
                } else {
                    String::new()
                }
            ))
        })?),
    };
    let outcome = match outcome {
        None => None,
        Some(o) => Some(Outcome::parse(o).ok_or_else(|| {
            CliError::usage(format!("--outcome {o:?} is not one of succeeded, failed, unknown, cancelled"))
        })?),
    };
    let newest = *newest || (!*oldest && std::io::stdout().is_terminal());
    let q = ListQuery {
        state,
        outcome,
        host: host.clone(),
        conversation: conversation.clone(),
        since_ms: since.as_deref().map(|t| moment_ms(ctx, "--since", t)).transpose()?,
        until_ms: until.as_deref().map(|t| moment_ms(ctx, "--until", t)).transpose()?,
        newest,
        after: *after,
        limit: *limit,
    };
    let conn = ctx.open_read()?;
    let page = listing::page(&conn, &q)?;
    output::deliveries(&with_reasons(ctx, &conn, page.rows)?, *json)?;
    match page.next {
        Some(next) => output::next_page(if newest { "--newest" } else { "--oldest" }, next),
        None => Ok(()),
    }
}

/// Runs one `held` subcommand.
pub(super) fn held(ctx: &Context, h: &HeldCmd) -> CliResult {
    match h {
        HeldCmd::List { conversation, limit, after, json } => {
            let q = ListQuery {
                state: Some(DeliveryState::Held),
                conversation: conversation.clone(),
                after: *after,
                limit: *limit,
                ..Default::default()
            };
            let conn = ctx.open_read()?;
            let page = listing::page(&conn, &q)?;
            output::deliveries(&with_reasons(ctx, &conn, page.rows)?, *json)?;
            match page.next {
                Some(next) => output::next_page("", next),
                None => Ok(()),
            }
        }
        HeldCmd::Release { id, conversation, force, why } => {
            let conn = ctx.open_write()?;
            let resolved = id.as_deref().map(|p| resolve_id(&conn, p)).transpose()?;
            let sel = match (&resolved, conversation) {
                (Some(id), _) => Selector::Delivery(id),
                (None, Some(c)) => Selector::Conversation(c),
                (None, None) => return Err(CliError::usage("give a delivery id or --conversation")),
            };
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

/// `requeue --instance ID [--host HOST]`.
pub(super) fn requeue(ctx: &Context, instance: &str, host: Option<&str>, reason: &str) -> CliResult {
    let conn = ctx.open_write()?;
    let swept = in_write_txn(&conn, |c| match host {
        Some(host) => {
            if hosts::standing(c, host)? == hosts::Standing::NotEnrolled {
                return Err(StoreError::Invalid(format!("host {host:?} is not enrolled")));
            }
            operator::requeue_host_instance(c, host, instance, &ctx.operator, reason, ctx.now_ms())
        }
        None => operator::requeue_instance(c, instance, &ctx.operator, reason, ctx.now_ms()),
    })?;
    ctx.wake_hub();
    if swept.requeued.is_empty() && swept.outcome_unknown.is_empty() {
        return Err(CliError::new(
            exit::NOTHING,
            match host {
                Some(host) => {
                    format!(
                        "nothing to do: instance {} holds nothing on host {}",
                        output::esc(instance),
                        output::esc(host)
                    )
                }
                None => format!("nothing to do: instance {} holds nothing", output::esc(instance)),
            },
        ));
    }
    output::line(format!(
        "instance {instance}: {} requeued, {} delivered without outcome marked unknown",
        swept.requeued.len(),
        swept.outcome_unknown.len()
    ))
}
