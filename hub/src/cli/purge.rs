//! `purge --message ID | --conversation C | --host H --reason R [--dry-run | --yes]`: settled
//! messages (or a recipient host's settled deliveries) removed now, never an unsettled delivery
//! (`store::upkeep::purge`). Destructive: what it removes is read and said first, and it asks
//! (`confirm`).

use super::args::Confirm;
use super::confirm::{self, Decision};
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::upkeep::purge::PurgeOf;
use crate::store::upkeep::purge::{self, Plan, Target};
use baton_shared::exit;

/// Runs `purge`.
pub(super) fn purge(
    ctx: &Context,
    message: Option<&str>,
    conversation: Option<&str>,
    confirm: &Confirm,
    reason: &str,
) -> CliResult {
    let target = match (message, conversation) {
        (Some(m), None) => Target::Message(m),
        (None, Some(c)) => Target::Conversation(c),
        _ => return Err(CliError::usage("give --message ID or --conversation C")),
    };
    let subject = target.subject();
    let record = ctx.open_read()?;
    let plan = record.run(record.purge_plan(purge_of(target)))?;
    drop(record);
    check(&subject, &plan)?;
    let text = format!(
        "would purge {} (reason: {}): {} message(s), {} deliveries (with their events and attempts)",
        output::esc(&subject),
        output::esc(reason),
        plan.messages.len(),
        plan.deliveries
    );
    if confirm::decide(confirm, &text, None)? == Decision::DryRun {
        return Ok(());
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    let plan = record.run(record.purge(purge_of(target), by))?;
    check(&subject, &plan)?;
    output::line(format!(
        "purged {}: {} message(s), {} deliveries (with their events and attempts)",
        output::esc(&subject),
        plan.messages.len(),
        plan.deliveries
    ))
}

/// Runs `purge --host H`: the host's settled deliveries, and the messages it alone received.
pub(super) fn purge_host(ctx: &Context, host: &str, confirm: &Confirm, reason: &str) -> CliResult {
    baton_shared::ids::check_name("--host", host).map_err(|e| CliError::usage(e.to_string()))?;
    let record = ctx.open_read()?;
    let plan = record.run(record.purge_host_plan(host.to_string()))?;
    drop(record);
    if plan.deliveries == 0 {
        return Err(CliError::new(
            exit::NOTHING,
            format!("nothing to do: no settled deliveries to host {}{}", output::esc(host), kept(&plan)),
        ));
    }
    let text = format!(
        "would purge host {}: {} settled deliveries (with their events and attempts), {} message(s) with no other \
         recipient{} (reason: {})",
        output::esc(host),
        plan.deliveries,
        plan.messages,
        kept(&plan),
        output::esc(reason)
    );
    if confirm::decide(confirm, &text, None)? == Decision::DryRun {
        return Ok(());
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    let plan = record.run(record.purge_host(host.to_string(), by))?;
    if plan.deliveries == 0 {
        return Err(CliError::new(
            exit::NOTHING,
            format!("nothing to do: no settled deliveries to host {}{}", output::esc(host), kept(&plan)),
        ));
    }
    output::line(format!(
        "purged host {}: {} settled deliveries (with their events and attempts), {} message(s) with no other \
         recipient{}",
        output::esc(host),
        plan.deliveries,
        plan.messages,
        kept(&plan)
    ))
}

/// What a host purge keeps: its unsettled deliveries, counted and the first ones named.
fn kept(plan: &purge::HostPlan) -> String {
    if plan.kept == 0 {
        return String::new();
    }
    let named: Vec<String> = plan.kept_shown.iter().map(|(id, state)| format!("{id} ({state})")).collect();
    let more = if plan.kept > named.len() as i64 { ", …" } else { "" };
    format!("; kept {} unsettled deliveries: {}{more}", plan.kept, named.join(", "))
}

/// Refuses a plan that touches unsettled work (exit 2) or finds nothing (exit 1).
fn check(subject: &str, plan: &Plan) -> CliResult {
    if !plan.allowed() {
        return Err(refusal(subject, plan));
    }
    if plan.messages.is_empty() {
        return Err(CliError::new(exit::NOTHING, format!("nothing to do: no messages of {}", output::esc(subject))));
    }
    Ok(())
}

/// The purge target, owned.
fn purge_of(target: Target<'_>) -> PurgeOf {
    match target {
        Target::Message(m) => PurgeOf::Message(m.to_string()),
        Target::Conversation(c) => PurgeOf::Conversation(c.to_string()),
    }
}

/// The refusal of a purge that would touch unfinished work, naming it.
fn refusal(subject: &str, plan: &Plan) -> CliError {
    let named: Vec<String> = plan.unsettled.iter().map(|(id, state)| format!("{id} ({state})")).collect();
    let more = if named.len() >= purge::UNSETTLED_SHOWN_MAX { ", …" } else { "" };
    let fan_out = if plan.fan_out_pending > 0 {
        format!("; {} message(s) still being fanned out", plan.fan_out_pending)
    } else {
        String::new()
    };
    CliError::usage(format!(
        "refusing to purge {}: it has deliveries that are not settled: {}{more}{fan_out}; nothing was removed \
         (cancel them or wait for their outcome first)",
        output::esc(subject),
        named.join(", ")
    ))
}
