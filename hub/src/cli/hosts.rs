//! The fleet: `hosts list` and `hosts show HOST`, read from the record (hosts, their bound
//! instance, the node sessions nodes register, holdings, certificates, events).

use super::args::HostsCmd;
use super::{CliError, CliResult, Context, output};
use crate::store::fleet;
use baton_shared::exit;

/// Runs one `hosts` subcommand.
pub(super) fn run(ctx: &Context, h: &HostsCmd) -> CliResult {
    match h {
        HostsCmd::List { json } => output::hosts(&fleet::hosts(&ctx.open_read()?)?, ctx.now_ms(), *json),
        HostsCmd::Show { host, json } => match fleet::host(&ctx.open_read()?, host)? {
            Some(detail) => output::host(&detail, ctx.now_ms(), *json),
            None => Err(CliError::new(exit::NOTHING, format!("host {} was never enrolled", output::esc(host)))),
        },
    }
}
