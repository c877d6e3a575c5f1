//! `fence pause|hold|block (--conversation C | --host H | --all) [--for D | --until T]
//! [--force]`, `fence lift ID`, `fence list`.
//!
//! A fence that could not match anything (a host never enrolled, a conversation with no
//! messages: most likely a typo) is refused unless `--force`; a fence the same as an active one
//! is refused naming it (it would change nothing). The hub lifts a time-boxed fence at its
//! expiry; changing fence commands lift expired ones first, so the record never shows a
//! fence active past its time when the hub is stopped.
//!
//! A block on everything or on a host is destructive (every queued delivery it covers fails at
//! its host's next claim, paused ones included): it needs a reason and `--yes`, and says first
//! how many deliveries it would fail (`confirm`).

use super::args::{Confirm, FenceCmd, FenceSet};
use super::confirm::{self, Decision};
use super::output::esc;
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::registry::fences::FencePlan;
use crate::store::registry::fences::FenceSetOutcome;
use crate::store::registry::fences::FenceTargetProblem;
use crate::store::registry::fences::{FenceKind, FenceScope};
use baton_shared::duration;
use baton_shared::exit;
use baton_shared::ids::check_name;

/// Runs one `fence` subcommand.
pub(super) fn run(ctx: &Context, f: &FenceCmd) -> CliResult {
    match f {
        FenceCmd::Pause(s) => set(ctx, FenceKind::Pause, s, None),
        FenceCmd::Hold(s) => set(ctx, FenceKind::Hold, s, None),
        FenceCmd::Block(b) => set(ctx, FenceKind::Block, &b.set, Some(&b.confirm)),
        FenceCmd::Lift { id, why } => {
            let record = ctx.open_write()?;
            let by = By { operator: ctx.operator.clone(), reason: why.reason.clone() };
            record.run(record.fence_lift(*id, by)).map_err(|e| match e {
                crate::store::StoreError::NotFound(_) => {
                    CliError::new(exit::NOTHING, format!("nothing to do: fence {id} is not active"))
                }
                e => e.into(),
            })?;
            ctx.wake_hub();
            output::line(format!("lifted fence {id}"))
        }
        FenceCmd::List { all, json } => {
            let record = ctx.open_read()?;
            output::fences(&record.run(record.fences(*all))?, ctx.now_ms(), *json)
        }
    }
}

/// When the hub lifts the fence, from `--for` or `--until`.
fn expiry_ms(ctx: &Context, set: &FenceSet) -> Result<Option<i64>, CliError> {
    let now = ctx.now_ms();
    let at = match (&set.for_duration, &set.until) {
        (Some(d), _) => {
            let d = duration::parse("--for", d).map_err(CliError::usage)?;
            now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }
        (None, Some(t)) => duration::parse_time_ms("--until", t).map_err(CliError::usage)?,
        (None, None) => return Ok(None),
    };
    if at <= now {
        return Err(CliError::usage("the fence would end before it begins: give a time in the future"));
    }
    Ok(Some(at))
}

/// The refusal of a fence whose target matches nothing today (a typo?).
fn target_refusal(problem: &FenceTargetProblem, target: Option<&str>) -> CliError {
    let t = esc(target.unwrap_or_default());
    let p = match problem {
        FenceTargetProblem::NeverEnrolled => format!("host {t} was never enrolled"),
        FenceTargetProblem::Retired => format!("host {t} is retired"),
        FenceTargetProblem::NoMessages => format!("conversation {t} has no messages"),
        FenceTargetProblem::NoSuchPool => format!("there is no pool {t}"),
    };
    CliError::usage(format!("{p}; a typo? (--force sets the fence anyway)"))
}

/// The refusal of a fence the same as an active one (`existing`, described): exit 1.
fn already_active(existing: &str) -> CliError {
    CliError::new(exit::NOTHING, format!("nothing to do: {} is already active", esc(existing)))
}

/// "; the hub lifts it at TIME" for a time-boxed fence, as the plan and the answer say it
/// (before the time: the fence is active until then).
fn until_text(expires_at_ms: Option<i64>) -> String {
    expires_at_ms.map(|at| format!("; the hub lifts it at {}", output::fmt_ms(at))).unwrap_or_default()
}

/// Reads what a block would do and asks (`confirm::decide`); `Ok(false)` for a dry run, which
/// has printed the plan and must change nothing.
fn confirm_block(
    ctx: &Context,
    set: &FenceSet,
    (scope, target): (FenceScope, Option<&str>),
    expires_at_ms: Option<i64>,
    confirm: &Confirm,
) -> Result<bool, CliError> {
    let reason = match scope {
        FenceScope::Host => set.why.required("fence block --host")?,
        FenceScope::Pool => set.why.required("fence block --pool")?,
        FenceScope::All => set.why.required("fence block --all")?,
        FenceScope::Conversation => set.why.text(),
    };
    let record = ctx.open_read()?;
    let FencePlan { problem, already, queued, paused } =
        record.run(record.fence_plan(FenceKind::Block, scope, target.map(str::to_string)))?;
    drop(record);
    if let (Some(problem), false) = (&problem, set.force) {
        return Err(target_refusal(problem, target));
    }
    if let Some(existing) = already {
        return Err(already_active(&existing));
    }
    let on = match target {
        Some(t) => format!("{} {}", scope.as_str(), esc(t)),
        None => "everything".to_string(),
    };
    let plan = format!(
        "fence block on {on} (reason: {}): {queued} queued deliveries would fail at their host's next claim, \
         {paused} of them paused now{}",
        esc(reason),
        until_text(expires_at_ms)
    );
    let json = set.json.then(|| {
        serde_json::json!({
            "kind": "block", "scope": scope.as_str(), "target": target,
            "expires_at_ms": expires_at_ms, "reason": reason, "queued": queued, "paused": paused,
        })
    });
    Ok(confirm::decide(confirm, &plan, json)? == Decision::Act)
}

fn set(ctx: &Context, kind: FenceKind, set: &FenceSet, confirm: Option<&Confirm>) -> CliResult {
    let (scope, target) = match (&set.target.conversation, &set.target.host, &set.target.pool) {
        (Some(c), _, _) => {
            check_name("conversation", c)?;
            (FenceScope::Conversation, Some(c.as_str()))
        }
        (_, Some(h), _) => {
            check_name("host", h)?;
            (FenceScope::Host, Some(h.as_str()))
        }
        (_, _, Some(p)) => {
            check_name("pool", p)?;
            (FenceScope::Pool, Some(p.as_str()))
        }
        _ => (FenceScope::All, None),
    };
    let expires_at_ms = expiry_ms(ctx, set)?;
    // A block on everything or on a host is always asked about; one on a conversation only
    // when a dry run asks what it would do.
    if let Some(confirm) = confirm
        && (scope != FenceScope::Conversation || confirm.dry_run)
        && !confirm_block(ctx, set, (scope, target), expires_at_ms, confirm)?
    {
        return Ok(());
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: set.why.text().to_string() };
    let id =
        match record.run(record.fence_set(kind, scope, target.map(str::to_string), by, expires_at_ms, set.force))? {
            FenceSetOutcome::Set(id) => id,
            FenceSetOutcome::TargetProblem(problem) => return Err(target_refusal(&problem, target)),
            FenceSetOutcome::AlreadyActive(existing) => return Err(already_active(&existing)),
        };
    ctx.wake_hub();
    if set.json {
        return output::json(&serde_json::json!({
            "id": id, "kind": kind.as_str(), "scope": scope.as_str(), "target": target, "expires_at_ms": expires_at_ms,
        }));
    }
    output::line(format!(
        "fence {id}: {} {}{}{}",
        kind.as_str(),
        scope.as_str(),
        target.map(|t| format!(" {t}")).unwrap_or_default(),
        until_text(expires_at_ms)
    ))
}
