//! The one way a destructive command asks before it acts (SPEC §9: destructive operator
//! commands say what they will do, take `--dry-run`, and need `--yes`).
//!
//! The command reads its plan from the record first (counts, names) and hands the text to
//! `decide`: with `--dry-run` the plan is printed on stdout (as JSON with `--json`) and nothing
//! changes; with `--yes` the plan goes to stderr and the command acts; without either, a person
//! at a terminal (stdin and stderr both one) is asked, and anything else (a script, a pipe, a
//! cron job) is refused with exit 2 naming what would have happened, so no unattended caller
//! destroys by default. What the command then prints is what it did, which may differ from the
//! plan by whatever changed in between.

use super::args::Confirm;
use super::{CliError, output};
use baton_shared::exit;
use std::io::{BufRead, IsTerminal, Write};

/// What the operator chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// `--dry-run`: the plan was printed; change nothing and exit 0.
    DryRun,
    /// `--yes`, or confirmed at the terminal: do it.
    Act,
}

/// The answers a terminal confirms with (anything else, an empty line included, declines).
fn confirms(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Shows `plan` and decides as `confirm` says (see the module documentation). `json` is the
/// plan as `--json` prints it for a dry run (`dry_run: true` is added); `None` prints the text.
/// Declined at the terminal: exit 1 (nothing changed); not a terminal and no `--yes`: exit 2.
pub(super) fn decide(confirm: &Confirm, plan: &str, json: Option<serde_json::Value>) -> Result<Decision, CliError> {
    if confirm.dry_run {
        match json {
            Some(mut v) => {
                if let Some(o) = v.as_object_mut() {
                    o.insert("dry_run".into(), serde_json::Value::Bool(true));
                }
                output::json(&v)?;
            }
            None => output::line(format!("{plan}\n(dry run: nothing changed)"))?,
        }
        return Ok(Decision::DryRun);
    }
    if confirm.yes {
        eprintln!("{plan}");
        return Ok(Decision::Act);
    }
    if !(std::io::stdin().is_terminal() && std::io::stderr().is_terminal()) {
        return Err(CliError::usage(format!(
            "{plan}\nrefusing without --yes (not a terminal to ask): nothing changed; pass --yes to do it, or \
             --dry-run to only see the plan"
        )));
    }
    let mut err = std::io::stderr().lock();
    write!(err, "{plan}\nProceed? [y/N] ")?;
    err.flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    if confirms(&answer) {
        Ok(Decision::Act)
    } else {
        Err(CliError::new(exit::NOTHING, "not confirmed: nothing changed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only an explicit yes confirms; the default (an empty line) declines.
    #[test]
    fn only_yes_confirms() {
        for yes in ["y", "Y\n", "yes", " YES \n"] {
            assert!(confirms(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yep", "ye s", "sure"] {
            assert!(!confirms(no), "{no:?}");
        }
    }
}
