//! Nodes: `NodeConfig`, the TOML file `baton-node run --config` reads, and `Node`, one node
//! instance (a config file and a data directory) with its `run` process.

use crate::EVENT_WAIT;
use crate::bins::{self, Binaries};
use crate::identity::Identity;
use crate::proc::Proc;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What a node runs for each turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Harness {
    /// A process per turn: `command = [ARGV…]`.
    Command(Vec<String>),
    /// The node's in-process no-op harness: `harness = "noop"`.
    Noop,
}

/// A node configuration: the keys every node needs, from an enrolled identity, plus any other
/// key as a TOML value.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    hub_url: String,
    identity: Identity,
    data_dir: PathBuf,
    harness: Harness,
    /// (key, TOML value), in the order they were set.
    settings: Vec<(String, String)>,
}

impl NodeConfig {
    /// A node of `identity` dialing `hub_url`, keeping its store in `data_dir`, running
    /// `harness`; every other key at its default.
    pub fn new(hub_url: &str, identity: &Identity, data_dir: &Path, harness: Harness) -> NodeConfig {
        NodeConfig {
            hub_url: hub_url.to_string(),
            identity: identity.clone(),
            data_dir: data_dir.to_path_buf(),
            harness,
            settings: Vec::new(),
        }
    }

    /// Sets `key` (replacing an earlier value); `toml_value` is TOML: `"\"1s\""`, `"4"`.
    pub fn set(mut self, key: &str, toml_value: &str) -> NodeConfig {
        self.settings.retain(|(k, _)| k != key);
        self.settings.push((key.to_string(), toml_value.to_string()));
        self
    }

    /// The file's text.
    pub(crate) fn to_toml(&self) -> anyhow::Result<String> {
        // A JSON string is a valid TOML basic string.
        let s = |v: &str| serde_json::to_string(v);
        let p = |p: &Path| s(&p.display().to_string());
        let harness = match &self.harness {
            Harness::Command(argv) => format!("command = {}", serde_json::to_string(argv)?),
            Harness::Noop => "harness = \"noop\"".to_string(),
        };
        let mut toml = format!(
            "hub_url = {}\nca_file = {}\ncert_file = {}\nkey_file = {}\ndata_dir = {}\n{harness}\n",
            s(&self.hub_url)?,
            p(&self.identity.ca)?,
            p(&self.identity.cert)?,
            p(&self.identity.key)?,
            p(&self.data_dir)?,
        );
        for (k, v) in &self.settings {
            toml.push_str(&format!("{k} = {v}\n"));
        }
        Ok(toml)
    }
}

/// One node instance: its config file, its data directory and, while it runs, its process.
#[derive(Debug)]
pub struct Node {
    bins: Binaries,
    config: PathBuf,
    data_dir: PathBuf,
    /// Extra environment for every later run.
    env: Vec<(String, String)>,
    proc: Proc,
}

impl Node {
    /// Writes `config` to `dir/NAME.toml`; runs will log to `dir/NAME.log`. Nothing runs yet.
    pub fn create(bins: &Binaries, dir: &Path, name: &str, config: &NodeConfig) -> anyhow::Result<Node> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, config.to_toml()?).with_context(|| format!("writing {}", path.display()))?;
        Ok(Node {
            bins: bins.clone(),
            config: path,
            data_dir: config.data_dir.clone(),
            env: Vec::new(),
            proc: Proc::new(dir, name),
        })
    }

    /// A scrubbed `baton-node run --config FILE` command for this node.
    pub fn run_command(&self) -> Command {
        let mut cmd = self.bins.node_command();
        cmd.arg("run").arg("--config").arg(&self.config);
        cmd
    }

    /// Starts `baton-node run` (with `BATON_CRASH_POINT` armed if given). Fails when it runs.
    pub fn start(&mut self, crash_point: Option<&str>) -> anyhow::Result<()> {
        let mut cmd = self.run_command();
        if let Some(p) = crash_point {
            cmd.env(baton_shared::crash::CRASH_POINT_ENV, p);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.proc.spawn(cmd)
    }

    /// An environment variable for every later run (`LD_PRELOAD`, say).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.push((key.to_string(), value.to_string()));
    }

    /// Drops the extra environment for later runs.
    pub fn clear_env(&mut self) {
        self.env.clear();
    }

    /// The data directory (the instance).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The node database.
    pub fn db(&self) -> PathBuf {
        self.data_dir.join("node.db")
    }

    /// `baton-node status --data-dir DIR [--json]` for this node.
    pub fn status(&self, json: bool) -> anyhow::Result<Output> {
        status(&self.bins, &self.data_dir, json)
    }

    /// The `run` process: signals, exit, logs.
    pub fn proc(&self) -> &Proc {
        &self.proc
    }

    /// The `run` process, to signal, wait for or stop it.
    pub fn proc_mut(&mut self) -> &mut Proc {
        &mut self.proc
    }
}

/// `baton-node status --data-dir DIR [--json]`, run to completion within `EVENT_WAIT`.
pub fn status(bins: &Binaries, data_dir: &Path, json: bool) -> anyhow::Result<Output> {
    let mut cmd = bins.node_command();
    cmd.arg("status").arg("--data-dir").arg(data_dir);
    if json {
        cmd.arg("--json");
    }
    bins::run(cmd, EVENT_WAIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::Role;

    #[test]
    fn the_config_is_toml_with_every_key_once() {
        let dir = Path::new("/tmp/odd \"dir\"");
        let id = Identity {
            role: Role::Node,
            name: "host-a".into(),
            cert: dir.join("host-a.crt"),
            key: dir.join("host-a.key"),
            ca: dir.join("ca.crt"),
        };
        let argv = vec!["sh".to_string(), "-c".to_string(), "echo \"$X\" 'y'\n".to_string()];
        let config = NodeConfig::new("https://127.0.0.1:9", &id, &dir.join("data"), Harness::Command(argv.clone()))
            .set("claim_wait", "\"5s\"")
            .set("parallel_conversations", "2")
            .set("claim_wait", "\"1s\"");
        let text = config.to_toml().unwrap();
        let v: toml::Table = text.parse().unwrap_or_else(|e| panic!("{e}:\n{text}"));
        assert_eq!(v["hub_url"].as_str(), Some("https://127.0.0.1:9"));
        assert_eq!(v["ca_file"].as_str(), Some("/tmp/odd \"dir\"/ca.crt"));
        assert_eq!(v["data_dir"].as_str(), Some("/tmp/odd \"dir\"/data"));
        let command: Vec<&str> = v["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(command, argv);
        assert_eq!((v["claim_wait"].as_str(), v["parallel_conversations"].as_integer()), (Some("1s"), Some(2)));
        assert_eq!(text.matches("claim_wait").count(), 1, "a key set twice is written once");

        let noop = NodeConfig::new("https://h", &id, &dir.join("data"), Harness::Noop).to_toml().unwrap();
        let v: toml::Table = noop.parse().unwrap();
        assert_eq!((v["harness"].as_str(), v.get("command")), (Some("noop"), None));
    }
}
