//! `completions` and `man`: the node's shell completion scripts and man pages, generated from
//! the clap definitions in `cli` by `baton_shared::manuals`.

use crate::cli::Cli;
use anyhow::{Context as _, anyhow};
use baton_shared::manuals::{self, Shell};
use clap::CommandFactory as _;
use std::path::Path;

/// The name the scripts and pages are generated for (the installed binary's name).
const BIN_NAME: &str = "baton-node";

/// `baton-node completions SHELL`.
pub fn completions(shell: Shell) -> anyhow::Result<()> {
    let script = manuals::completion_script(Cli::command(), BIN_NAME, shell).map_err(|e| anyhow!(e))?;
    crate::output::print(&script).context("writing to stdout")
}

/// `baton-node man --out DIR`: prints each page it wrote.
pub fn man(out: &Path) -> anyhow::Result<()> {
    let pages: String = manuals::write_man_pages(Cli::command(), out)
        .map_err(|e| anyhow!(e))?
        .iter()
        .map(|p| format!("{}\n", p.display()))
        .collect();
    crate::output::print(&pages).context("writing to stdout")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible command has its page and every top-level one its completion, whatever was
    /// added to `cli`; the hidden turn gate has neither.
    #[test]
    fn every_command_has_a_man_page_and_a_completion() {
        let dir = tempfile::tempdir().unwrap();
        manuals::write_man_pages(Cli::command(), dir.path()).unwrap();
        assert_eq!(manuals::missing(&Cli::command(), BIN_NAME, dir.path()), Vec::<String>::new());
        let paths = manuals::visible_command_paths(&Cli::command());
        assert!(paths.len() > 4, "{paths:?}");
        assert!(paths.iter().any(|p| p == "baton-node-config-check"), "{paths:?}");
        assert!(paths.iter().any(|p| p == "baton-node-completions"), "{paths:?}");
        assert!(!paths.iter().any(|p| p.contains("turn-gate")), "the hidden gate has no page: {paths:?}");
    }

    /// In the real zsh, a second-level subcommand and a flag complete.
    #[test]
    fn zsh_completes_a_second_level_subcommand_and_a_flag() {
        let script = manuals::completion_script(Cli::command(), BIN_NAME, manuals::Shell::Zsh).unwrap();
        let Some(subcommands) = manuals::zsh_completes_or_skip(&script, BIN_NAME, "config ") else { return };
        assert!(subcommands.contains("check"), "config <TAB> lists no check:\n{subcommands}");
        let flags = manuals::zsh_completes_or_skip(&script, BIN_NAME, "config check --").unwrap_or_default();
        assert!(flags.contains("--online"), "config check --<TAB>:\n{flags}");
    }
}
