//! `fence pause|hold|block (--conversation C | --host H | --all)`, `fence lift ID`, `fence list`.

use super::args::{FenceCmd, FenceSet};
use super::{CliResult, Context, output};
use crate::store::fences::{self, FenceKind, FenceScope, NewFence};
use crate::store::in_write_txn;
use baton_shared::ids::check_name;

/// Runs one `fence` subcommand.
pub(super) fn run(ctx: &Context, f: &FenceCmd) -> CliResult {
    match f {
        FenceCmd::Pause(s) => set(ctx, FenceKind::Pause, s),
        FenceCmd::Hold(s) => set(ctx, FenceKind::Hold, s),
        FenceCmd::Block(s) => set(ctx, FenceKind::Block, s),
        FenceCmd::Lift { id, why } => {
            let conn = ctx.open_write()?;
            in_write_txn(&conn, |c| fences::lift(c, *id, &ctx.operator, &why.reason, ctx.now_ms()))?;
            ctx.wake_hub();
            output::line(format!("lifted fence {id}"))
        }
        FenceCmd::List { all, json } => output::fences(&fences::list(&ctx.open_read()?, *all)?, *json),
    }
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
    let conn = ctx.open_write()?;
    let new = NewFence { kind, scope, target, operator: &ctx.operator, reason: &set.why.reason };
    let id = in_write_txn(&conn, |c| fences::set(c, new, ctx.now_ms()))?;
    if set.json {
        return output::json(
            &serde_json::json!({"id": id, "kind": kind.as_str(), "scope": scope.as_str(), "target": target}),
        );
    }
    output::line(format!(
        "fence {id}: {} {}{}",
        kind.as_str(),
        scope.as_str(),
        target.map(|t| format!(" {t}")).unwrap_or_default()
    ))
}
