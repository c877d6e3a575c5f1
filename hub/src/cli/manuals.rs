//! `completions` and `man`: the hub's shell completion scripts and man pages, generated from
//! the clap definitions in `args` by `baton_shared::manuals`.

use super::{Cli, CliError, CliResult, output};
use baton_shared::manuals::{self, Shell};
use clap::CommandFactory as _;
use std::path::Path;

/// The name the scripts and pages are generated for (the installed binary's name).
const BIN_NAME: &str = "baton-hub";

/// `baton-hub completions SHELL`.
pub(super) fn completions(shell: Shell) -> CliResult {
    let script = manuals::completion_script(Cli::command(), BIN_NAME, shell).map_err(CliError::failure)?;
    output::line(script.trim_end())
}

/// `baton-hub man --out DIR`: prints each page it wrote.
pub(super) fn man(out: &Path) -> CliResult {
    for page in manuals::write_man_pages(Cli::command(), out).map_err(CliError::failure)? {
        output::line(page.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible command has its page and every top-level one its completion, whatever was
    /// added to `args`: the list comes from the definition itself.
    #[test]
    fn every_command_has_a_man_page_and_a_completion() {
        let dir = tempfile::tempdir().unwrap();
        manuals::write_man_pages(Cli::command(), dir.path()).unwrap();
        assert_eq!(manuals::missing(&Cli::command(), BIN_NAME, dir.path()), Vec::<String>::new());
        let paths = manuals::visible_command_paths(&Cli::command());
        assert!(paths.len() > 20, "{paths:?}");
        assert!(paths.iter().any(|p| p == "baton-hub-enroll-node"), "{paths:?}");
        assert!(paths.iter().any(|p| p == "baton-hub-completions"), "{paths:?}");
    }

    /// In the real zsh, a second-level subcommand and a flag complete (`missing` holds bash
    /// to every command and flag; zsh completes only in its line editor, so two probes).
    #[test]
    fn zsh_completes_a_second_level_subcommand_and_a_flag() {
        let script = manuals::completion_script(Cli::command(), BIN_NAME, manuals::Shell::Zsh).unwrap();
        let subs = ["block", "hold", "lift", "list", "pause"];
        let Some(subcommands) = manuals::zsh_completes_or_skip(&script, BIN_NAME, "fence ", &subs) else { return };
        for sub in subs {
            assert!(subcommands.contains(sub), "fence <TAB> lists no {sub}:\n{subcommands}");
        }
        let flags =
            manuals::zsh_completes_or_skip(&script, BIN_NAME, "fence pause --", &["--conversation", "--reason"])
                .unwrap_or_default();
        assert!(flags.contains("--conversation") && flags.contains("--reason"), "fence pause --<TAB>:\n{flags}");
    }
}
