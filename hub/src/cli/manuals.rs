//! `completions` and `man`: shell completion scripts and man pages generated from the clap
//! definitions in `args`, so a command or flag added there appears in both without anyone
//! editing anything here. Nothing generated is checked in: the packages generate both from
//! the binary they ship (`hub/pkg/build-deb`), so they cannot drift from it.

use super::{Cli, CliError, CliResult, output};
use clap::CommandFactory as _;
use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The name the scripts and pages are generated for (the installed binary's name).
const BIN_NAME: &str = "baton-hub";

/// The completion script for `shell`.
pub(super) fn completion_script(shell: Shell) -> Result<String, CliError> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), BIN_NAME, &mut script);
    String::from_utf8(script).map_err(|e| CliError::failure(format!("the {shell} script is not UTF-8: {e}")))
}

/// Writes one man page per command and visible subcommand into `out` (created if missing):
/// `baton-hub.1`, `baton-hub-serve.1`, `baton-hub-enroll-node.1`, … Returns the pages now in
/// `out`.
pub(super) fn write_man_pages(out: &Path) -> Result<Vec<PathBuf>, CliError> {
    let failed = |e: std::io::Error| CliError::failure(format!("writing man pages into {}: {e}", out.display()));
    std::fs::create_dir_all(out).map_err(failed)?;
    clap_mangen::generate_to(Cli::command(), out).map_err(failed)?;
    man_files(out).map_err(failed)
}

/// The `*.1` files in `dir`, sorted.
fn man_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "1") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `baton-hub completions SHELL`.
pub(super) fn completions(shell: Shell) -> CliResult {
    output::line(completion_script(shell)?.trim_end())
}

/// `baton-hub man --out DIR`: prints each page it wrote.
pub(super) fn man(out: &Path) -> CliResult {
    for page in write_man_pages(out)? {
        output::line(page.display())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every visible command path, as the page names it: `baton-hub-enroll-node`.
    fn command_paths(cmd: &clap::Command, prefix: &str, paths: &mut Vec<String>) {
        let name = if prefix.is_empty() { cmd.get_name().to_string() } else { format!("{prefix}-{}", cmd.get_name()) };
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            command_paths(sub, &name, paths);
        }
        paths.push(name);
    }

    /// Each visible command and subcommand has its page, whatever was added to `args`: the
    /// list comes from the definition itself.
    #[test]
    fn every_command_has_a_man_page() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_man_pages(dir.path()).unwrap();
        let mut paths = Vec::new();
        command_paths(&Cli::command(), "", &mut paths);
        assert!(paths.len() > 20, "{paths:?}");
        for path in &paths {
            let page = dir.path().join(format!("{path}.1"));
            assert!(written.contains(&page), "no page for {path}: {written:?}");
            let text = std::fs::read_to_string(&page).unwrap();
            assert!(text.contains(".TH"), "{path}: not a man page");
        }
        assert!(paths.iter().any(|p| p == "baton-hub-enroll-node"), "{paths:?}");
        assert!(paths.iter().any(|p| p == "baton-hub-completions"), "{paths:?}");
    }

    /// The scripts of the shells the packages install complete every top-level command.
    #[test]
    fn completion_scripts_name_every_command() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = completion_script(shell).unwrap();
            for sub in Cli::command().get_subcommands().filter(|s| !s.is_hide_set()) {
                assert!(script.contains(sub.get_name()), "{shell}: {} missing", sub.get_name());
            }
            assert!(script.contains(BIN_NAME), "{shell}");
        }
    }
}
