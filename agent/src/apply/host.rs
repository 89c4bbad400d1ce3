//! Everything the agent does to the host besides writing bundle files, as [`HostAction`]s run
//! by a [`Host`]: [`SystemHost`] performs them (systemctl, apt-get, HTTPS waits, helm and
//! kubectl), [`RecordingHost`] only records them (`--root` and `--dry-run`).
//!
//! Every command is a program with an argument vector: nothing is ever passed through a shell.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use exk8s_common::names::{PackageName, UnitName};
use exk8s_common::payload::Artifact;

use crate::error::AgentError;
use crate::log::{log_info, log_warn};
use crate::state::{StateDir, state_dir};

use super::exec::run;
use super::waits;

/// One host action.
#[derive(Debug, Clone)]
pub enum HostAction<'a> {
    DaemonReload,
    Enable(&'a UnitName),
    Start(&'a UnitName),
    Restart(&'a UnitName),
    /// A unit stopped (a restore stops etcd).
    Stop(&'a UnitName),
    InstallPackages(Vec<&'a PackageName>),
    InstallArtifact(&'a Artifact),
    WaitEtcd(waits::EtcdProbe),
    /// Between updates (`sync`): is this node's etcd still healthy?
    CheckEtcd(waits::EtcdProbe),
    WaitApiserver(waits::ApiserverProbe),
    WaitComponent(waits::ComponentProbe),
    WaitNodeRegistered(waits::NodeProbe),
    WaitStaticPod(waits::StaticPodProbe),
    /// The running static pod `uid` retired before its replacement is written: its manifest
    /// taken away, then waited for until the kubelet has cleaned it up ([`super::retire`]).
    RetireStaticPod {
        manifest: PathBuf,
        uid: String,
    },
    /// A helm or kubectl invocation with `KUBECONFIG` set.
    Command {
        program: PathBuf,
        args: Vec<String>,
        kubeconfig: PathBuf,
        timeout: Duration,
    },
    DrainNode(super::drain::Drain<'a>),
    EtcdJoin(super::membership::Membership),
    EtcdPromote(super::membership::Membership),
    /// A leaving member (its client URL) removed.
    EtcdRemove(super::membership::Membership, String),
    /// This node's member's snapshot streamed to a file (`to`), its metadata beside it (`meta`).
    SaveEtcdSnapshot {
        probe: waits::EtcdProbe,
        to: PathBuf,
        meta: PathBuf,
    },
    /// A fetched snapshot restored into etcd's data directory ([`crate::etcd_restore`]).
    RestoreEtcd(super::etcd_data::DataDir),
}

impl fmt::Display for HostAction<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DaemonReload => write!(f, "systemctl daemon-reload"),
            Self::Enable(unit) => write!(f, "systemctl enable --no-reload {unit}"),
            Self::Start(unit) => write!(f, "systemctl start --no-block {unit}"),
            Self::Restart(unit) => write!(f, "systemctl restart --no-block {unit}"),
            Self::Stop(unit) => write!(f, "systemctl stop {unit}"),
            Self::RestoreEtcd(restore) => write!(f, "{restore}"),
            Self::InstallPackages(names) => {
                write!(f, "apt-get {}", apt_install_args(names).join(" "))
            }
            Self::InstallArtifact(a) => {
                write!(f, "install artifact {} {} -> {}", a.name, a.version, a.dest)
            }
            Self::WaitEtcd(probe) => write!(
                f,
                "wait for etcd health at {} (up to {}s)",
                probe.endpoint,
                probe.timeout.as_secs()
            ),
            Self::CheckEtcd(probe) => write!(
                f,
                "check etcd health at {} (up to {}s)",
                probe.endpoint,
                probe.timeout.as_secs()
            ),
            Self::WaitApiserver(probe) => write!(
                f,
                "wait for apiserver /readyz via {} (up to {}s)",
                probe.kubeconfig.display(),
                probe.timeout.as_secs()
            ),
            Self::WaitComponent(probe) => write!(
                f,
                "wait for {} /healthz at {} (up to {}s)",
                probe.component,
                probe.url(),
                probe.timeout.as_secs()
            ),
            Self::WaitNodeRegistered(probe) => write!(
                f,
                "wait for node {} to be registered via {} (up to {}s)",
                probe.node,
                probe.kubeconfig.display(),
                probe.timeout.as_secs()
            ),
            Self::WaitStaticPod(probe) => write!(
                f,
                "wait for static pod {} to run inputs {} (up to {}s)",
                probe.mirror_pod,
                probe
                    .inputs_sha256
                    .get(..12)
                    .unwrap_or(&probe.inputs_sha256),
                probe.timeout.as_secs()
            ),
            Self::RetireStaticPod { manifest, uid } => write!(
                f,
                "retire static pod {uid} (remove {}) before its replacement",
                manifest.display()
            ),
            Self::EtcdJoin(m) => write!(
                f,
                "join etcd as learner {} through {}",
                m.peer_url,
                m.voters.join(",")
            ),
            Self::EtcdPromote(m) => write!(
                f,
                "promote etcd learner {} through {} (up to {}s)",
                m.peer_url,
                m.voters.join(","),
                m.timeout.as_secs()
            ),
            Self::SaveEtcdSnapshot { probe, to, .. } => write!(
                f,
                "save an etcd snapshot from {} to {}",
                probe.endpoint,
                to.display()
            ),
            Self::EtcdRemove(m, leaving) => write!(
                f,
                "remove etcd member {} ({leaving}) through {} (up to {}s)",
                m.peer_url,
                m.voters.join(","),
                m.timeout.as_secs()
            ),
            Self::DrainNode(drain) => write!(
                f,
                "drain node {} through the eviction API, then delete it (KUBECONFIG={}, up to {}s)",
                drain.node,
                drain.kubeconfig.display(),
                drain.timeout.as_secs()
            ),
            Self::Command {
                program,
                args,
                kubeconfig,
                ..
            } => {
                write!(
                    f,
                    "KUBECONFIG={} {} {}",
                    kubeconfig.display(),
                    program.display(),
                    args.join(" ")
                )
            }
        }
    }
}

/// Performs or records host actions.
pub trait Host {
    fn perform(&mut self, action: &HostAction<'_>) -> Result<(), AgentError>;
    /// Each lane's actions in order, the lanes side by side where the host can (they must not
    /// depend on each other); a failure's error is returned. Recording runs them one lane after
    /// another, so a recorded log reads the same every time.
    fn perform_lanes(&mut self, lanes: &[Vec<HostAction<'_>>]) -> Result<(), AgentError> {
        lanes
            .iter()
            .flatten()
            .try_for_each(|action| self.perform(action))
    }
    /// Whether a unit is running (decides start versus restart).
    fn is_active(&mut self, unit: &UnitName) -> Result<bool, AgentError>;
    /// Packages among `names` that are not installed.
    fn missing_packages<'a>(
        &mut self,
        names: &[&'a PackageName],
    ) -> Result<Vec<&'a PackageName>, AgentError>;
}

/// Records actions in `<root>/var/lib/exk8s/recorded-actions.log` (and in memory), performing
/// none. A unit counts as active once a start or restart of it has been recorded.
pub struct RecordingHost {
    /// The root whose state directory holds the log; `None` for `--dry-run`.
    root: Option<PathBuf>,
    pub actions: Vec<String>,
}

const ACTION_LOG: &str = "recorded-actions.log";

impl RecordingHost {
    /// `persist` = false for `--dry-run`, which writes nothing at all.
    pub fn new(root: &Path, persist: bool) -> Self {
        Self {
            root: persist.then(|| root.to_owned()),
            actions: Vec::new(),
        }
    }

    fn recorded(&self) -> Result<String, AgentError> {
        let mut text = String::new();
        if let Some(root) = &self.root {
            if let Some(dir) = StateDir::open(root, false)? {
                if let Some(bytes) = dir.read(ACTION_LOG)? {
                    text = String::from_utf8_lossy(&bytes).into_owned();
                }
            }
        }
        Ok(text + &self.actions.join("\n"))
    }
}

/// Test hook: the first recorded action whose text contains this variable's value fails, as
/// a health check that fails once would (what follows, e.g. restoring, then succeeds). Read
/// only by [`RecordingHost`] (`--root`); unset in production.
const FAIL_ACTION_HOOK: &str = "EXK8S_AGENT_TEST_FAIL_ACTION";
static FAILED_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Host for RecordingHost {
    fn perform(&mut self, action: &HostAction<'_>) -> Result<(), AgentError> {
        let line = action.to_string();
        if let Some(fail) = std::env::var(FAIL_ACTION_HOOK)
            .ok()
            .filter(|f| !f.is_empty() && line.contains(f.as_str()))
            .filter(|_| !FAILED_ONCE.swap(true, std::sync::atomic::Ordering::SeqCst))
        {
            return Err(step_error(
                action,
                format!("failed on purpose ({FAIL_ACTION_HOOK}={fail})"),
            ));
        }
        log_info!("recorded (not performed): {line}");
        if let Some(root) = &self.root {
            let dir = StateDir::open(root, true)?.ok_or_else(|| AgentError::State {
                path: state_dir(root),
                source: std::io::ErrorKind::NotFound.into(),
            })?;
            dir.append_line(ACTION_LOG, &line)?;
        }
        self.actions.push(line);
        Ok(())
    }

    fn is_active(&mut self, unit: &UnitName) -> Result<bool, AgentError> {
        let recorded = self.recorded()?;
        Ok(recorded.lines().any(|l| {
            l.ends_with(&format!(" --no-block {unit}"))
                && (l.contains(" start ") || l.contains(" restart "))
        }))
    }

    fn missing_packages<'a>(
        &mut self,
        names: &[&'a PackageName],
    ) -> Result<Vec<&'a PackageName>, AgentError> {
        let recorded = self.recorded()?;
        Ok(names
            .iter()
            .copied()
            .filter(|n| {
                !recorded.lines().any(|l| {
                    l.starts_with("apt-get install")
                        && l.split_whitespace().any(|w| w == n.as_str())
                })
            })
            .collect())
    }
}

/// Performs actions on this machine.
pub struct SystemHost {
    pub root: PathBuf,
    pub request_timeout: Duration,
    /// Set when a lane beside this one failed: downloads stop retrying, no further action
    /// starts ([`Host::perform_lanes`]).
    abandoned: Arc<AtomicBool>,
}

impl SystemHost {
    pub fn new(root: PathBuf, request_timeout: Duration) -> Self {
        Self {
            root,
            request_timeout,
            abandoned: Arc::default(),
        }
    }

    /// One lane's actions in order; its failure abandons every lane beside it.
    fn perform_lane(&mut self, lane: &[HostAction<'_>]) -> Result<(), AgentError> {
        lane.iter().try_for_each(|action| {
            if self.abandoned.load(Ordering::Relaxed) {
                return Err(AgentError::Abandoned {
                    what: action.to_string(),
                });
            }
            self.perform(action)
                .inspect_err(|_| self.abandoned.store(true, Ordering::Relaxed))
        })
    }
}

/// `path` (as the bundle names it, from `/`) under `root`.
fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn step_error(action: &HostAction<'_>, reason: String) -> AgentError {
    AgentError::Step {
        step: action.to_string(),
        reason,
    }
}

/// `apt-get`'s arguments to install `names`. The bundle writes some packages' conffiles
/// before they are installed (`/etc/containerd/config.toml`): dpkg keeps the file it finds
/// (`--force-confold`) instead of asking, which would stop a non-interactive install.
fn apt_install_args<'a>(names: &[&'a PackageName]) -> Vec<&'a str> {
    let mut args = vec![
        "install",
        "-y",
        "--no-install-recommends",
        "-o",
        "Dpkg::Options::=--force-confdef",
        "-o",
        "Dpkg::Options::=--force-confold",
    ];
    args.extend(names.iter().map(|n| n.as_str()));
    args
}

/// The `HOME` helm and kubectl run with: the agent's unit hides home directories
/// (`ProtectHome=yes`), and helm keeps its cache and registry configuration, kubectl its
/// discovery cache, under `HOME`. Made on first use, private to root.
fn tool_home(root: &Path) -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt as _;
    let home = state_dir(root).join("home");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&home)
        .map_err(|e| format!("making {}: {e}", home.display()))?;
    Ok(home)
}

fn systemctl(args: &[&str]) -> Result<(), String> {
    run(Path::new("systemctl"), args, &[])
}

impl Host for SystemHost {
    /// Lanes run on threads of their own. The first lane to fail abandons the others (their
    /// downloads stop retrying, their next action does not start), and its error is the one
    /// returned: a phase that cannot succeed fails at once instead of after every other lane's
    /// deadline.
    fn perform_lanes(&mut self, lanes: &[Vec<HostAction<'_>>]) -> Result<(), AgentError> {
        let abandoned = Arc::new(AtomicBool::new(false));
        let ended: Vec<Result<(), AgentError>> = std::thread::scope(|scope| {
            let running: Vec<_> = lanes
                .iter()
                .map(|lane| {
                    let mut host = SystemHost {
                        abandoned: Arc::clone(&abandoned),
                        ..SystemHost::new(self.root.clone(), self.request_timeout)
                    };
                    scope.spawn(move || host.perform_lane(lane))
                })
                .collect();
            // Every lane is joined before an error is returned.
            running
                .into_iter()
                .map(|lane| {
                    lane.join().unwrap_or_else(|_| {
                        Err(AgentError::Step {
                            step: "a lane of host actions".into(),
                            reason: "its thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let (abandoned, failed): (Vec<_>, Vec<_>) = ended
            .into_iter()
            .filter_map(Result::err)
            .partition(|e| matches!(e, AgentError::Abandoned { .. }));
        match failed.into_iter().chain(abandoned).next() {
            Some(first) => Err(first),
            None => Ok(()),
        }
    }

    fn perform(&mut self, action: &HostAction<'_>) -> Result<(), AgentError> {
        log_info!("{action}");
        let result = match action {
            HostAction::DaemonReload => systemctl(&["daemon-reload"]),
            // Without systemd's implicit reload: systemd 252 reloads on every `enable`, even of a
            // unit already enabled (every generation applied reloaded it once a unit, about
            // 0.13 CPU-seconds each on a booted Debian 12 node). The plan's DaemonReload step
            // reloads when a unit file changed; a link in a target's `.wants/` needs none.
            HostAction::Enable(unit) => systemctl(&["enable", "--no-reload", unit.as_str()]),
            HostAction::Start(unit) => systemctl(&["start", "--no-block", unit.as_str()]),
            HostAction::Restart(unit) => systemctl(&["restart", "--no-block", unit.as_str()]),
            HostAction::Stop(unit) => systemctl(&["stop", unit.as_str()]),
            HostAction::RestoreEtcd(restore) => {
                super::etcd_data::restore_data_dir(&self.root, restore)
            }
            HostAction::InstallPackages(names) => {
                let apt = Path::new("apt-get");
                let env = [("DEBIAN_FRONTEND", Path::new("noninteractive"))];
                return run(apt, &["update", "-q"], &env)
                    .and_then(|()| run(apt, &apt_install_args(names), &env))
                    .map_err(AgentError::Packages);
            }
            HostAction::InstallArtifact(artifact) => {
                return super::artifacts::install(
                    &self.root,
                    artifact,
                    self.request_timeout,
                    &self.abandoned,
                );
            }
            HostAction::WaitEtcd(probe) | HostAction::CheckEtcd(probe) => {
                waits::etcd(&self.root, probe)
            }
            HostAction::WaitApiserver(probe) => waits::apiserver(&self.root, probe),
            HostAction::WaitComponent(probe) => waits::component(probe),
            HostAction::WaitNodeRegistered(probe) => waits::node_registered(&self.root, probe),
            HostAction::RetireStaticPod { manifest, uid } => {
                super::retire::retire(&self.root, &under_root(&self.root, manifest), uid)
            }
            HostAction::WaitStaticPod(probe) => waits::static_pod(&self.root, probe).map_err(|e| {
                match super::kubelet_log::last_error(&probe.mirror_pod, probe.timeout) {
                    Some(said) => format!("{e}; the kubelet's last error for the pod: {said}"),
                    None => e,
                }
            }),
            HostAction::Command {
                program,
                args,
                kubeconfig,
                timeout,
            } => tool_home(&self.root)
                .and_then(|home| retry_command(program, args, kubeconfig, &home, *timeout)),
            HostAction::DrainNode(drain) => super::drain::perform(drain),
            HostAction::EtcdJoin(m) => super::membership::join(&self.root, m),
            HostAction::EtcdPromote(m) => super::membership::promote(&self.root, m),
            HostAction::EtcdRemove(m, leaving) => super::membership::remove(&self.root, m, leaving),
            HostAction::SaveEtcdSnapshot { probe, to, meta } => {
                crate::snapshot::save(&self.root, probe, to, meta)
            }
        };
        result.map_err(|reason| step_error(action, reason))
    }

    fn is_active(&mut self, unit: &UnitName) -> Result<bool, AgentError> {
        let status = Command::new("systemctl")
            .args(["is-active", "--quiet", unit.as_str()])
            .status()
            .map_err(|e| AgentError::Step {
                step: format!("systemctl is-active {unit}"),
                reason: e.to_string(),
            })?;
        Ok(status.success())
    }

    fn missing_packages<'a>(
        &mut self,
        names: &[&'a PackageName],
    ) -> Result<Vec<&'a PackageName>, AgentError> {
        let mut missing = Vec::new();
        for name in names {
            let output = Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", name.as_str()])
                .output()
                .map_err(|e| AgentError::Packages(format!("running dpkg-query: {e}")))?;
            if !String::from_utf8_lossy(&output.stdout).contains("install ok installed") {
                missing.push(*name);
            }
        }
        Ok(missing)
    }
}

/// helm and kubectl talk to an apiserver that may still be settling: three attempts, with
/// 5 s and then 15 s between them, all within the step's timeout.
fn retry_command(
    program: &Path,
    args: &[String],
    kubeconfig: &Path,
    home: &Path,
    timeout: Duration,
) -> Result<(), String> {
    let start = Instant::now();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut last = String::new();
    for (attempt, pause) in [(1, 5u64), (2, 15), (3, 0)] {
        match run(
            program,
            &args,
            &[("KUBECONFIG", kubeconfig), ("HOME", home)],
        ) {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        if pause == 0 || start.elapsed() + Duration::from_secs(pause) > timeout {
            break;
        }
        log_warn!(
            "{} attempt {attempt} failed; retrying in {pause}s: {last}",
            program.display()
        );
        std::thread::sleep(Duration::from_secs(pause));
    }
    Err(last)
}
