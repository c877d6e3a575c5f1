//! The fleet: `hosts list` and `hosts show HOST`, read from the record (hosts, their bound
//! instance, the node sessions nodes register, holdings, certificates, events).

use super::args::HostsCmd;
use super::{CliError, CliResult, Context, output};
use baton_shared::exit;

/// Runs one `hosts` subcommand.
pub(super) fn run(ctx: &Context, h: &HostsCmd) -> CliResult {
    match h {
        HostsCmd::List { json } => {
            let record = ctx.open_read()?;
            let silence_warn_ms = super::deliveries::silence_warn_ms(ctx)?;
            output::hosts(&record.run(record.hosts())?, ctx.now_ms(), silence_warn_ms, *json)
        }
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
