//! `baton`, the producer command line, end to end against the real `baton-hub` and
//! `baton-node`: send (flag, file and stdin payloads; a replay), get by id and key, wait with
//! the exit status of each outcome (succeeded 0, not succeeded 7, timeout 8), cancel, stored
//! text escaped in human output, and configuration errors that name what is wrong.

use crate::harness::{EVENT_WAIT, Hub, output_within};
use crate::node_harness::wait_for;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The `baton` binary, built once per test process.
pub fn baton_bin() -> PathBuf {
    baton_testkit::bins::producer_cli().unwrap_or_else(|e| panic!("{e:#}"))
}

/// A scrubbed `baton ARGS…` command (no `HOME`, no `BATON_*` from the test's environment).
pub fn baton<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut cmd = baton_testkit::bins::command(&baton_bin());
    cmd.args(args);
    cmd
}

/// Runs `cmd` within a generous deadline.
pub fn run(cmd: Command) -> Output {
    output_within(cmd, EVENT_WAIT * 4)
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts the exit status, showing both outputs when it differs.
#[track_caller]
pub fn status(out: &Output, expected: i32) {
    assert_eq!(out.status.code(), Some(expected), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
}

/// Writes the producer `prod`'s configuration file into a scratch directory; the certificate
/// paths are relative to it where `relative` (copies of the enrolled files sit next to it).
pub fn config_file(hub: &Hub, relative: bool) -> PathBuf {
    let dir = hub.scratch("producer");
    let id = hub.identity("prod");
    let (ca, cert, key) = if relative {
        for (from, to) in [(&id.ca, "ca.crt"), (&id.cert, "prod.crt"), (&id.key, "prod.key")] {
            std::fs::copy(from, dir.join(to)).expect("copy identity");
        }
        ("ca.crt".to_string(), "prod.crt".to_string(), "prod.key".to_string())
    } else {
        let s = |p: &Path| p.display().to_string();
        (s(&id.ca), s(&id.cert), s(&id.key))
    };
    let file = dir.join("baton.toml");
    let body = format!("hub_url = {:?}\nca_file = {ca:?}\ncert_file = {cert:?}\nkey_file = {key:?}\n", hub.url());
    std::fs::write(&file, body).expect("write baton.toml");
    file
}

/// stdout as JSON.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

/// send, get and wait: a turn that succeeds exits 0, one that fails exits 7, one that cannot
/// run before the timeout exits 8; a cancel changes it, and one of a message that already ended changes nothing (1).
#[test]
fn send_get_wait_and_cancel_with_their_exit_statuses() {
    let hub = Hub::with_nodes(&["host-a"]);
    // The harness fails turns of the conversation "fail" and writes a terminal escape into
    // every result, which human output must show escaped.
    let _node =
        hub.node_process("host-a").then("printf '\\033[31m'; [ \"$BATON_CONVERSATION\" != fail ] || exit 3").start();
    let config = config_file(&hub, true);
    let cfg = ["--config".to_string(), config.display().to_string()];

    // send with --payload; the exact text is kept.
    let payload = r#"{"n": 1.50, "big": 12345678901234567890123}"#;
    let send = |extra: &[&str]| {
        let mut args: Vec<String> = cfg.to_vec();
        args.extend(extra.iter().map(|s| s.to_string()));
        run(baton(args))
    };
    let out = send(&["send", "--conversation", "ok", "--to", "host-a", "--key", "k1", "--payload", payload]);
    status(&out, 0);
    assert!(text(&out.stdout).contains("accepted"), "{}", text(&out.stdout));
    let out = send(&["--json", "send", "--conversation", "ok", "--to", "host-a", "--key", "k1", "--payload", payload]);
    status(&out, 0);
    let replay = json(&out);
    assert_eq!(replay["duplicate"], true, "{replay}");
    let id = replay["message_id"].as_str().expect("message_id").to_string();

    let out = send(&["wait", &id, "--timeout", "60s"]);
    status(&out, 0);
    assert!(text(&out.stdout).contains("1 of 1 deliveries succeeded"), "{}", text(&out.stdout));
    // Human output escapes the stored result; JSON keeps the payload's exact text.
    let out = send(&["get", &id]);
    status(&out, 0);
    assert!(!out.stdout.contains(&0x1b) && text(&out.stdout).contains("\\x1b[31m"), "{}", text(&out.stdout));
    let out = send(&["get", "--key", "k1", "--json"]);
    status(&out, 0);
    assert!(text(&out.stdout).contains(payload), "{}", text(&out.stdout));
    assert_eq!(json(&out)["message_id"], id.as_str());

    // send from a file and from stdin; a failing turn makes wait exit 7.
    let file = hub.scratch("producer").join("payload.json");
    std::fs::write(&file, "{\"step\": 2}\n").expect("payload file");
    let file_arg = file.display().to_string();
    status(&send(&["send", "--conversation", "ok", "--to", "host-a", "--key", "k2", "--payload-file", &file_arg]), 0);
    let mut from_stdin = baton(
        cfg.iter()
            .chain(["send", "--conversation", "fail", "--to", "host-a", "--key", "k3", "-"].map(String::from).iter()),
    );
    from_stdin.stdin(std::fs::File::open(&file).expect("open payload"));
    status(&run(from_stdin), 0);
    let out = send(&["wait", "--key", "k3", "--timeout", "60s"]);
    status(&out, 7);
    assert!(text(&out.stdout).contains("attempt 1: failed exit 3"), "{}", text(&out.stdout));
    status(&send(&["wait", "--key", "k2", "--timeout", "60s"]), 0);

    // A paused conversation: wait times out (8); cancel fails the delivery (0), and wait then
    // reports it did not succeed (7).
    hub.fence("pause", &["--conversation", "parked"], "held back by the test");
    let out = send(&["--json", "send", "--conversation", "parked", "--to", "host-a", "--key", "k4", "--payload", "{}"]);
    status(&out, 0);
    let parked = json(&out)["message_id"].as_str().expect("id").to_string();
    let out = send(&["wait", &parked, "--timeout", "1s"]);
    status(&out, 8);
    assert!(text(&out.stdout).contains("timed out: 0 of 1 deliveries ended"), "{}", text(&out.stdout));
    let out = send(&["cancel", &parked, "--reason", "not needed"]);
    status(&out, 0);
    assert!(text(&out.stdout).contains("cancelled"), "{}", text(&out.stdout));
    // Repeating it answers the same; cancelling a message that already ended changes nothing.
    let again = send(&["cancel", &parked, "--reason", "not needed"]);
    status(&again, 0);
    assert_eq!(text(&again.stdout), text(&out.stdout));
    let out = send(&["cancel", &id]);
    status(&out, 1);
    assert!(text(&out.stdout).contains("final"), "{}", text(&out.stdout));
    status(&send(&["wait", &parked, "--timeout", "10s"]), 7);

    // Unknown: not found (1); a key used for other content: invalid input (2).
    status(&send(&["get", "00000000-0000-7000-8000-000000000000"]), 1);
    let out = send(&["send", "--conversation", "ok", "--to", "host-a", "--key", "k1", "--payload", "{}"]);
    status(&out, 2);
    assert!(text(&out.stderr).contains("idempotency_conflict"), "{}", text(&out.stderr));

    // A send inside a turn joins the turn's trace: TRACEPARENT from the environment (as the
    // node gives it to the harness) is the message's; a malformed one is refused, naming it.
    let traced = |key: &str, traceparent: &str| {
        let mut cmd = baton(cfg.iter().map(String::as_str).chain([
            "--json",
            "send",
            "--conversation",
            "ok",
            "--to",
            "host-a",
            "--key",
            key,
            "--payload",
            "{}",
        ]));
        cmd.env("TRACEPARENT", traceparent);
        run(cmd)
    };
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let out = traced("k-traced", tp);
    status(&out, 0);
    let traced_id = json(&out)["message_id"].as_str().expect("id").to_string();
    let shown = json(&send(&["--json", "get", &traced_id]));
    assert_eq!(shown["traceparent"], tp, "{shown}");
    let out = traced("k-mangled", "00-not-a-trace");
    status(&out, 2);
    assert!(text(&out.stderr).contains("TRACEPARENT"), "{}", text(&out.stderr));
    status(&send(&["get", "--key", "k-mangled"]), 1);
}

/// A refusal of the caller is its own status (9), apart from the hub being unreachable (4),
/// which a wrapper retries: a post outside the producer's publish scope, and a revoked
/// certificate, each end a retry loop at once.
#[test]
fn a_refused_caller_exits_9_not_the_retryable_4() {
    let hub = Hub::with_nodes(&["host-a"]);
    hub.cli_ok(["producers", "scope", "prod", "team-*", "--reason", "narrow"]);
    let config = config_file(&hub, false);
    let send = |conversation: &str, key: &str| {
        let mut cmd =
            baton(["send", "--conversation", conversation, "--to", "host-a", "--key", key, "--payload", "{}"]);
        cmd.arg("--config").arg(&config);
        run(cmd)
    };
    status(&send("team-a", "in-scope"), 0);
    let out = send("elsewhere", "out-of-scope");
    status(&out, 9);
    assert!(text(&out.stderr).contains("forbidden"), "{}", text(&out.stderr));
    hub.cli_ok(["revoke", "prod", "--reason", "gone", "--yes"]);
    let out = send("team-a", "after-revoke");
    status(&out, 9);
    let help = run(baton(["--help"]));
    assert!(text(&help.stdout).contains("  9  refused"), "the help names status 9: {}", text(&help.stdout));
}

/// A configuration that cannot work is refused before anything is sent (exit 2), naming
/// what is wrong; the environment overrides the file and a flag overrides both.
#[test]
fn bad_configuration_is_named_and_layers_override_in_order() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).start();
    let good = config_file(&hub, false);
    let dir = hub.scratch("configs");
    let refused = |file_text: Option<&str>, env: &[(&str, &str)], flags: &[&str], says: &[&str]| {
        let mut cmd = baton(flags);
        if let Some(t) = file_text {
            let f = dir.join("baton.toml");
            std::fs::write(&f, t).expect("write config");
            cmd.arg("--config").arg(&f);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.args(["get", "--key", "k"]);
        let out = run(cmd);
        status(&out, 2);
        let err = text(&out.stderr);
        for s in says {
            assert!(err.contains(s), "{s:?} not in {err}");
        }
    };
    // Nothing configured at all (no HOME, so no default file either).
    refused(None, &[], &[], &["no hub_url", "BATON_HUB_URL", "--config"]);
    // Nothing configured, and no file where the default path points: the error names that
    // path, so a file put in the wrong place is found.
    let xdg = dir.join("xdg").display().to_string();
    refused(None, &[("XDG_CONFIG_HOME", &xdg)], &[], &["no hub_url", &format!("{xdg}/baton/baton.toml"), "--config"]);
    // A named file that is not there.
    let absent = dir.join("absent.toml").display().to_string();
    refused(None, &[], &["--config", &absent], &["cannot read", "absent.toml"]);
    // A misspelt key.
    refused(Some("hub_url = \"https://127.0.0.1:1\"\ncert = \"x\"\n"), &[], &[], &["unknown field `cert`"]);
    // A key missing from the file.
    refused(Some("hub_url = \"https://127.0.0.1:1\"\n"), &[], &[], &["no ca_file", "baton.toml", "BATON_CA_FILE"]);
    // Plain HTTP.
    let id = hub.identity("prod");
    let files = format!("ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n", id.ca, id.cert, id.key);
    refused(Some(&format!("hub_url = \"http://127.0.0.1:1\"\n{files}")), &[], &[], &["hub_url", "https://"]);
    // A certificate file that is not there.
    let missing = format!(
        "hub_url = \"https://127.0.0.1:1\"\nca_file = {:?}\ncert_file = \"/nonexistent/p.crt\"\nkey_file = {:?}\n",
        id.ca, id.key
    );
    refused(Some(&missing), &[], &[], &["cert_file", "/nonexistent/p.crt"]);
    // A flag overrides the environment, which overrides the file.
    refused(None, &[("BATON_CONFIG", &good.display().to_string())], &["--hub-url", "http://x:1"], &["https://"]);

    // The file names a dead hub; the environment names the real one: found nothing (1), so
    // the request reached the hub.
    let text_of = std::fs::read_to_string(&good).expect("read good config");
    let dead = dir.join("dead.toml");
    std::fs::write(&dead, text_of.replace(&hub.url(), "https://127.0.0.1:1")).expect("write dead config");
    let mut cmd = baton(["get", "--key", "never-sent"]);
    cmd.arg("--config").arg(&dead).env("BATON_HUB_URL", hub.url());
    status(&run(cmd), 1);
    let mut cmd = baton(["get", "--key", "never-sent"]);
    cmd.arg("--config").arg(&dead);
    let out = run(cmd);
    status(&out, 4);
    assert!(text(&out.stderr).contains("unreachable"), "{}", text(&out.stderr));
}

/// `wait` keeps reading through a hub restart (saying so once on stderr) and still ends with
/// the status of the outcome.
#[test]
fn wait_reads_through_a_hub_restart() {
    let mut hub = Hub::with_nodes(&["host-a"]);
    let config = config_file(&hub, false);
    let cfg = ["--config".to_string(), config.display().to_string()];
    hub.fence("pause", &["--conversation", "parked"], "held back by the test");
    let mut args: Vec<String> = cfg.to_vec();
    args.extend(
        ["--json", "send", "--conversation", "parked", "--to", "host-a", "--key", "k1", "--payload", "{}"]
            .map(String::from),
    );
    let out = run(baton(args));
    status(&out, 0);
    let id = json(&out)["message_id"].as_str().expect("id").to_string();

    hub.kill9();
    let mut waiter = baton_testkit::Proc::new(&hub.scratch("waiter"), "baton-wait");
    let mut args: Vec<String> = cfg.to_vec();
    args.extend(["wait".to_string(), id.clone(), "--timeout".into(), "120s".into()]);
    waiter.spawn(baton(args)).expect("spawn baton wait");
    wait_for("baton wait to find the hub gone", EVENT_WAIT, || {
        waiter.stderr().contains("reading again until the timeout").then_some(())
    });
    hub.serve(None);
    let mut args: Vec<String> = cfg.to_vec();
    args.extend(["cancel".to_string(), id, "--reason".into(), "not needed".into()]);
    status(&run(baton(args)), 0);
    let exited = waiter.wait_exit(EVENT_WAIT).expect("wait for baton wait").expect("baton wait still runs");
    assert_eq!(exited.code(), Some(7), "stdout: {}\nstderr: {}", waiter.stdout(), waiter.stderr());
    assert_eq!(waiter.stderr().matches("reading again").count(), 1, "{}", waiter.stderr());
}

/// README's part from the line `start` up to the next `## ` heading.
fn readme_section<'a>(readme: &'a str, start: &str) -> &'a str {
    let from = readme.find(start).unwrap_or_else(|| panic!("README.md has no {start:?}"));
    let rest = &readme[from + start.len()..];
    rest.find("\n## ").map_or(rest, |to| &rest[..to])
}

/// The first fenced block of `lang` in `part`.
fn fenced<'a>(part: &'a str, lang: &str) -> &'a str {
    part.split(&format!("```{lang}\n")).nth(1).and_then(|s| s.split("```").next()).expect("a fenced block")
}

/// README's steps as an operator types them, in a shell: "Running a hub" after its `init` and
/// `serve` (this hub did both), then the producer's `baton send` lines of "Producers: the
/// `baton` CLI" with README's `baton.toml` (its certificate paths relative to the file, the
/// hub's URL this hub's). Every step exits 0: none names a host the steps never enrolled, and
/// the send "to the members" finds members.
#[test]
fn readmes_hub_and_producer_steps_run_as_written() {
    let hub = Hub::start();
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).expect("README");
    let dir = hub.scratch("readme");
    let programs = [crate::harness::bins().hub.clone(), baton_bin()];
    let mut path: Vec<PathBuf> = programs.iter().filter_map(|p| p.parent().map(Path::to_path_buf)).collect();
    path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    let path = std::env::join_paths(path).expect("PATH");
    let shell = |line: &str| {
        let mut cmd = baton_testkit::bins::command(Path::new("sh"));
        cmd.arg("-c").arg(line).current_dir(&dir).env("PATH", &path);
        cmd.env("BATON_HUB_DATA_DIR", hub.data_dir()).env("BATON_OPERATOR", "readme");
        cmd.env("BATON_CONFIG", dir.join("baton.toml"));
        let out = run(cmd);
        assert_eq!(out.status.code(), Some(0), "README step `{line}`:\n{}{}", text(&out.stdout), text(&out.stderr));
    };

    let running = fenced(readme_section(&readme, "## Running a hub\n"), "sh");
    let steps: Vec<&str> = running
        .lines()
        .filter(|l| {
            l.starts_with("baton-hub ") && !l.starts_with("baton-hub init ") && !l.starts_with("baton-hub serve ")
        })
        .collect();
    assert!(steps.len() >= 4, "{running}");
    for line in steps {
        shell(line);
    }

    let producers = readme_section(&readme, "## Producers: the `baton` CLI\n");
    let toml: String = fenced(producers, "toml")
        .lines()
        .map(|l| if l.starts_with("hub_url") { format!("hub_url = {:?}\n", hub.url()) } else { format!("{l}\n") })
        .collect();
    std::fs::write(dir.join("baton.toml"), toml).expect("baton.toml");
    std::fs::write(dir.join("turn.json"), "{\"ticket\": 43}\n").expect("turn.json");
    let sends: Vec<&str> = fenced(producers, "sh").lines().filter(|l| l.contains("baton send ")).collect();
    assert!(sends.len() >= 3, "{producers}");
    for line in sends {
        shell(line);
    }
}
