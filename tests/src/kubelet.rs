//! A node's kubelet and containerd, run for real from what the agent wrote under its root: the
//! kubelet from its rendered unit's `ExecStart` (every rendered flag, the rendered
//! `KubeletConfiguration`, kubeconfig and serving certificate), containerd from its rendered
//! configuration, CNI from the rendered conflist and Debian's plugins, pods by runc.
//!
//! Each node's runtime runs in the node's network namespace ([`crate::netns`]) and in a mount
//! namespace of its own, where the node's directories are bind-mounted over the host paths the
//! bundle names ([`BINDS`]): the kubelet and containerd read `/etc/exk8s/...` and
//! `/var/lib/kubelet/config.yaml` as a node would, so no rendered path is rewritten. The mount
//! points are made on the host when missing (empty directories); nothing is mounted there.
//!
//! What this machine lacks that a node has forces the rewrites of [`Machine`], each made only
//! when this machine needs it and each saying why. Images cannot be pulled here: [`images`]
//! builds the two the tests use from local binaries and imports them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::control_plane::log_tail;
use crate::netns::Lan;
use crate::procs::Proc;
use crate::units::exec_start;

/// A node directory (relative to its root) and the host path it is mounted over. The first
/// five hold what the bundle rendered; the rest are the runtime's own state, kept per node.
pub const BINDS: [(&str, &str); 11] = [
    ("etc/exk8s", "/etc/exk8s"),
    ("etc/kubernetes", "/etc/kubernetes"),
    ("etc/cni", "/etc/cni"),
    ("etc/containerd", "/etc/containerd"),
    ("var/lib/kubelet", "/var/lib/kubelet"),
    ("var/lib/containerd", "/var/lib/containerd"),
    ("run/containerd", "/run/containerd"),
    ("var/lib/cni", "/var/lib/cni"),
    ("run/netns", "/run/netns"),
    ("var/log/pods", "/var/log/pods"),
    ("var/log/containers", "/var/log/containers"),
];

/// The busybox image pods of the tests run (`imagePullPolicy: Never`).
pub const BUSYBOX: &str = "exk8s.test/busybox:1";

/// What a node has and this machine may not, read once.
#[derive(Debug, Clone, Copy)]
pub struct Machine {
    /// systemd is PID 1: the rendered `systemd` cgroup driver can ask it for cgroups.
    pub systemd: bool,
    /// `/sys/fs/cgroup` is cgroup v2, which Kubernetes 1.35's kubelet requires by default.
    pub cgroup_v2: bool,
    /// CAP_SYS_RESOURCE is in the bounding set: runc may lower a container's `oom_score_adj`
    /// (the kubelet asks -998 for sandboxes).
    pub sys_resource: bool,
}

impl Machine {
    pub fn read() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let bounding = status
            .lines()
            .find_map(|l| l.strip_prefix("CapBnd:"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
            .unwrap();
        Self {
            systemd: Path::new("/run/systemd/system").is_dir(),
            cgroup_v2: Path::new("/sys/fs/cgroup/cgroup.controllers").is_file(),
            sys_resource: bounding & (1 << 24) != 0,
        }
    }

    /// Flags added to the kubelet's rendered ones (flags win over its configuration file).
    pub fn kubelet_flags(self, cgroup_root: &str) -> Vec<String> {
        let mut flags = vec![
            // Two kubelets share this machine's cgroup tree: each would kill the other's pods
            // as orphans. A node's kubelet is alone on its host and uses the default root.
            format!("--cgroup-root={cgroup_root}"),
            // Every kubelet here and the build share this machine's disk, whose free share
            // says nothing about a node's own: disk pressure would taint the nodes under test.
            "--eviction-hard=memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,\
             imagefs.available<1%,imagefs.inodesFree<1%"
                .into(),
        ];
        if !self.systemd {
            // No systemd as PID 1 to create cgroups for the `systemd` driver.
            flags.push("--cgroup-driver=cgroupfs".into());
        }
        if !self.cgroup_v2 {
            // This machine is cgroup v1 (hybrid); nodes are cgroup v2.
            flags.push("--fail-cgroupv1=false".into());
        }
        flags
    }

    /// The rendered containerd configuration, changed only where this machine needs it.
    pub fn containerd_config(self, rendered: &str) -> String {
        let mut config = rendered.to_owned();
        if !self.systemd {
            // The cgroup driver follows the kubelet's (above).
            let systemd = "SystemdCgroup = true";
            assert!(config.contains(systemd), "{rendered}");
            config = config.replace(systemd, "SystemdCgroup = false");
        }
        if !self.sys_resource {
            // Without CAP_SYS_RESOURCE runc cannot set the sandbox's -998: containerd then
            // keeps every container at or above its own score.
            let cri = "[plugins.\"io.containerd.grpc.v1.cri\"]\n";
            assert!(config.contains(cri), "{rendered}");
            config = config.replace(cri, &format!("{cri}  restrict_oom_score_adj = true\n"));
        }
        config
    }
}

/// The pause binary, built once per test process from `tests/tools/pause.c`.
fn pause_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("exk8s-pause-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("pause");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/pause.c");
        let built = Command::new("cc")
            .args(["-Os", "-static", "-o"])
            .arg(&out)
            .arg(&source)
            .output()
            .expect("a C compiler (`cc`; scripts/test.sh installs gcc and libc6-dev)");
        assert!(
            built.status.success(),
            "cc -static pause.c: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        out
    })
}

/// A `docker save` archive at `path` of one single-layer image tagged `tags`: `/pause` (the
/// entrypoint) and Debian's static busybox as `/bin/busybox` with `sh`, `echo`, `cat`, `sleep`.
fn image_archive(path: &Path, tags: &[&str]) {
    let busybox = Path::new("/bin/busybox");
    let kind = Command::new("file").arg(busybox).output();
    if let Ok(kind) = kind {
        assert!(
            String::from_utf8_lossy(&kind.stdout).contains("statically linked"),
            "/bin/busybox must be static (scripts/test.sh installs busybox-static)"
        );
    }
    let mut layer = tar::Builder::new(Vec::new());
    let mut add = |name: &str, source: &Path| {
        let mut file =
            std::fs::File::open(source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        layer.append_file(name, &mut file).unwrap();
    };
    add("pause", pause_binary());
    add("bin/busybox", busybox);
    for applet in ["sh", "echo", "cat", "sleep", "hostname"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        layer
            .append_link(&mut header, format!("bin/{applet}"), "busybox")
            .unwrap();
    }
    let layer = layer.into_inner().unwrap();
    let diff_id = format!("sha256:{:x}", Sha256::digest(&layer));
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/pause"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    });
    let manifest = serde_json::json!([{
        "Config": "config.json", "RepoTags": tags, "Layers": ["layer.tar"],
    }]);
    let mut archive = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in [
        ("manifest.json", serde_json::to_vec(&manifest).unwrap()),
        ("config.json", serde_json::to_vec(&config).unwrap()),
        ("layer.tar", layer),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        archive
            .append_data(&mut header, name, bytes.as_slice())
            .unwrap();
    }
    archive.finish().unwrap();
}

/// The sandbox image a rendered containerd configuration names.
fn sandbox_image(config: &str) -> String {
    config
        .lines()
        .find_map(|l| l.trim().strip_prefix("sandbox_image = "))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("the rendered containerd configuration names its sandbox image")
}

/// Every hierarchy under `/sys/fs/cgroup` (or the one, on cgroup v2).
fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").is_file() {
        return vec![base.to_owned()];
    }
    std::fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect()
}

/// `dir` and every cgroup under it, deepest first.
fn cgroups_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                found.extend(cgroups_under(&entry.path()));
            }
        }
    }
    if dir.is_dir() {
        found.push(dir.to_owned());
    }
    found
}

fn kill(pid: &str) {
    let _ = Command::new("kill")
        .args(["-KILL", pid])
        .stderr(Stdio::null())
        .status();
}

/// One node's containerd and kubelet.
pub struct Runtime {
    pub root: PathBuf,
    /// The kubelet's cgroup root (`/exk8s-<namespace>`).
    pub cgroup_root: String,
    containerd: Option<Proc>,
    /// containerd's process: the kubelet enters its namespaces.
    containerd_pid: String,
    kubelet: Option<Proc>,
    /// containerd's mount namespace: its shims and the kubelet share it.
    mount_ns: PathBuf,
    /// Held open for the runtime's life, so the namespace outlives its last process until
    /// `Drop` has killed everything in it: a dead namespace's inode number is reused, and a
    /// new namespace with it (each `ip netns exec` makes one: the tests' own curl and kubectl)
    /// would look like this one's and be killed.
    _mount_ns_held: Option<std::fs::File>,
}

impl Runtime {
    /// Starts containerd for node `index` of `lan` (root `root`), imports the test images and
    /// starts the kubelet from its rendered unit.
    pub fn start(lan: &Lan, index: usize, root: &Path) -> Self {
        let machine = Machine::read();
        let ns = &lan.name(index);
        let cgroup_root = format!("/exk8s-{ns}");
        for hierarchy in hierarchies() {
            let dir = hierarchy.join(cgroup_root.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            if hierarchy.ends_with("cpuset") {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = std::fs::read_to_string(hierarchy.join(file)).unwrap();
                    std::fs::write(dir.join(file), parent).unwrap();
                }
            }
        }
        // The test's own files for this node: outside every bound directory.
        let state = root.join("test-runtime");
        std::fs::create_dir_all(&state).unwrap();
        let rendered = std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap();
        let config = state.join("containerd.toml");
        std::fs::write(&config, machine.containerd_config(&rendered)).unwrap();

        let mut script = String::from("set -e\n");
        for (inside, host) in BINDS {
            let source = root.join(inside);
            std::fs::create_dir_all(&source).unwrap();
            std::fs::create_dir_all(host).unwrap();
            script += &format!("mount --bind '{}' '{host}'\n", source.display());
        }
        script += &format!(
            "mount --bind '{}' /etc/hosts\nexec containerd --config '{}'\n",
            lan.hosts_file(index).display(),
            config.display()
        );
        let log = |name: &str| std::fs::File::create(root.join(name)).unwrap();
        let containerd = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{ns}"))
            .args(["unshare", "--mount", "--propagation", "slave", "sh", "-c"])
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(log("containerd.log"))
            .stderr(log("containerd.log"))
            .spawn()
            .expect("nsenter and unshare (util-linux)");
        let pid = containerd.id().to_string();
        let mut runtime = Self {
            root: root.to_owned(),
            cgroup_root,
            containerd: Some(Proc(containerd)),
            containerd_pid: pid.clone(),
            kubelet: None,
            mount_ns: PathBuf::new(),
            _mount_ns_held: None,
        };
        let socket = root.join("run/containerd/containerd.sock");
        let start = Instant::now();
        while !socket.exists() {
            runtime.assert_running();
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "containerd never made its socket"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        runtime._mount_ns_held = Some(std::fs::File::open(format!("/proc/{pid}/ns/mnt")).unwrap());
        runtime.mount_ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
        // Drop kills every process in this namespace: it must not be the test's own.
        assert_ne!(
            runtime.mount_ns,
            std::fs::read_link("/proc/self/ns/mnt").unwrap(),
            "containerd runs in a mount namespace of its own"
        );

        let archive = state.join("images.tar");
        image_archive(&archive, &[&sandbox_image(&rendered), BUSYBOX]);
        let imported = Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(&archive)
            .output()
            .unwrap();
        assert!(
            imported.status.success(),
            "ctr images import: {}",
            String::from_utf8_lossy(&imported.stderr)
        );

        runtime.start_kubelet();
        runtime
    }

    /// Starts the kubelet from its rendered unit at the release the unit names
    /// (`/opt/exk8s/kubernetes/<version>/kubelet`), as the node would; a kubelet already running
    /// is stopped first, as systemd restarts it when an update changed its unit.
    pub fn start_kubelet(&mut self) {
        if let Some(old) = self.kubelet.take() {
            old.terminate(Duration::from_secs(30));
        }
        let unit =
            std::fs::read_to_string(self.root.join("etc/systemd/system/kubelet.service")).unwrap();
        // systemd makes the unit's configuration directories (the kubelet's `--config-dir`)
        // before it starts the kubelet.
        for line in unit.lines() {
            if let Some(dirs) = line.strip_prefix("ConfigurationDirectory=") {
                for dir in dirs.split_whitespace() {
                    std::fs::create_dir_all(self.root.join("etc").join(dir)).unwrap();
                }
            }
        }
        let exec = exec_start(&unit);
        let release = exec[0]
            .strip_prefix("/opt/exk8s/kubernetes/")
            .and_then(|rest| rest.strip_suffix("/kubelet"))
            .unwrap_or_else(|| panic!("the unit runs {}, not a release's kubelet", exec[0]));
        let log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.root.join("kubelet.log"))
                .unwrap()
        };
        let kubelet = Command::new("nsenter")
            .args(["--target", &self.containerd_pid, "--mount", "--net", "--"])
            .arg(crate::bins::kubernetes_at(release, "kubelet"))
            .args(&exec[1..])
            .args(Machine::read().kubelet_flags(&self.cgroup_root))
            .stdin(Stdio::null())
            .stdout(log())
            .stderr(log())
            .spawn()
            .unwrap();
        self.kubelet = Some(Proc(kubelet));
    }

    /// Panics with its log's tail when containerd or the kubelet has exited.
    pub fn assert_running(&mut self) {
        for (name, proc) in [
            ("containerd", &mut self.containerd),
            ("kubelet", &mut self.kubelet),
        ] {
            let Some(proc) = proc else { continue };
            if let Some(status) = proc.0.try_wait().unwrap() {
                let tail = log_tail(&self.root.join(format!("{name}.log")), 30);
                panic!("{name} exited with {status}:\n{tail}");
            }
        }
    }

    /// Every process in the kubelet's cgroup tree (the pods' containers).
    fn pod_processes(&self) -> Vec<String> {
        let mut pids = Vec::new();
        for hierarchy in hierarchies() {
            for cgroup in cgroups_under(&hierarchy.join(self.cgroup_root.trim_start_matches('/'))) {
                if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
                    pids.extend(procs.lines().map(str::to_owned));
                }
            }
        }
        pids
    }

    /// Every process in containerd's mount namespace: containerd, its shims, the kubelet.
    fn runtime_processes(&self) -> Vec<String> {
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.bytes().all(|b| b.is_ascii_digit())
                && std::fs::read_link(entry.path().join("ns/mnt"))
                    .ok()
                    .as_deref()
                    == Some(self.mount_ns.as_path())
            {
                pids.push(name);
            }
        }
        pids
    }
}

impl Drop for Runtime {
    /// Kills the kubelet, every container, containerd and its shims, then removes the cgroups.
    fn drop(&mut self) {
        drop(self.kubelet.take());
        let start = Instant::now();
        loop {
            let mut pids = self.pod_processes();
            if !self.mount_ns.as_os_str().is_empty() {
                pids.extend(self.runtime_processes());
            }
            if pids.is_empty() || start.elapsed() > Duration::from_secs(20) {
                break;
            }
            pids.iter().for_each(|p| kill(p));
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(self.containerd.take());
        for hierarchy in hierarchies() {
            for cgroup in cgroups_under(&hierarchy.join(self.cgroup_root.trim_start_matches('/'))) {
                let _ = std::fs::remove_dir(cgroup);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_like_a_node_rewrites_nothing_but_the_cgroup_root_and_disk_pressure() {
        let node = Machine {
            systemd: true,
            cgroup_v2: true,
            sys_resource: true,
        };
        let flags = node.kubelet_flags("/exk8s-x");
        assert_eq!(flags[0], "--cgroup-root=/exk8s-x");
        assert!(flags[1].starts_with("--eviction-hard=memory.available<100Mi,nodefs.available<1%"));
        assert_eq!(flags.len(), 2);
        let rendered = "[plugins.\"io.containerd.grpc.v1.cri\"]\n  SystemdCgroup = true\n";
        assert_eq!(node.containerd_config(rendered), rendered);
        let bare = Machine {
            systemd: false,
            cgroup_v2: false,
            sys_resource: false,
        };
        assert_eq!(
            bare.containerd_config(rendered),
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n  restrict_oom_score_adj = true\n  SystemdCgroup = false\n"
        );
        assert_eq!(bare.kubelet_flags("/r").len(), 4);
    }

    #[test]
    fn the_kubelet_units_exec_start_joins_continued_lines() {
        let unit = "[Service]\nExecStart=/usr/local/bin/kubelet \\\n  --config=/a \\\n  --node-ip=10.0.0.1\nRestart=always\n";
        assert_eq!(
            exec_start(unit),
            [
                "/usr/local/bin/kubelet",
                "--config=/a",
                "--node-ip=10.0.0.1"
            ]
        );
    }
}
