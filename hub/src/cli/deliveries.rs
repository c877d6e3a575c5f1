//! Inspecting and steering deliveries: `deliveries list|show|explain` (cancel and retry are in `turns`), `held list|release`,
//! `retire HOST` (which also ends its memberships) and `requeue --instance ID`.

use super::args::{Confirm, Decide, DeliveriesCmd, HeldCmd};
use super::confirm::{self, Decision};
use super::lookup::{judging, moment_ms, resolve_id, silence_warn_ms};
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::lifecycle::approval::ApprovalBy;
use crate::store::lifecycle::approval::Decision as Verdict;
use crate::store::lifecycle::operator::Release;
use crate::store::lifecycle::operator::Select;
use crate::store::views::listing::ListQuery;
use crate::store::views::overview::RunningFilter;
use baton_shared::exit;
use baton_shared::states::{DeliveryState, Outcome};
use std::io::IsTerminal;

/// Runs one `deliveries` subcommand.
pub(super) fn run(ctx: &Context, d: &DeliveriesCmd) -> CliResult {
    match d {
        DeliveriesCmd::List { .. } => list(ctx, d),
        DeliveriesCmd::Show { id, json } => {
            let record = ctx.open_read()?;
            let id = resolve_id(&record, id)?;
            output::detail(&record.run(record.delivery_detail(id))?, *json)
        }
        DeliveriesCmd::Explain { id, json } => {
            let judging = judging(ctx)?;
            let record = ctx.open_read()?;
            let id = resolve_id(&record, id)?;
            output::explanation(&record.run(record.explain(id, judging))?, judging.now_ms, *json)
        }
        DeliveriesCmd::Cancel(a) => super::turns::cancel(ctx, a),
        DeliveriesCmd::Retry(a) => super::turns::retry(ctx, a),
    }
}

/// `deliveries list`: one page, its cursor on stderr when more remain.
fn list(ctx: &Context, d: &DeliveriesCmd) -> CliResult {
    let DeliveriesCmd::List {
        state,
        outcome,
        host,
        conversation,
        since,
        until,
        newest,
        oldest,
        limit,
        after,
        wide,
        running,
        json,
    } = d
    else {
        return Err(CliError::failure("not a list command"));
    };
    if *running {
        let filter = RunningFilter { host: host.clone(), conversation: conversation.clone() };
        let silence_ms = silence_warn_ms(ctx)?;
        let record = ctx.open_read()?;
        let now_ms = ctx.now_ms();
        let (total, rows, silent) = record.run(record.running_turns(filter, *limit, now_ms, silence_ms))?;
        output::running(&rows, &silent, now_ms, *json)?;
        if total > rows.len() as i64 {
            output::more_remain(&format!("{} more running turn(s) not shown (--limit)", total - rows.len() as i64))?;
        }
        return Ok(());
    }
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
    let record = ctx.open_read()?;
    let short = !*json && !*wide;
    let (rows, next) = record.run(record.deliveries_page(q, judging(ctx)?, short))?;
    output::deliveries(&rows, *json)?;
    match next {
        Some(next) => output::next_page(if newest { "--newest" } else { "--oldest" }, next),
        None => Ok(()),
    }
}

/// Runs one `held` subcommand.
pub(super) fn held(ctx: &Context, h: &HeldCmd) -> CliResult {
    match h {
        HeldCmd::List { conversation, limit, after, wide, json } => {
            let q = ListQuery {
                state: Some(DeliveryState::Held),
                conversation: conversation.clone(),
                after: *after,
                limit: *limit,
                ..Default::default()
            };
            let record = ctx.open_read()?;
            let short = !*json && !*wide;
            let (rows, next) = record.run(record.deliveries_page(q, judging(ctx)?, short))?;
            output::deliveries(&rows, *json)?;
            match next {
                Some(next) => output::next_page("", next),
                None => Ok(()),
            }
        }
        HeldCmd::Release { id, conversation, force, why } => {
            let record = ctx.open_write()?;
            let resolved = id.as_deref().map(|p| resolve_id(&record, p)).transpose()?;
            let sel = match (resolved, conversation) {
                (Some(id), _) => Select::Delivery(id),
                (None, Some(c)) => Select::Conversation(c.clone()),
                (None, None) => return Err(CliError::usage("give a delivery id or --conversation")),
            };
            let by = By { operator: ctx.operator.clone(), reason: why.reason.clone() };
            let ids = match record.run(record.release(sel, by, *force))? {
                Release::Released(ids) => ids,
                Release::WouldHoldAgain(named) => {
                    return Err(CliError::usage(format!(
                        "an active fence would catch the release again at the next claim: {}; lift it first, or \
                         release with --force",
                        output::esc(&named.join("; "))
                    )));
                }
            };
            if ids.is_empty() {
                return Err(CliError::new(exit::NOTHING, "nothing to do: nothing was held"));
            }
            ctx.wake_hub();
            output::line(format!("released {} deliveries", ids.len()))
        }
        HeldCmd::Approve(d) => decide(ctx, d, Verdict::Approve),
        HeldCmd::Reject(d) => decide(ctx, d, Verdict::Reject),
    }
}

/// `held approve|reject ID`: the message ID names (a message id, or a delivery id or prefix)
/// is decided by the operator, every delivery of it with it.
fn decide(ctx: &Context, d: &Decide, decision: Verdict) -> CliResult {
    let record = ctx.open_write()?;
    let message_id = match record.run(record.approval_message(d.id.clone()))? {
        Some(m) => m,
        None => {
            let delivery = resolve_id(&record, &d.id)?;
            record
                .run(record.approval_message(delivery.clone()))?
                .ok_or_else(|| CliError::new(exit::NOTHING, format!("no delivery {}", output::esc(&delivery))))?
        }
    };
    let by = ApprovalBy::Operator(ctx.operator.clone());
    let done = record.run(record.decide_approval(message_id, by, decision, d.why.reason.clone()))?;
    ctx.wake_hub();
    output::line(format!(
        "message {} {}: {} deliveries {}",
        done.message_id,
        done.decision,
        done.moved.len(),
        if decision == Verdict::Approve { "queued" } else { "failed" }
    ))
}

/// `retire HOST --reason R [--dry-run | --yes]`: its pending work is swept and it leaves every
/// conversation, in one transaction, so no post after the retirement counts it as a member.
/// It says first what it will sweep and leave, read from the record, and asks (`confirm`): a
/// retirement is not undone.
pub(super) fn retire(ctx: &Context, host: &str, reason: &str, confirm: &Confirm) -> CliResult {
    let record = ctx.open_read()?;
    let plan = record.run(record.retire_plan(host.to_string()))?;
    drop(record);
    let text = format!(
        "retire host {} (reason: {}): {} deliveries would fail ({} queued, {} held, {} claimed), {} mirrored would \
         become unknown, {} delivered without outcome would be marked unknown, {} pool deliveries it claimed would go \
         back to their pools; it would leave {} conversation(s){}",
        output::esc(host),
        output::esc(reason),
        plan.failing(),
        plan.queued,
        plan.held,
        plan.claimed,
        plan.mirrored,
        plan.outcome_unknown,
        plan.to_pools,
        plan.leaves.len(),
        if plan.leaves.is_empty() {
            String::new()
        } else {
            format!(": {}", plan.leaves.iter().map(|c| output::esc(c)).collect::<Vec<_>>().join(", "))
        }
    );
    if confirm::decide(confirm, &text, None)? == Decision::DryRun {
        return Ok(());
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    let (swept, left, pools) = record.run(record.retire(host.to_string(), by))?;
    ctx.wake_hub();
    output::line(format!(
        "retired {host}: {} failed, {} unknown, {} delivered without outcome marked unknown, {} back to their pools; \
         left {} conversation(s){}{}",
        swept.failed.len(),
        swept.unknown.len(),
        swept.outcome_unknown.len(),
        swept.requeued.len(),
        left.len(),
        if left.is_empty() { String::new() } else { format!(": {}", left.join(", ")) },
        if pools.is_empty() { String::new() } else { format!("; left pool(s): {}", pools.join(", ")) }
    ))
}

/// `requeue --instance ID [--host HOST]`.
pub(super) fn requeue(ctx: &Context, instance: &str, host: Option<&str>, reason: &str) -> CliResult {
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    let swept = record.run(record.requeue(instance.to_string(), host.map(str::to_string), by))?;
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
