//! Day 2 on a booted three-member cluster ([`day_two`]): a forced renewal of every certificate,
//! each node's sync unit started as its timer starts it, a reboot, a minor Kubernetes upgrade
//! (after a failed one: [`super::failed_upgrade`]), a lost member remediated
//! ([`super::remediation`]) and a join abandoned ([`super::abandoned_join`]) — each while the
//! first machine samples the apiservers' `/readyz` and requests through the balancers and
//! HAProxy ([`super::haproxy`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::bins::{
    ETCD_VERSION, KUBERNETES_VERSION, NEXT_ETCD_VERSION, NEXT_KUBERNETES_VERSION,
};
use exk8s_tests::cluster::{operator, operator_kubeconfig, view};
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use exk8s_tests::timeline::mark;
use serde_json::{Value, json};

use super::control_plane::{hand, kubectl_with};
use super::nodes;
use super::sampler::{assert_all_ok, assert_two_ready, etcd_status_as, sampling};

/// The module doc's changes, in that order, on the cluster whose nodes are `vms` (id and
/// address, the three members first) booted as `machines`, named `names`; the stack's clock
/// hook file is in `dir`. `machines` then holds the machines that run at the end.
pub(crate) fn day_two(
    stack: &Stack,
    cluster: i64,
    dir: &std::path::Path,
    registry: &mut exk8s_tests::registry::Registry,
    machines: &mut Vec<Machine>,
    vms: &[(i64, String)],
    names: &BTreeMap<i64, String>,
) {
    let cp: Vec<(String, String)> = vms[..3]
        .iter()
        .map(|(vm, ip)| (ip.clone(), names[vm].clone()))
        .collect();
    let addresses: Vec<String> = vms.iter().map(|(_, ip)| ip.clone()).collect();
    let members: Vec<String> = cp.iter().map(|(ip, _)| ip.clone()).collect();
    let ca = super::haproxy::trust_file(stack, cluster, dir);
    let outside = super::haproxy::Haproxy::listing(&machines[0], &members, &ca, dir);
    mark("day 2: renewal");
    renew(stack, cluster, machines, &addresses, &cp);
    mark("day 2: a member stopped and started");
    reboot_the_last_member(stack, machines, vms, names);
    mark("day 2: a failed upgrade");
    super::failed_upgrade::fail_and_roll_back(stack, cluster, registry, machines, &cp);
    mark("day 2: a minor upgrade");
    upgrade(stack, cluster, machines, &cp);
    mark("day 2: remediation of a lost member");
    super::remediation::remediate_a_lost_member(stack, cluster, dir, machines, &cp);
    let members: Vec<String> = exk8s_tests::site::nodes(stack, cluster)
        .iter()
        .filter(|n| n["role"] == "control-plane")
        .map(|n| n["private_ipv4"].as_str().unwrap().to_owned())
        .collect();
    mark("day 2: an abandoned join");
    super::abandoned_join::abandon_a_join(stack, cluster, dir, machines, &members);
    drop(outside);
}

/// `kubectl` on `machine` with its admin kubeconfig (the kubectl of the release the node was
/// founded at, which stays beside a newer one).
pub(crate) fn kubectl(machine: &Machine, args: &[&str]) -> std::process::Output {
    let kubectl = format!("/opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubectl");
    let mut all = vec!["--kubeconfig", "/etc/exk8s/kubeconfig/admin.kubeconfig"];
    all.extend_from_slice(args);
    machine.run(&kubectl, &all)
}

/// Each control-plane node's running kube-apiserver container: when it started.
fn apiserver_starts(sampler: &Machine, names: &[&String]) -> BTreeMap<String, String> {
    names
        .iter()
        .map(|name| {
            let pod = format!("kube-apiserver-{name}");
            let started = r"jsonpath={.status.containerStatuses[0].state.running.startedAt}";
            let out = kubectl(
                sampler,
                &[
                    "get",
                    "pod",
                    "--namespace",
                    "kube-system",
                    &pod,
                    "-o",
                    started,
                ],
            );
            let started = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            ((*name).clone(), started)
        })
        .collect()
}

/// The certificate `ip:port` serves to `sampler`'s LAN (its PEM, whitespace dropped), asked
/// until it answers (a kubelet the sync restarted last may still be starting).
fn served(sampler: &Machine, ip: &str, port: u16) -> String {
    let mut pem = String::new();
    let what = format!("the certificate {ip}:{port} serves");
    exk8s_tests::procs::wait_until(&what, Duration::from_secs(60), || {
        let shown = sampler
            .on_lan("openssl")
            .args(["s_client", "-connect", &format!("{ip}:{port}")])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&shown.stdout);
        if text.contains("-----BEGIN CERTIFICATE-----") {
            pem = nodes::first_pem(&text);
        }
        !pem.is_empty()
    });
    pem
}

/// What every node serves: each apiserver's certificate (the members at `cp`) and each
/// kubelet's (every machine, at `ips`).
fn serving(sampler: &Machine, ips: &[String], cp: &[(String, String)]) -> Vec<String> {
    let mut certs: Vec<String> = cp.iter().map(|(ip, _)| served(sampler, ip, 6443)).collect();
    certs.extend(ips.iter().map(|ip| served(sampler, ip, 10250)));
    certs
}

/// A forced renewal on booted machines (`POST …/certificates/renew`): every node's sync unit
/// started (what its timer runs) over and over, all at once, until every node has applied its
/// new generation. The API hands one control-plane node at a time its bundle while the others
/// are healthy: in every round of samples the first machine took meanwhile, at least two of
/// the three apiservers answered `ok` and every request through its node-local balancer, every
/// other node's and HAProxy was answered, its balancer's own restart included; every apiserver was restarted, and every
/// apiserver, etcd member and kubelet serves a new certificate — the one its bundle now
/// carries — and a client holding the etcd health-check identity from before is still answered
/// by every member; the operator kubeconfig minted after it works. `addresses` are the
/// machines' own, in their order.
fn renew(
    stack: &Stack,
    cluster: i64,
    machines: &[Machine],
    addresses: &[String],
    cp: &[(String, String)],
) {
    let (sampler, ips) = (
        &machines[0],
        cp.iter().map(|(ip, _)| ip.clone()).collect::<Vec<_>>(),
    );
    let names: Vec<&String> = cp.iter().map(|(_, name)| name).collect();
    let before = apiserver_starts(sampler, &names);
    assert!(before.values().all(|s| !s.is_empty()), "{before:?}");
    let certs_before = serving(sampler, addresses, cp);
    let etcd_before: Vec<String> = ips.iter().map(|ip| served(sampler, ip, 2379)).collect();
    // A client that keeps the health-check identity the first node holds now.
    let kept = tempfile::tempdir().unwrap();
    for file in [
        "etcd-ca.pem",
        "etcd-healthcheck-client.pem",
        "etcd-healthcheck-client-key.pem",
    ] {
        std::fs::copy(
            sampler.root.join("etc/exk8s/pki").join(file),
            kept.path().join(file),
        )
        .unwrap();
    }
    let started = operator(
        stack,
        "POST",
        &format!("/clusters/{cluster}/certificates/renew"),
    )
    .call();
    assert!(started.is_ok(), "{started:?}");
    let ((), rounds) = sampling(sampler, &ips, machines, || {
        // The sampler's balancer restarted first: its socket stays, so nothing is refused.
        std::thread::sleep(Duration::from_secs(2));
        sampler.ok(
            "systemctl",
            &["restart", "exk8s-apiserver-balancer.service"],
        );
        syncing(machines, || {
            nodes(stack, cluster)
                .iter()
                .all(|n| n["up_to_date"] == true)
        });
    });
    assert_two_ready("renewal", &rounds);
    let balancer = sampler.journal("exk8s-apiserver-balancer.service", 400);
    assert!(
        balancer
            .matches("listening on 127.0.0.1:7445 (systemd's socket)")
            .count()
            >= 2,
        "restarted on systemd's socket: {balancer}"
    );
    for machine in machines {
        let sync = machine.show("exk8s-agent-sync.service", &["Result"]);
        assert_eq!(sync, "Result=success", "{}", machine.name);
    }
    exk8s_tests::procs::wait_until("every apiserver restarted", Duration::from_secs(60), || {
        let after = apiserver_starts(sampler, &names);
        before
            .iter()
            .all(|(name, started)| !after[name].is_empty() && after[name] != *started)
    });
    let certs_after = serving(sampler, addresses, cp);
    for (i, (old, new)) in certs_before.iter().zip(&certs_after).enumerate() {
        assert_ne!(
            old, new,
            "endpoint {i} serves the certificate it served before"
        );
    }
    for (i, machine) in machines.iter().enumerate() {
        let pem = |file: &str| {
            nodes::first_pem(&std::fs::read_to_string(machine.root.join(file)).unwrap())
        };
        let kubelet = &certs_after[cp.len() + i];
        assert_eq!(
            *kubelet,
            pem("etc/exk8s/pki/kubelet.pem"),
            "{}",
            machine.name
        );
        if i < cp.len() {
            assert_eq!(
                certs_after[i],
                pem("etc/exk8s/pki/apiserver.pem"),
                "{}",
                machine.name
            );
            // Each etcd member serves its renewed certificate, and a client still holding the
            // identity from before the renewal (the same CA's) is answered by every member.
            let etcd_now = served(sampler, &ips[i], 2379);
            assert_ne!(
                etcd_now, etcd_before[i],
                "{}: etcd's certificate",
                machine.name
            );
            assert_eq!(
                etcd_now,
                pem("etc/exk8s/pki/etcd-server.pem"),
                "{}",
                machine.name
            );
            let status = etcd_status_as(sampler, kept.path(), &ips[i]);
            assert!(
                status.is_ok(),
                "{}: the identity from before: {status:?}",
                machine.name
            );
        }
    }
    let healthcheck =
        |dir: &std::path::Path| std::fs::read(dir.join("etcd-healthcheck-client.pem")).unwrap();
    assert_ne!(
        healthcheck(&sampler.root.join("etc/exk8s/pki")),
        healthcheck(kept.path()),
        "the health-check identity was not renewed"
    );
    // The operator kubeconfig minted now verifies the renewed apiserver, which takes it.
    let fresh = hand(
        sampler,
        "operator-renewed.kubeconfig",
        &operator_kubeconfig(stack, cluster),
    );
    let api = kubectl_with(sampler, &fresh, &["get", "--raw", "/api"]);
    assert!(
        api.as_deref().is_ok_and(|a| a.contains("APIVersions")),
        "{api:?}"
    );
}

/// Starts every machine's sync unit (what its timer runs) over and over, all at once, until
/// `done` says the change is over.
pub(crate) fn syncing(machines: &[Machine], done: impl Fn() -> bool) {
    let synced = AtomicBool::new(false);
    std::thread::scope(|s| {
        for machine in machines {
            let synced = &synced;
            s.spawn(move || {
                while !synced.load(Ordering::Relaxed) {
                    machine.assert_up();
                    let _ = machine.run("systemctl", &["start", "exk8s-agent-sync.service"]);
                    // A "wait" answer ends the unit at once: a few seconds apart, as systemd's
                    // start limit (5 in 10 s) allows.
                    std::thread::sleep(Duration::from_secs(3));
                }
            });
        }
        let _synced = exk8s_tests::procs::SetOnDrop(&synced);
        exk8s_tests::procs::wait_until("the change", Duration::from_secs(900), &done);
    });
}

/// A minor upgrade on booted machines (`PATCH /clusters/{id}`; its preflight snapshot taken by a
/// member's agent from its etcd and stored): the control-plane members' sync units started
/// over and over while the first machine samples every apiserver's `/readyz` (never two down
/// in one round); each member takes the release's etcd, kubelet and static pods from the
/// mirror and the registry. The pool follows on its own: a new worker per old one (all at
/// once: the pool's `max_surge` is its size), booted from the image at the new release, the old
/// ones drained by the first member's agent and their VMs deleted. At the end every apiserver
/// and every kubelet runs the new release, every node is Ready, and the kubelets run the static
/// pods under the UIDs their manifests name. `machines` then holds the new workers in the old
/// ones' place.
fn upgrade(stack: &Stack, cluster: i64, machines: &mut Vec<Machine>, cp: &[(String, String)]) {
    let ips: Vec<String> = cp.iter().map(|(ip, _)| ip.clone()).collect();
    let old_workers: Vec<i64> = machines[cp.len()..].iter().map(|m| m.vm).collect();
    let count = machines.len();
    // Written before, read after through another member.
    let written = kubectl(
        &machines[0],
        &[
            "create",
            "configmap",
            "before-upgrade",
            "--from-literal=kept=yes",
        ],
    );
    assert!(written.status.success(), "{written:?}");
    let patched = operator(stack, "PATCH", &format!("/clusters/{cluster}"))
        .send_json(json!({"kubernetes_version": NEXT_KUBERNETES_VERSION}));
    let patched: Value = patched.unwrap().into_json().unwrap();
    assert_eq!(patched["upgrade"], "upgrading", "{patched}");
    let snapshot = patched["snapshot_id"].as_i64().expect("a snapshot first");
    let upgraded = || {
        let all = nodes(stack, cluster);
        view(stack, cluster)["version"] == NEXT_KUBERNETES_VERSION
            && all.len() == count
            && all.iter().all(|n| {
                n["up_to_date"] == true
                    && n["kubernetes_version"] == NEXT_KUBERNETES_VERSION
                    && !old_workers.contains(&n["vm_id"].as_i64().unwrap())
            })
    };
    let ((), rounds) = sampling(&machines[0], &ips, &machines[..cp.len()], || {
        syncing(&machines[..cp.len()], upgraded);
    });
    assert_two_ready("upgrade", &rounds);
    // The preflight snapshot: taken by a member's agent from its etcd, at the old release's
    // etcd (the API hands no member the new release before it is stored).
    let stored: Value = operator(
        stack,
        "GET",
        &format!("/clusters/{cluster}/snapshots/{snapshot}"),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap();
    assert_eq!(
        (
            &stored["state"],
            &stored["trigger"],
            &stored["etcd_version"]
        ),
        (
            &json!("stored"),
            &json!("upgrade"),
            &json!(ETCD_VERSION.trim_start_matches('v'))
        ),
        "{stored}"
    );

    // The new workers' machines, in the old ones' place.
    machines.truncate(cp.len());
    for node in nodes(stack, cluster)
        .iter()
        .filter(|n| n["role"] == "worker")
    {
        let machine = Machine::of(stack, node["vm_id"].as_i64().unwrap());
        machine.wait_booted();
        machines.push(machine);
    }
    let sampler = &machines[0];
    for ((ip, name), machine) in cp.iter().zip(&machines[..cp.len()]) {
        let release = super::failed_upgrade::apiserver_release(sampler, ip);
        assert_eq!(release, NEXT_KUBERNETES_VERSION, "{name}");
        // Each member's etcd moved to the release's etcd with it.
        let etcd = super::failed_upgrade::etcd_release(machine, ip);
        assert_eq!(etcd, NEXT_ETCD_VERSION, "{name}");
    }
    let last = format!("--server=https://{}:6443", cp[cp.len() - 1].0);
    let kept = kubectl(
        sampler,
        &[
            &last,
            "get",
            "configmap",
            "before-upgrade",
            "-o",
            "jsonpath={.data.kept}",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&kept.stdout), "yes", "{kept:?}");
    let kubelets = r#"jsonpath={range .items[*]}{.status.nodeInfo.kubeletVersion}/{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}"#;
    let ready = format!("{NEXT_KUBERNETES_VERSION}/True");
    exk8s_tests::procs::wait_until(
        "every node Ready at the new release",
        Duration::from_secs(120),
        || {
            let out = kubectl(sampler, &["get", "nodes", "-o", kubelets]);
            let listed = String::from_utf8_lossy(&out.stdout).into_owned();
            listed.lines().count() == count && listed.lines().all(|l| l == ready)
        },
    );
    for (machine, (_, name)) in machines.iter().zip(cp) {
        for unit in ["etcd.service", "containerd.service", "kubelet.service"] {
            let active = machine.ok("systemctl", &["is-active", unit]);
            assert_eq!(active, "active", "{}: {unit}", machine.name);
        }
        // The kubelet runs each static pod under the UID its manifest names (the new kubelet
        // would otherwise have made its own and replaced the pods once more).
        for component in [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            let manifest = machine
                .root
                .join(format!("etc/kubernetes/manifests/{component}.yaml"));
            let manifest: yaml_serde::Value =
                yaml_serde::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
            let hash = r"jsonpath={.metadata.annotations.kubernetes\.io/config\.hash}";
            let pod = format!("{component}-{name}");
            let out = kubectl(
                sampler,
                &["get", "pod", "--namespace", "kube-system", &pod, "-o", hash],
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                manifest["metadata"]["uid"].as_str().unwrap(),
                "{pod}"
            );
        }
        let images = machine.ok("ctr", &["--namespace", "k8s.io", "containers", "list"]);
        let image = format!("registry.k8s.io/kube-apiserver:{NEXT_KUBERNETES_VERSION}");
        assert!(
            images.contains(&image),
            "{}: {image} in {images}",
            machine.name
        );
    }
}

/// Reboots the last control-plane member (machine 2, a joiner that completed) while the
/// first machine asks the two others' apiservers for `/readyz` every few hundred
/// milliseconds, and every other node sends `GET /version` through its node-local balancer:
/// every answer is `ok`. Booted again from its disk, its boot unit finds
/// `bootstrap.done` and syncs, etcd, containerd and the kubelet come back, and its node is
/// Ready again.
fn reboot_the_last_member(
    stack: &Stack,
    machines: &mut Vec<Machine>,
    vms: &[(i64, String)],
    names: &BTreeMap<i64, String>,
) {
    let rebooted = machines.remove(2);
    let vm = rebooted.vm;
    let others: Vec<String> = vms[..2].iter().map(|(_, ip)| ip.clone()).collect();
    let sampler = &machines[0];
    let (again, rounds) = sampling(sampler, &others, machines, || {
        rebooted.stop();
        let again = Machine::start(stack, vm);
        again.wait_booted();
        exk8s_tests::procs::wait_until(
            "the rebooted member's agent",
            Duration::from_secs(300),
            || {
                let Ok(agent) = again.try_show("exk8s-agent.service", &["ActiveState", "Result"])
                else {
                    again.assert_up();
                    return false;
                };
                assert!(
                    !agent.contains("Result=exit-code"),
                    "the agent failed after the reboot: {}",
                    again.journal("exk8s-agent.service", 40)
                );
                agent.contains("ActiveState=active")
            },
        );
        let name = &names[&vms[2].0];
        exk8s_tests::procs::wait_until("the rebooted node Ready", Duration::from_secs(120), || {
            let ready = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
            let out = kubectl(sampler, &["get", "node", name, "-o", ready]);
            String::from_utf8_lossy(&out.stdout).trim() == "True"
        });
        again
    });
    assert_all_ok("a member's reboot", &rounds);
    let journal = again.journal("exk8s-agent.service", 200);
    assert!(
        journal.contains("bootstrap.done") || journal.contains("sync"),
        "{journal}"
    );
    for unit in ["etcd.service", "containerd.service", "kubelet.service"] {
        assert_eq!(
            again.ok("systemctl", &["is-active", unit]),
            "active",
            "{unit}"
        );
    }
    machines.insert(2, again);
}
