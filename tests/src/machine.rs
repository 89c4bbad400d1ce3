//! Machines that boot, made as the dev stack's compute makes them (`exk8s-api dev --machines
//! nspawn`, `exk8s_api::sim::machines`): a test bakes the node image as an image builder does
//! ([`bake_image`]: `scripts/node-image.sh`'s Debian 12 root, the agent baked in by
//! `packaging/bake-image.sh`), starts the stack with it ([`dev_args`]), and reaches the machine
//! behind each VM the compute API made through [`Machine::of`]: programs run inside it by
//! `nsenter` (every namespace of its PID 1); stop and start go through the simulator's routes,
//! as a cloud's console would. What a booted machine here has that a VM would not lives in the
//! API's `sim::machines` (its kernel is the host's), in one place with its reasons. Needs root,
//! `systemd-nspawn` (Debian's `systemd-container`) and `nsenter`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::dev::{Stack, http};
use crate::procs::binary;

/// How long a machine may take from power-on to a finished boot: for the first control-plane
/// node that includes its whole bootstrap (about 95 s on an idle 2-core machine; a new CI
/// machine builds the release binaries beside the tests).
pub const BOOT: Duration = Duration::from_secs(240);

/// The node image's root (`EXK8S_NODE_IMAGE`, which `scripts/test.sh` exports), built by
/// `scripts/node-image.sh`.
pub fn node_image() -> PathBuf {
    let image = std::env::var_os("EXK8S_NODE_IMAGE").map(PathBuf::from);
    let image = image.unwrap_or_else(|| {
        panic!("EXK8S_NODE_IMAGE is not set: run `scripts/node-image.sh` (scripts/test.sh does)")
    });
    assert!(
        image.join("sbin/init").exists(),
        "{} is no node image: run `scripts/node-image.sh`",
        image.display()
    );
    image
}

/// The agent.toml of an image for the dev stack on `127.0.0.1:api_port`: the API where every
/// machine reaches it, the instance metadata where a cloud serves it.
pub fn agent_toml(api_port: u16) -> String {
    format!(
        "api_url = \"http://127.0.0.1:{api_port}\"\nimds_url = \"http://169.254.169.254\"\n\
         insecure_http = true\n"
    )
}

/// The node image copied to `dir/image` and baked as `packaging/bake-image.sh` bakes it, with
/// `keys_dir`'s trusted keys and `agent_toml` as `/etc/exk8s/agent.toml`; `finish` changes the
/// copy further (an image builder's own files) before it is used.
pub fn bake_image(
    dir: &Path,
    keys_dir: &Path,
    agent_toml: &str,
    finish: impl FnOnce(&Path),
) -> PathBuf {
    let root = dir.join("image");
    let copied = Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(node_image())
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        copied.status.success(),
        "copying the node image: {copied:?}"
    );
    let config = dir.join("image-agent.toml");
    std::fs::write(&config, agent_toml).unwrap();
    let baked = Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/bake-image.sh"))
        .arg(&root)
        .arg("--agent")
        .arg(binary("exk8s-agent"))
        .arg("--keys-dir")
        .arg(keys_dir)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(baked.status.success(), "bake-image.sh: {baked:?}");
    finish(&root);
    root
}

/// `exk8s-api keys generate` into `data/signing.key` (which the dev stack then uses) and its
/// public line into `dir/keys`: the trusted keys an image is baked with before the stack runs.
pub fn signing_key(data: &Path, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(data).unwrap();
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let out = Command::new(binary("exk8s-api"))
        .args(["keys", "generate", "--out"])
        .arg(data.join("signing.key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::write(keys.join("exk8s-dev.pub"), &out.stdout).unwrap();
    keys
}

/// The dev stack's arguments that boot every VM from `image`, each machine reaching the host's
/// `forwards` ports (a mirror, a registry) besides the API.
pub fn dev_args(image: &Path, forwards: &[u16]) -> Vec<String> {
    let mut args = vec![
        "--machines".to_owned(),
        "nspawn".to_owned(),
        "--node-image".to_owned(),
        image.display().to_string(),
    ];
    if !forwards.is_empty() {
        let ports: Vec<String> = forwards.iter().map(u16::to_string).collect();
        args.extend(["--machine-forward".to_owned(), ports.join(",")]);
    }
    args
}

/// `GET /sim/compute/sim/machines/{vm}`, or `None` before the machine exists.
fn info(stack: &Stack, vm: i64) -> Option<Value> {
    let url = format!("{}/sim/compute/sim/machines/{vm}", stack.base);
    match http().get(&url).call() {
        Ok(response) => Some(response.into_json().unwrap()),
        Err(ureq::Error::Status(404, _)) => None,
        Err(e) => panic!("{url}: {e}"),
    }
}

/// The end of a console file: its last 40 lines.
fn console_tail(console: &Path) -> String {
    let log = std::fs::read_to_string(console).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// A booted machine: the one behind a VM of the dev stack.
pub struct Machine {
    pub vm: i64,
    /// Its hostname (the VM's name).
    pub name: String,
    /// Its disk, as the machine sees it at `/`.
    pub root: PathBuf,
    /// Its console.
    pub console: PathBuf,
    /// Its network namespace (under `/run/netns`): the host's tools run there as on the
    /// machine's LAN ([`Self::on_lan`]).
    pub netns: String,
    /// The machine's PID 1 (systemd), as the host numbers it.
    init: u32,
    base: String,
}

impl Machine {
    /// VM `vm`'s machine once its PID 1 runs (its boot may still go on: [`Self::wait_booted`]).
    pub fn of(stack: &Stack, vm: i64) -> Self {
        let start = Instant::now();
        loop {
            if let Some(info) = info(stack, vm) {
                match info["state"].as_str().unwrap() {
                    "running" => return Self::running(stack, vm, &info),
                    "failed" => panic!(
                        "VM {vm}'s machine failed: {}: {}",
                        info["error"],
                        console_tail(Path::new(info["console"].as_str().unwrap()))
                    ),
                    _ => {}
                }
            }
            assert!(start.elapsed() < BOOT, "VM {vm}'s machine never ran");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// VM `vm`'s machine if its PID 1 runs now; `None` while it is still being made or booted
    /// (or once it is gone).
    pub fn try_of(stack: &Stack, vm: i64) -> Option<Self> {
        let info = info(stack, vm)?;
        (info["state"] == "running").then(|| Self::running(stack, vm, &info))
    }

    /// The path VM `vm`'s disk has (or will have, once the image's copy is renamed into
    /// place), while the compute API knows the VM.
    pub fn disk_of(stack: &Stack, vm: i64) -> Option<PathBuf> {
        let info = info(stack, vm)?;
        Some(PathBuf::from(info["disk"].as_str().unwrap()))
    }

    /// The running machine the simulator's `info` describes.
    fn running(stack: &Stack, vm: i64, info: &Value) -> Self {
        Self {
            vm,
            name: info["hostname"].as_str().unwrap().to_owned(),
            root: PathBuf::from(info["disk"].as_str().unwrap()),
            init: u32::try_from(info["init_pid"].as_u64().unwrap()).unwrap(),
            netns: info["netns"].as_str().unwrap().to_owned(),
            console: PathBuf::from(info["console"].as_str().unwrap()),
            base: stack.base.clone(),
        }
    }

    /// The host's `program` in the machine's network namespace only: a light client on its
    /// LAN (the host's curl costs a fraction of the machine's kubectl).
    pub fn on_lan(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net=/run/netns/{}", self.netns))
            .args(["--", program]);
        command
    }

    /// `program args` inside the machine (every namespace of its PID 1); returns even when the
    /// machine shuts down meanwhile ([`crate::procs::output_woken`]).
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        crate::procs::output_woken(
            Command::new("nsenter")
                .arg(format!("--target={}", self.init))
                .args(["--all", "--"])
                .arg(program)
                .args(args),
        )
    }

    /// [`Self::run`]'s stdout, trimmed; panics when the program fails.
    pub fn ok(&self, program: &str, args: &[&str]) -> String {
        let out = self.run(program, args);
        assert!(
            out.status.success(),
            "{}: {program} {}: {}{}",
            self.name,
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until systemd finished booting; the system's state then (`running` when every
    /// unit is fine, `degraded` when one failed).
    pub fn wait_booted(&self) -> String {
        let start = Instant::now();
        loop {
            let out = self.run("systemctl", &["is-system-running", "--wait"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !matches!(state.as_str(), "" | "initializing" | "starting") {
                return state;
            }
            assert!(
                start.elapsed() < BOOT,
                "{} never finished booting ({state}): {}\n{}",
                self.name,
                console_tail(&self.console),
                self.stuck()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The units that failed, each with the end of its journal: what a failed boot says.
    pub fn failures(&self) -> String {
        let failed = self.run("systemctl", &["--failed", "--no-legend", "--plain"]);
        let failed = String::from_utf8_lossy(&failed.stdout).into_owned();
        let mut report = failed.clone();
        for unit in failed.lines().filter_map(|l| l.split_whitespace().next()) {
            report.push_str(&self.journal(unit, 20));
        }
        report
    }

    /// What keeps a boot from finishing: the jobs still queued and the failed units, each
    /// with the end of its journal, and the host's free disk and memory (a full disk or an
    /// out-of-memory kill looks like a crashing unit from inside).
    pub fn stuck(&self) -> String {
        let jobs = self.run("systemctl", &["list-jobs", "--no-legend", "--plain"]);
        let jobs = String::from_utf8_lossy(&jobs.stdout).into_owned();
        let mut report = format!("queued jobs:\n{jobs}");
        for unit in jobs.lines().filter_map(|l| l.split_whitespace().nth(1)) {
            report.push_str(&self.journal(unit, 30));
        }
        report.push_str("failed units:\n");
        report.push_str(&self.failures());
        for (program, args) in [("df", &["-h", "/"][..]), ("free", &["-m"][..])] {
            if let Ok(out) = Command::new(program).args(args).output() {
                report.push_str(&String::from_utf8_lossy(&out.stdout));
            }
        }
        report
    }

    /// The last `lines` lines of `unit`'s journal.
    pub fn journal(&self, unit: &str, lines: usize) -> String {
        let out = self.run(
            "journalctl",
            &["--no-pager", "-n", &lines.to_string(), "-u", unit],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The lines of `unit`'s journal that match `pattern` (journalctl's `--grep`).
    pub fn journal_grep(&self, unit: &str, pattern: &str) -> String {
        // Every line logged before now, stored first: journald reads a unit's output
        // asynchronously, and a loaded host lets it fall behind a unit that just ended.
        self.run("journalctl", &["--sync"]);
        let out = self.run(
            "journalctl",
            &["--no-pager", "--output=cat", "-u", unit, "--grep", pattern],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many times systemd has reloaded its units since the machine booted (its
    /// `Reloading.` lines: `systemctl daemon-reload`, and `systemctl enable` without
    /// `--no-reload`).
    pub fn systemd_reloads(&self) -> usize {
        self.run("journalctl", &["--sync"]);
        let out = self.run(
            "journalctl",
            &[
                "--no-pager",
                "--output=cat",
                "-b",
                "_PID=1",
                "--grep",
                "^Reloading\\.$",
            ],
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|line| *line == "Reloading.")
            .count()
    }

    /// `systemctl show` of `unit`'s `properties`, as `name=value` lines.
    pub fn show(&self, unit: &str, properties: &[&str]) -> String {
        self.try_show(unit, properties)
            .unwrap_or_else(|e| panic!("{}: systemctl show {unit}: {e}", self.name))
    }

    /// The CFS quota of the machine's own cgroup in the host's `cpu` hierarchy (cgroup v1), in
    /// microseconds a period: `-1` when its CPU time is not capped.
    pub fn cpu_quota_us(&self) -> String {
        let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", self.init)).unwrap();
        let path = cgroups
            .lines()
            .filter_map(|l| {
                let mut fields = l.splitn(3, ':').skip(1);
                fields.next().zip(fields.next())
            })
            .find(|(controllers, _)| controllers.split(',').any(|c| c == "cpu"))
            .map(|(controllers, path)| {
                Path::new("/sys/fs/cgroup")
                    .join(controllers)
                    .join(path.trim_start_matches('/'))
            })
            .expect("a cgroup v1 cpu hierarchy");
        let own = path
            .ancestors()
            .find(|dir| dir.file_name().is_some_and(|n| *n == *self.netns))
            .unwrap_or_else(|| panic!("{}: no cgroup of its own in {}", self.name, path.display()));
        std::fs::read_to_string(own.join("cpu.cfs_quota_us"))
            .unwrap()
            .trim()
            .to_owned()
    }

    /// Panics with the machine's console when its PID 1 has ended (the machine went down).
    pub fn assert_up(&self) {
        assert!(
            Path::new(&format!("/proc/{}", self.init)).exists(),
            "{} went down: {}",
            self.name,
            console_tail(&self.console)
        );
    }

    /// [`Self::show`], or why systemctl could not answer: for polls that run while packages
    /// are installed, whose scripts may re-execute systemd (`daemon-reexec`), which leaves
    /// its bus away for a moment ("Failed to connect to bus").
    pub fn try_show(&self, unit: &str, properties: &[&str]) -> Result<String, String> {
        let asked = format!("--property={}", properties.join(","));
        let out = self.run("systemctl", &["show", unit, &asked]);
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
        }
    }

    /// Stops the VM as a cloud's console does (`POST /sim/vms/{vm}/stop`): the machine powers
    /// off through its systemd; returns once the compute API says `stopped`.
    pub fn stop(self) {
        let url = format!("{}/sim/compute/sim/vms/{}/stop", self.base, self.vm);
        http().post(&url).call().unwrap();
        let start = Instant::now();
        loop {
            let url = format!("{}/sim/compute/sim/machines/{}", self.base, self.vm);
            let info: Value = http().get(&url).call().unwrap().into_json().unwrap();
            if info["state"] == "stopped" {
                return;
            }
            assert!(
                start.elapsed() < BOOT,
                "{} did not power off ({}): {}",
                self.name,
                info["state"],
                console_tail(&self.console)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts VM `vm` again (`POST /sim/vms/{vm}/start`): it boots from its disk.
    pub fn start(stack: &Stack, vm: i64) -> Self {
        let url = format!("{}/sim/compute/sim/vms/{vm}/start", stack.base);
        http().post(&url).call().unwrap();
        Self::of(stack, vm)
    }
}
