//! The Debian packages, built from the debug binaries this suite already uses (no release
//! build: `hub/pkg/build-deb dev`, which runs `cargo deb --no-build --profile dev`): their
//! files and control data, `systemd-analyze verify` on their units, and each unit's
//! `ExecStart` run by hand from the unpacked package with its packaged configuration, speaking
//! the `sd_notify` protocol to a socket the test listens on.
//!
//! As root, `packages_install_remove_and_purge_with_dpkg` installs both packages on this
//! machine with `dpkg -i`, follows README's steps for a node's certificate files, checks owners
//! and modes, removes and purges them, and leaves the machine as it found it.
//!
//! Needs `cargo deb`, `systemd-analyze` and `dpkg-deb` (the dpkg test also root, `dpkg`,
//! `adduser` and `runuser`). Without them the tests say so and pass, unless
//! `BATON_REQUIRE_PACKAGING` is set (CI sets it), when they fail.

use baton_testkit::bins::{self, Binaries};
use baton_testkit::{EVENT_WAIT, Hub, Proc, Role, Signal, fresh_dir, wait};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// Set (to anything) to make missing packaging tools a failure instead of a skip.
const REQUIRE_VAR: &str = "BATON_REQUIRE_PACKAGING";
/// Building a package runs `cargo metadata` and compresses a debug binary.
const BUILD_WAIT: Duration = Duration::from_secs(300);

/// Whether the tools are here; `false` (after saying why) when the test should skip.
fn tools_present() -> bool {
    let missing: Vec<&str> =
        [("cargo", &["deb", "--version"][..]), ("systemd-analyze", &["--version"]), ("dpkg-deb", &["--version"])]
            .into_iter()
            .filter(|(program, args)| !Command::new(program).args(*args).output().is_ok_and(|o| o.status.success()))
            .map(|(program, _)| if program == "cargo" { "cargo-deb" } else { program })
            .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os(REQUIRE_VAR).is_none(),
        "{REQUIRE_VAR} is set but these packaging tools are missing: {missing:?}"
    );
    eprintln!(
        "SKIPPED: packaging tools missing ({}); install them (cargo install cargo-deb --locked; apt-get install \
         systemd dpkg) or set {REQUIRE_VAR} to make this a failure",
        missing.join(", ")
    );
    false
}

/// The workspace root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// An unpacked package: the `.deb`, and its files under `root`.
struct Package {
    deb: PathBuf,
    root: PathBuf,
    /// `dpkg-deb -c`: one line per file.
    contents: String,
    /// `dpkg-deb -I`: the control fields and the maintainer scripts' names.
    info: String,
}

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Builds `name`'s package with `PKG/pkg/build-deb` from the binaries in `bins`' directory,
/// checks it lists what every package must hold, and unpacks it into `dir`.
fn build(bins: &Binaries, name: &str, dir: &Path) -> Package {
    let profile_dir = bins.hub.parent().expect("the binaries live in a profile directory");
    let target_dir = profile_dir.parent().expect("a profile directory lives in a target directory");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => panic!("no profile in {}", profile_dir.display()),
    };
    let crate_dir = name.trim_start_matches("baton-");
    let out = dir.join("debs");
    let mut cmd = Command::new(repo().join(crate_dir).join("pkg/build-deb"));
    cmd.arg(&profile).arg("--output").arg(&out).arg("--fast").env("CARGO_TARGET_DIR", target_dir);
    let built = bins::run(cmd, BUILD_WAIT).unwrap();
    assert!(built.status.success(), "{name}/pkg/build-deb failed:\n{}", text(&built));
    let deb = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .unwrap_or_else(|| panic!("no .deb in {}:\n{}", out.display(), text(&built)));
    let dpkg = |flag: &str| {
        let o = Command::new("dpkg-deb").arg(flag).arg(&deb).output().unwrap();
        assert!(o.status.success(), "dpkg-deb {flag}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (contents, info) = (dpkg("-c"), dpkg("-I"));
    let root = dir.join("root");
    let o = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root).output().unwrap();
    assert!(o.status.success(), "dpkg-deb -x: {}", text(&o));
    Package { deb, root, contents, info }
}

/// `name`'s package, built once per test process (the tests of its contents and the dpkg test
/// share it) under the target directory, next to the binaries it holds.
fn package(bins: &Binaries, name: &str) -> &'static Package {
    static HUB: OnceLock<Package> = OnceLock::new();
    static NODE: OnceLock<Package> = OnceLock::new();
    let cell = if name == "baton-hub" { &HUB } else { &NODE };
    cell.get_or_init(|| {
        let profile_dir = bins.hub.parent().expect("the binaries live in a profile directory");
        let dir = profile_dir.join("packaging-test").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
        std::fs::create_dir_all(&dir).unwrap();
        build(bins, name, &dir)
    })
}

impl Package {
    fn assert_holds(&self, path: &str) {
        assert!(
            self.contents.contains(&format!(" ./{path}\n")),
            "{} lacks {path}:\n{}",
            self.deb.display(),
            self.contents
        );
    }

    /// The unit file, as installed.
    fn unit(&self, name: &str) -> (PathBuf, String) {
        let path = ["usr/lib/systemd/system", "lib/systemd/system"]
            .iter()
            .map(|d| self.root.join(d).join(format!("{name}.service")))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("no {name}.service in the package:\n{}", self.contents));
        let text = std::fs::read_to_string(&path).unwrap();
        (path, text)
    }

    /// What every package holds: the binary, its unit (checked by `systemd-analyze verify`
    /// and for the settings operators rely on), the conffile, the maintainer scripts, one man
    /// page per page the binary generates (a unit test proves those cover every command) and
    /// the completion scripts of bash, zsh and fish.
    fn check_common(&self, bins: &Binaries, name: &str, dir: &Path) {
        self.assert_holds(&format!("usr/bin/{name}"));
        let config = if name == "baton-hub" { "etc/baton/hub.toml" } else { "etc/baton/node.toml" };
        self.assert_holds(config);
        assert!(self.info.contains(&format!("Package: {name}")), "{}", self.info);
        assert!(self.info.contains("adduser"), "the postinst needs adduser: {}", self.info);
        for script in ["postinst", "postrm", "conffiles"] {
            assert!(self.info.contains(script), "no {script}: {}", self.info);
        }
        let control = dir.join("control");
        let o = Command::new("dpkg-deb").arg("-e").arg(&self.deb).arg(&control).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let listed = std::fs::read_to_string(control.join("conffiles")).unwrap();
        assert!(listed.contains(&format!("/{config}")), "{listed}");
        for script in ["postinst", "postrm", "prerm"] {
            let o = Command::new("sh").arg("-n").arg(control.join(script)).output().unwrap();
            assert!(o.status.success(), "{script} is not valid sh: {}", text(&o));
        }
        let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
        assert!(postinst.contains("adduser --system") && postinst.contains("-m 0700"), "{postinst}");

        let pages = dir.join("man");
        let program = if name == "baton-hub" { &bins.hub } else { &bins.node };
        let mut man = bins::command(program);
        man.arg("man").arg("--out").arg(&pages);
        let o = bins::run(man, EVENT_WAIT).unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let mut count = 0;
        for page in std::fs::read_dir(&pages).unwrap().flatten() {
            let file = page.file_name().to_string_lossy().into_owned();
            self.assert_holds(&format!("usr/share/man/man1/{file}.gz"));
            count += 1;
        }
        assert!(count >= 4, "only {count} man pages");
        self.assert_holds(&format!("usr/share/bash-completion/completions/{name}"));
        self.assert_holds(&format!("usr/share/zsh/vendor-completions/_{name}"));
        self.assert_holds(&format!("usr/share/fish/vendor_completions.d/{name}.fish"));

        let (unit_path, unit) = self.unit(name);
        for line in [
            "Type=notify",
            "WatchdogSec=",
            "KillSignal=SIGTERM",
            "Restart=on-failure",
            &format!("User={name}"),
            "ProtectSystem=strict",
            &format!("ReadWritePaths=/var/lib/{name}"),
            &format!("StateDirectory={name}"),
            "StateDirectoryMode=0700",
            "NoNewPrivileges=yes",
            "PrivateTmp=yes",
            "CapabilityBoundingSet=\n",
        ] {
            assert!(unit.contains(line), "{name}.service lacks {line:?}:\n{unit}");
        }
        // `--root` makes systemd look for ExecStart's binary inside the unpacked package; the
        // units it depends on (sysinit.target, …) are copied in from this machine. A unit it
        // cannot parse still exits 0, so any output at all is a failure.
        // Other programs the unit runs (`/bin/kill` for a reload) come from this machine too.
        let units = unit_path.parent().expect("a unit directory");
        let o = Command::new("cp").arg("-a").arg("-n").arg("/usr/lib/systemd/system/.").arg(units).output().unwrap();
        assert!(o.status.success(), "copying the system units: {}", text(&o));
        for line in unit.lines().filter(|l| l.starts_with("Exec") && !l.starts_with("ExecStart=")) {
            let program = line.split_once('=').and_then(|(_, v)| v.split_whitespace().next()).unwrap_or_default();
            let inside = self.root.join(program.trim_start_matches('/'));
            if !inside.exists() {
                std::fs::create_dir_all(inside.parent().expect("a directory")).unwrap();
                std::fs::copy(program, &inside).unwrap_or_else(|e| panic!("{line}: {program}: {e}"));
            }
        }
        let o = Command::new("systemd-analyze")
            .arg("verify")
            .arg("--man=no")
            .arg(format!("--root={}", self.root.display()))
            .arg(&unit_path)
            .output()
            .unwrap();
        let said = text(&o);
        assert!(o.status.success() && said.trim().is_empty(), "systemd-analyze verify {name}.service:\n{said}");
    }

    /// The unit's `ExecStart` as a command of the unpacked package: every absolute path in it
    /// is looked up under the package root, except `data_dir` (given by the caller, as the
    /// unit's `StateDirectory=` would create it).
    fn exec_start(&self, name: &str, data_dir: &Path) -> Command {
        let (_, unit) = self.unit(name);
        let line = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart line");
        let state = format!("/var/lib/{name}");
        let mut words = line.split_whitespace().map(|w| {
            if w == state {
                data_dir.to_path_buf()
            } else if let Some(rel) = w.strip_prefix('/') {
                self.root.join(rel)
            } else {
                PathBuf::from(w)
            }
        });
        let program = words.next().expect("a program");
        let mut cmd = bins::command(&program);
        cmd.args(words);
        cmd
    }
}

/// A socket standing in for systemd's notification socket.
struct NotifySocket {
    path: PathBuf,
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        NotifySocket { path, socket }
    }

    /// Reads messages until one contains `what`; returns everything read.
    fn wait_for(&self, what: &str, proc: &mut Proc) -> String {
        let mut seen = String::new();
        wait::until(&format!("{what} on NOTIFY_SOCKET"), EVENT_WAIT, || {
            let mut buf = [0u8; 4096];
            if let Ok(n) = self.socket.recv(&mut buf) {
                seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                seen.push('\n');
            }
            if seen.contains(what) {
                return Ok(Some(()));
            }
            proc.check_running()?;
            Ok(None)
        })
        .unwrap_or_else(|e| panic!("{e:#}\nmessages so far:\n{seen}\nlog:\n{}", proc.stderr()));
        seen
    }
}

/// Lays out the hub's data directory as the package's postinst does: mode 0700, `hub.toml`
/// linking to the packaged configuration, and a first `init`.
fn postinst_hub_data_dir(pkg: &Package, data: &Path) {
    std::fs::create_dir_all(data).unwrap();
    std::fs::set_permissions(data, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(pkg.root.join("etc/baton/hub.toml"), data.join("hub.toml")).unwrap();
    let init =
        bins::command(&pkg.root.join("usr/bin/baton-hub")).arg("init").arg("--data-dir").arg(data).output().unwrap();
    assert!(init.status.success(), "{}", text(&init));
}

/// The hub's package: its contents, its unit, and its `ExecStart` run by hand with the
/// packaged configuration, which sends READY=1 only once the listener is up, feeds the
/// watchdog, says STOPPING=1 on SIGTERM and exits 0.
#[test]
fn hub_package_installs_a_service_that_notifies_systemd() {
    if !tools_present() {
        return;
    }
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("pkg-hub").unwrap();
    let pkg = package(&bins, "baton-hub");
    pkg.check_common(&bins, "baton-hub", dir.path());
    let (_, unit) = pkg.unit("baton-hub");
    assert!(unit.contains("RestartPreventExitStatus=2 3"), "{unit}");
    // The packaged configuration is the template `init` writes, under its header.
    let packaged = std::fs::read_to_string(pkg.root.join("etc/baton/hub.toml")).unwrap();
    let fresh = dir.path().join("fresh");
    let mut init = bins.hub_command();
    init.arg("init").arg("--data-dir").arg(&fresh);
    let o = bins::run(init, EVENT_WAIT).unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(packaged.ends_with(&std::fs::read_to_string(fresh.join("hub.toml")).unwrap()), "{packaged}");
    // `baton`, the producer command line, comes with the hub: its binary (it runs), a man page
    // per command and its completions.
    pkg.assert_holds("usr/bin/baton");
    for page in ["baton.1.gz", "baton-send.1.gz", "baton-wait.1.gz"] {
        pkg.assert_holds(&format!("usr/share/man/man1/{page}"));
    }
    pkg.assert_holds("usr/share/bash-completion/completions/baton");
    pkg.assert_holds("usr/share/zsh/vendor-completions/_baton");
    pkg.assert_holds("usr/share/fish/vendor_completions.d/baton.fish");
    let mut version = bins::command(&pkg.root.join("usr/bin/baton"));
    version.arg("--version");
    let o = bins::run(version, EVENT_WAIT).unwrap();
    assert!(o.status.success() && text(&o).contains("baton"), "{}", text(&o));

    let data = dir.path().join("var-lib-baton-hub");
    postinst_hub_data_dir(pkg, &data);
    let notify = NotifySocket::bind(dir.path());
    let mut cmd = pkg.exec_start("baton-hub", &data);
    // The packaged address is fixed (7443); the environment layer moves it for the test.
    cmd.env("BATON_HUB_LISTEN", "127.0.0.1:0")
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", "1000000")
        .current_dir(dir.path());
    let mut hub = Proc::new(dir.path(), "hub");
    hub.spawn(cmd).unwrap();
    let ready = notify.wait_for("READY=1", &mut hub);
    // The listener was bound before READY=1: its address is announced and it accepts.
    let addr = std::fs::read_to_string(data.join("hub.addr")).unwrap();
    std::net::TcpStream::connect(addr.trim()).unwrap_or_else(|e| panic!("{addr}: {e}; {ready}"));
    notify.wait_for("WATCHDOG=1", &mut hub);
    hub.signal(Signal::SIGTERM).unwrap();
    let said = notify.wait_for("STOPPING=1", &mut hub);
    let status = hub.wait_exit(EVENT_WAIT).unwrap().expect("the hub stops on SIGTERM");
    assert_eq!(status.code(), Some(0), "{said}\n{}", hub.stderr());
}

/// The node's package: its contents, its unit (refused-for-good and taken-over exits are not
/// restarted), and its `ExecStart` run by hand with the packaged configuration: READY=1 after
/// recovery once the hub answered, and, with the hub down, READY=1 all the same (retrying).
#[test]
fn node_package_installs_a_service_that_notifies_systemd() {
    if !tools_present() {
        return;
    }
    let bins = Binaries::build().unwrap();
    let dir = fresh_dir("pkg-node").unwrap();
    let pkg = package(&bins, "baton-node");
    pkg.check_common(&bins, "baton-node", dir.path());
    let (_, unit) = pkg.unit("baton-node");
    for line in ["RestartPreventExitStatus=2 3 5 6", "KillMode=mixed", "ExecReload="] {
        assert!(unit.contains(line), "baton-node.service lacks {line:?}:\n{unit}");
    }

    let mut hub = Hub::init(&bins, &dir.path().join("hub"), "ops").unwrap();
    let id = hub.enroll(Role::Node, "pkg-host").unwrap();
    hub.serve(None).unwrap();
    let hub_url = format!("https://localhost:{}", hub.addr().expect("a serving hub").port());
    let dead_url = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("https://localhost:{}", l.local_addr().unwrap().port())
    };
    for (case, url, status) in [("up", hub_url.as_str(), "the hub answered"), ("down", &dead_url, "not answering")] {
        let data = dir.path().join(format!("var-lib-baton-node-{case}"));
        let notify_dir = dir.path().join(case);
        std::fs::create_dir_all(&notify_dir).unwrap();
        let notify = NotifySocket::bind(&notify_dir);
        let mut cmd = pkg.exec_start("baton-node", &data);
        // The packaged file's placeholders (hub address, certificate files, harness) are what
        // an operator sets; the environment layer sets them here.
        cmd.env("BATON_NODE_HUB_URL", url)
            .env("BATON_NODE_CA_FILE", &id.ca)
            .env("BATON_NODE_CERT_FILE", &id.cert)
            .env("BATON_NODE_KEY_FILE", &id.key)
            .env("BATON_NODE_DATA_DIR", &data)
            .env("BATON_NODE_COMMAND", r#"["/bin/cat"]"#)
            .env("BATON_NODE_BACKOFF_MAX", "1s")
            .env("NOTIFY_SOCKET", &notify.path)
            .env("WATCHDOG_USEC", "1000000");
        let mut node = Proc::new(dir.path(), &format!("node-{case}"));
        node.spawn(cmd).unwrap();
        let said = notify.wait_for("READY=1", &mut node);
        assert!(said.contains(status), "{case}: {said}");
        notify.wait_for("WATCHDOG=1", &mut node);
        node.signal(Signal::SIGTERM).unwrap();
        notify.wait_for("STOPPING=1", &mut node);
        let exit = node.wait_exit(EVENT_WAIT).unwrap().expect("the node stops on SIGTERM");
        assert_eq!(exit.code(), Some(0), "{case}: {}", node.stderr());
    }
}

/// The quoted value of `key = "…"` in a TOML text (the first line that sets it).
fn toml_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(&format!("{key} = \""))).and_then(|rest| rest.split('"').next())
}

/// README's part from `start` up to the next line that begins with `end`.
fn readme_part<'a>(readme: &'a str, start: &str, end: &str) -> &'a str {
    let from = readme.find(start).unwrap_or_else(|| panic!("README.md has no {start:?}"));
    let rest = &readme[from..];
    let to = rest[1..].find(&format!("\n{end}")).map_or(rest.len(), |i| i + 1);
    &rest[..to]
}

/// README's steps that install a node's certificate files: the `sudo install …` lines after
/// "**A node**".
fn readme_install_lines(readme: &str) -> Vec<&str> {
    let part = readme_part(readme, "**A node**", "**Removing");
    let lines: Vec<&str> = part.lines().filter(|l| l.starts_with("sudo install ")).collect();
    assert!(!lines.is_empty(), "README.md gives no `sudo install` step for a node's files:\n{part}");
    lines
}

/// `readme_install_lines`, each as (mode, group, source, destination).
fn readme_install_steps(readme: &str) -> Vec<(String, String, String, String)> {
    readme_install_lines(readme)
        .into_iter()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let flag =
                |f: &str| words.iter().position(|w| *w == f).map(|i| words[i + 1].to_string()).unwrap_or_default();
            let [.., src, dst] = words[..] else { panic!("an install step without source and destination: {l}") };
            (flag("-m"), flag("-g"), src.to_string(), dst.to_string())
        })
        .collect()
}

/// README names the package's paths for a node: its "Running a node" configuration holds the
/// certificate files and data directory of `node/pkg/node.toml`, its commands read the unit's
/// `/etc/baton/node.toml`, and its install steps put the files exactly there, the key readable
/// by the `baton-node` group alone.
#[test]
fn readme_gives_the_node_package_paths() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let packaged = std::fs::read_to_string(repo().join("node/pkg/node.toml")).unwrap();
    let unit = std::fs::read_to_string(repo().join("node/pkg/baton-node.service")).unwrap();
    let config = "/etc/baton/node.toml";
    assert!(unit.contains(&format!("--config {config}")), "{unit}");
    assert!(packaged.contains(&format!("as {config}")), "{packaged}");
    let section = readme_part(&readme, "## Running a node\n", "## ");
    let example = section.split("```toml\n").nth(1).and_then(|s| s.split("```").next()).expect("a TOML example");
    let mut files = Vec::new();
    for key in ["ca_file", "cert_file", "key_file", "data_dir"] {
        let ours = toml_value(&packaged, key).unwrap_or_else(|| panic!("node/pkg/node.toml lacks {key}"));
        assert_eq!(toml_value(example, key), Some(ours), "README's \"Running a node\" sets {key} otherwise");
        files.push((key, ours));
    }
    let commands: Vec<&str> = section.lines().filter(|l| l.starts_with("baton-node ")).collect();
    assert!(!commands.is_empty(), "{section}");
    for line in commands {
        let words: Vec<&str> = line.split_whitespace().collect();
        for (flag, path) in [("--config", config), ("--data-dir", "/var/lib/baton-node")] {
            if let Some(i) = words.iter().position(|w| *w == flag) {
                assert_eq!(words.get(i + 1), Some(&path), "README: {line}");
            }
        }
    }
    let steps = readme_install_steps(&readme);
    for (key, path) in files.iter().filter(|(k, _)| *k != "data_dir") {
        let (mode, group, ..) = steps
            .iter()
            .find(|(.., dst)| dst == path)
            .unwrap_or_else(|| panic!("README installs no file as {path} ({key}): {steps:?}"));
        assert_eq!(group, "baton-node", "{path}");
        if *key == "key_file" {
            assert_eq!(mode, "0640", "{path}: readable by root and the baton-node group only");
        }
    }
}

/// How long one `dpkg` or user-management command may take.
const SYSTEM_WAIT: Duration = Duration::from_secs(300);
/// Everything the dpkg test installs or creates beyond the packages' own files, removed by its
/// cleanup: the machine must have none of it before the test.
const INSTALLED_PATHS: [&str; 3] = ["/var/lib/baton-hub", "/var/lib/baton-node", "/etc/baton"];
const PACKAGES: [&str; 2] = ["baton-node", "baton-hub"];

/// A system command with a clean environment and the usual root `PATH` (dpkg needs `/sbin`).
fn system(program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_clear().env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C");
    cmd.args(args).current_dir("/").stdin(std::process::Stdio::null());
    cmd
}

/// Runs `cmd` to completion within `SYSTEM_WAIT`.
fn run_system(cmd: Command) -> Output {
    bins::run(cmd, SYSTEM_WAIT).unwrap()
}

/// Runs `program ARGS`, failing the test unless it exits 0; returns stdout and stderr.
fn must(program: &str, args: &[&str]) -> String {
    let o = run_system(system(program, args));
    assert!(o.status.success(), "{program} {} exited {}:\n{}", args.join(" "), o.status, text(&o));
    text(&o)
}

/// Whether `getent DATABASE NAME` finds it; its numeric id when it does.
fn getent_id(database: &str, name: &str) -> Option<u32> {
    let o = run_system(system("getent", &[database, name]));
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    o.status.success().then(|| line.split(':').nth(2).and_then(|id| id.trim().parse().ok()).expect("an id"))
}

/// A package's dpkg status (`installed`, `config-files`, …), `None` when dpkg does not know it.
fn dpkg_status(name: &str) -> Option<String> {
    let o = run_system(system("dpkg-query", &["-W", "-f", "${db:Status-Status}", name]));
    let status = String::from_utf8_lossy(&o.stdout).trim().to_string();
    (o.status.success() && !status.is_empty() && status != "not-installed").then_some(status)
}

/// Why this machine cannot run the dpkg test, if it cannot: not root, tools missing, or a
/// package, user or directory of Baton's here already (the test would take it over and remove it).
fn dpkg_test_blocked() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if uid.as_deref().ok() != Some("0") {
        return Some("not running as root (dpkg -i installs for real)".into());
    }
    let missing: Vec<&str> = ["dpkg", "dpkg-query", "adduser", "deluser", "runuser", "getent"]
        .into_iter()
        .filter(|p| !run_system(system("sh", &["-c", &format!("command -v {p}")])).status.success())
        .collect();
    if !missing.is_empty() {
        return Some(format!("missing {}", missing.join(", ")));
    }
    let mut present = Vec::new();
    for name in PACKAGES {
        if let Some(status) = dpkg_status(name) {
            present.push(format!("package {name} ({status})"));
        }
        for database in ["passwd", "group"] {
            if getent_id(database, name).is_some() {
                present.push(format!("{database} entry {name}"));
            }
        }
    }
    present.extend(INSTALLED_PATHS.iter().filter(|p| Path::new(p).exists()).map(|p| p.to_string()));
    (!present.is_empty()).then(|| {
        format!("this machine has {} already; the test installs and purges Baton for real", present.join(", "))
    })
}

/// Removes whatever the dpkg test may have left, on every way out of it: both packages purged
/// with their data, the users and groups, the directories. Runs only after `dpkg_test_blocked`
/// found none of them, so it restores the machine as it was.
struct DpkgCleanup;

impl Drop for DpkgCleanup {
    fn drop(&mut self) {
        let mut purge = system("dpkg", &["--purge", PACKAGES[0], PACKAGES[1]]);
        purge.env("BATON_PURGE_DATA", "yes");
        let _ = bins::run(purge, SYSTEM_WAIT);
        for name in PACKAGES {
            if getent_id("passwd", name).is_some() {
                let _ = bins::run(system("deluser", &["--quiet", "--system", name]), SYSTEM_WAIT);
            }
            if getent_id("group", name).is_some() {
                let _ = bins::run(system("delgroup", &["--quiet", "--system", name]), SYSTEM_WAIT);
            }
        }
        for path in INSTALLED_PATHS {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// (mode bits, uid, gid) of `path`, not following a last symlink.
fn owner_mode(path: &str) -> (u32, u32, u32) {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    (m.mode() & 0o7777, m.uid(), m.gid())
}

/// Fails unless `path` has exactly `mode`, owner `uid` and group `gid`.
fn assert_owner_mode(path: &str, mode: u32, uid: u32, gid: u32) {
    let (m, u, g) = owner_mode(path);
    assert!((m, u, g) == (mode, uid, gid), "{path}: mode {m:04o} owner {u}:{g}, expected {mode:04o} {uid}:{gid}");
}

/// Whether `user` can read `path` (`runuser -u USER -- cat PATH`).
fn readable_by(user: &str, path: &str) -> bool {
    run_system(system("runuser", &["-u", user, "--", "cat", path])).status.success()
}

/// Files named `NAME.service` left under `dir` (systemd's enablement links and
/// deb-systemd-helper's state).
fn unit_traces(dir: &Path, name: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}.service"))) {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            unit_traces(&path, name, found);
        }
    }
}

/// Both packages installed, removed and purged with dpkg on this machine, as CI runs it (root,
/// systemd not PID 1, so the maintainer scripts must not need it): `hub.toml` is a 0640
/// root:baton-hub conffile; README's steps give a node key the `baton-node` user reads and no
/// one else; the unit files are installed; `dpkg -r` keeps configuration and data; `dpkg -P`
/// keeps both data directories (the CA and the record; the node store) and says so and how to
/// remove them, and a reinstall uses them as they are; a purge with `BATON_PURGE_DATA=yes`
/// removes them and the users, leaving nothing behind.
#[test]
fn packages_install_remove_and_purge_with_dpkg() {
    if !tools_present() {
        return;
    }
    if let Some(why) = dpkg_test_blocked() {
        assert!(std::env::var_os(REQUIRE_VAR).is_none(), "{REQUIRE_VAR} is set but the dpkg test cannot run: {why}");
        eprintln!("SKIPPED: dpkg install test: {why}; set {REQUIRE_VAR} to make this a failure");
        return;
    }
    let bins = Binaries::build().unwrap();
    let hub_pkg = package(&bins, "baton-hub");
    let node_pkg = package(&bins, "baton-node");
    let debs = [node_pkg.deb.to_str().expect("a UTF-8 path"), hub_pkg.deb.to_str().expect("a UTF-8 path")];
    let dir = fresh_dir("pkg-dpkg").unwrap();
    let _cleanup = DpkgCleanup;

    let said = must("dpkg", &["-i", debs[0], debs[1]]);
    let hub_gid = getent_id("group", "baton-hub").unwrap_or_else(|| panic!("no baton-hub group:\n{said}"));
    let node_uid = getent_id("passwd", "baton-node").unwrap_or_else(|| panic!("no baton-node user:\n{said}"));
    let node_gid = getent_id("group", "baton-node").expect("a baton-node group");
    let hub_uid = getent_id("passwd", "baton-hub").expect("a baton-hub user");

    // The hub's configuration may hold a database password: a conffile only root and the hub read.
    assert_owner_mode("/etc/baton/hub.toml", 0o640, 0, hub_gid);
    let conffiles = must("dpkg-query", &["-W", "-f", "${Conffiles}", "baton-hub"]);
    assert!(conffiles.contains("/etc/baton/hub.toml "), "{conffiles}");
    assert!(!readable_by("nobody", "/etc/baton/hub.toml"));
    let check = run_system(system("runuser", &["-u", "baton-hub", "--", "baton-hub", "config", "check"]));
    assert!(check.status.success(), "the hub's user cannot read its configuration:\n{}", text(&check));
    assert_owner_mode("/var/lib/baton-hub", 0o700, hub_uid, hub_gid);
    assert_owner_mode("/var/lib/baton-node", 0o700, node_uid, node_gid);
    assert_owner_mode("/etc/baton/node", 0o750, 0, node_gid);
    let ca = std::fs::read("/var/lib/baton-hub/ca.crt").expect("the postinst's init wrote the CA");
    for name in PACKAGES {
        let files = must("dpkg", &["-L", name]);
        let unit = files
            .lines()
            .find(|l| l.ends_with(&format!("/systemd/system/{name}.service")))
            .unwrap_or_else(|| panic!("{name} installs no unit:\n{files}"));
        assert!(Path::new(unit).is_file(), "{unit}");
        assert!(Path::new(&format!("/usr/bin/{name}")).is_file());
    }

    // README's steps: enroll on the hub as its user, install the three files on the node.
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let enroll = readme
        .lines()
        .find(|l| l.starts_with("sudo -u baton-hub baton-hub enroll node "))
        .expect("README's enroll step for a node");
    let words: Vec<&str> = enroll.split_whitespace().collect();
    let out = words.iter().position(|w| *w == "--out").map(|i| words[i + 1]).expect("enroll --out DIR");
    let host = words[6];
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let carried = dir.path().join("carried");
    must("install", &["-d", "-o", "baton-hub", "-m", "0700", carried.to_str().expect("UTF-8")]);
    let here = carried.join(host);
    let here = here.to_str().expect("UTF-8");
    let mut args: Vec<&str> = vec!["-u", "baton-hub", "--"];
    args.extend(words[3..].iter().map(|w| if *w == out { here } else { w }));
    must("runuser", &args);
    // Each step as written, run as root (`sudo` dropped), from where the directory was carried.
    for line in readme_install_lines(&readme) {
        let line = line.trim_start_matches("sudo ").replace(out, here);
        let words: Vec<&str> = line.split_whitespace().collect();
        must(words[0], &words[1..]);
    }
    let key = toml_value(&std::fs::read_to_string(repo().join("node/pkg/node.toml")).unwrap(), "key_file")
        .expect("key_file")
        .to_string();
    assert_owner_mode(&key, 0o640, 0, node_gid);
    assert!(readable_by("baton-node", &key), "the node's user cannot read {key}");
    assert!(!readable_by("nobody", &key), "{key} is readable by others");
    assert!(!readable_by("baton-hub", &key), "{key} is readable by the hub's user");
    // The node, as its user, reads all three files and finds the key and certificate a pair.
    let checked = run_system(system(
        "runuser",
        &["-u", "baton-node", "--", "baton-node", "config", "check", "--config", "/etc/baton/node.toml", "--json"],
    ));
    let report: serde_json::Value = serde_json::from_slice(&checked.stdout)
        .unwrap_or_else(|e| panic!("config check --json: {e}:\n{}", text(&checked)));
    for name in ["files", "key", "identity", "ca"] {
        let c = report["checks"].as_array().and_then(|cs| cs.iter().find(|c| c["name"] == name));
        assert_eq!(c.map(|c| &c["status"]), Some(&serde_json::json!("ok")), "{name}: {report}");
    }

    // Remove: the binaries go; configuration, data and users stay.
    must("dpkg", &["-r", PACKAGES[0], PACKAGES[1]]);
    assert!(!Path::new("/usr/bin/baton-hub").exists());
    for kept in
        ["/etc/baton/hub.toml", "/etc/baton/node.toml", &key, "/var/lib/baton-hub/hub.db", "/var/lib/baton-node"]
    {
        assert!(Path::new(kept).exists(), "dpkg -r removed {kept}");
    }

    // Purge: the configuration goes; the data directories stay, and the purge says so.
    let said = must("dpkg", &["-P", PACKAGES[0], PACKAGES[1]]);
    for gone in ["/etc/baton/hub.toml", "/etc/baton/node.toml", "/etc/baton/node"] {
        assert!(!Path::new(gone).exists(), "dpkg -P left {gone}:\n{said}");
    }
    for data in ["/var/lib/baton-hub", "/var/lib/baton-node"] {
        assert!(Path::new(data).is_dir(), "dpkg -P removed {data}:\n{said}");
        assert!(said.contains(&format!("kept {data}")), "the purge does not say it kept {data}:\n{said}");
    }
    assert!(said.contains("BATON_PURGE_DATA=yes") && said.contains("rm -rf /var/lib/baton-hub"), "{said}");
    assert_eq!(std::fs::read("/var/lib/baton-hub/ca.crt").unwrap(), ca, "the purge changed the CA");
    assert_eq!(getent_id("passwd", "baton-hub"), Some(hub_uid), "the kept data's owner is kept");

    // Installed again, the hub takes the kept directory as it is: the same CA, no new init.
    must("dpkg", &["-i", debs[0], debs[1]]);
    assert_eq!(std::fs::read("/var/lib/baton-hub/ca.crt").unwrap(), ca, "a reinstall replaced the CA");
    assert_owner_mode("/etc/baton/hub.toml", 0o640, 0, hub_gid);

    // Purge with BATON_PURGE_DATA=yes: nothing is left.
    let mut purge = system("dpkg", &["-P", PACKAGES[0], PACKAGES[1]]);
    purge.env("BATON_PURGE_DATA", "yes");
    let o = run_system(purge);
    assert!(o.status.success(), "{}", text(&o));
    for gone in INSTALLED_PATHS {
        assert!(!Path::new(gone).exists(), "BATON_PURGE_DATA=yes left {gone}:\n{}", text(&o));
    }
    for name in PACKAGES {
        assert_eq!(dpkg_status(name), None, "{name}");
        assert_eq!(getent_id("passwd", name), None, "the user {name} is left");
        assert_eq!(getent_id("group", name), None, "the group {name} is left");
        let mut traces = Vec::new();
        for d in [
            "/etc/systemd/system",
            "/var/lib/systemd/deb-systemd-helper-enabled",
            "/var/lib/systemd/deb-systemd-helper-masked",
        ] {
            unit_traces(Path::new(d), name, &mut traces);
        }
        assert!(traces.is_empty(), "{name}.service is left in {traces:?}");
    }
}
