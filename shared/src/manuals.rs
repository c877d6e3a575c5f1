//! Shell completion scripts and man pages generated from a binary's clap definition, so a
//! command or flag added there appears in both without anyone editing anything here. Nothing
//! generated is checked in: the packages generate both from the binary they ship
//! (`hub/pkg/build-deb`, `node/pkg/build-deb`), so they cannot drift from it. Each binary's
//! `completions SHELL` and `man --out DIR` commands call these with its own `clap::Command`.

pub use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The completion script of `cmd`, installed as `bin`, for `shell`.
pub fn completion_script(mut cmd: clap::Command, bin: &str, shell: Shell) -> Result<String, String> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, bin, &mut script);
    String::from_utf8(script).map_err(|e| format!("the {shell} script is not UTF-8: {e}"))
}

/// Writes one man page per command and visible subcommand of `cmd` into `out` (created if
/// missing): `baton-hub.1`, `baton-hub-serve.1`, `baton-hub-enroll-node.1`, … Returns the
/// `*.1` files now in `out`, sorted.
pub fn write_man_pages(cmd: clap::Command, out: &Path) -> Result<Vec<PathBuf>, String> {
    let failed = |e: std::io::Error| format!("writing man pages into {}: {e}", out.display());
    std::fs::create_dir_all(out).map_err(failed)?;
    clap_mangen::generate_to(cmd, out).map_err(failed)?;
    let mut files = Vec::new();
    for entry in std::fs::read_dir(out).map_err(failed)? {
        let path = entry.map_err(failed)?.path();
        if path.extension().is_some_and(|e| e == "1") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Every visible command path of `cmd`, as its man page is named (`baton-hub-enroll-node`):
/// what `write_man_pages` must have written a page for.
pub fn visible_command_paths(cmd: &clap::Command) -> Vec<String> {
    fn walk(cmd: &clap::Command, prefix: &str, paths: &mut Vec<String>) {
        let name = if prefix.is_empty() { cmd.get_name().to_string() } else { format!("{prefix}-{}", cmd.get_name()) };
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            walk(sub, &name, paths);
        }
        paths.push(name);
    }
    let mut paths = Vec::new();
    walk(cmd, "", &mut paths);
    paths
}

/// What is missing from the manuals of `cmd` (installed as `bin`): a visible command with no
/// man page in `pages_dir` (or a page that is not one), or a shell whose completion script does
/// not name a visible top-level command. Empty when nothing is: the check each binary's tests
/// run against its own definition.
pub fn missing(cmd: &clap::Command, bin: &str, pages_dir: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    for path in visible_command_paths(cmd) {
        let page = pages_dir.join(format!("{path}.1"));
        if !std::fs::read_to_string(&page).is_ok_and(|t| t.contains(".TH")) {
            missing.push(format!("no man page for {path}"));
        }
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        match completion_script(cmd.clone(), bin, shell) {
            Ok(script) => {
                for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
                    if !script.contains(sub.get_name()) {
                        missing.push(format!("{shell}: {} not completed", sub.get_name()));
                    }
                }
            }
            Err(e) => missing.push(e),
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> clap::Command {
        clap::Command::new("tool")
            .subcommand(clap::Command::new("serve"))
            .subcommand(clap::Command::new("enroll").subcommand(clap::Command::new("node")))
            .subcommand(clap::Command::new("gate").hide(true))
    }

    #[test]
    fn every_visible_command_gets_a_page_and_a_completion() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_man_pages(example(), dir.path()).unwrap();
        let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert!(names.contains(&"tool-enroll-node.1".to_string()), "{names:?}");
        let paths = visible_command_paths(&example());
        assert!(paths.contains(&"tool-enroll-node".to_string()) && !paths.iter().any(|p| p.contains("gate")));
        assert!(missing(&example(), "tool", dir.path()).is_empty());
    }

    #[test]
    fn a_missing_page_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_man_pages(example(), dir.path()).unwrap();
        std::fs::remove_file(dir.path().join("tool-serve.1")).unwrap();
        assert_eq!(missing(&example(), "tool", dir.path()), ["no man page for tool-serve"]);
    }
}
