//! `fence pause|hold|block (--conversation C | --host H | --all) [--for D | --until T]
//! [--force]`, `fence lift ID`, `fence list`.
//!
//! A fence that could not match anything (a host never enrolled, a conversation with no
//! messages: most likely a typo) is refused unless `--force`; a fence the same as an active one
//! is refused naming it (it would change nothing). A time-boxed fence is lifted by the hub at
//! its expiry; changing fence commands lift expired ones first, so the record never shows a
//! fence active past its time when the hub is stopped.

use super::args::{FenceCmd, FenceSet};
use super::output::esc;
use super::{CliError, CliResult, Context, output};
use crate::store::api::{By, FenceSetOutcome, FenceTargetProblem};
use crate::store::fences::{FenceKind, FenceScope};
use baton_shared::duration;
use baton_shared::exit;
use baton_shared::ids::check_name;

/// Runs one `fence` subcommand.
pub(super) fn run(ctx: &Context, f: &FenceCmd) -> CliResult {
    match f {
        FenceCmd::Pause(s) => set(ctx, FenceKind::Pause, s),
        FenceCmd::Hold(s) => set(ctx, FenceKind::Hold, s),
        FenceCmd::Block(s) => set(ctx, FenceKind::Block, s),
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

fn set(ctx: &Context, kind: FenceKind, set: &FenceSet) -> CliResult {
    let (scope, target) = match (&set.target.conversation, &set.target.host, set.target.all) {
        (Some(c), _, _) => {
            check_name("conversation", c)?;
            (FenceScope::Conversation, Some(c.as_str()))
        }
        (_, Some(h), _) => {
            check_name("host", h)?;
            (FenceScope::Host, Some(h.as_str()))
        }
        _ => (FenceScope::All, None),
    };
    let expires_at_ms = expiry_ms(ctx, set)?;
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: set.why.reason.clone() };
    let id =
        match record.run(record.fence_set(kind, scope, target.map(str::to_string), by, expires_at_ms, set.force))? {
            FenceSetOutcome::Set(id) => id,
            FenceSetOutcome::TargetProblem(problem) => {
                let t = esc(target.unwrap_or_default());
                let p = match problem {
                    FenceTargetProblem::NeverEnrolled => format!("host {t} was never enrolled"),
                    FenceTargetProblem::Retired => format!("host {t} is retired"),
                    FenceTargetProblem::NoMessages => format!("conversation {t} has no messages"),
                };
                return Err(CliError::usage(format!("{p}; a typo? (--force sets the fence anyway)")));
            }
            FenceSetOutcome::AlreadyActive(existing) => {
                return Err(CliError::new(
                    exit::NOTHING,
                    format!("nothing to do: {} is already active", esc(&existing)),
                ));
            }
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
        expires_at_ms.map(|at| format!(", lifted by the hub at {}", output::fmt_ms(at))).unwrap_or_default()
    ))
}
