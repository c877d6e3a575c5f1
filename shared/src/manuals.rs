//! Shell completion scripts and man pages generated from a binary's clap definition, so a
//! command or flag added there appears in both without anyone editing anything here. Nothing
//! generated is checked in: the packages generate both from the binary they ship
//! (`hub/pkg/build-deb`, `node/pkg/build-deb`), so they cannot drift from it. Each binary's
//! `completions SHELL` and `man --out DIR` commands call these with its own `clap::Command`.

pub use clap_complete::Shell;
use std::path::{Path, PathBuf};

/// The completion script of `cmd`, installed as `bin`, for `shell`.
///
/// clap_complete's bash generator spells a hyphenated binary's name two ways: the walk over the
/// typed words names the states `baton__hub__subcmd__fence`, the branches that complete each
/// state `baton__subcmd__hub__subcmd__fence`, so nothing past the first word completed. The
/// script is mended to the walk's spelling, the one its top-level branch already uses.
pub fn completion_script(mut cmd: clap::Command, bin: &str, shell: Shell) -> Result<String, String> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, bin, &mut script);
    let script = String::from_utf8(script).map_err(|e| format!("the {shell} script is not UTF-8: {e}"))?;
    Ok(match shell {
        Shell::Bash if bin.contains('-') => {
            let walked = bin.replace('-', "__");
            let branched = bin.replace('-', "__subcmd__");
            script.replace(&format!("{branched}__subcmd__"), &format!("{walked}__subcmd__"))
        }
        _ => script,
    })
}

/// What bash completes for `words` typed after `bin` (the last one the word being completed,
/// empty for a fresh one), from `script`: the completion function run by the real `bash`, as
/// a terminal runs it on TAB. `None` when `bash` cannot be run here.
pub fn bash_completes(script: &str, bin: &str, words: &[&str]) -> Option<Vec<String>> {
    let function = format!("_{}", bin.replace('-', "__"));
    let mut all = vec![bin.to_string()];
    all.extend(words.iter().map(|w| w.to_string()));
    let quoted: Vec<String> = all.iter().map(|w| format!("'{}'", w.replace('\'', "'\\''"))).collect();
    let cword = all.len() - 1;
    let prev = &quoted[cword.saturating_sub(1)];
    let run = format!(
        "{script}\nCOMP_WORDS=({words}); COMP_CWORD={cword}; COMP_LINE=\"${{COMP_WORDS[*]}}\"; COMP_POINT=${{#COMP_LINE}}\n\
         {function} {bin} {cur} {prev}\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = quoted.join(" "),
        cur = quoted[cword],
    );
    let out = std::process::Command::new("bash").arg("--norc").arg("--noprofile").arg("-c").arg(run).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

/// What the real `zsh` lists for `line` typed after `bin` and a TAB, from `script` (its
/// completion function, installed as `_BIN` on `fpath`): the screen text, escape sequences
/// removed. zsh completes only in its line editor, so this drives an interactive `zsh -f`
/// through a pseudo-terminal (`zsh/zpty`) as a person at a terminal would, and reads the
/// screen until every word of `expected` is on it, or for `ZSH_LISTING_WAIT` at most (the
/// caller then names what is missing). `None` when `zsh` cannot be run here.
pub fn zsh_completes(script: &str, bin: &str, line: &str, expected: &[&str]) -> Option<String> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let dir = TempDir(std::env::temp_dir().join(format!("baton-zsh-{}-{nanos}", std::process::id())));
    std::fs::create_dir_all(dir.path()).ok()?;
    std::fs::write(dir.path().join(format!("_{bin}")), script).ok()?;
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let steps = ZSH_LISTING_WAIT.as_millis() / 100;
    let listed = if expected.is_empty() {
        "1 == 0".to_string()
    } else {
        expected.iter().map(|w| format!("$out == *{}*", quote(w))).collect::<Vec<_>>().join(" && ")
    };
    let driver = format!(
        "zmodload zsh/zpty\n\
         zpty z zsh -f -i\n\
         zpty -w z {setup}\n\
         zpty -w z {typed}$'\\t'\n\
         out=''\n\
         for i in {{1..{steps}}}; do sleep 0.1; while zpty -r -t z chunk 2>/dev/null; do out+=$chunk; done; [[ {listed} ]] && break; done\n\
         print -r -- \"$out\"\n\
         zpty -d z\n",
        setup = quote(&format!(
            "PROMPT='> '; fpath=({} $fpath); autoload -U compinit; compinit -u -D; compdef _{bin} {bin}",
            dir.path().display()
        )),
        typed = quote(&format!("{bin} {line}")),
    );
    let out = std::process::Command::new("zsh").arg("-f").arg("-c").arg(driver).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let raw = String::from_utf8_lossy(&out.stdout);
    // Escape sequences (CSI, and the two-byte ones) and carriage returns are the terminal's.
    let mut text = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for n in chars.by_ref() {
                        if n.is_ascii_alphabetic() || n == '~' {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' => text.push('\n'),
            c => text.push(c),
        }
    }
    Some(text)
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Set (to anything) to make a missing `zsh` a failure of the completion tests instead of a
/// skip (CI sets it, after installing zsh).
pub const REQUIRE_SHELLS_VAR: &str = "BATON_REQUIRE_SHELLS";

/// `zsh_completes`, or `None` after saying why the caller's test skips; panics when `zsh`
/// cannot be run and `REQUIRE_SHELLS_VAR` is set.
pub fn zsh_completes_or_skip(script: &str, bin: &str, line: &str, expected: &[&str]) -> Option<String> {
    let shown = zsh_completes(script, bin, line, expected);
    if shown.is_none() {
        assert!(std::env::var_os(REQUIRE_SHELLS_VAR).is_none(), "{REQUIRE_SHELLS_VAR} is set but zsh cannot be run");
        eprintln!(
            "SKIPPED: zsh cannot be run here (apt-get install zsh, or set {REQUIRE_SHELLS_VAR} to make this a failure)"
        );
    }
    shown
}

/// How long `zsh_completes` reads the screen after the TAB for a listing that has not come:
/// zsh lists within a fraction of a second, but a loaded machine has been seen to take more
/// than three (the reading stops as soon as the expected words are on the screen).
pub const ZSH_LISTING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

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
    if let Ok(script) = completion_script(cmd.clone(), bin, Shell::Bash) {
        missing.extend(bash_gaps(cmd, bin, &script));
    }
    missing
}

/// What the real `bash` fails to complete from `script`: below every visible command, each
/// visible subcommand after `COMMAND <TAB>` and each visible long flag after `COMMAND --<TAB>`,
/// two levels down (`baton-hub fence <TAB>`, `baton-hub fence pause --<TAB>`). Empty where
/// `bash` cannot be run.
fn bash_gaps(cmd: &clap::Command, bin: &str, script: &str) -> Vec<String> {
    fn visible(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
        cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
    }
    let mut gaps = Vec::new();
    let mut check = |path: &[&str], sub: &clap::Command| {
        let mut words = path.to_vec();
        let subs: Vec<&str> = visible(sub).map(|s| s.get_name()).collect();
        let flags: Vec<String> = sub
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .map(|l| format!("--{l}"))
            .collect();
        let (typed, wanted) =
            if subs.is_empty() { ("--", flags) } else { ("", subs.iter().map(|s| s.to_string()).collect()) };
        words.push(typed);
        let Some(offered) = bash_completes(script, bin, &words) else { return };
        let absent: Vec<&String> = wanted.iter().filter(|w| !offered.contains(w)).collect();
        if !absent.is_empty() {
            gaps.push(format!("bash: `{bin} {}<TAB>` does not offer {absent:?}", words.join(" ")));
        }
    };
    for sub in visible(cmd) {
        check(&[sub.get_name()], sub);
        for second in visible(sub) {
            check(&[sub.get_name(), second.get_name()], second);
        }
    }
    gaps
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

    /// A hyphenated name like the binaries': clap_complete's bash script completed nothing
    /// past its first word for one until `completion_script` mended it.
    fn hyphenated() -> clap::Command {
        clap::Command::new("baton-tool")
            .subcommand(clap::Command::new("serve").arg(clap::Arg::new("listen").long("listen")))
            .subcommand(
                clap::Command::new("fence")
                    .subcommand(clap::Command::new("pause").arg(clap::Arg::new("conversation").long("conversation")))
                    .subcommand(clap::Command::new("lift")),
            )
    }

    #[test]
    fn bash_completes_past_the_first_word_of_a_hyphenated_binary() {
        let script = completion_script(hyphenated(), "baton-tool", Shell::Bash).unwrap();
        let Some(top) = bash_completes(&script, "baton-tool", &[""]) else {
            eprintln!("SKIPPED: bash cannot be run here");
            return;
        };
        assert!(top.contains(&"fence".to_string()), "{top:?}");
        let second = bash_completes(&script, "baton-tool", &["fence", ""]).unwrap();
        assert!(second.contains(&"pause".to_string()) && second.contains(&"lift".to_string()), "{second:?}");
        let flag = bash_completes(&script, "baton-tool", &["fence", "pause", "--con"]).unwrap();
        assert_eq!(flag, ["--conversation"]);
        assert_eq!(bash_gaps(&hyphenated(), "baton-tool", &script), Vec::<String>::new());
        // clap_complete's own script, unmended, is what the check exists to catch.
        let mut raw = Vec::new();
        clap_complete::generate(Shell::Bash, &mut hyphenated(), "baton-tool", &mut raw);
        let gaps = bash_gaps(&hyphenated(), "baton-tool", &String::from_utf8(raw).unwrap());
        assert!(gaps.iter().any(|g| g.contains("fence <TAB>")), "{gaps:?}");
    }

    #[test]
    fn a_missing_page_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write_man_pages(example(), dir.path()).unwrap();
        std::fs::remove_file(dir.path().join("tool-serve.1")).unwrap();
        assert_eq!(missing(&example(), "tool", dir.path()), ["no man page for tool-serve"]);
    }
}
