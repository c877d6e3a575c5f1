//! The operator's side of conversations: `members add|remove|list` (the registry, SPEC §6) and
//! `producers scope|list` (publish scopes, SPEC §3). The store does the checking and the
//! recording; this module validates the command line, runs one write transaction per change,
//! wakes a running hub and prints what changed.

use super::args::{MembersChange, MembersCmd, ProducersCmd};
use super::{CliError, CliResult, Context, output};
use crate::store::{in_write_txn, members, producers};
use baton_shared::exit;
use baton_shared::ids::check_name;

/// Runs one `members` subcommand.
pub(super) fn members(ctx: &Context, m: &MembersCmd) -> CliResult {
    match m {
        MembersCmd::Add(change) => change_members(ctx, change, Direction::Add),
        MembersCmd::Remove(change) => change_members(ctx, change, Direction::Remove),
        MembersCmd::List { conversation, json } => {
            if let Some(c) = conversation {
                check_name("conversation", c)?;
            }
            let rows = members::list(&ctx.open_read()?, conversation.as_deref())?;
            output::members(&rows, *json)
        }
    }
}

/// Which way a membership change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Add,
    Remove,
}

/// `members add|remove`: one transaction for every host named; exit 1 when none changed.
fn change_members(ctx: &Context, m: &MembersChange, direction: Direction) -> CliResult {
    check_name("conversation", &m.conversation)?;
    for h in &m.hosts {
        check_name("host", h)?;
    }
    let conn = ctx.open_write()?;
    let (op, reason, now) = (ctx.operator.as_str(), m.why.reason.as_str(), ctx.now_ms());
    let changes = in_write_txn(&conn, |c| match direction {
        Direction::Add => members::add(c, &m.conversation, &m.hosts, op, reason, now),
        Direction::Remove => members::remove(c, &m.conversation, &m.hosts, op, reason, now),
    })?;
    let changed = changes.iter().filter(|c| c.changed).count();
    if changed > 0 {
        ctx.wake_hub();
    }
    let (verb, unchanged) = match direction {
        Direction::Add => ("joined", "already a member"),
        Direction::Remove => ("left", "not a member"),
    };
    for c in &changes {
        let seq = c.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        if c.changed {
            output::line(format!("{}: {verb} {} after seq {seq}", c.host, m.conversation))?;
        } else {
            output::line(format!("{}: {unchanged} of {}, unchanged", c.host, m.conversation))?;
        }
    }
    if changed == 0 {
        return Err(CliError::new(exit::NOTHING, "nothing changed"));
    }
    Ok(())
}

/// Runs one `producers` subcommand.
pub(super) fn producers(ctx: &Context, p: &ProducersCmd) -> CliResult {
    match p {
        ProducersCmd::Scope { name, patterns, why } => {
            check_name("producer", name)?;
            check_patterns(patterns)?;
            let conn = ctx.open_write()?;
            let scope = in_write_txn(&conn, |c| {
                producers::set_scope(c, name, patterns, &ctx.operator, &why.reason, ctx.now_ms())
            })?;
            ctx.wake_hub();
            output::line(format!("producer {name} may post into: {}", scope.join(" ")))
        }
        ProducersCmd::List { json } => output::producers(&producers::list(&ctx.open_read()?)?, *json),
    }
}

/// Checks publish-scope patterns before any work (exit 2 naming the first bad one).
pub(super) fn check_patterns(patterns: &[String]) -> CliResult {
    if patterns.is_empty() {
        return Err(CliError::usage("give at least one conversation pattern (`*` for every conversation)"));
    }
    for p in patterns {
        producers::check_pattern(p).map_err(CliError::usage)?;
    }
    Ok(())
}
