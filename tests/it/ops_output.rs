//! Safe output: text a node or a harness stored (results, reject reasons) reaches the
//! operator's terminal escaped in every human-readable output, exactly in `--json`; read-only
//! commands log nothing about migrations; durations read as units.

use crate::harness::Hub;

/// Escape sequences a hostile harness might print: clear the screen, home the cursor, write
/// the clipboard (OSC 52), an 8-bit CSI, a right-to-left override and a fake table row.
const HOSTILE: &str =
    "ok\u{1b}[2J\u{1b}[H\u{1b}]52;c;cm0gLXJmIH4=\u{7}\u{9b}31m\u{202e}\rdeadbeef  host-z  c  1  succeeded";

/// Whether `text` carries any control character but line breaks, or a bidirectional override.
fn raw_controls(text: &str) -> Vec<char> {
    text.chars().filter(|c| (c.is_control() && *c != '\n') || ('\u{202a}'..='\u{202e}').contains(c)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escape_sequences_in_a_result_are_shown_escaped_and_json_stays_exact() {
    let hub = Hub::start();
    let prod = hub.client("prod");
    let node = hub.node("host-a", "inst-1");
    let first = prod.submit_new("c", "k1", &["host-a"]).await;
    let second = prod.submit_new("c", "k2", &["host-a"]).await;
    let got = node.claim(2, 0).await;
    assert_eq!(got.len(), 2);
    node.mirror_and_ack(&got[0]).await;
    let mut body = node.report_body(&got[0], "r1", "succeeded", 0);
    body["result"] = serde_json::json!(format!("{HOSTILE}\nsecond line"));
    body["duration_ms"] = serde_json::json!(60_003);
    node.api.post("/delivery-report", &body).await.ok(201);
    node.reject(&got[1], HOSTILE).await.ok(200);

    let shown = hub.cli_ok(["deliveries", "show", first.to("host-a")]);
    assert!(raw_controls(&shown).is_empty(), "raw control characters {:?} in:\n{shown}", raw_controls(&shown));
    assert!(shown.contains(r"\x1b]52;c;cm0gLXJmIH4=\x07"), "the OSC 52 sequence is shown escaped:\n{shown}");
    assert!(shown.contains("second line"), "{shown}");
    assert!(shown.contains("1m 0.003s"), "durations read as units:\n{shown}");

    let rejected = hub.cli_ok(["deliveries", "show", second.to("host-a")]);
    assert!(raw_controls(&rejected).is_empty(), "{rejected}");
    let table = hub.cli_ok(["deliveries", "list"]);
    assert!(raw_controls(&table).is_empty(), "{table}");
    assert_eq!(table.lines().count(), 3, "a header and two rows, no faked one:\n{table}");

    // JSON is exact: the stored bytes come back unchanged.
    let json = hub.show(first.to("host-a"));
    assert_eq!(json["attempts"][0]["result"], format!("{HOSTILE}\nsecond line"));
    assert_eq!(hub.show(second.to("host-a"))["delivery"]["reason"].as_str().map(|r| r.contains(HOSTILE)), Some(true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_on_a_migrated_database_log_no_migration() {
    let hub = Hub::start();
    for args in [vec!["status"], vec!["deliveries", "list"], vec!["fence", "pause", "--all", "--reason", "r"]] {
        let out = hub.cli(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(!stderr.contains("igrat"), "{args:?} logged a migration that did not run: {stderr}");
    }
}

/// What a terminal shows of a command is its output: `init`, which really migrates a new
/// record, prints no migration runner's log line (with `BATON_LOG` unset, as at a terminal),
/// and a reader that goes away early (`| head`) ends the command quietly, exit 0, where it
/// printed "Broken pipe" and exited 4.
#[test]
fn no_migration_line_and_a_closed_pipe_ends_quietly() {
    let hub = &crate::harness::bins().hub;
    let dir = baton_testkit::fresh_dir("quiet").unwrap();
    let out = std::process::Command::new(hub)
        .arg("init")
        .arg("--data-dir")
        .arg(dir.path().join("hub"))
        .env_remove("BATON_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("igrat"), "init logged the migration runner's line: {stderr}");

    // The bash completion script is larger than a pipe's buffer: `head` leaves before it ends.
    let script = format!(
        "{:?} completions bash 2>{:?} | head -c 10 >/dev/null; exit ${{PIPESTATUS[0]}}",
        hub,
        dir.path().join("err")
    );
    let out = std::process::Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let said = std::fs::read_to_string(dir.path().join("err")).unwrap();
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(said, "", "a closed pipe is not an error to report");
}
