//! `baton-node` as an operator runs it: the real binary in a fresh temporary directory with a
//! scrubbed environment. Exit statuses, the log filter variable, and stdout into a closed pipe.

use baton_shared::exit;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The binary with an empty environment, so nothing from the caller's shell leaks in.
fn node() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_baton-node"));
    cmd.env_clear().stdin(Stdio::null());
    cmd
}

/// Environment for `baton-node run` that passes the start-up checks (a real CA and a node
/// certificate for `h`, a harness that exists) with a hub URL the client refuses (it has a
/// path), so the node stops (exit 2) after it has opened its store and logged that it starts.
fn run_env(cmd: &mut Command, dir: &Path) {
    use baton_shared::ids::Role;
    use baton_shared::pki::{self, LeafKind};
    let ca = pki::create_ca("test ca").unwrap();
    let kind = LeafKind::Client { role: Role::Node, name: "h".into(), lifetime: pki::LEAF_VALIDITY_DEFAULT };
    let leaf = pki::issue(&ca.cert_pem, &ca.key_pem, &kind).unwrap();
    std::fs::write(dir.join("ca.crt"), &ca.cert_pem).unwrap();
    std::fs::write(dir.join("h.crt"), &leaf.cert_pem).unwrap();
    std::fs::write(dir.join("h.key"), &leaf.key_pem).unwrap();
    cmd.env("BATON_NODE_HUB_URL", "https://127.0.0.1:9/not-the-root")
        .env("BATON_NODE_CA_FILE", dir.join("ca.crt"))
        .env("BATON_NODE_CERT_FILE", dir.join("h.crt"))
        .env("BATON_NODE_KEY_FILE", dir.join("h.key"))
        .env("BATON_NODE_DATA_DIR", dir.join("data"))
        .env("BATON_NODE_COMMAND", "/bin/true");
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn status_into_a_closed_pipe_ends_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let mut db =
        baton_node::store::Db::open(&dir.path().join("node.db"), baton_shared::sqlite::Synchronous::Full).unwrap();
    db.instance_id().unwrap();
    drop(db);
    for json in [false, true] {
        // The reader is gone before the node writes a byte, as after `| head -0`.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = node();
        cmd.arg("status").arg("--data-dir").arg(dir.path()).stdout(writer).stderr(Stdio::piped());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::OK)), "json {json}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "json {json}: a closed stdout is not worth a word: {}", stderr(&out));
    }
}

#[test]
fn a_data_directory_in_use_is_another_failure_exit_4() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let lock = std::fs::File::create(dir.path().join("data").join("node.lock")).unwrap();
    lock.try_lock().unwrap();
    let mut cmd = node();
    run_env(&mut cmd, dir.path());
    let out = cmd.arg("run").output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::FAILURE)), "{}", stderr(&out));
    assert!(stderr(&out).contains("another baton-node is running"), "{}", stderr(&out));
}

#[test]
fn a_missing_store_is_refused_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let out = node().arg("status").arg("--data-dir").arg(dir.path().join("nowhere")).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::REFUSED)), "{}", stderr(&out));
    assert!(!dir.path().join("nowhere").exists(), "status creates nothing");
}

#[test]
fn the_log_filter_is_baton_log() {
    let starting = |vars: &[(&str, &str)]| {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = node();
        run_env(&mut cmd, dir.path());
        cmd.envs(vars.iter().copied()).arg("run");
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(i32::from(exit::USAGE)), "{vars:?}: {}", stderr(&out));
        stderr(&out).contains("baton-node starting")
    };
    assert!(starting(&[]), "info is the default");
    assert!(!starting(&[("BATON_LOG", "warn")]), "BATON_LOG=warn hides info lines");
    assert!(starting(&[("RUST_LOG", "warn")]), "RUST_LOG is not the node's variable");
}

#[test]
fn help_lists_every_key_with_its_flag_and_environment_variable_and_the_exit_statuses() {
    let out = node().args(["run", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(baton_node::config::KEYS.len(), 33);
    for key in baton_node::config::KEYS {
        let flag = format!("--{}", key.name.replace('_', "-"));
        let env = format!("BATON_NODE_{}", key.name.to_ascii_uppercase());
        assert!(help.contains(&flag) && help.contains(&env), "{}: {help}", key.name);
    }
    assert!(help.contains(exit::NODE_HELP), "{help}");
}

#[test]
fn status_refuses_a_corrupt_row_by_name_exit_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("node.db");
    let mut db = baton_node::store::Db::open(&path, baton_shared::sqlite::Synchronous::Full).unwrap();
    db.instance_id().unwrap();
    drop(db);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "PRAGMA ignore_check_constraints = ON;
         INSERT INTO deliveries(delivery_id, message_id, conversation, seq, payload, claim_token, state,
             mirrored_at_ms, updated_at_ms)
         VALUES ('d-corrupt', 'm1', 'c', 1, '{}', 'tok', 'half-acked', 0, 0);",
    )
    .unwrap();
    drop(conn);
    let out = node().arg("status").arg("--data-dir").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(i32::from(exit::REFUSED)), "{}", stderr(&out));
    assert!(stderr(&out).contains("delivery d-corrupt") && stderr(&out).contains("half-acked"), "{}", stderr(&out));
}
