//! Certificates through the real binary: the identity `baton-hub send` writes as is reserved,
//! so no enrolled node or producer can hold it.

use crate::harness::Hub;
use baton_shared::pki::CLI_SENDER;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_send_identity_cannot_be_enrolled_in_any_role() {
    let hub = Hub::start();
    for role in ["producer", "node"] {
        let out_dir = hub.scratch(role);
        let out = hub.cli(["enroll", role, CLI_SENDER, "--out", out_dir.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{role}: {stderr}");
        assert!(stderr.contains("reserved") && stderr.contains("baton-hub send"), "{stderr}");
        assert!(!out_dir.join(format!("{CLI_SENDER}.crt")).exists(), "a refused enrollment writes nothing");
    }
    let certs = hub.cli_json(["certs", "list", "--name", CLI_SENDER, "--json"]);
    assert_eq!(certs.as_array().map(Vec::len), Some(0), "{certs}");

    // `send` still records under the reserved name; an enrolled producer cannot read it back.
    let sent =
        hub.cli_json(["send", "--conversation", "c", "--key", "k1", "--payload", "{}", "--to", "host-a", "--json"]);
    assert_eq!(sent["duplicate"], false, "{sent}");
    hub.client("prod").get("/v1/messages?idempotency_key=k1").await.err(404, "not_found");
}
