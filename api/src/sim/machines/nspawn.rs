//! A machine booted by `systemd-nspawn` with **systemd as PID 1**, in a network namespace of the
//! LAN. nspawn registers nothing with a machine manager here (`--register=no --keep-unit`: the
//! host's PID 1 need not be systemd), so nothing gives a machine a cgroup of its own:
//! [`own_cgroups`] does, in every hierarchy, before nspawn starts (two machines' systemd in one
//! cgroup tree fail each other's units with `219/CGROUP`). What the kubelet and runc need of the
//! kernel is given at boot, as a VM's kernel gives it: every capability, session keyrings,
//! `/dev/kmsg`, the cgroup v1 controllers writable below the machine's cgroup on a v1 host.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::MachineError;
use super::cpu::CpuShare;

/// How long a machine may take to start systemd, and to power off.
const PATIENCE: Duration = Duration::from_secs(120);

/// A running machine.
#[derive(Debug)]
pub(super) struct Booted {
    nspawn: Child,
    /// The machine's PID 1 (systemd), as the host numbers it.
    pub(super) init: u32,
    cgroups: Vec<PathBuf>,
    /// Where its processes and namespace are written down while it runs, for a stack started
    /// after this one was killed ([`end_leftover`]).
    record: PathBuf,
    /// [`Self::kill`] ran.
    ended: bool,
}

/// A cgroup of its own for machine `name` in each of this process's hierarchies (cgroups v1
/// controllers, systemd's named hierarchy and the unified one), below where this process is.
fn own_cgroups(name: &str, cpus: Option<CpuShare>) -> Result<Vec<PathBuf>, MachineError> {
    let mine = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| MachineError::Io {
        what: "reading /proc/self/cgroup".into(),
        detail: e.to_string(),
    })?;
    let mut dirs = Vec::new();
    for line in mine.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mount = match controllers {
            "" => "unified",
            "name=systemd" => "systemd",
            other => other,
        };
        let dir = Path::new("/sys/fs/cgroup")
            .join(mount)
            .join(path.trim_start_matches('/'))
            .join(name);
        let failed = |e: std::io::Error| MachineError::Io {
            what: format!("making the cgroup {}", dir.display()),
            detail: e.to_string(),
        };
        if !dir.parent().is_some_and(Path::is_dir) {
            // A hierarchy this host does not mount where /proc says (unified on a pure v1
            // host): nothing to place the machine in there.
            continue;
        }
        std::fs::create_dir_all(&dir).map_err(failed)?;
        if let Some(share) = cpus {
            share.limit(&dir, controllers).map_err(failed)?;
        }
        if controllers == "cpuset" {
            // A v1 cpuset takes no process before it has CPUs and memory nodes.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = dir.parent().map(|p| p.join(file)).unwrap_or_default();
                let value = std::fs::read_to_string(parent).map_err(failed)?;
                std::fs::write(dir.join(file), value.trim()).map_err(failed)?;
            }
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// Removes `dirs` and what the machine's systemd left below them, deepest first; true when
/// none is left.
fn remove_cgroups(dirs: &[PathBuf]) -> bool {
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
    dirs.iter().for_each(|d| remove(d));
    dirs.iter().all(|d| !d.exists())
}

impl Booted {
    /// Boots `disk` as machine `name` in the namespace `netns`, its console appended to
    /// `console`, its CPU time capped at `cpus` when given; returns once its PID 1 runs systemd.
    pub(super) fn boot(
        disk: &Path,
        name: &str,
        netns: &str,
        console: &Path,
        cpus: Option<CpuShare>,
    ) -> Result<Self, MachineError> {
        let record = console.with_extension("pid");
        let cgroups = own_cgroups(name, cpus)?;
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(console)
                .map_err(|e| MachineError::Io {
                    what: format!("opening {}", console.display()),
                    detail: e.to_string(),
                })
        };
        let joined: Vec<String> = cgroups.iter().map(|d| d.display().to_string()).collect();
        let nspawn = Command::new("sh")
            .arg("-c")
            .arg(r#"for d in $EXK8S_CGROUPS; do echo $$ > "$d/cgroup.procs"; done; exec "$@""#)
            .arg("sh")
            .env("EXK8S_CGROUPS", joined.join(" "))
            .arg("systemd-nspawn")
            .args(["--quiet", "--register=no", "--keep-unit"])
            .arg(format!("--machine={name}"))
            .arg("--directory")
            .arg(disk)
            .arg(format!("--network-namespace-path=/run/netns/{netns}"))
            // The machine's own /etc/resolv.conf, /etc/hosts and clock zone, as on a VM.
            .args(["--resolv-conf=off", "--timezone=off", "--link-journal=no"])
            .arg("--console=read-only")
            // What runc and the kubelet need of a machine, as a VM's kernel gives them: every
            // capability, session keyrings (runc makes one per container), the kernel's log
            // (the kubelet's OOM watcher).
            .args(["--capability=all", "--system-call-filter=@keyring"])
            .arg("--bind-ro=/dev/kmsg")
            // systemd as PID 1 once the cgroup v1 controllers, which nspawn mounts read-only,
            // are writable below the machine's own cgroup (runc makes the pods' cgroups
            // there; nothing to do on cgroup v2, where nspawn delegates the machine's tree),
            // and so is /proc/sys/net, the machine's own network namespace's parameters: nspawn
            // makes it writable for a network it makes itself, not for one it is given (CNI's
            // portmap sets `route_localnet` on the pods' bridge for every hostPort).
            .args([
                "/bin/sh",
                "-c",
                "for c in /sys/fs/cgroup/*/; do \
                 ! mountpoint -q \"$c\" || mount -o remount,bind,rw \"$c\"; done; \
                 mount --bind /proc/sys/net /proc/sys/net && \
                 mount -o remount,bind,rw /proc/sys/net; \
                 exec /sbin/init",
            ])
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?)
            .spawn()
            .map_err(|e| MachineError::Tool {
                tool: "systemd-nspawn (Debian's systemd-container)",
                detail: e.to_string(),
            })?;
        let mut booted = Self {
            nspawn,
            init: 0,
            cgroups,
            record,
            ended: false,
        };
        match booted.find_init(name) {
            Ok(init) => {
                booted.init = init;
                let written = format!("{} {init}\n{netns}\n", booted.nspawn.id());
                if let Err(e) = std::fs::write(&booted.record, written) {
                    tracing::warn!(path = %booted.record.display(), error = %e, "recording a machine");
                }
                Ok(booted)
            }
            Err(e) => {
                booted.kill();
                Err(e)
            }
        }
    }

    /// The PID of the machine's systemd: nspawn's child, once it runs systemd.
    fn find_init(&mut self, name: &str) -> Result<u32, MachineError> {
        let pid = self.nspawn.id();
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                return Err(MachineError::Boot(format!(
                    "systemd-nspawn for {name} exited with {status} before systemd ran"
                )));
            }
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            for child in children.split_whitespace() {
                let comm =
                    std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
                if comm.trim() == "systemd"
                    && let Ok(init) = child.parse()
                {
                    return Ok(init);
                }
            }
            if start.elapsed() > PATIENCE {
                return Err(MachineError::Boot(format!(
                    "{name} did not run systemd within {PATIENCE:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether nspawn still runs (false once the machine went down by itself).
    pub(super) fn running(&mut self) -> bool {
        matches!(self.nspawn.try_wait(), Ok(None))
    }

    /// Shuts the machine down through its systemd (`systemctl poweroff`), as a cloud's stop
    /// does; killed when it takes longer than [`PATIENCE`].
    pub(super) fn power_off(mut self) -> Result<(), MachineError> {
        let asked = Command::new("nsenter")
            .arg(format!("--target={}", self.init))
            .args(["--all", "--", "systemctl", "poweroff", "--no-block"])
            .output();
        let start = Instant::now();
        while self.running() {
            if asked.is_err() || start.elapsed() > PATIENCE {
                self.kill();
                return Err(MachineError::Boot(format!(
                    "the machine did not power off within {PATIENCE:?}; killed"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
        Ok(())
    }

    /// Ends the machine at once (its PID 1 killed ends every process of its PID namespace)
    /// and removes its cgroups.
    pub(super) fn kill(&mut self) {
        if self.ended {
            return;
        }
        self.ended = true;
        if self.init != 0 {
            let _ = rustix::process::Pid::from_raw(self.init as i32)
                .map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::KILL));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
        let _ = std::fs::remove_file(&self.record);
        // Killed processes leave their cgroups a moment after they are reaped.
        for _ in 0..100 {
            if remove_cgroups(&self.cgroups) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Ends what a killed stack left running of the machine `record` describes — its PID 1 and its
/// nspawn, only while they still are what the record says (systemd below a `systemd-nspawn`
/// of `disk`) — and removes the record. Returns the namespace the machine was in.
pub(super) fn end_leftover(record: &Path, disk: &Path) -> Option<String> {
    let text = std::fs::read_to_string(record).ok()?;
    let _ = std::fs::remove_file(record);
    let mut lines = text.lines();
    let mut pids = lines.next()?.split_whitespace().map(str::parse::<i32>);
    let (Some(Ok(nspawn)), Some(Ok(init))) = (pids.next(), pids.next()) else {
        return None;
    };
    let netns = lines.next()?.to_owned();
    let cmdline = std::fs::read(format!("/proc/{nspawn}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let comm = std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap_or_default();
    let ours = cmdline.contains("systemd-nspawn")
        && cmdline.contains(disk.to_string_lossy().as_ref())
        && comm.trim() == "systemd";
    if ours {
        tracing::warn!(disk = %disk.display(), "ending a machine a killed stack left running");
        for pid in [init, nspawn] {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        let start = Instant::now();
        while Path::new(&format!("/proc/{nspawn}")).exists() && start.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Some(netns)
}

impl Drop for Booted {
    fn drop(&mut self) {
        self.kill();
    }
}
