//! A node's rendered control plane run as processes, from what the agent wrote under its root:
//! etcd from its `etcd.service` ExecStart, and kube-apiserver, kube-controller-manager and
//! kube-scheduler from their static-pod manifests' `command` — the real binaries of
//! [`crate::bins`] with exactly the rendered flags. Each node runs in its own network namespace
//! ([`crate::netns`]), so every process binds the address and port its bundle rendered. The harness
//! plays the kubelet's part for static pods: it creates their `DirectoryOrCreate` host paths and
//! (re)starts a component when its manifest changes ([`Node::sync_static_pods`]).
//!
//! The only rewrite is [`crate::units::rewrite`]: host paths rebased into the root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use yaml_serde::Value;

use crate::netns::Lan;
use crate::procs::Proc;
use crate::units::{exec_start, rewrite, unit_environment};

/// Where a rendered bundle puts what the harness reads.
pub const ETCD_UNIT: &str = "etc/systemd/system/etcd.service";
pub const MANIFESTS: &str = "etc/kubernetes/manifests";
/// Where the harness, playing the kubelet, records the inputs each static pod runs: the
/// agent's `waits::STAND_IN_KUBELET_DIR`, read by `waits::manifest_probe` when its
/// `EXK8S_AGENT_TEST_PERFORM_KUBERNETES` hook has it perform the waits with no kubelet.
const STAND_IN_KUBELET_DIR: &str = "run/exk8s-test-kubelet";
/// The static pods of a control-plane node, in the order a kubelet would bring them up.
pub const STATIC_PODS: [&str; 3] = [
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// How long a stopped process may take to exit after SIGTERM (the kubelet's default grace
/// period) before it is killed.
pub const GRACE: Duration = Duration::from_secs(30);

/// The last `lines` lines of the log at `path` (empty when there is none).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// etcd's rendered ExecStart arguments (the binary itself dropped), rewritten.
pub fn etcd_args(root: &Path) -> Vec<String> {
    let unit = std::fs::read_to_string(root.join(ETCD_UNIT)).unwrap();
    exec_start(&unit)
        .iter()
        .skip(1)
        .map(|arg| rewrite(root, arg))
        .collect()
}

/// A static pod's manifest as the harness reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPod {
    /// The command's program (`kube-apiserver`), then its rewritten arguments.
    pub program: String,
    /// The release its image names (`registry.k8s.io/kube-apiserver:v1.35.3`): the harness
    /// runs the binary of that release, as the kubelet would run that image.
    pub version: String,
    pub args: Vec<String>,
    /// `DirectoryOrCreate` host paths, rebased: the kubelet makes them before the pod starts.
    pub make_dirs: Vec<PathBuf>,
    /// The digest of the files it mounts, from its annotation.
    pub inputs: String,
    /// The manifest as written: any change (a mounted file's digest in its annotation too)
    /// makes the kubelet recreate the pod.
    pub manifest: String,
}

/// Reads `root`'s manifest of `name`.
pub fn static_pod(root: &Path, name: &str) -> StaticPod {
    let path = root.join(MANIFESTS).join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap();
    let pod: Value = yaml_serde::from_str(&text).unwrap();
    let container = &pod["spec"]["containers"][0];
    let mut command = container["command"]
        .as_sequence()
        .unwrap_or_else(|| panic!("{}: no command", path.display()))
        .iter()
        .map(|v| v.as_str().unwrap().to_owned());
    let program = command.next().unwrap();
    let args = command.map(|arg| rewrite(root, &arg)).collect();
    let image = container["image"].as_str().unwrap();
    let version = image
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("{}: image `{image}` has no tag", path.display()))
        .1
        .to_owned();
    let make_dirs = pod["spec"]["volumes"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter(|v| v["hostPath"]["type"].as_str() == Some("DirectoryOrCreate"))
        .map(|v| PathBuf::from(rewrite(root, v["hostPath"]["path"].as_str().unwrap())))
        .collect();
    let inputs = pod["metadata"]["annotations"]["exk8s.io/inputs-sha256"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    StaticPod {
        program,
        version,
        args,
        make_dirs,
        inputs,
        manifest: text,
    }
}

/// One node's running control plane.
pub struct Node {
    pub root: PathBuf,
    /// The node's index in its LAN.
    pub index: usize,
    procs: BTreeMap<String, (StaticPod, Proc)>,
    etcd: Option<Proc>,
    /// How much of the agent's recorded actions the harness has acted on (bytes).
    actions_seen: usize,
    /// (release, program) → what runs in its place ([`Node::run_instead`]).
    instead: BTreeMap<(String, String), PathBuf>,
}

/// Where the agent records the host actions it would perform (`--root`).
const RECORDED_ACTIONS: &str = "var/lib/exk8s/recorded-actions.log";

/// The host actions the agent has recorded in `root` so far.
fn recorded_actions(root: &Path) -> String {
    std::fs::read_to_string(root.join(RECORDED_ACTIONS)).unwrap_or_default()
}

impl Node {
    pub fn new(root: &Path, index: usize) -> Self {
        Self {
            root: root.to_owned(),
            index,
            procs: BTreeMap::new(),
            etcd: None,
            actions_seen: 0,
            instead: BTreeMap::new(),
        }
    }

    /// From now on a static pod of `program` at `release` runs `path` (a broken build, say).
    pub fn run_instead(&mut self, release: &str, program: &str, path: &Path) {
        self.instead
            .insert((release.to_owned(), program.to_owned()), path.to_owned());
    }

    fn spawn(
        &self,
        lan: &Lan,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
        log: &str,
    ) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join(log))
            .unwrap();
        let child = lan
            .command(self.index, program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        Proc(child)
    }

    /// Starts (or restarts) etcd from the unit.
    pub fn start_etcd(&mut self, lan: &Lan) {
        if let Some(old) = self.etcd.take() {
            old.terminate(GRACE);
        }
        self.actions_seen = recorded_actions(&self.root).len();
        let unit = std::fs::read_to_string(self.root.join(ETCD_UNIT)).unwrap();
        let etcd = self.spawn(
            lan,
            &crate::etcd::unit_binary(&unit),
            &etcd_args(&self.root),
            &unit_environment(&self.root, &unit),
            "etcd.log",
        );
        self.etcd = Some(etcd);
    }

    /// Kills etcd with SIGKILL (a disaster, not a stop the agent asked for).
    pub fn kill_etcd(&mut self) {
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.0.kill();
            let _ = etcd.0.wait();
        }
    }

    /// Plays systemd for etcd: restarts it when the agent restarted `etcd.service` (or starts
    /// it when the agent started it and it is not running) since the harness last looked (its plan restarts it when a file the unit
    /// watches changed: the unit, etcd's CA, server and peer certificates; a restore starts it
    /// from its restored data), stops it when the agent's last word was a stop (a restore's
    /// first step); true when it (re)started it.
    pub fn sync_etcd(&mut self, lan: &Lan) -> bool {
        let actions = recorded_actions(&self.root);
        let new = actions.get(self.actions_seen..).unwrap_or_default();
        let last = new
            .lines()
            .rev()
            .find(|l| {
                matches!(
                    *l,
                    "systemctl restart --no-block etcd.service"
                        | "systemctl start --no-block etcd.service"
                        | "systemctl stop etcd.service"
                )
            })
            .map(str::to_owned);
        self.actions_seen = actions.len();
        match last.as_deref() {
            Some("systemctl stop etcd.service") => {
                if let Some(old) = self.etcd.take() {
                    old.terminate(GRACE);
                }
                false
            }
            // As systemd: starting a running unit does nothing.
            Some("systemctl start --no-block etcd.service") if self.etcd.is_some() => false,
            Some(_) => {
                self.start_etcd(lan);
                true
            }
            None => false,
        }
    }

    /// Starts every static pod whose manifest is new or changed since it was started, stopping
    /// the old process first (the kubelet's part); returns the names (re)started.
    pub fn sync_static_pods(&mut self, lan: &Lan) -> Vec<&'static str> {
        let mut started = Vec::new();
        for name in STATIC_PODS {
            if !self
                .root
                .join(MANIFESTS)
                .join(format!("{name}.yaml"))
                .exists()
            {
                // Its manifest was put aside: the kubelet stops the pod.
                if let Some((_, old)) = self.procs.remove(name) {
                    old.terminate(GRACE);
                }
                continue;
            }
            let pod = static_pod(&self.root, name);
            if self
                .procs
                .get(name)
                .is_some_and(|(running, _)| *running == pod)
            {
                continue;
            }
            if let Some((_, old)) = self.procs.remove(name) {
                old.terminate(GRACE);
            }
            for dir in &pod.make_dirs {
                std::fs::create_dir_all(dir).unwrap();
            }
            let program = self
                .instead
                .get(&(pod.version.clone(), pod.program.clone()))
                .cloned()
                .unwrap_or_else(|| crate::bins::kubernetes_at(&pod.version, &pod.program));
            let proc = self.spawn(lan, &program, &pod.args, &[], &format!("{name}.log"));
            // What the kubelet reports through the mirror pod: the inputs the pod runs.
            let record = self.root.join(STAND_IN_KUBELET_DIR);
            std::fs::create_dir_all(&record).unwrap();
            std::fs::write(record.join(format!("{name}.yaml")), &pod.inputs).unwrap();
            self.procs.insert(name.to_owned(), (pod, proc));
            started.push(name);
        }
        started
    }

    /// Runs `agent` (this node's `exk8s-agent`) to its end while playing systemd and the
    /// kubelet for it: etcd and each static pod are restarted as the agent changes them, so
    /// the agent's own waits (its test hook) see them; then once more for the files it left
    /// (put back, say). Its output, its log also shown.
    pub fn run_agent(
        &mut self,
        lan: &Lan,
        agent: &mut std::process::Command,
    ) -> std::process::Output {
        let mut child = agent
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The agent's log, read meanwhile so that it never blocks on a full pipe.
        let mut stderr = child.stderr.take().unwrap();
        let log = std::thread::spawn(move || {
            let mut text = Vec::new();
            std::io::Read::read_to_end(&mut stderr, &mut text).unwrap();
            text
        });
        while child.try_wait().unwrap().is_none() {
            self.sync_etcd(lan);
            self.sync_static_pods(lan);
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut out = child.wait_with_output().unwrap();
        out.stderr = log.join().unwrap();
        eprintln!(
            "{}'s agent ({}):\n{}",
            self.root.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        self.sync_etcd(lan);
        self.sync_static_pods(lan);
        out
    }

    /// Panics with its log when a started process has exited.
    pub fn assert_running(&mut self) {
        let root = self.root.clone();
        let dead = |name: &str, proc: &mut Proc| {
            if let Some(status) = proc.0.try_wait().unwrap() {
                let tail = log_tail(&root.join(format!("{name}.log")), 40);
                panic!("{name} exited with {status}:\n{tail}");
            }
        };
        if let Some(etcd) = self.etcd.as_mut() {
            dead("etcd", etcd);
        }
        for (name, (_, proc)) in &mut self.procs {
            dead(name, proc);
        }
    }
}

/// Runs etcd 3.6's `etcdctl` inside node `i`'s namespace against `endpoint`, trusting `root`'s
/// etcd CA with the identity `(certificate, key)` of `root`'s pki directory (file names).
pub fn etcdctl(
    lan: &Lan,
    i: usize,
    root: &Path,
    endpoint: &str,
    (cert, key): (&str, &str),
    args: &[&str],
) -> std::process::Output {
    let pki = |name: &str| root.join("etc/exk8s/pki").join(name).display().to_string();
    lan.command(i, crate::bins::etcd("etcdctl"))
        .arg(format!("--endpoints={endpoint}"))
        .arg(format!("--cacert={}", pki("etcd-ca.pem")))
        .arg(format!("--cert={}", pki(cert)))
        .arg(format!("--key={}", pki(key)))
        .args(args)
        .output()
        .unwrap()
}

/// Runs `kubectl` (the built one) inside node `i`'s namespace with `kubeconfig`; (success,
/// stdout, stderr).
pub fn kubectl(lan: &Lan, i: usize, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = lan
        .command(i, crate::bins::kubernetes("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--request-timeout=10s")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls `kubectl args` in node `i` until it succeeds; its stdout. Panics after `timeout`,
/// with what kubectl last said, after checking every process of `nodes` still runs.
pub fn kubectl_until(
    lan: &Lan,
    nodes: &mut [&mut Node],
    i: usize,
    kubeconfig: &Path,
    args: &[&str],
    timeout: Duration,
) -> String {
    let start = Instant::now();
    loop {
        let (ok, out, err) = kubectl(lan, i, kubeconfig, args);
        if ok {
            return out;
        }
        for node in nodes.iter_mut() {
            node.assert_running();
        }
        assert!(
            start.elapsed() < timeout,
            "kubectl {} never succeeded: {out}{err}",
            args.join(" ")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_host_paths_are_rebased() {
        let root = Path::new("/tmp/node-1");
        assert_eq!(
            rewrite(root, "--tls-cert-file=/etc/exk8s/pki/apiserver.pem"),
            "--tls-cert-file=/tmp/node-1/etc/exk8s/pki/apiserver.pem"
        );
        for unchanged in [
            "--secure-port=6443",
            "--etcd-servers=https://10.0.0.11:2379",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        ] {
            assert_eq!(rewrite(root, unchanged), unchanged);
        }
    }
}
