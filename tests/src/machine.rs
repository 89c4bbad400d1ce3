//! Machines that boot: a copy of the node image (`scripts/node-image.sh`, Debian 12 with systemd)
//! with exk8s-agent baked in by `packaging/bake-image.sh` exactly as an image builder bakes it,
//! booted by `systemd-nspawn` with **systemd as PID 1**, on one namespace of a [`Lan`] (its
//! address, its routes, nothing of the host's network). Each machine has its own hostname and
//! machine-id; [`Machine::run`] runs a program inside it as `nsenter` sees it (every namespace of
//! its init); [`Machine::power_off`] shuts it down through systemd.
//!
//! What a booted machine here has that a VM would not, in this one place: its kernel is the
//! host's (cgroups v1 hybrid on these machines; kernel modules and `/proc/sys` are the host's,
//! so `systemd-modules-load` and `systemd-sysctl` skip themselves by their own conditions), and
//! nspawn registers nothing with a machine manager (`--register=no --keep-unit`: the host's
//! PID 1 is not systemd), so nothing gives each machine a cgroup of its own: [`own_cgroups`]
//! does, in every hierarchy, before nspawn starts (two machines' systemd in one cgroup tree
//! failed each other's units with `219/CGROUP`). What the kubelet and runc need of the host
//! kernel is given at boot (every capability, session keyrings, `/dev/kmsg`, the cgroup v1
//! controllers writable below the machine's cgroup); what this host lacks that a node has is
//! changed in the image by [`host_rewrites`], in files of its own. Needs root, `systemd-nspawn` (Debian's `systemd-container`) and
//! `nsenter`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::netns::Lan;
use crate::procs::binary;

/// How long a machine may take from power-on to a finished boot.
pub const BOOT: Duration = Duration::from_secs(120);

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

/// A cgroup of its own for machine `name` in each of this process's hierarchies (cgroups v1
/// controllers, systemd's named hierarchy and the unified one), below where this process is:
/// the directories to move its nspawn into.
fn own_cgroups(name: &str) -> Vec<PathBuf> {
    let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    mine.lines()
        .map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (
                fields.next(),
                fields.next().unwrap(),
                fields.next().unwrap(),
            );
            let mount = match controllers {
                "" => "unified".to_owned(),
                "name=systemd" => "systemd".to_owned(),
                other => other.to_owned(),
            };
            let dir = Path::new("/sys/fs/cgroup")
                .join(mount)
                .join(path.trim_start_matches('/'))
                .join(format!("exk8s-machine-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("making the cgroup {}: {e}", dir.display()));
            if controllers == "cpuset" {
                // A v1 cpuset takes no process before it has CPUs and memory nodes.
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = std::fs::read_to_string(dir.parent().unwrap().join(file));
                    std::fs::write(dir.join(file), parent.unwrap().trim()).unwrap();
                }
            }
            dir
        })
        .collect()
}

/// Removes `dirs` and what the machine's systemd left below them, deepest first.
fn remove_cgroups(dirs: &[PathBuf]) {
    fn remove(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&entry.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for dir in dirs {
        remove(dir);
    }
}

/// What this host's kernel makes a machine's image need that a VM's would not: each change
/// made only when the host needs it, each in a file of the image named `exk8s-host-*`, none to
/// a file the bundle writes (the agent would put it back).
fn host_rewrites(root: &Path) {
    let host = crate::kubelet::Machine::read();
    let kubelet_dropins = root.join("etc/kubernetes/kubelet.conf.d");
    std::fs::create_dir_all(&kubelet_dropins).unwrap();
    // containerd's image filesystem is a directory of the host's disk, which the kubelet's
    // cAdvisor cannot measure inside a container ("invalid capacity 0 on image filesystem"):
    // its signals would read as no space left and taint the node with disk pressure, so they
    // are off (0%). The node's own file system is the host's disk, shared with the build and
    // every other machine: its free share says nothing about a node's, hence 1 %.
    std::fs::write(
        kubelet_dropins.join("90-exk8s-host-disk.conf"),
        "# exk8s test machine: a directory of the host's disk, shared.\n\
         apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 1%\n  \
         nodefs.inodesFree: 1%\n  imagefs.available: 0%\n  imagefs.inodesFree: 0%\n",
    )
    .unwrap();
    if !host.cgroup_v2 {
        // Kubernetes 1.35's kubelet refuses cgroup v1 unless told otherwise; the bundle's
        // kubelet reads the image's drop-ins (`--config-dir`).
        std::fs::write(
            kubelet_dropins.join("90-exk8s-host-cgroup-v1.conf"),
            "# exk8s test machine: this host is cgroup v1 (hybrid); nodes are cgroup v2.\n\
             apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failCgroupV1: false\n",
        )
        .unwrap();
    }
    if !host.sys_resource {
        // Without CAP_SYS_RESOURCE nobody here may lower an `oom_score_adj` (runc sets the
        // sandbox's -998): containerd runs from the bundle's configuration plus
        // `restrict_oom_score_adj`, copied at each start.
        let script = root.join("usr/local/libexec/exk8s-host-containerd-config");
        std::fs::create_dir_all(script.parent().unwrap()).unwrap();
        std::fs::write(
            &script,
            r#"#!/bin/sh
# exk8s test machine: no CAP_SYS_RESOURCE on this host.
set -e
sed '/^\[plugins."io.containerd.grpc.v1.cri"\]$/a\  restrict_oom_score_adj = true' \
  /etc/containerd/config.toml > /run/exk8s-host-containerd.toml
grep -q restrict_oom_score_adj /run/exk8s-host-containerd.toml
"#,
        )
        .unwrap();
        let executable =
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755);
        std::fs::set_permissions(&script, executable).unwrap();
        let dropin = root.join("etc/systemd/system/containerd.service.d");
        std::fs::create_dir_all(&dropin).unwrap();
        std::fs::write(
            dropin.join("90-exk8s-host.conf"),
            "[Service]\nExecStartPre=/usr/local/libexec/exk8s-host-containerd-config\n\
             ExecStart=\nExecStart=/usr/bin/containerd --config /run/exk8s-host-containerd.toml\n",
        )
        .unwrap();
    }
}

/// How a machine's image is baked: `packaging/bake-image.sh`'s arguments.
pub struct Bake<'a> {
    /// The directory of trusted bundle-signing keys (`*.pub`).
    pub keys_dir: &'a Path,
    /// `/etc/exk8s/agent.toml`, when the image carries one.
    pub config: Option<&'a Path>,
}

/// A booted machine.
pub struct Machine {
    pub name: String,
    /// Its root file system, as the machine sees it at `/`.
    pub root: PathBuf,
    nspawn: Option<Child>,
    /// The cgroups it runs in ([`own_cgroups`]).
    cgroups: Vec<PathBuf>,
    /// The machine's PID 1 (systemd), as the host numbers it.
    init: u32,
    /// Its console.
    pub console: PathBuf,
}

impl Machine {
    /// Copies the node image into `dir/<name>` and bakes the agent into it, with `name` as its
    /// hostname: the machine's disk, which the caller may change further before [`Self::boot`].
    pub fn bake(dir: &Path, name: &str, bake: &Bake<'_>) -> PathBuf {
        let root = dir.join(name);
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
        let mut baking = Command::new("bash");
        baking
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/bake-image.sh"))
            .arg(&root)
            .arg("--agent")
            .arg(binary("exk8s-agent"))
            .arg("--keys-dir")
            .arg(bake.keys_dir);
        if let Some(config) = bake.config {
            baking.arg("--config").arg(config);
        }
        let baked = baking.output().unwrap();
        assert!(baked.status.success(), "bake-image.sh: {baked:?}");
        std::fs::write(root.join("etc/hostname"), format!("{name}\n")).unwrap();
        host_rewrites(&root);
        root
    }

    /// Boots the machine whose disk is `root` ([`Self::bake`]) in node `i`'s namespace of
    /// `lan`, its console in `root`'s sibling `<name>.console`. Returns once its PID 1 runs;
    /// [`Self::wait_booted`] waits for the boot to finish.
    pub fn boot(root: &Path, lan: &Lan, i: usize) -> Self {
        let name = root.file_name().unwrap().to_string_lossy().into_owned();
        let root = root.to_owned();
        let dir = root.parent().unwrap();
        let console = dir.join(format!("{name}.console"));
        let cgroups = own_cgroups(&name);
        let nspawn = Command::new("sh")
            .arg("-c")
            .arg(r#"for d in $EXK8S_CGROUPS; do echo $$ > "$d/cgroup.procs"; done; exec "$@""#)
            .arg("sh")
            .env(
                "EXK8S_CGROUPS",
                cgroups
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" "),
            )
            .arg("systemd-nspawn")
            .args(["--quiet", "--register=no", "--keep-unit"])
            .arg(format!("--machine={name}"))
            .arg("--directory")
            .arg(&root)
            .arg(format!(
                "--network-namespace-path=/run/netns/{}",
                lan.name(i)
            ))
            // The machine's own /etc/resolv.conf and clock zone, as on a VM.
            .args(["--resolv-conf=off", "--timezone=off", "--link-journal=no"])
            .arg("--console=read-only")
            // What runc and the kubelet need of a machine, as a VM's kernel gives them: every
            // capability, session keyrings (runc makes one per container), the kernel's log
            // (the kubelet's OOM watcher).
            .args(["--capability=all", "--system-call-filter=@keyring"])
            .arg("--bind-ro=/dev/kmsg")
            // systemd as PID 1 once the cgroup v1 controllers, which nspawn mounts read-only,
            // are writable below the machine's own cgroup (runc makes the pods' cgroups
            // there); nothing to do on cgroup v2, where nspawn delegates the machine's tree.
            .args([
                "/bin/sh",
                "-c",
                "for c in /sys/fs/cgroup/*/; do \
                 ! mountpoint -q \"$c\" || mount -o remount,bind,rw \"$c\"; done; \
                 exec /sbin/init",
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&console).unwrap())
            .stderr(Stdio::from(
                std::fs::File::options()
                    .append(true)
                    .open(&console)
                    .unwrap(),
            ))
            .spawn()
            .expect("systemd-nspawn (Debian's systemd-container; scripts/test.sh installs it)");
        let mut machine = Self {
            name,
            root,
            init: 0,
            nspawn: Some(nspawn),
            cgroups,
            console,
        };
        machine.init = machine.find_init();
        machine
    }

    /// The PID of the machine's systemd: nspawn's child, once it runs systemd.
    fn find_init(&mut self) -> u32 {
        let nspawn = self.nspawn.as_mut().unwrap();
        let pid = nspawn.id();
        let start = Instant::now();
        loop {
            if let Some(status) = nspawn.try_wait().unwrap() {
                panic!(
                    "systemd-nspawn for {} exited with {status} before booting: {}",
                    self.name,
                    crate::control_plane::log_tail(&self.console, 40)
                );
            }
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children.split_whitespace() {
                let comm =
                    std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
                if comm.trim() == "systemd" {
                    return child.parse().unwrap();
                }
            }
            assert!(
                start.elapsed() < BOOT,
                "{} never ran systemd: {}",
                self.name,
                crate::control_plane::log_tail(&self.console, 40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `program args` inside the machine (every namespace of its PID 1).
    pub fn run(&self, program: &str, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--target={}", self.init))
            .args(["--all", "--"])
            .arg(program)
            .args(args)
            .output()
            .expect("nsenter (util-linux)")
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
                "{} never finished booting ({state}): {}",
                self.name,
                crate::control_plane::log_tail(&self.console, 40)
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
        let out = self.run(
            "journalctl",
            &["--no-pager", "--output=cat", "-u", unit, "--grep", pattern],
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl show` of `unit`'s `properties`, as `name=value` lines.
    pub fn show(&self, unit: &str, properties: &[&str]) -> String {
        self.try_show(unit, properties)
            .unwrap_or_else(|e| panic!("{}: systemctl show {unit}: {e}", self.name))
    }

    /// Panics with the machine's console when its PID 1 has ended (the machine went down).
    pub fn assert_up(&self) {
        assert!(
            Path::new(&format!("/proc/{}", self.init)).exists(),
            "{} went down: {}",
            self.name,
            crate::control_plane::log_tail(&self.console, 40)
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

    /// Shuts the machine down through its systemd (`poweroff`) and waits for nspawn to end.
    pub fn power_off(mut self) {
        let nspawn = self.nspawn.take();
        if let Some(mut nspawn) = nspawn {
            let _ = self.run("systemctl", &["poweroff", "--no-block"]);
            let start = Instant::now();
            while nspawn.try_wait().unwrap().is_none() {
                assert!(
                    start.elapsed() < BOOT,
                    "{} did not power off: {}",
                    self.name,
                    crate::control_plane::log_tail(&self.console, 40)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            let status = nspawn.wait().unwrap();
            assert!(status.success(), "{} powered off with {status}", self.name);
        }
        remove_cgroups(&self.cgroups);
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // A test that failed midway: its PID 1 killed ends every process of the machine
        // (its PID namespace), then nspawn.
        if let Some(mut nspawn) = self.nspawn.take() {
            let _ = Command::new("kill")
                .args(["-KILL", &self.init.to_string()])
                .status();
            let _ = nspawn.kill();
            let _ = nspawn.wait();
        }
        // Killed processes leave their cgroups a moment after they are reaped.
        for _ in 0..100 {
            remove_cgroups(&self.cgroups);
            if self.cgroups.iter().all(|d| !d.exists()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
