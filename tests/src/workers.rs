//! A worker pool's nodes, for real: each worker the API makes boots from its bundle
//! (`exk8s-agent run`) in a network namespace of its own on the cluster's LAN and runs its real
//! kubelet and containerd ([`crate::kubelet::Runtime`]); the pool as the API shows it; and a
//! pool's replacement followed worker by worker (a new worker Ready at the new release, the
//! old one drained by the control plane and its VM released).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::cluster::{Founded, agent_ok, operator};
use crate::control_plane::kubectl;
use crate::dev::Stack;
use crate::kubelet::Runtime;
use crate::netns::Lan;
use crate::procs::wait_until;
use crate::units::exec_start;

/// How long a worker may take to register Ready, or the API to move a pool on.
pub const READY: Duration = Duration::from_secs(180);

/// `--flag=value` of the kubelet unit rendered under `root`.
pub fn kubelet_flag(root: &Path, flag: &str) -> String {
    let unit = std::fs::read_to_string(root.join("etc/systemd/system/kubelet.service")).unwrap();
    exec_start(&unit)
        .iter()
        .find_map(|a| a.strip_prefix(&format!("--{flag}=")).map(str::to_owned))
        .unwrap_or_else(|| panic!("--{flag} in {unit}"))
}

/// `GET /clusters/{cluster}/node-pools/{pool}` as JSON.
pub fn pool_view(stack: &Stack, cluster: i64, pool: i64) -> Value {
    operator(
        stack,
        "GET",
        &format!("/clusters/{cluster}/node-pools/{pool}"),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap()
}

/// A pool view's workers: VM id and removal (`null`, `draining`, `drained`).
pub fn pool_workers(view: &Value) -> Vec<(i64, Value)> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["vm_id"].as_i64().unwrap(), n["removal"].clone()))
        .collect()
}

/// One pool's running workers on a LAN.
pub struct Workers<'a> {
    pub stack: &'a Stack,
    pub founded: &'a Founded,
    pub pool: i64,
    /// Where each worker's root goes (`worker-<vm>`).
    pub dir: PathBuf,
    pub lan: &'a Lan,
    /// What a worker's `/etc/hosts` says (the control plane's name).
    pub hosts: String,
    /// Where the test's `kubectl` runs (a LAN index) and as whom.
    pub kubectl: (usize, PathBuf),
    /// VM id → the worker's Node name and runtime.
    pub running: BTreeMap<i64, (String, Runtime)>,
}

impl Workers<'_> {
    /// The pool's view now.
    pub fn view(&self) -> Value {
        pool_view(self.stack, self.founded.cluster, self.pool)
    }

    /// `kubectl args` once; its output, or nothing when it failed.
    pub fn kubectl_once(&self, args: &[&str]) -> String {
        let (ok, out, _) = kubectl(self.lan, self.kubectl.0, &self.kubectl.1, args);
        if ok { out } else { String::new() }
    }

    /// The first worker the pool lists that is not in `known`, once there is one.
    pub fn wait_new(&self, known: &[i64]) -> i64 {
        let mut found = None;
        wait_until("a new worker in the pool", READY, || {
            found = pool_workers(&self.view())
                .into_iter()
                .map(|(vm, _)| vm)
                .find(|vm| !known.contains(vm));
            found.is_some()
        });
        found.unwrap()
    }

    /// Worker `vm` boots from its bundle in a namespace of its own, and its real kubelet
    /// registers Ready at `release`; its Node name.
    pub fn boot(&mut self, vm: i64, release: &str) -> String {
        let root = self.dir.join(format!("worker-{vm}"));
        agent_ok(self.stack, self.founded, &root, vm, "run");
        let name = kubelet_flag(&root, "hostname-override");
        let index = self.lan.add(&kubelet_flag(&root, "node-ip"), &self.hosts);
        let mut runtime = Runtime::start(self.lan, index, &root);
        let asked = "jsonpath={.status.nodeInfo.kubeletVersion} \
                     {.status.conditions[?(@.type==\"Ready\")].status}";
        let mut seen = String::new();
        let start = std::time::Instant::now();
        while seen != format!("{release} True") {
            runtime.assert_running();
            assert!(
                start.elapsed() < READY,
                "{name} Ready at {release}: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(500));
            seen = self.kubectl_once(&["get", "node", &name, "-o", asked]);
        }
        self.running.insert(vm, (name.clone(), runtime));
        name
    }

    /// The pool replaced one worker at a time, as its `max_surge` of 1 does: for each worker
    /// running now, a new one is made, boots and is Ready at `release`; then one old worker is
    /// marked draining (the pool's oldest by ordinal, which need not be the lowest VM id: workers
    /// are made in parallel), `drain(name)` has the control plane drain it, and its VM is
    /// released (its kubelet stopped with it). The new workers' VM ids and names.
    pub fn replace_each(
        &mut self,
        release: &str,
        mut drain: impl FnMut(&str),
    ) -> Vec<(i64, String)> {
        let mut olds: BTreeMap<i64, String> = self
            .running
            .iter()
            .map(|(vm, (name, _))| (*vm, name.clone()))
            .collect();
        let mut news = Vec::new();
        while !olds.is_empty() {
            let known: Vec<i64> = self.running.keys().copied().collect();
            let new_vm = self.wait_new(&known);
            news.push((new_vm, self.boot(new_vm, release)));
            let mut going = None;
            wait_until("an old worker to be drained", READY, || {
                going = pool_workers(&self.view())
                    .into_iter()
                    .find(|(vm, removal)| olds.contains_key(vm) && removal == "draining")
                    .map(|(vm, _)| vm);
                going.is_some()
            });
            let old_vm = going.unwrap();
            let old_name = olds.remove(&old_vm).unwrap();
            drain(&old_name);
            wait_until(&format!("{old_name}'s VM to be released"), READY, || {
                pool_workers(&self.view())
                    .iter()
                    .all(|(vm, _)| *vm != old_vm)
            });
            // The VM is gone: its kubelet with it.
            self.running.remove(&old_vm);
        }
        news
    }

    /// Panics when a worker's containerd or kubelet has exited.
    pub fn assert_running(&mut self) {
        for (_, runtime) in self.running.values_mut() {
            runtime.assert_running();
        }
    }
}
