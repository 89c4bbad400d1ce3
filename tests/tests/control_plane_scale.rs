//! Scaling a real control plane 1 → 3 → 1: etcd 3.6, kube-apiserver, controller-manager and
//! scheduler run from each node's root in its own network namespace (as in
//! `control_plane_day2.rs`), and the real agent runs inside its node's namespace too, reaching
//! the API through a forwarded loopback port and performing its etcd membership steps for real
//! (`EXK8S_AGENT_TEST_PERFORM_ETCD`). A joining node's agent adds it as a learner through the
//! voters; the harness starts its etcd (what `systemctl start` would do), the agent promotes it,
//! and its apiserver starts from its manifest; then every member takes its new generation one at
//! a time (each apiserver's `--etcd-servers` follows), restarted from its new files and ready
//! before the next. Shrinking, the oldest member's agent removes the newest member from etcd,
//! its VM goes (the harness stops its processes), and the others follow. Throughout, every
//! apiserver in service and `GET /api` through the control-plane name are sampled every 200 ms
//! (`exk8s_tests::availability`): no failed sample except on the one node changing, never two
//! nodes down at once. A ConfigMap written before the first change is read from every apiserver
//! at three members and from the last one at the end.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_tests::availability::{self, Shared};
use exk8s_tests::cluster::{Founded, agent_with, found, operator, operator_kubeconfig, view};
use exk8s_tests::control_plane::{Node, etcdctl, kubectl, kubectl_until};
use exk8s_tests::dev::{Stack, start_dev};
use exk8s_tests::members::{HEALTHCHECK, control_plane, member_in, sim_vm_ids, wait_for};
use exk8s_tests::netns::{Forward, Lan};
use exk8s_tests::procs::binary;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(120);
const SUBNET: &str = "10.221.0.0/24";
const CLIENT_IP: &str = "10.221.0.250";
/// The client namespace's index in the LAN (the first; nodes come after it).
const CLIENT: usize = 0;
const SUPER_ADMIN: &str = "etc/exk8s/kubeconfig/super-admin.kubeconfig";

/// The control plane as the test drives it: each node's processes and namespace by VM id.
struct Plane<'a> {
    stack: &'a Stack,
    founded: &'a Founded,
    dir: &'a Path,
    lan: &'a Lan,
    shared: &'a Shared,
    dns_name: &'a str,
    port: u16,
    /// VM id → (its node, the API's port forwarded into its namespace).
    nodes: std::collections::BTreeMap<i64, (Node, Forward)>,
}

impl Plane<'_> {
    fn root(&self, vm: i64) -> PathBuf {
        self.dir.join(format!("vm-{vm}"))
    }

    /// A namespace on the LAN for `vm` at `ip`, with the API's port forwarded into it.
    fn place(&mut self, vm: i64, ip: &str) -> usize {
        let index = self.lan.add(ip, &self.hosts());
        let forward = self.lan.forward_loopback(index, self.port);
        let node = Node::new(&self.root(vm), index);
        self.nodes.insert(vm, (node, forward));
        index
    }

    fn index(&self, vm: i64) -> usize {
        self.nodes[&vm].0.index
    }

    /// `/etc/hosts` lines: the control-plane name leads to every node in service.
    fn hosts(&self) -> String {
        let serving = self.shared.serving.lock().unwrap();
        serving
            .iter()
            .map(|(_, ip)| format!("{ip} {}\n", self.dns_name))
            .collect()
    }

    /// Puts node `index` at `ip` in service (`true`) or out of it, and the name follows.
    fn serve(&self, index: usize, ip: &str, on: bool) {
        {
            let mut serving = self.shared.serving.lock().unwrap();
            serving.retain(|(i, _)| *i != index);
            if on {
                serving.push((index, ip.to_owned()));
            }
        }
        let hosts = self.hosts();
        for i in 0..self.lan.count() {
            self.lan.set_hosts(i, &hosts);
        }
    }

    /// The real agent's `command` for `vm`, run in its namespace.
    fn agent(&self, vm: i64, command: &str) -> std::process::Command {
        let inside = self.lan.command(self.index(vm), binary("exk8s-agent"));
        agent_with(
            inside,
            self.stack,
            self.founded,
            &self.root(vm),
            vm,
            command,
        )
    }

    fn agent_ok(&self, vm: i64, command: &str) {
        let out = self.agent(vm, command).output().unwrap();
        assert!(
            out.status.success(),
            "exk8s-agent {command} for vm {vm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn wait_ready(&mut self, vm: i64) {
        let index = self.index(vm);
        let config = self.root(vm).join(SUPER_ADMIN);
        let mut all: Vec<&mut Node> = self.nodes.values_mut().map(|(n, _)| n).collect();
        let ready = kubectl_until(
            self.lan,
            &mut all,
            index,
            &config,
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok");
    }

    /// `vm` takes its generation; what changed restarts, and the node is ready again.
    fn sync(&mut self, vm: i64) {
        self.agent_ok(vm, "sync");
        self.shared.set_changing(Some(self.index(vm)));
        let lan = self.lan;
        let node = &mut self.nodes.get_mut(&vm).unwrap().0;
        let etcd = node.sync_etcd(lan);
        let pods = node.sync_static_pods(lan);
        eprintln!("vm {vm} synced: etcd restarted: {etcd}; static pods restarted: {pods:?}");
        self.wait_ready(vm);
        self.shared.set_changing(None);
    }

    /// Every member takes its generation, one at a time.
    fn sync_all(&mut self) {
        for node in control_plane(self.stack, self.founded.cluster) {
            self.sync(node["vm_id"].as_i64().unwrap());
        }
    }

    /// etcd's members, through the first node: (peer URLs, is learner).
    fn etcd_members(&self) -> Vec<(String, bool)> {
        let first = self.founded.vms[0];
        let out = etcdctl(
            self.lan,
            self.index(first),
            &self.root(first),
            "https://127.0.0.1:2379",
            (
                HEALTHCHECK.0.rsplit('/').next().unwrap(),
                HEALTHCHECK.1.rsplit('/').next().unwrap(),
            ),
            &["member", "list", "-w", "json"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let list: Value = serde_json::from_slice(&out.stdout).unwrap();
        list["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["peerURLs"][0].as_str().unwrap_or_default().to_owned(),
                    m["isLearner"].as_bool().unwrap_or(false),
                )
            })
            .collect()
    }

    /// One member joins: its agent adds the learner and waits; its etcd starts once etcd lists
    /// the learner; the agent promotes it; its apiserver starts and is put in service; then
    /// every member follows.
    fn join(&mut self) {
        let joining = member_in(self.stack, self.founded.cluster, "joining");
        let vm = joining["vm_id"].as_i64().unwrap();
        let ip = joining["private_ipv4"].as_str().unwrap().to_owned();
        self.shared.step(&format!("join vm {vm}"));
        let index = self.place(vm, &ip);
        let log = self.dir.join(format!("agent-{vm}.log"));
        let agent = self
            .agent(vm, "run")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        wait_for("etcd to list the learner", || {
            self.etcd_members().iter().any(|(_, learner)| *learner)
        });
        let lan = self.lan;
        self.nodes.get_mut(&vm).unwrap().0.start_etcd(lan);
        let out = agent.wait_with_output().unwrap();
        let said = std::fs::read_to_string(&log).unwrap();
        assert!(out.status.success(), "the joining agent: {said}");
        assert!(said.contains("performed and recorded"), "{said}");
        self.nodes.get_mut(&vm).unwrap().0.sync_static_pods(lan);
        self.wait_ready(vm);
        wait_for("the new member voting", || {
            control_plane(self.stack, self.founded.cluster)
                .iter()
                .any(|n| n["vm_id"] == vm && n["etcd_membership"] == "voter")
        });
        self.serve(index, &ip, true);
        self.shared.step(&format!("roll after vm {vm} joined"));
        self.sync_all();
    }

    /// The newest member leaves: out of service, removed from etcd by the oldest member's
    /// agent, its VM deleted (its processes stopped); then every member follows.
    fn leave(&mut self) {
        let leaving = member_in(self.stack, self.founded.cluster, "leaving");
        let vm = leaving["vm_id"].as_i64().unwrap();
        let ip = leaving["private_ipv4"].as_str().unwrap().to_owned();
        let remaining = control_plane(self.stack, self.founded.cluster).len() - 1;
        self.shared.step(&format!("vm {vm} leaves"));
        let index = self.index(vm);
        self.shared.set_changing(Some(index));
        self.serve(index, &ip, false);
        self.agent_ok(self.founded.vms[0], "sync");
        wait_for("the member removed", || {
            control_plane(self.stack, self.founded.cluster).len() == remaining
        });
        assert_eq!(self.etcd_members().len(), remaining);
        self.nodes.remove(&vm);
        self.shared.set_changing(None);
        self.shared.step(&format!("roll after vm {vm} left"));
        self.sync_all();
    }

    /// The marker ConfigMap as node `vm`'s apiserver serves it.
    fn marker(&self, vm: i64) -> String {
        let (ok, out, err) = kubectl(
            self.lan,
            self.index(vm),
            &self.root(vm).join(SUPER_ADMIN),
            &[
                "get",
                "configmap",
                "scale-marker",
                "-o",
                "jsonpath={.data.written}",
            ],
        );
        assert!(ok, "{err}");
        out
    }
}

fn scale(stack: &Stack, founded: &Founded, count: i64) {
    let started = operator(stack, "PATCH", &format!("/clusters/{}", founded.cluster))
        .send_json(json!({"control_plane_count": count}))
        .unwrap();
    assert_eq!(started.status(), 202, "PATCH to {count}");
}

#[test]
fn a_real_control_plane_goes_one_three_one_with_every_other_apiserver_ready() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = start_dev(
        &dir.join("dev"),
        SUBNET,
        &dir.join("api.log"),
        &[
            "--member-join-timeout-secs",
            "300",
            "--reconcile-interval-secs",
            "1",
            // A test's many agent runs, seconds apart: more than a real node sends.
            "--bootstrap-rate-per-vm",
            "600",
            "--bootstrap-rate-per-source",
            "6000",
        ],
    );
    let port: u16 = stack.base.rsplit(':').next().unwrap().parse().unwrap();
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let first = founded.vms[0];
    let first_ip = founded.ip_of[&first].clone();
    let dns_name = founded.created["control_plane_dns_name"].as_str().unwrap();
    let lan = Lan::new(&[CLIENT_IP], 24, "");
    let operator_config = dir.join("operator.kubeconfig");
    let text = operator_kubeconfig(&stack, founded.cluster);
    std::fs::write(&operator_config, text).unwrap();
    let shared = Shared::new(Vec::new(), operator_config);
    let mut plane = Plane {
        stack: &stack,
        founded: &founded,
        dir,
        lan: &lan,
        shared: &shared,
        dns_name,
        port,
        nodes: std::collections::BTreeMap::new(),
    };
    let index = plane.place(first, &first_ip);
    assert_eq!(index, CLIENT + 1);
    plane.agent_ok(first, "run");
    let lan_ref = plane.lan;
    let node = &mut plane.nodes.get_mut(&first).unwrap().0;
    node.start_etcd(lan_ref);
    node.sync_static_pods(lan_ref);
    plane.wait_ready(first);
    plane.serve(index, &first_ip, true);
    let (ok, _, err) = kubectl(
        &lan,
        index,
        &plane.root(first).join(SUPER_ADMIN),
        &[
            "create",
            "configmap",
            "scale-marker",
            "--from-literal=written=before-scaling",
        ],
    );
    assert!(ok, "{err}");

    let samples = availability::sample_during(&lan, CLIENT, dns_name, &shared, || {
        scale(&stack, &founded, 3);
        plane.join();
        plane.join();
        let members = plane.etcd_members();
        assert_eq!(members.len(), 3, "{members:?}");
        assert!(members.iter().all(|(_, learner)| !learner), "{members:?}");
        for vm in plane.nodes.keys() {
            assert_eq!(plane.marker(*vm), "before-scaling", "vm {vm}");
        }
        assert_eq!(shared.serving.lock().unwrap().len(), 3);

        scale(&stack, &founded, 1);
        plane.leave();
        plane.leave();
    });
    eprintln!("{}", availability::check(&samples, 50, 10));

    assert_eq!(plane.nodes.keys().copied().collect::<Vec<_>>(), [first]);
    assert_eq!(plane.marker(first), "before-scaling");
    assert_eq!(plane.etcd_members().len(), 1);
    assert_eq!(
        sim_vm_ids(&stack),
        [first],
        "every VM released with its member"
    );
    let done = view(&stack, founded.cluster);
    assert_eq!(
        done["control_plane_members"],
        json!({"desired": 1, "voters": 1, "joining": 0, "leaving": 0})
    );
    for (node, _) in plane.nodes.values_mut() {
        node.assert_running();
    }
}
