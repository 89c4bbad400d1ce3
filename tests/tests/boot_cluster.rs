//! A cluster boots for real: the dev stack's compute boots every VM it makes for a cluster's
//! control plane and a pool of workers (`exk8s-api dev --machines nspawn`) from the node image
//! baked for it, all at once under systemd, and each agent's boot unit runs `exk8s-agent run` at
//! `/` — one control-plane node and one worker with ECDSA keys, three and two with RSA keys. The
//! agents find their identity at the cloud's instance-metadata address and the control plane's
//! name in the cloud's DNS. In the first cluster the package mirror is away when the machines
//! first boot: every node reports its failed prerequisites and systemd's retry completes it once
//! the mirror is back, with no operator. Debian's packages come from that mirror through
//! `apt-get`, the kubelet and etcd as the artifact catalog pins them. On the control plane etcd
//! is started by systemd, the kubelet starts kube-apiserver, kube-controller-manager and
//! kube-scheduler as containers of the images the static pods name, pulled through the image's
//! mirror of registry.k8s.io (a real registry, `tests/src/registry.rs`), and the agent's kubectl
//! applies the bootstrap RBAC; every node is Ready and under no pressure. What the control plane
//! is — the operator's and the kubelets' identities and what they may do, service-account
//! tokens, Secrets encrypted at rest, the audit log, the aggregation layer, leader leases, one
//! etcd cluster of voters — is checked on both ([`control_plane`]), and so is what each node is:
//! its address, its block of the pod CIDR, its taints and its pool's labels, the kubelet's
//! serving certificate, a pod placed on a worker by label (and toleration) with its address
//! from that block, `kubectl logs` and `exec` ([`nodes`]).
//!
//! The addons: the three-member cluster runs flannel (`pod_network: flannel`), and its first
//! node completes — flannel and kube-proxy run on every node and CoreDNS's two replicas, from
//! the images the registry serves; workloads then reach each other across nodes through DNS
//! and Services ([`workloads`]), and a bounded selection of Kubernetes' conformance tests
//! passes ([`conformance`]). The first cluster runs the default,
//! Cilium, whose chart lives at quay.io, which nothing here reaches: its first node's addons
//! step fails for that one reason, the failure is reported and systemd tries the boot again,
//! resuming with the bundle it fetched.
//!
//! Day 2 on the three-member cluster ([`day2`]): a forced renewal of every certificate, every
//! node's sync unit started as its timer starts it, while the first machine samples every
//! apiserver's `/readyz` and sends a request through its node-local balancer and through the
//! HAProxy `docs/apiserver-endpoint.md` shows ([`haproxy`]) — never two apiservers down at
//! once, no request through either failed, each apiserver restarted, and every apiserver and
//! kubelet serving its new certificate; then the last member is stopped and started through the
//! compute API while the two others' apiservers answer every sample, and it comes back by
//! itself; then a minor upgrade whose images the registry cannot serve fails on its first
//! member, whose agent puts its files back, stops there and is rolled back
//! ([`failed_upgrade`]); then a minor Kubernetes upgrade (its preflight etcd snapshot stored, then etcd, the
//! kubelet and the static pods of the next release from the mirror and the registry, one
//! member at a time, sampled the same way; the pool replaced by workers booted at the new
//! release); then the last member's VM is destroyed behind exk8s's back and the API remediates
//! it with no operator call ([`remediation`]), and a fifth member's join whose etcd can never
//! start is abandoned at the API's deadline ([`abandoned_join`]), both sampled the same way.
//! Stopped, each machine's kubelet stops its pods before systemd would have to.
//!
//! A third cluster, one booted member with no pod network ([`one_node`]), takes a snapshot into
//! a bucket of a real S3 server, an in-place restore of it after its etcd's data is destroyed,
//! the rotation of its service-account key ([`sa_key`]), grows to three members, rotates its
//! cluster CA there (the exec credential plugin's kubeconfig working throughout:
//! [`ca_rotation`]) and shrinks back to one, with no request through its balancer or HAProxy
//! failing ([`scale`]), and gives its
//! snapshot to a new cluster founded from it ([`from_snapshot`]).
//!
//! A fourth runs the README's real local cluster as written ([`readme`]): `scripts/dev-cluster.sh`
//! and the commands after it, until kubectl lists both nodes Ready.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::Duration;

use exk8s_tests::bins::{KUBERNETES_VERSION, kubernetes};
use exk8s_tests::cluster::{found, operator, view};
use exk8s_tests::machine::Machine;
use exk8s_tests::site::{Site, nodes};
use exk8s_tests::timeline::{self, mark};
use serde_json::{Value, json};

#[path = "boot_cluster/abandoned_join.rs"]
mod abandoned_join;
#[path = "boot_cluster/ca_rotation.rs"]
mod ca_rotation;
#[path = "boot_cluster/cluster_api.rs"]
mod cluster_api;
#[path = "boot_cluster/conformance.rs"]
mod conformance;
#[path = "boot_cluster/control_plane.rs"]
mod control_plane;
#[path = "boot_cluster/day2.rs"]
mod day2;
#[path = "boot_cluster/failed_upgrade.rs"]
mod failed_upgrade;
#[path = "boot_cluster/from_snapshot.rs"]
mod from_snapshot;
#[path = "boot_cluster/haproxy.rs"]
mod haproxy;
#[path = "boot_cluster/lan.rs"]
mod lan;
#[path = "boot_cluster/nodes.rs"]
mod nodes;
#[path = "boot_cluster/one_node.rs"]
mod one_node;
#[path = "boot_cluster/readme.rs"]
mod readme;
#[path = "boot_cluster/remediation.rs"]
mod remediation;
#[path = "boot_cluster/replace.rs"]
mod replace;
#[path = "boot_cluster/sa_key.rs"]
mod sa_key;
#[path = "boot_cluster/sampler.rs"]
mod sampler;
#[path = "boot_cluster/scale.rs"]
mod scale;
#[path = "boot_cluster/workloads.rs"]
mod workloads;

/// The cluster's shape and where its machines live.
struct Shape {
    sim_cidr: &'static str,
    control_planes: usize,
    workers: usize,
    key_algorithm: &'static str,
    /// What `openssl x509 -text` names the certificates' key algorithm.
    public_key: &'static str,
    /// The package and artifact mirror is away when the machines first boot: every node's
    /// first boot fails in its prerequisites, is reported, and systemd's retry completes it.
    mirror_away_first: bool,
    /// The cluster's `pod_network`: Cilium's chart is out of reach here, so with `cilium` the
    /// first node's addons fail (and are retried); with `flannel` they complete and pods
    /// reach each other across nodes.
    pod_network: &'static str,
    /// The pool's workers are tainted (`dedicated=batch:NoSchedule`): the addons and the
    /// workloads of a cluster whose pods must run on them do without.
    tainted_pool: bool,
}

impl Shape {
    fn addons_complete(&self) -> bool {
        self.pod_network != "cilium"
    }
}

#[test]
fn one_control_plane_node_and_a_worker_boot_and_run_their_cluster() {
    let _timeline = timeline::begin("1+1");
    boot_and_check(&Shape {
        sim_cidr: "10.237.0.0/24",
        control_planes: 1,
        workers: 1,
        key_algorithm: "ecdsa-p256",
        public_key: "id-ecPublicKey",
        mirror_away_first: true,
        pod_network: "cilium",
        tainted_pool: true,
    });
}

#[test]
fn three_control_plane_nodes_and_two_workers_boot_and_run_their_cluster() {
    let _timeline = timeline::begin("3+2");
    boot_and_check(&Shape {
        sim_cidr: "10.236.0.0/24",
        control_planes: 3,
        workers: 2,
        key_algorithm: "rsa-2048",
        public_key: "rsaEncryption",
        mirror_away_first: false,
        pod_network: "flannel",
        tainted_pool: false,
    });
}

/// Named to start first (tests start in name order, two at a time here), beside the
/// one-member cluster: the three-member cluster starts once that one ends, so the two longest
/// run side by side.
#[test]
fn a_booted_node_takes_tokens_snapshots_a_restore_and_scales() {
    let _timeline = timeline::begin("one node");
    one_node::run();
}

/// Named to start last (tests start in name order, two at a time here): the shortest, it runs
/// beside the one-member cluster's long day 2 once the three-member cluster has started.
#[test]
fn with_the_readme_a_real_local_cluster_boots() {
    let _timeline = timeline::begin("README");
    readme::run();
}

fn boot_and_check(shape: &Shape) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mut site = Site::prepare(dir, shape.mirror_away_first);
    // The day-2 cluster's updates wait a shorter while for what they restart (its failed
    // upgrade waits that long for an apiserver that cannot start); its health pass runs every
    // two seconds on a clock the remediation moves.
    let clock = remediation::clock_file(dir);
    let clock = clock.to_str().unwrap();
    let (day2_flags, day2_env): (&[&str], &[(&str, &str)]) = if shape.control_planes == 3 {
        (
            &[
                "--update-wait-secs",
                failed_upgrade::UPDATE_WAIT_SECS,
                "--reconcile-interval-secs",
                "2",
                "--member-join-timeout-secs",
                abandoned_join::JOIN_TIMEOUT_SECS,
            ],
            &[(remediation::CLOCK_HOOK, clock)],
        )
    } else {
        (&[], &[])
    };
    let stack = site.start_stack(dir, shape.sim_cidr, day2_flags, day2_env);
    mark("the stack serves");
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": shape.control_planes, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1,
                "key_algorithm": shape.key_algorithm,
                "pod_network": shape.pod_network}),
    );
    let cluster = founded.cluster;
    assert_eq!(view(&stack, cluster)["pod_network"], shape.pod_network);
    let dns_name = founded.created["control_plane_dns_name"].as_str().unwrap();
    // The pool, asked for at once: its machines boot beside the control plane's.
    let pool_asked = nodes::Pool {
        labels: json!({"example.com/tier": "batch"}),
        taints: if shape.tainted_pool {
            json!([{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}])
        } else {
            json!([])
        },
    };
    let pool = operator(&stack, "POST", &format!("/clusters/{cluster}/node-pools")).send_json(
        json!({"name": "blue", "count": shape.workers, "instance_type": "dev.small",
               "image_id": 1, "subnet_id": 1, "labels": pool_asked.labels,
               "taints": pool_asked.taints, "max_surge": shape.workers}),
    );
    assert!(pool.is_ok(), "{pool:?}");
    let mut workers = Vec::new();
    exk8s_tests::procs::wait_until("the pool's workers", Duration::from_secs(60), || {
        workers = nodes(&stack, cluster)
            .iter()
            .filter(|n| n["role"] == "worker" && n["private_ipv4"].is_string())
            .map(|n| {
                (
                    n["vm_id"].as_i64().unwrap(),
                    n["private_ipv4"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        workers.len() == shape.workers
    });

    // Every VM boots as the compute API made it, control plane first; the cloud's DNS
    // answers the control plane's name in each.
    let mut vms: Vec<(i64, String, &str)> = founded
        .vms
        .iter()
        .map(|vm| (*vm, founded.ip_of[vm].clone(), "cp"))
        .collect();
    vms.extend(workers.iter().map(|(vm, ip)| (*vm, ip.clone(), "worker")));
    mark("founded; the machines boot");
    let mut machines: Vec<Machine> = vms
        .iter()
        .map(|(vm, ..)| Machine::of(&stack, *vm))
        .collect();
    for machine in &machines {
        machine.wait_booted();
        let hosts = std::fs::read_to_string(machine.root.join("etc/hosts")).unwrap();
        for vm in &founded.vms {
            let line = format!("{} {dns_name}", founded.ip_of[vm]);
            assert!(
                hosts.lines().any(|l| l == line),
                "{}: {line} in {hosts}",
                machine.name
            );
        }
    }
    if shape.mirror_away_first {
        // Nothing answers at the mirror: every first boot fails in its prerequisites and
        // says so; the mirror back, systemd's retry (30 s later) goes on without an operator.
        exk8s_tests::procs::wait_until(
            "every first boot's failure reported",
            Duration::from_secs(120),
            || {
                nodes(&stack, cluster)
                    .iter()
                    .all(|n| n["phase"] == "prereqs:failed")
            },
        );
        for machine in &machines {
            let journal = machine.journal("exk8s-agent.service", 100);
            assert!(journal.contains("phase prereqs: failed"), "{journal}");
        }
        site.mirror.start();
    }
    let (first, control_plane) = (&machines[0], &machines[..shape.control_planes]);

    if !shape.addons_complete() {
        // Everything up to the addons runs on the first node; Cilium's chart is at quay.io,
        // which no machine here reaches: the addons phase fails, says why, is reported, and
        // the boot is tried again. Every other node completes.
        let failed = "phase addons: failed";
        exk8s_tests::procs::wait_until("the first node's addons", Duration::from_secs(400), || {
            first.assert_up();
            first.journal("exk8s-agent.service", 400).contains(failed)
        });
        let journal = first.journal("exk8s-agent.service", 400);
        for step in [
            "phase etcd: succeeded",
            "phase apiserver: succeeded",
            "kubectl apply -f /etc/exk8s/manifests/rbac.yaml",
            // Every manifest is applied before the pod network's chart is waited for.
            "kubectl apply -f /etc/exk8s/manifests/kube-proxy.yaml",
            "kubectl apply -f /etc/exk8s/manifests/coredns.yaml",
            "helm upgrade --install cilium oci://quay.io/cilium/charts/cilium",
            "lookup quay.io",
        ] {
            assert!(journal.contains(step), "{step} in {journal}");
        }
        let agent = first.show("exk8s-agent.service", &["ActiveState"]);
        assert_eq!(agent, "ActiveState=activating", "tried again: {agent}");
    }
    // Every node completes its first boot (the first one too once its addons run).
    let completing = |n: &&Value| shape.addons_complete() || n["vm_id"] != vms[0].0;
    mark("waiting for every node's first boot");
    exk8s_tests::procs::wait_until("every node's first boot", Duration::from_secs(400), || {
        machines.iter().for_each(Machine::assert_up);
        let phases: Vec<Value> = nodes(&stack, cluster)
            .iter()
            .filter(completing)
            .map(|n| n["phase"].clone())
            .collect();
        let all = vms.len() - usize::from(!shape.addons_complete());
        phases.len() == all && phases.iter().all(|p| p == "complete")
    });
    let names: BTreeMap<i64, String> = nodes(&stack, cluster)
        .iter()
        .map(|n| {
            (
                n["vm_id"].as_i64().unwrap(),
                n["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let first_node = || {
        nodes(&stack, cluster)
            .into_iter()
            .find(|n| n["vm_id"] == vms[0].0)
            .unwrap()
    };
    let (phase, done) = if shape.addons_complete() {
        ("complete", 0)
    } else {
        ("addons:failed", 1)
    };
    if shape.addons_complete() {
        assert_eq!(first_node()["phase"], phase, "{}", first_node());
    } else {
        // Each retry reports its addons phase started, then failed again.
        exk8s_tests::procs::wait_until(
            "the first node's addons failed",
            Duration::from_secs(90),
            || {
                let node = first_node();
                assert!(
                    node["phase"].as_str().unwrap().starts_with("addons:"),
                    "{node}"
                );
                node["phase"] == phase
            },
        );
    }
    let retries = usize::from(shape.mirror_away_first);
    for machine in &machines[done..] {
        let agent = machine.show("exk8s-agent.service", &["Result", "NRestarts"]);
        assert_eq!(
            agent,
            format!("Result=success\nNRestarts={retries}"),
            "{}: {agent}",
            machine.name
        );
        assert!(machine.root.join("var/lib/exk8s/bootstrap.done").is_file());
    }
    for machine in &machines {
        assert!(
            !machine
                .root
                .join("var/lib/exk8s/recorded-actions.log")
                .exists(),
            "{}: nothing was recorded",
            machine.name
        );
    }

    // A worker's prerequisites are Debian's packages, installed by apt-get from the mirror;
    // the bundle's containerd configuration survived Debian's containerd package, whose
    // conffile it is; the kubelet is the one the catalog pins.
    let kubelet =
        exk8s_common::names::Sha256Digest::of(&std::fs::read(kubernetes("kubelet")).unwrap());
    for machine in &machines[shape.control_planes..] {
        for package in ["containerd", "runc", "conntrack", "socat"] {
            assert_eq!(
                machine.ok("dpkg-query", &["-W", "-f=${Status}", package]),
                "install ok installed",
                "{}: {package}",
                machine.name
            );
        }
        let containerd =
            std::fs::read_to_string(machine.root.join("etc/containerd/config.toml")).unwrap();
        assert!(
            containerd.contains("/etc/containerd/certs.d"),
            "the bundle's containerd configuration, not the package's: {containerd}"
        );
        let installed = std::fs::read(
            machine
                .root
                .join(format!("opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubelet")),
        )
        .unwrap();
        assert_eq!(exk8s_common::names::Sha256Digest::of(&installed), kubelet);
    }

    // systemd runs etcd, containerd and the kubelet; each kubelet runs its control plane as
    // containers of the images the static pods name, pulled through the registry mirror;
    // every certificate has the cluster's key algorithm.
    for (i, machine) in machines.iter().enumerate() {
        let units: &[&str] = if i < shape.control_planes {
            &["etcd.service", "containerd.service", "kubelet.service"]
        } else {
            &["containerd.service", "kubelet.service"]
        };
        for unit in units {
            let active = machine.ok("systemctl", &["is-active", unit]);
            assert_eq!(active, "active", "{}: {unit}", machine.name);
        }
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-text", "-in"])
            .arg(machine.root.join("etc/exk8s/pki/kubelet.pem"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&text.stdout);
        let algorithm = format!("Public Key Algorithm: {}", shape.public_key);
        assert!(text.contains(&algorithm), "{}: {text}", machine.name);
    }
    for machine in control_plane {
        let images = machine.ok("ctr", &["--namespace", "k8s.io", "containers", "list"]);
        for image in [
            format!("registry.k8s.io/kube-apiserver:{KUBERNETES_VERSION}"),
            format!("registry.k8s.io/kube-controller-manager:{KUBERNETES_VERSION}"),
            format!("registry.k8s.io/kube-scheduler:{KUBERNETES_VERSION}"),
            "registry.k8s.io/pause:3.10".to_owned(),
        ] {
            assert!(
                images.contains(&image),
                "{}: {image} in {images}",
                machine.name
            );
        }
    }

    // Through the API every node is Ready, each control-plane node runs its components, and
    // none is under pressure; no kubelet ever tried to reclaim anything (its eviction manager
    // has run a few times since: the addons step alone retries for 20 s).
    let kubectl = |args: &[&str]| {
        let kubectl = format!("/opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubectl");
        let mut all = vec!["--kubeconfig", "/etc/exk8s/kubeconfig/admin.kubeconfig"];
        all.extend_from_slice(args);
        first.ok(&kubectl, &all)
    };
    let ready = r#"{range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;
    let all_ready: BTreeSet<String> = names.values().map(|n| format!("{n}=True")).collect();
    mark("every first boot complete; waiting for every node Ready");
    // A node is Ready once its pod network is (its CIDR allocated, containerd's CNI
    // configuration written from it): about a minute after the first boot on an idle host, so
    // the bound leaves a loaded one room (the first node's failing chart pull no longer hides
    // that minute: it fails at once, its lookups refused).
    exk8s_tests::procs::wait_until("every node Ready", Duration::from_secs(300), || {
        let listed = kubectl(&["get", "nodes", "-o", &format!("jsonpath={ready}")]);
        listed.lines().map(str::to_owned).collect::<BTreeSet<_>>() == all_ready
    });
    // Each control-plane node's components as mirror pods (asked until they are: a mirror pod
    // made before its node was registered is deleted by the pod garbage collector as an
    // orphan, and its kubelet makes it again).
    let wanted: Vec<String> = vms[..shape.control_planes]
        .iter()
        .flat_map(|(vm, _, _)| {
            [
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
            ]
            .map(|component| format!("{component}-{}=Running", names[vm]))
        })
        .collect();
    let mut phases = String::new();
    exk8s_tests::procs::wait_until(
        "the control plane's mirror pods",
        Duration::from_secs(120),
        || {
            phases = kubectl(&[
                "get",
                "pods",
                "--namespace",
                "kube-system",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}"#,
            ]);
            wanted.iter().all(|line| phases.lines().any(|l| l == line))
        },
    );
    let members: Vec<(&Machine, &str)> = control_plane
        .iter()
        .zip(&vms)
        .map(|(machine, (_, ip, _))| (machine, ip.as_str()))
        .collect();
    let member_names: Vec<&str> = vms[..shape.control_planes]
        .iter()
        .map(|(vm, ..)| names[vm].as_str())
        .collect();
    mark("the control plane's checks");
    control_plane::check_control_plane(&stack, cluster, dns_name, &members, &member_names);
    let all: Vec<nodes::Node<'_>> = machines
        .iter()
        .zip(&vms)
        .map(|(machine, (vm, ip, _))| (machine, names[vm].as_str(), ip.as_str()))
        .collect();
    let (cp_nodes, worker_nodes) = all.split_at(shape.control_planes);
    mark("the nodes' checks");
    nodes::check_nodes(cp_nodes, worker_nodes, &pool_asked);
    if shape.addons_complete() {
        // The addons run: kube-proxy on every node, CoreDNS's two replicas, each from the
        // image the registry serves.
        let running = kubectl(&[
            "get",
            "pods",
            "--namespace",
            "kube-system",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.labels.k8s-app}={.status.phase}{"\n"}{end}"#,
        ]);
        let count = |line: &str| running.lines().filter(|l| *l == line).count();
        assert_eq!(count("kube-proxy=Running"), vms.len(), "{running}");
        assert_eq!(count("kube-dns=Running"), 2, "{running}");
        if shape.pod_network == "flannel" {
            assert_eq!(count("flannel=Running"), vms.len(), "{running}");
            let workers: Vec<(String, String, &Machine)> = vms[shape.control_planes..]
                .iter()
                .zip(&machines[shape.control_planes..])
                .map(|((vm, ip, _), machine)| (names[vm].clone(), ip.clone(), machine))
                .collect();
            mark("workloads");
            workloads::run_workloads(first, &workers);
            mark("conformance");
            conformance::run_conformance(first, dir);
        }
    } else {
        nodes::resumed_without_restarts(first, &names[&vms[0].0]);
    }
    let pressures = kubectl(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*]}{range .status.conditions[*]}{.type}={.status}{"\n"}{end}{end}"#,
    ]);
    for line in pressures.lines().filter(|l| l.contains("Pressure")) {
        assert!(line.ends_with("=False"), "{line} in {pressures}");
    }
    assert_eq!(
        pressures.lines().filter(|l| l.contains("Pressure")).count(),
        3 * vms.len()
    );
    for machine in &machines {
        let kubelet = machine.journal("kubelet.service", 5000);
        assert!(
            !kubelet.contains("Eviction manager: attempting to reclaim"),
            "{}: the kubelet found pressure: {kubelet}",
            machine.name
        );
    }
    if shape.control_planes == 3 {
        let vm_ips: Vec<(i64, String)> = vms.iter().map(|(vm, ip, _)| (*vm, ip.clone())).collect();
        mark("day 2");
        day2::day_two(
            &stack,
            cluster,
            dir,
            &mut site.registry,
            &mut machines,
            &vm_ips,
            &names,
        );
    }
    mark("powering off");
    nodes::power_off(machines);
}
