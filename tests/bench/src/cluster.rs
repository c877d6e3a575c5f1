//! The real processes: locating the binaries, the hub's data directory and certificates
//! (through the real `baton-hub init` and `enroll`), starting `baton-hub serve` and
//! `baton-node run`, and mTLS clients for producers and nodes.
//!
//! Invariant: every child this benchmark starts is owned by a `ChildGuard`, which stops it
//! (SIGTERM, then SIGKILL after `STOP_GRACE`) and reaps it when dropped, so an error or a
//! panic anywhere never leaves a process behind. Drop does not run when the benchmark itself
//! is signalled, so live children are also listed in `LIVE_CHILDREN`, which
//! `stop_children_on_signal` stops before the benchmark exits on SIGINT or SIGTERM.

use anyhow::{Context, bail};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a stopped child may take to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(15);
/// How long the hub may take to open its store (a `quick_check` of a large backlog) and bind.
pub const HUB_START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long every node may take to start and make its first claim.
pub const NODE_START_TIMEOUT: Duration = Duration::from_secs(60);
/// Timeout of one producer or claim request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Process ids of the children started and not yet reaped.
static LIVE_CHILDREN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn live_children(f: impl FnOnce(&mut BTreeSet<u32>)) {
    if let Ok(mut set) = LIVE_CHILDREN.lock() {
        f(&mut set);
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// Waits for SIGINT or SIGTERM; then stops every live child (SIGTERM, then SIGKILL after two
/// seconds) and exits with status 130. Spawn it on the runtime at start.
pub async fn stop_children_on_signal() {
    use tokio::signal::unix::{SignalKind, signal as listen};
    let (Ok(mut term), Ok(mut int)) = (listen(SignalKind::terminate()), listen(SignalKind::interrupt())) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("baton-bench: interrupted; stopping the hub and nodes");
    let pids: Vec<u32> = LIVE_CHILDREN.lock().map(|s| s.iter().copied().collect()).unwrap_or_default();
    for pid in &pids {
        signal(*pid, nix::sys::signal::Signal::SIGTERM);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for pid in &pids {
        signal(*pid, nix::sys::signal::Signal::SIGKILL);
    }
    std::process::exit(130);
}

/// The two binaries the benchmark drives.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `baton-hub`.
    pub hub: PathBuf,
    /// `baton-node`.
    pub node: PathBuf,
}

impl Binaries {
    /// The given paths, else the binaries next to this executable (the same cargo target dir).
    pub fn locate(hub: Option<PathBuf>, node: Option<PathBuf>) -> anyhow::Result<Binaries> {
        let exe = std::env::current_exe().context("locating this executable")?;
        let dir = exe.parent().context("this executable has no directory")?.to_path_buf();
        let pick = |given: Option<PathBuf>, name: &str| -> anyhow::Result<PathBuf> {
            let path = given.unwrap_or_else(|| dir.join(name));
            if !path.is_file() {
                bail!(
                    "{name} not found at {}; build it first (cargo build --release -p baton-bench -p baton-hub \
                     -p baton-node) or name it with --{}-bin",
                    path.display(),
                    name.trim_start_matches("baton-")
                );
            }
            Ok(path)
        };
        Ok(Binaries { hub: pick(hub, "baton-hub")?, node: pick(node, "baton-node")? })
    }
}

/// A child process that is stopped and reaped when dropped.
pub struct ChildGuard {
    child: Option<Child>,
    name: String,
    log: PathBuf,
}

impl ChildGuard {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Fails, with the end of its log, when the child has already exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!("{} exited early ({status}); end of {}:\n{}", self.name, self.log.display(), log_tail(&self.log));
        }
        Ok(())
    }

    /// Sends SIGTERM, waits up to `STOP_GRACE`, then kills; returns how it ended.
    pub fn stop(mut self) -> anyhow::Result<ExitStatus> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> anyhow::Result<ExitStatus> {
        let Some(mut child) = self.child.take() else { bail!("{} was already stopped", self.name) };
        let pid = child.id();
        let status = stop_and_reap(&mut child, &self.name);
        live_children(|s| {
            s.remove(&pid);
        });
        status
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if self.child.is_some() {
            let _ = self.stop_inner();
        }
    }
}

fn stop_and_reap(child: &mut Child, name: &str) -> anyhow::Result<ExitStatus> {
    if let Some(status) = child.try_wait()? {
        return Ok(status);
    }
    signal(child.id(), nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + STOP_GRACE;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("baton-bench: {name} ignored SIGTERM for {STOP_GRACE:?}; killing it");
    let _ = child.kill();
    Ok(child.wait()?)
}

/// The last lines of a log file, for error messages.
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

fn spawn(program: &Path, args: &[&str], name: &str, log: &Path, envs: &[(&str, &str)]) -> anyhow::Result<ChildGuard> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    let mut cmd = Command::new(program);
    cmd.args(args).stdin(Stdio::null()).stdout(out).stderr(err);
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let child = cmd.spawn().with_context(|| format!("starting {}", program.display()))?;
    live_children(|s| {
        s.insert(child.id());
    });
    Ok(ChildGuard { child: Some(child), name: name.to_string(), log: log.to_path_buf() })
}

/// Runs one `baton-hub` CLI command to completion; fails with its output when it fails.
pub fn hub_cli(bins: &Binaries, data_dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(&bins.hub)
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", bins.hub.display()))?;
    if !out.status.success() {
        bail!(
            "baton-hub {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A hub data directory with enrolled hosts and one producer, all made by the real CLI.
#[derive(Debug, Clone)]
pub struct HubSetup {
    /// The hub's data directory (`hub.db` lives here).
    pub data_dir: PathBuf,
    /// Where `NAME.crt`, `NAME.key` and `ca.crt` were written.
    pub certs: PathBuf,
}

impl HubSetup {
    /// `baton-hub init`, then `enroll node` for each host and `enroll producer` for each producer.
    pub fn create(bins: &Binaries, root: &Path, hosts: &[String], producers: &[&str]) -> anyhow::Result<HubSetup> {
        let data_dir = root.join("hub");
        let certs = root.join("certs");
        hub_cli(bins, &data_dir, &["init"])?;
        for h in hosts {
            hub_cli(bins, &data_dir, &["enroll", "node", h, "--out", &path_str(&certs)?])?;
        }
        for p in producers {
            hub_cli(bins, &data_dir, &["enroll", "producer", p, "--out", &path_str(&certs)?])?;
        }
        Ok(HubSetup { data_dir, certs })
    }

    /// The hub database.
    pub fn db(&self) -> PathBuf {
        self.data_dir.join("hub.db")
    }
}

fn path_str(p: &Path) -> anyhow::Result<String> {
    p.to_str().map(str::to_string).with_context(|| format!("{} is not UTF-8", p.display()))
}

/// A running `baton-hub serve`.
pub struct RunningHub {
    /// The process.
    pub guard: ChildGuard,
    /// Its base URL, `https://127.0.0.1:PORT`.
    pub url: String,
    /// How long it took from spawn to `hub.addr` appearing (store open, repair, bind).
    pub start_s: f64,
}

/// Starts the hub on loopback (port 0) and waits for the address it writes to `hub.addr`.
pub fn start_hub(bins: &Binaries, setup: &HubSetup, log: &Path) -> anyhow::Result<RunningHub> {
    let addr_file = setup.data_dir.join("hub.addr");
    let _ = std::fs::remove_file(&addr_file);
    let started = Instant::now();
    let data_dir = path_str(&setup.data_dir)?;
    let mut guard = spawn(
        &bins.hub,
        &["--data-dir", &data_dir, "serve", "--listen", "127.0.0.1:0"],
        "baton-hub",
        log,
        &[("BATON_LOG", "info")],
    )?;
    let deadline = started + HUB_START_TIMEOUT;
    loop {
        guard.check_running()?;
        if let Ok(text) = std::fs::read_to_string(&addr_file)
            && let Ok(addr) = text.trim().parse::<SocketAddr>()
        {
            return Ok(RunningHub { guard, url: format!("https://{addr}"), start_s: started.elapsed().as_secs_f64() });
        }
        if Instant::now() > deadline {
            bail!("the hub wrote no {} within {HUB_START_TIMEOUT:?}", addr_file.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a node runs for each turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarnessKind {
    /// The node's in-process no-op harness (`harness = "noop"`).
    Noop,
    /// A real process per turn (`command = [...]`).
    Command(Vec<String>),
}

/// How the benchmark configures each node.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    /// What runs a turn.
    pub harness: HarnessKind,
    /// `parallel_conversations`.
    pub parallel_conversations: u32,
    /// `claim_batch_max`.
    pub claim_batch_max: u32,
}

/// Writes a node config for `host` under `dir` and starts `baton-node run` with it.
pub fn start_node(
    bins: &Binaries,
    hub_url: &str,
    certs: &Path,
    host: &str,
    dir: &Path,
    settings: &NodeSettings,
) -> anyhow::Result<ChildGuard> {
    let data_dir = dir.join(host);
    std::fs::create_dir_all(&data_dir)?;
    let q = |p: PathBuf| -> anyhow::Result<String> { serde_json::to_string(&path_str(&p)?).map_err(Into::into) };
    let harness = match &settings.harness {
        HarnessKind::Noop => "harness = \"noop\"".to_string(),
        HarnessKind::Command(argv) => format!("command = {}", serde_json::to_string(argv)?),
    };
    let config = format!(
        "hub_url = {hub}\nca_file = {ca}\ncert_file = {crt}\nkey_file = {key}\ndata_dir = {data}\n{harness}\n\
         parallel_conversations = {par}\nclaim_batch_max = {batch}\nclaim_wait = \"10s\"\nexec_timeout = \"60s\"\n\
         shutdown_grace = \"5s\"\nbackoff_max = \"1s\"\n",
        hub = serde_json::to_string(hub_url)?,
        ca = q(certs.join("ca.crt"))?,
        crt = q(certs.join(format!("{host}.crt")))?,
        key = q(certs.join(format!("{host}.key")))?,
        data = q(data_dir.clone())?,
        par = settings.parallel_conversations,
        batch = settings.claim_batch_max,
    );
    let config_path = dir.join(format!("{host}.toml"));
    std::fs::write(&config_path, config)?;
    let log = dir.join(format!("{host}.log"));
    spawn(
        &bins.node,
        &["run", "--config", &path_str(&config_path)?],
        &format!("baton-node {host}"),
        &log,
        &[("RUST_LOG", "info")],
    )
}

/// An mTLS client presenting `certs/NAME.crt` and trusting only `certs/ca.crt`.
pub fn client(certs: &Path, name: &str) -> anyhow::Result<reqwest::Client> {
    let read = |p: PathBuf| std::fs::read(&p).with_context(|| format!("reading {}", p.display()));
    let ca = reqwest::Certificate::from_pem(&read(certs.join("ca.crt"))?)?;
    let mut pem = read(certs.join(format!("{name}.crt")))?;
    pem.push(b'\n');
    pem.extend(read(certs.join(format!("{name}.key")))?);
    let identity = reqwest::Identity::from_pem(&pem)?;
    Ok(reqwest::Client::builder()
        .tls_certs_only([ca])
        .identity(identity)
        .https_only(true)
        .timeout(REQUEST_TIMEOUT)
        .build()?)
}

/// Waits until `GET /readyz` answers 200.
pub async fn wait_ready(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + HUB_START_TIMEOUT;
    loop {
        match client.get(format!("{url}/readyz")).send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) if Instant::now() > deadline => bail!("/readyz still answers {}", r.status()),
            Err(e) if Instant::now() > deadline => bail!("/readyz unreachable: {e}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}
