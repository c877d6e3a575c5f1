//! The fleet: `hosts list` and `hosts show HOST`, read from the record (hosts, their bound
//! instance, the node sessions nodes register, holdings, certificates, events), and `hosts
//! drain|undrain HOST`: a host pause fence, and a wait until the host holds nothing.

use super::args::HostsCmd;
use super::output::esc;
use super::{CliError, CliResult, Context, output};
use crate::store::By;
use crate::store::registry::fences::FenceSetOutcome;
use crate::store::registry::fences::{FenceKind, FenceScope};
use crate::store::views::fleet::Holdings;
use baton_shared::duration::{self, human};
use baton_shared::exit;
use baton_shared::ids::check_name;
use std::time::{Duration, Instant};

/// How often `hosts drain` reads what the host still holds: a read transaction each time, so
/// a long drain costs the record next to nothing.
const DRAIN_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Runs one `hosts` subcommand.
pub(super) fn run(ctx: &Context, h: &HostsCmd) -> CliResult {
    match h {
        HostsCmd::List { json } => {
            let record = ctx.open_read()?;
            let silence_warn_ms = super::lookup::silence_warn_ms(ctx)?;
            output::hosts(&record.run(record.hosts())?, ctx.now_ms(), silence_warn_ms, *json)
        }
        HostsCmd::Drain { host, deadline, reason } => drain(ctx, host, deadline.as_deref(), reason),
        HostsCmd::Undrain { host, why } => undrain(ctx, host, &why.reason),
        HostsCmd::Show { host, json } => {
            let record = ctx.open_read()?;
            let detail = record.run(record.host(host.clone()))?;
            match detail {
                Some(detail) => output::host(&detail, ctx.now_ms(), *json),
                None => Err(CliError::new(exit::NOTHING, format!("host {} was never enrolled", output::esc(host)))),
            }
        }
    }
}

/// What a host holds, in one line.
fn holding(h: &Holdings) -> String {
    format!("{} claimed, {} mirrored, {} running or unreported", h.claimed, h.mirrored, h.delivered)
}

/// `hosts drain HOST [--deadline D] --reason R`: a pause fence on the host (or the one already
/// active), then a wait until it holds nothing, printing each change of what it holds.
fn drain(ctx: &Context, host: &str, deadline: Option<&str>, reason: &str) -> CliResult {
    check_name("host", host)?;
    let deadline = deadline.map(|d| duration::parse("--deadline", d).map_err(CliError::usage)).transpose()?;
    let record = ctx.open_write()?;
    let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
    match record.run(record.fence_set(FenceKind::Pause, FenceScope::Host, Some(host.to_string()), by, None, false))? {
        FenceSetOutcome::Set(id) => {
            ctx.wake_hub();
            output::line(format!("fence {id}: pause host {host}: no new work for it until `hosts undrain {host}`"))?;
        }
        FenceSetOutcome::AlreadyActive(existing) => {
            output::line(format!("{} is already active: no new work for {host}", esc(&existing)))?;
        }
        FenceSetOutcome::TargetProblem(_) => {
            return Err(CliError::new(exit::NOTHING, format!("host {} was never enrolled or is retired", esc(host))));
        }
    }
    drop(record);
    let started = Instant::now();
    let read = ctx.open_read()?;
    let mut shown: Option<String> = None;
    loop {
        let detail = read
            .run(read.host(host.to_string()))?
            .ok_or_else(|| CliError::new(exit::NOTHING, format!("host {} was never enrolled", esc(host))))?;
        let h = &detail.host.holdings;
        if h.claimed + h.mirrored + h.delivered == 0 {
            return output::line(format!("{host} holds nothing: drained in {}", human(started.elapsed())));
        }
        let now = holding(h);
        if shown.as_deref() != Some(now.as_str()) {
            output::line(format!("{host}: {now}"))?;
            shown = Some(now.clone());
        }
        if let Some(limit) = deadline.filter(|d| started.elapsed() >= *d) {
            return Err(CliError::new(
                exit::FAILURE,
                format!(
                    "deadline ({}) passed: {host} still holds {now}; it stays paused (hosts undrain {host} to resume)",
                    human(limit)
                ),
            ));
        }
        std::thread::sleep(DRAIN_POLL_INTERVAL);
    }
}

/// `hosts undrain HOST`: lifts every active pause fence on the host.
fn undrain(ctx: &Context, host: &str, reason: &str) -> CliResult {
    check_name("host", host)?;
    let record = ctx.open_write()?;
    let pauses: Vec<i64> = record
        .run(record.fences(false))?
        .into_iter()
        .filter(|f| f.kind == FenceKind::Pause && f.scope == FenceScope::Host && f.target.as_deref() == Some(host))
        .map(|f| f.id)
        .collect();
    if pauses.is_empty() {
        // A name no host ever had is most likely a typo: say that, not that it is unpaused.
        if record.run(record.host(host.to_string()))?.is_none() {
            return Err(CliError::new(exit::NOTHING, format!("host {} was never enrolled", esc(host))));
        }
        return Err(CliError::new(exit::NOTHING, format!("nothing to do: no pause fence on host {}", esc(host))));
    }
    for id in &pauses {
        let by = By { operator: ctx.operator.clone(), reason: reason.to_string() };
        record.run(record.fence_lift(*id, by))?;
        output::line(format!("lifted fence {id}: {host} takes work again"))?;
    }
    ctx.wake_hub();
    Ok(())
}
