//! Files a user names are read within a bound, by all three binaries: a payload file (and a
//! payload on standard input), the CA, certificate and key files, and the configuration files
//! of `baton`, `baton-node` and `baton-hub`. A file over its bound is refused with an error
//! naming the file and the bound (`baton_shared::limits::…_FILE_BYTES_MAX`), after reading at
//! most the bound and one byte: `/dev/zero` is refused at once instead of filling memory.
//!
//! Each case first uses a sparse file one byte over the bound (cheap, and read whole by code
//! without the bound), then `/dev/zero`.

use crate::harness::{EVENT_WAIT, Hub, bins, output_within};
use baton_shared::limits::{CONFIG_FILE_BYTES_MAX, PAYLOAD_FILE_BYTES_MAX, PEM_FILE_BYTES_MAX};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Longest any refusal here may take: reading one bound's worth is instant, so this only
/// keeps a binary that reads `/dev/zero` without end from hanging the suite.
const REFUSAL_WAIT: std::time::Duration = EVENT_WAIT;

/// A sparse file of `bytes` zero bytes (takes no room on disk).
fn sparse(dir: &Path, name: &str, bytes: u64) -> PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path).and_then(|f| f.set_len(bytes)).expect("sparse file");
    path
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Asserts a refusal with exit status `code` whose output names `file` and `bound`.
#[track_caller]
fn refused(out: &Output, code: i32, file: &Path, bound: &str) {
    let said = text(out);
    assert_eq!(out.status.code(), Some(code), "{said}");
    assert!(said.contains(&file.display().to_string()), "the file is not named: {said}");
    assert!(said.contains(bound) && said.contains("read no further"), "the bound is not named: {said}");
}

/// `baton` with a scrubbed environment.
fn baton(args: &[&str]) -> Command {
    let bin = baton_testkit::bins::producer_cli().unwrap_or_else(|e| panic!("{e:#}"));
    let mut cmd = baton_testkit::bins::command(&bin);
    cmd.args(args);
    cmd
}

/// `baton`'s payload file and standard input, its configuration file and its CA file.
#[test]
fn baton_reads_its_files_within_their_bounds() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&["prod"]).start();
    let dir = hub.scratch("bounds");
    let id = hub.identity("prod");
    let config = |ca: &Path| {
        let file = dir.join(format!("baton-{}.toml", ca.file_name().and_then(|n| n.to_str()).unwrap_or("ca")));
        let body = format!(
            "hub_url = {:?}\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            hub.url(),
            ca.display().to_string(),
            id.cert.display().to_string(),
            id.key.display().to_string()
        );
        std::fs::write(&file, body).expect("write baton.toml");
        file.display().to_string()
    };
    let good = config(&id.ca);
    let send = |payload_file: &Path| {
        let file = payload_file.display().to_string();
        let args = ["--config", &good, "send", "--conversation", "c", "--to", "host-a", "--key", "k"];
        let mut cmd = baton(&args);
        cmd.args(["--payload-file", &file]);
        output_within(cmd, REFUSAL_WAIT)
    };
    let big = sparse(&dir, "payload.json", PAYLOAD_FILE_BYTES_MAX + 1);
    refused(&send(&big), 2, &big, "PAYLOAD_FILE_BYTES_MAX");
    refused(&send(Path::new("/dev/zero")), 2, Path::new("/dev/zero"), "PAYLOAD_FILE_BYTES_MAX");
    // Standard input: the same bound.
    let mut cmd = baton(&["--config", &good, "send", "--conversation", "c", "--to", "host-a", "--key", "k", "-"]);
    cmd.stdin(Stdio::from(std::fs::File::open("/dev/zero").expect("/dev/zero")));
    let out = output_within(cmd, REFUSAL_WAIT);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("stdin") && text(&out).contains("PAYLOAD_FILE_BYTES_MAX"), "{}", text(&out));

    // The CA file (as the certificate and key files are read).
    let get = |config: &str| {
        let cmd = baton(&["--config", config, "get", "--key", "k"]);
        output_within(cmd, REFUSAL_WAIT)
    };
    let big_ca = sparse(&dir, "big-ca.crt", PEM_FILE_BYTES_MAX + 1);
    let out = get(&config(&big_ca));
    refused(&out, 2, &big_ca, "PEM_FILE_BYTES_MAX");
    assert!(text(&out).contains("ca_file"), "the setting is named: {}", text(&out));
    refused(&get(&config(Path::new("/dev/zero"))), 2, Path::new("/dev/zero"), "PEM_FILE_BYTES_MAX");

    // The configuration file itself.
    let big_config = sparse(&dir, "big.toml", CONFIG_FILE_BYTES_MAX + 1);
    refused(&get(&big_config.display().to_string()), 2, &big_config, "CONFIG_FILE_BYTES_MAX");
    refused(&get("/dev/zero"), 2, Path::new("/dev/zero"), "CONFIG_FILE_BYTES_MAX");

    // Within the bounds all is as before: the message is sent.
    let payload = dir.join("ok.json");
    std::fs::write(&payload, "{\"ok\": true}\n").expect("payload");
    let out = send(&payload);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

/// `baton-node`'s CA file (for `config check` and `run` alike) and its configuration file.
#[test]
fn baton_node_reads_its_files_within_their_bounds() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&[]).stopped().start();
    let dir = hub.scratch("bounds");
    let id = hub.identity("host-a");
    let config = |ca: &Path| {
        let s = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("json");
        let body = format!(
            "hub_url = \"https://127.0.0.1:1\"\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\ncommand \
             = [\"sh\"]\n",
            s(ca),
            s(&id.cert),
            s(&id.key),
            s(&dir.join("data")),
        );
        let file = dir.join("node.toml");
        std::fs::write(&file, body).expect("write node.toml");
        file
    };
    let node = |args: &[&str], config: &Path| {
        let mut cmd = bins().node_command();
        cmd.args(args).arg("--config").arg(config);
        output_within(cmd, REFUSAL_WAIT)
    };
    for ca in [sparse(&dir, "big-ca.crt", PEM_FILE_BYTES_MAX + 1), PathBuf::from("/dev/zero")] {
        let file = config(&ca);
        let out = node(&["config", "check"], &file);
        refused(&out, 2, &ca, "PEM_FILE_BYTES_MAX");
        assert!(text(&out).contains("ca_file"), "the setting is named: {}", text(&out));
        refused(&node(&["run"], &file), 2, &ca, "PEM_FILE_BYTES_MAX");
    }
    for file in [sparse(&dir, "big.toml", CONFIG_FILE_BYTES_MAX + 1), PathBuf::from("/dev/zero")] {
        refused(&node(&["config", "check"], &file), 2, &file, "CONFIG_FILE_BYTES_MAX");
    }
}

/// `baton-hub`'s payload file, its configuration file (named, or the data directory's
/// `hub.toml`) and the PEM files of its data directory.
#[test]
fn baton_hub_reads_its_files_within_their_bounds() {
    let hub = Hub::builder().nodes(&["host-a"]).producers(&[]).stopped().start();
    let dir = hub.scratch("bounds");
    let cli = |args: &[&str]| output_within(hub.cli_command(args), REFUSAL_WAIT);
    let send = |file: &Path| {
        let file = file.display().to_string();
        cli(&["send", "--conversation", "c", "--to", "host-a", "--key", "k", "--payload-file", &file])
    };
    let big = sparse(&dir, "payload.json", PAYLOAD_FILE_BYTES_MAX + 1);
    refused(&send(&big), 2, &big, "PAYLOAD_FILE_BYTES_MAX");
    refused(&send(Path::new("/dev/zero")), 2, Path::new("/dev/zero"), "PAYLOAD_FILE_BYTES_MAX");

    for file in [sparse(&dir, "big.toml", CONFIG_FILE_BYTES_MAX + 1), PathBuf::from("/dev/zero")] {
        let shown = file.display().to_string();
        refused(&cli(&["config", "check", "--config", &shown]), 2, &file, "CONFIG_FILE_BYTES_MAX");
    }
    // The data directory's own `hub.toml`, read when no file is named: by `config check` and
    // by `serve` alike, through the same bound.
    let hub_toml = hub.data_dir().join("hub.toml");
    let kept_toml = std::fs::read(&hub_toml).ok();
    std::fs::File::create(&hub_toml).and_then(|f| f.set_len(CONFIG_FILE_BYTES_MAX + 1)).expect("sparse hub.toml");
    refused(&cli(&["config", "check"]), 2, &hub_toml, "CONFIG_FILE_BYTES_MAX");
    refused(&cli(&["serve", "--listen", "127.0.0.1:0"]), 2, &hub_toml, "CONFIG_FILE_BYTES_MAX");
    match kept_toml {
        Some(bytes) => std::fs::write(&hub_toml, bytes).expect("restore hub.toml"),
        None => std::fs::remove_file(&hub_toml).expect("remove hub.toml"),
    }
    assert_eq!(cli(&["config", "check"]).status.code(), Some(0), "within the bound, as before");

    // The server certificate, as `status` and `renew --server` read it (and `serve`).
    let server_cert = hub.data_dir().join("hub.crt");
    let kept = std::fs::read(&server_cert).expect("hub.crt");
    std::fs::File::create(&server_cert).and_then(|f| f.set_len(PEM_FILE_BYTES_MAX + 1)).expect("sparse hub.crt");
    refused(&cli(&["renew", "--server"]), 4, &server_cert, "PEM_FILE_BYTES_MAX");
    refused(&cli(&["status"]), 4, &server_cert, "PEM_FILE_BYTES_MAX");
    std::fs::write(&server_cert, kept).expect("restore hub.crt");
    assert_eq!(cli(&["renew", "--server"]).status.code(), Some(0));
}
