//! The operator's side of pools: `pools add|remove` (one write transaction per change, audited
//! by the store, then a running hub is woken so its members' waiting claims look again) and
//! `pools list|show` (members with their standing for pool work, queued, oldest queued age,
//! in flight, bound conversations).

use super::args::{PoolChange, PoolsCmd};
use super::lookup::judging;
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use baton_shared::exit;
use baton_shared::ids::check_name;

/// Runs one `pools` subcommand.
pub(super) fn run(ctx: &Context, p: &PoolsCmd) -> CliResult {
    match p {
        PoolsCmd::Add(change) => change_members(ctx, change, true),
        PoolsCmd::Remove(change) => change_members(ctx, change, false),
        PoolsCmd::List { json } => {
            let judging = judging(ctx)?;
            let record = ctx.open_read()?;
            let rows = record.run(record.pool_standings(None, judging))?;
            output::pools(&rows, judging.now_ms, *json)
        }
        PoolsCmd::Show { name, json } => {
            check_name("pool", name)?;
            let judging = judging(ctx)?;
            let record = ctx.open_read()?;
            let pool = record.run(record.pool_standings(Some(name.clone()), judging))?;
            output::pools(&pool, judging.now_ms, *json)
        }
    }
}

/// `pools add|remove`: every host named in one transaction; exit 1 when none changed.
fn change_members(ctx: &Context, p: &PoolChange, add: bool) -> CliResult {
    check_name("pool", &p.pool)?;
    for h in &p.hosts {
        check_name("host", h)?;
    }
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: p.why.reason.clone() };
    let changes = record.run(record.pool_members_change(add, p.pool.clone(), p.hosts.clone(), by))?;
    let changed = changes.iter().filter(|c| c.changed).count();
    if changed > 0 {
        ctx.wake_hub();
    }
    let (verb, unchanged) = if add { ("joined", "already a member of") } else { ("left", "not a member of") };
    for c in &changes {
        if c.changed {
            output::line(format!("{}: {verb} pool {}", c.host, p.pool))?;
        } else {
            output::line(format!("{}: {unchanged} pool {}, unchanged", c.host, p.pool))?;
        }
    }
    if changed == 0 {
        return Err(CliError::new(exit::NOTHING, "nothing changed"));
    }
    Ok(())
}
