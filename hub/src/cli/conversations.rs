//! The operator's side of conversations: `members add|remove|allow-mention|disallow-mention|list`
//! (the registry, SPEC §6, with families and mention authorizations) and
//! `producers scope|quota|list` (publish scopes, SPEC §3, and quotas). The store does the
//! checking and the recording; this module validates the command line, runs one write
//! transaction per change, wakes a running hub and prints what changed.

use super::args::{MembersChange, MembersCmd, ProducersCmd, QuotaArgs};
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::registry::members::Membership;
use crate::store::registry::producers;
use baton_shared::exit;
use baton_shared::ids::check_name;

/// Runs one `members` subcommand.
pub(super) fn members(ctx: &Context, m: &MembersCmd) -> CliResult {
    match m {
        MembersCmd::Add(change) => change_members(ctx, change, Direction::Add),
        MembersCmd::Remove(change) => change_members(ctx, change, Direction::Remove),
        MembersCmd::AllowMention(change) => change_members(ctx, change, Direction::AllowMention),
        MembersCmd::DisallowMention(change) => change_members(ctx, change, Direction::DisallowMention),
        MembersCmd::List { conversation, json } => {
            if let Some(c) = conversation {
                check_name("conversation", c)?;
            }
            let record = ctx.open_read()?;
            let rows = record.run(record.members(conversation.clone()))?;
            output::members(&rows, *json)
        }
    }
}

/// Which way a membership change goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Add,
    Remove,
    AllowMention,
    DisallowMention,
}

/// `members add|remove|allow-mention|disallow-mention`: one transaction for every host named;
/// exit 1 when none changed.
fn change_members(ctx: &Context, m: &MembersChange, direction: Direction) -> CliResult {
    // A family (`support-*`) for add and remove: the publish scopes' grammar.
    let family = m.conversation.ends_with('*');
    match (family, direction) {
        (true, Direction::Add | Direction::Remove) => {
            producers::check_pattern(&m.conversation).map_err(|e| CliError::usage(format!("--conversation: {e}")))?
        }
        (true, _) => {
            return Err(CliError::usage(format!(
                "--conversation {:?}: a mention is allowed in one conversation, not a pattern",
                m.conversation
            )));
        }
        (false, _) => check_name("conversation", &m.conversation)?,
    }
    for h in &m.hosts {
        check_name("host", h)?;
    }
    for p in &m.pools {
        check_name("pool", p)?;
    }
    if !m.pools.is_empty() && (family || !matches!(direction, Direction::Add | Direction::Remove)) {
        return Err(CliError::usage(
            "--pool: a pool is made a member (or not) of one conversation with `members add|remove`",
        ));
    }
    let record = ctx.open_write()?;
    let membership = match direction {
        Direction::Add => Membership::Join,
        Direction::Remove => Membership::Leave,
        Direction::AllowMention => Membership::AllowMention,
        Direction::DisallowMention => Membership::DisallowMention,
    };
    let by = By { operator: ctx.operator.clone(), reason: m.why.reason.clone() };
    let mut changes = Vec::new();
    if !m.hosts.is_empty() {
        changes = record.run(record.members_change(membership, m.conversation.clone(), m.hosts.clone(), by.clone()))?;
    }
    // Pools after hosts, each line naming it as a pool.
    let hosts_changed = changes.len();
    if !m.pools.is_empty() {
        let join = direction == Direction::Add;
        changes.extend(record.run(record.member_pools_change(join, m.conversation.clone(), m.pools.clone(), by))?);
    }
    let changed = changes.iter().filter(|c| c.changed).count();
    if changed > 0 {
        ctx.wake_hub();
    }
    let (verb, unchanged) = match direction {
        Direction::Add => ("joined", "already a member of"),
        Direction::Remove => ("left", "not a member of"),
        Direction::AllowMention => ("may be mentioned in", "already allowed to be mentioned in"),
        Direction::DisallowMention => ("may no longer be mentioned in", "not allowed to be mentioned in"),
    };
    for (i, c) in changes.iter().enumerate() {
        let seq = c.seq.map(|s| s.to_string()).unwrap_or_else(|| "-".into());
        if i >= hosts_changed {
            let line = if c.changed {
                format!("pool {}: {verb} {} after seq {seq}", c.host, m.conversation)
            } else {
                format!("pool {}: {unchanged} {}, unchanged", c.host, m.conversation)
            };
            output::line(line)?;
            continue;
        }
        if c.changed && family {
            let when = if direction == Direction::Add { "from its next post on" } else { "after its last post" };
            output::line(format!("{}: {verb} every conversation matching {}, each {when}", c.host, m.conversation))?;
        } else if c.changed {
            output::line(format!("{}: {verb} {} after seq {seq}", c.host, m.conversation))?;
        } else {
            output::line(format!("{}: {unchanged} {}, unchanged", c.host, m.conversation))?;
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
            let record = ctx.open_write()?;
            let by = By { operator: ctx.operator.clone(), reason: why.reason.clone() };
            let scope = record.run(record.producer_scope(name.clone(), patterns.clone(), by))?;
            ctx.wake_hub();
            output::line(format!("producer {name} may post into: {}", scope.join(" ")))
        }
        ProducersCmd::Quota { name, quota, why } => {
            check_name("producer", name)?;
            let change = quota_change(quota)?;
            if change.is_empty() {
                return Err(CliError::usage("give --max-unsettled or --max-unsettled-bytes (a number or `unlimited`)"));
            }
            let record = ctx.open_write()?;
            let by = By { operator: ctx.operator.clone(), reason: why.reason.clone() };
            let q = record.run(record.producer_quota(name.clone(), change, by))?;
            output::line(format!("producer {name} quota: {}", output::quota(&q)))
        }
        ProducersCmd::Approve { name, patterns, none, why } => {
            check_name("producer", name)?;
            if !none {
                check_patterns(patterns)?;
            }
            let record = ctx.open_write()?;
            let by = By { operator: ctx.operator.clone(), reason: why.reason.clone() };
            let right = record.run(record.producer_approve(name.clone(), patterns.clone(), by))?;
            if right.is_empty() {
                output::line(format!("producer {name} may approve in no conversation"))
            } else {
                output::line(format!("producer {name} may approve in: {}", right.join(" ")))
            }
        }
        ProducersCmd::List { json } => {
            let record = ctx.open_read()?;
            output::producers(&record.run(record.producers())?, *json)
        }
    }
}

/// Reads `--max-unsettled` and `--max-unsettled-bytes` into a quota change, refusing (exit 2,
/// naming the flag and its range) a value that is neither a number in range nor `unlimited`.
pub(super) fn quota_change(q: &QuotaArgs) -> Result<producers::QuotaChange, CliError> {
    fn limit(flag: &str, value: Option<&str>, max: u64) -> Result<Option<Option<u64>>, CliError> {
        let Some(v) = value else { return Ok(None) };
        if v == "unlimited" {
            return Ok(Some(None));
        }
        let n: u64 = v
            .parse()
            .map_err(|_| CliError::usage(format!("--{flag} {v:?}: give a number in 1..={max} or `unlimited`")))?;
        producers::check_limit(&format!("--{flag}"), Some(n), max).map_err(CliError::usage)?;
        Ok(Some(Some(n)))
    }
    Ok(producers::QuotaChange {
        unsettled_max: limit("max-unsettled", q.max_unsettled.as_deref(), producers::QUOTA_UNSETTLED_MAX)?,
        unsettled_bytes_max: limit(
            "max-unsettled-bytes",
            q.max_unsettled_bytes.as_deref(),
            producers::QUOTA_UNSETTLED_BYTES_MAX,
        )?,
    })
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
