//! One booted control-plane node (`pod_network: none`, its snapshots in a bucket of a real
//! S3 server) takes what a single member's cluster goes through on day 2, each change applied
//! by its agent's sync unit as its timer runs it (the timer itself stopped: the test starts
//! the unit once per step, so it can look between steps):
//!
//! - **a snapshot** ([`snapshot`]): `exk8s snapshots create --wait`, which follows it on the
//!   cluster's event stream until it is stored; the agent streams it from the
//!   member's etcd and uploads it; the bucket holds only ciphertext; what `exk8s snapshots
//!   download` writes is what etcd wrote (its recorded digest, mode 0600), `etcdutl snapshot
//!   status` reads it, and an etcd restored from it on the host serves what the apiserver had
//!   written, the Secret still encrypted. The schedule is shown and set.
//! - **an in-place restore** ([`restore_in_place`]): after more writes, etcd is stopped and its
//!   data directory destroyed; `exk8s restore --yes`; the agent's three steps put the
//!   kubelet's static pods aside, restore the data directory (`--bump-revision`,
//!   `--mark-compacted`) and start etcd under systemd, then bring the pods back. What the
//!   snapshot held is back and only that, the Secret still encrypted, a watch from a
//!   resourceVersion taken after the snapshot ends at once ("too old resource version"), a
//!   token issued before the snapshot authenticates.
//! - **the service-account key's rotation** ([`super::sa_key`]), then **the front proxy's
//!   CA's** ([`super::ca_rotation`]), one sync per phase.
//! - **Cluster API** ([`super::cluster_api`]): adopts the cluster and reaches its apiserver:
//!   the Cluster `Available` in Cluster API's status; a MachinePool's worker boots and its Node
//!   is matched by provider ID; the MachinePool's delete drains it and deletes its machine.
//! - **growing to three members, the cluster CA's rotation there ([`super::ca_rotation`]), and
//!   back to one** ([`super::scale`]), its sync timer's work
//!   done by the test every few seconds on every member.
//! - **a new cluster founded from the snapshot** ([`super::from_snapshot`]), this one powered
//!   off first.
//! - **deleting the snapshot** (`--yes` asked for, then the object gone).

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use exk8s_tests::bins::{ETCD_VERSION, etcd};
use exk8s_tests::cluster::{Founded, found, operator};
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::{Proc, free_port, wait_until};
use exk8s_tests::s3;
use exk8s_tests::site::{Site, wait_complete};
use exk8s_tests::timeline::mark;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use super::control_plane::{admin, etcdctl, hand, kubectl_with};

/// The booted node and what the checks need of its cluster.
pub(crate) struct OneNode<'a> {
    pub(crate) stack: &'a Stack,
    pub(crate) machine: Machine,
    pub(crate) cluster: i64,
    pub(crate) ip: String,
    pub(crate) dns_name: String,
    /// The test's directory (the CLI's home, downloads).
    pub(crate) dir: &'a Path,
}

impl<'a> OneNode<'a> {
    /// The founded one-member cluster's node once its first boot is complete, its sync timer
    /// stopped: the test starts the sync unit itself, once per step.
    pub(crate) fn booted(stack: &'a Stack, founded: &Founded, dir: &'a Path) -> Self {
        let vm = founded.vms[0];
        let machine = wait_complete(stack, founded.cluster, &[vm], Duration::from_secs(400))
            .pop()
            .unwrap();
        machine.ok("systemctl", &["stop", "exk8s-agent-sync.timer"]);
        OneNode {
            stack,
            machine,
            cluster: founded.cluster,
            ip: founded.ip_of[&vm].clone(),
            dns_name: founded.created["control_plane_dns_name"]
                .as_str()
                .unwrap()
                .to_owned(),
            dir,
        }
    }
}

impl OneNode<'_> {
    /// The `exk8s` CLI as the operator runs it; its stdout as JSON (`-o json` is asked).
    pub(crate) fn exk8s(&self, args: &[&str]) -> Value {
        let mut all = vec!["-o", "json"];
        all.extend_from_slice(args);
        let out = self.stack.exk8s(self.dir, &all);
        assert!(
            out.status.success(),
            "exk8s {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The node's sync unit started once, as its timer starts it; it must succeed.
    pub(crate) fn sync(&self) {
        let out = self
            .machine
            .run("systemctl", &["start", "exk8s-agent-sync.service"]);
        assert!(
            out.status.success(),
            "the sync unit failed: {}",
            self.machine.journal("exk8s-agent-sync.service", 80)
        );
    }

    /// `kubectl` with a token-only kubeconfig for `token`: who it authenticates as, or the
    /// error.
    pub(crate) fn whoami(&self, token: &str) -> Result<String, String> {
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}:6443\n    certificate-authority: /etc/exk8s/pki/ca.pem\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
            self.dns_name
        );
        let config = hand(&self.machine, "token.kubeconfig", &config);
        kubectl_with(
            &self.machine,
            &config,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        )
    }
}

/// `count` ConfigMaps named `<prefix>-<n>`, as one List for `kubectl create -f`.
fn config_maps(prefix: &str, count: usize) -> String {
    let items: Vec<Value> = (0..count)
        .map(|n| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": format!("{prefix}-{n}"), "namespace": "default"},
                   "data": {"n": n.to_string()}})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}

/// How many ConfigMaps of `default` are named `<prefix>-…`.
fn counted(machine: &Machine, prefix: &str) -> usize {
    admin(machine, &["get", "configmaps", "-o", "name"])
        .lines()
        .filter(|l| l.starts_with(&format!("configmap/{prefix}-")))
        .count()
}

/// The test: founds the cluster on its own site, boots its node, and goes through the module's
/// changes in order.
pub(crate) fn run() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let site = Site::prepare(dir, false);
    let bucket = s3::serve(&dir.join("s3"));
    let store = format!("s3://{}/prod", s3::BUCKET);
    let env: Vec<(&str, &str)> = bucket.env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The port Cluster API's management apiserver listens on, reached from the machines.
    let management = free_port();
    let forward = management.to_string();
    let stack = site.start_stack(
        dir,
        "10.224.0.0/24",
        &["--snapshot-store", &store, "--machine-forward", &forward],
        &env,
    );
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1,
                "pod_network": "none"}),
    );
    mark("founded; the machine boots");
    let node = OneNode::booted(&stack, &founded, dir);
    mark("booted; a snapshot");

    // What the snapshot holds: 1,000 ConfigMaps, one more by name, a Secret, and a service
    // account's token.
    let before = hand(&node.machine, "before.json", &config_maps("before", 1000));
    admin(&node.machine, &["create", "-f", &before]);
    admin(
        &node.machine,
        &[
            "create",
            "configmap",
            "snapshotted",
            "--from-literal=kept=yes",
        ],
    );
    admin(
        &node.machine,
        &[
            "create",
            "secret",
            "generic",
            "kept",
            "--from-literal=password=hunter2",
        ],
    );
    admin(&node.machine, &["create", "serviceaccount", "robot"]);
    let token = admin(
        &node.machine,
        &["create", "token", "robot", "--duration=2h"],
    );

    let snapshot = snapshot(&node, &dir.join(format!("s3/{}/prod", s3::BUCKET)));
    mark("an in-place restore");
    restore_in_place(&node, snapshot.id, &token);
    mark("a service-account key rotation");
    let token = super::sa_key::rotate(&node, &token);
    mark("the front proxy CA's rotation");
    super::ca_rotation::rotate_front_proxy(&node);
    // Late enough that scripts/test.sh has built Cluster API beside the booted clusters.
    mark("Cluster API adopts the cluster and reaches it: Available");
    super::cluster_api::available(&node, management);
    mark("grow to three, rotate the CA, shrink");
    super::scale::grow_and_shrink(&node);
    mark("a cluster founded from the snapshot");
    super::from_snapshot::found_from(node, snapshot.id, &token);
    mark("delete and purge");

    // Deleting asks for confirmation, then removes the object too.
    let id = snapshot.id.to_string();
    let name = founded.cluster.to_string();
    let unconfirmed = stack.exk8s(dir, &["snapshots", "delete", &name, &id]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(snapshot.object.exists());
    let deleted = stack.exk8s(dir, &["snapshots", "delete", &name, &id, "--yes"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert!(!snapshot.object.exists());
    // The deleted source, its snapshot gone, is purged: nothing of it is kept.
    let purged = stack.exk8s(dir, &["clusters", "purge", &name, "--yes"]);
    assert!(
        purged.status.success(),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    let kept = stack.exk8s(dir, &["clusters", "list", "--deleted", "-o", "json"]);
    assert_eq!(String::from_utf8_lossy(&kept.stdout).trim(), "[]");
    bucket.server.terminate(Duration::from_secs(5));
}

/// A stored snapshot: its id and the object that holds it.
struct Stored {
    id: i64,
    object: std::path::PathBuf,
}

/// A snapshot taken by the node's agent into the bucket (`objects`: the bucket's prefix on
/// the S3 server's disk), and every check of the module doc on it.
fn snapshot(node: &OneNode<'_>, objects: &Path) -> Stored {
    let name = node.cluster.to_string();
    let shown = node.exk8s(&["snapshots", "schedule", &name]);
    assert_eq!(shown, json!({"every_hours": 12, "retain": 14}));
    let set = node.exk8s(&[
        "snapshots",
        "schedule",
        &name,
        "--every-hours",
        "0",
        "--retain",
        "3",
    ]);
    assert_eq!(
        set,
        json!({"every_hours": 0, "retain": 3}),
        "only when asked"
    );
    // `--wait` follows the snapshot on the cluster's event stream until the agent's upload
    // ends it.
    let waited = std::thread::scope(|s| {
        let waiting = s.spawn(|| node.exk8s(&["snapshots", "create", &name, "--wait"]));
        exk8s_tests::procs::wait_until("the snapshot asked", Duration::from_secs(30), || {
            let listed = node.exk8s(&["snapshots", "list", &name]);
            listed[0]["state"] == "requested"
        });
        node.sync();
        waiting.join().unwrap()
    });
    let id = waited[0]["id"].as_i64().unwrap();
    assert_eq!(waited[0]["state"], "stored", "{waited}");
    let taken = node.machine.journal_grep(
        "exk8s-agent-sync.service",
        &format!("etcd snapshot {id} taken and uploaded"),
    );
    assert!(!taken.is_empty(), "the agent took snapshot {id}");
    let listed = node.exk8s(&["snapshots", "list", &name]);
    let stored = listed[0].clone();
    assert_eq!(
        (&stored["id"], &stored["state"]),
        (&json!(id), &json!("stored"))
    );
    assert_eq!(
        format!("v{}", stored["etcd_version"].as_str().unwrap()),
        ETCD_VERSION
    );
    // The agent's file is gone; the bucket holds only the sealed object.
    let leftovers: Vec<_> = std::fs::read_dir(node.machine.root.join("var/lib/exk8s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let object = std::fs::read_dir(objects.join(format!("clusters/{}/snapshots", node.cluster)))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{id}-")))
        })
        .expect("the snapshot's object");
    let sealed = std::fs::read(&object).unwrap();
    assert!(!sealed.windows(11).any(|w| w == b"snapshotted"));

    // What comes back is what etcd wrote (the CLI checks its digest against the recorded one).
    let file = node.dir.join("snapshot.db");
    let downloaded = node.stack.exk8s(
        node.dir,
        &[
            "snapshots",
            "download",
            &name,
            &id.to_string(),
            "-f",
            file.to_str().unwrap(),
        ],
    );
    assert!(
        downloaded.status.success(),
        "{}",
        String::from_utf8_lossy(&downloaded.stderr)
    );
    let content = std::fs::read(&file).unwrap();
    assert_eq!(content.len() as u64, stored["size_bytes"].as_u64().unwrap());
    let digest: String = Sha256::digest(&content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(digest, stored["sha256"].as_str().unwrap());
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let status = std::process::Command::new(etcd("etcdutl"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["revision"].as_i64().unwrap() >= stored["revision"].as_i64().unwrap(),
        "{status} {stored}"
    );
    served_by_a_restored_member(&file, &node.dir.join("restored"));
    Stored { id, object }
}

/// An etcd restored from `file` into `data` and run on the host's loopback serves the
/// ConfigMap written before the snapshot, and the Secret as the apiserver stored it:
/// encrypted.
fn served_by_a_restored_member(file: &Path, data: &Path) {
    let (client, peer) = (free_port(), free_port());
    let peer_url = format!("http://127.0.0.1:{peer}");
    let restored = std::process::Command::new(etcd("etcdutl"))
        .args(["snapshot", "restore"])
        .arg(file)
        .arg("--data-dir")
        .arg(data)
        .arg("--name=restored")
        .arg(format!("--initial-cluster=restored={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .output()
        .unwrap();
    assert!(restored.status.success(), "{restored:?}");
    let client_url = format!("http://127.0.0.1:{client}");
    let log = std::fs::File::create(data.with_extension("log")).unwrap();
    let member = Proc(
        std::process::Command::new(etcd("etcd"))
            .arg("--data-dir")
            .arg(data)
            .arg("--name=restored")
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let get = |key: &str| {
        std::process::Command::new(etcd("etcdctl"))
            .arg(format!("--endpoints={client_url}"))
            .args(["get", key, "--print-value-only"])
            .output()
            .unwrap()
            .stdout
    };
    wait_until("the restored member", Duration::from_secs(30), || {
        !get("/registry/configmaps/default/snapshotted").is_empty()
    });
    let secret = get("/registry/secrets/default/kept");
    assert!(
        secret.starts_with(b"k8s:enc:"),
        "the Secret is as the apiserver stored it: encrypted"
    );
    member.terminate(Duration::from_secs(10));
}

/// The module doc's in-place restore of snapshot `snapshot`; `token` was issued before it.
fn restore_in_place(node: &OneNode<'_>, snapshot: i64, token: &str) {
    let machine = &node.machine;
    // Written after it, and an informer's last resourceVersion.
    let after = hand(machine, "after.json", &config_maps("after", 100));
    admin(machine, &["create", "-f", &after]);
    let seen: Value = serde_json::from_str(&admin(
        machine,
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/default/configmaps?limit=1",
        ],
    ))
    .unwrap();
    let seen = seen["metadata"]["resourceVersion"].as_str().unwrap();

    // The disaster: etcd stopped, its data gone.
    machine.ok("systemctl", &["stop", "etcd.service"]);
    machine.ok("rm", &["-rf", "/var/lib/etcd"]);
    let (name, id) = (node.cluster.to_string(), snapshot.to_string());
    let unconfirmed = node.stack.exk8s(node.dir, &["restore", &name, &id]);
    assert_eq!(unconfirmed.status.code(), Some(2), "asks for --yes");
    // One step per sync: the static pods aside and etcd stopped; the data directory restored
    // and etcd started by systemd; etcd healthy, the pods back, the apiserver ready. `--wait`
    // follows it on the cluster's event stream meanwhile, saying each phase.
    let restore_of = || {
        operator(
            node.stack,
            "GET",
            &format!("/clusters/{}/restore", node.cluster),
        )
        .call()
        .unwrap()
        .into_json::<Value>()
        .unwrap()
    };
    let waited = std::thread::scope(|s| {
        let waiting = s.spawn(|| {
            let args = ["-o", "json", "restore", &name, &id, "--yes", "--wait"];
            node.stack.exk8s(node.dir, &args)
        });
        // (404 until the CLI has asked for it.)
        exk8s_tests::procs::wait_until("the restore started", Duration::from_secs(30), || {
            operator(
                node.stack,
                "GET",
                &format!("/clusters/{}/restore", node.cluster),
            )
            .call()
            .is_ok_and(|r| r.into_json::<Value>().is_ok_and(|v| v["phase"] == "stop"))
        });
        steps(node, &restore_of);
        waiting.join().unwrap()
    });
    assert!(
        waited.status.success(),
        "{}",
        String::from_utf8_lossy(&waited.stderr)
    );
    let shown: Value = serde_json::from_slice(&waited.stdout).unwrap();
    assert_eq!(shown["phase"], "done", "{shown}");
    let said = String::from_utf8_lossy(&waited.stderr);
    let phases: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("restore "))
        .filter_map(|l| l.split_once(": ").map(|(_, phase)| phase))
        .collect();
    assert_eq!(phases, ["stop", "restore", "start", "done"], "{said}");
    assert_eq!(restore_of()["phase"], "done");
    let compacted = machine.journal_grep(
        "exk8s-agent-sync.service",
        "mark-compacted|marked compacted",
    );
    assert!(
        !compacted.is_empty(),
        "{}",
        machine.journal("exk8s-agent-sync.service", 60)
    );
    assert_eq!(
        machine.ok("systemctl", &["is-active", "etcd.service"]),
        "active"
    );
    assert_eq!(admin(machine, &["get", "--raw", "/readyz"]), "ok");

    // What the snapshot held is back, and only that.
    assert_eq!(counted(machine, "before"), 1000);
    assert_eq!(counted(machine, "after"), 0);
    let password = admin(
        machine,
        &["get", "secret", "kept", "-o", "jsonpath={.data.password}"],
    );
    assert_eq!(password, "aHVudGVyMg==");
    let stored = etcdctl(
        machine,
        &node.ip,
        &[
            "get",
            "/registry/secrets/default/kept",
            "--print-value-only",
        ],
    );
    assert!(
        stored.stdout.starts_with(b"k8s:enc:"),
        "the Secret is still encrypted in etcd: {stored:?}"
    );

    // An informer's watch from after the snapshot ends at once instead of waiting for
    // revisions that will never come.
    let watch = format!(
        "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={seen}&timeoutSeconds=5"
    );
    let watched = super::day2::kubectl(machine, &["get", "--raw", &watch]);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&watched.stdout),
        String::from_utf8_lossy(&watched.stderr)
    );
    assert!(said.contains("too old resource version"), "{said}");

    // The token issued before the snapshot still authenticates.
    assert_eq!(
        node.whoami(token).as_deref(),
        Ok("system:serviceaccount:default:robot")
    );
}

/// The restore's three steps on the booted node, one sync each, checked between steps.
fn steps(node: &OneNode<'_>, restore_of: &dyn Fn() -> Value) {
    let machine = &node.machine;
    for step in ["stop", "restore", "start"] {
        node.sync();
        let done = machine.journal_grep("exk8s-agent-sync.service", &format!("{step} step done"));
        assert!(
            !done.is_empty(),
            "{step}: {}",
            machine.journal("exk8s-agent-sync.service", 60)
        );
        if step == "stop" {
            let manifest = machine
                .root
                .join("etc/kubernetes/manifests/kube-apiserver.yaml");
            assert!(!manifest.exists(), "the apiserver's manifest is put aside");
            assert_eq!(restore_of()["phase"], "restore");
        }
    }
}
