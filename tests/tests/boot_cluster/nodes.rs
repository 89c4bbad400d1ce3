//! What each booted node's kubelet is, checked through the API and on the machines: every Node
//! Ready at its rendered address; the controller-manager gives each its own block of the
//! cluster's pod CIDR (the one source of pod ranges); the control-plane nodes carry
//! Kubernetes' control-plane taint and the workers exactly their pool's labels and taints;
//! each kubelet serves the certificate its bundle carried; a pod placed on a worker by the
//! pool's label (and toleration) gets its address from that worker's block through the bridge
//! configuration containerd wrote from the rendered template; `kubectl logs` and `exec` reach
//! it through the apiserver's kubelet client certificate. At the end every machine is powered
//! off with its kubelet's shutdown lock held ([`power_off`]).

use std::time::Duration;

use exk8s_tests::machine::Machine;
use serde_json::{Value, json};

use super::day2::kubectl;

/// A node: its machine, Node name and address.
pub(crate) type Node<'a> = (&'a Machine, &'a str, &'a str);

/// What the workers' pool asked for: its labels and taints.
pub(crate) struct Pool {
    pub labels: Value,
    pub taints: Value,
}

/// The admin kubeconfig's `kubectl` on `machine`, which must succeed.
fn get(machine: &Machine, args: &[&str]) -> String {
    let out = kubectl(machine, args);
    assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first PEM block of `text`, whitespace removed.
pub(crate) fn first_pem(text: &str) -> String {
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("a certificate");
    let end = text[begin..].find("-----END CERTIFICATE-----").unwrap() + begin;
    text[begin..end].split_whitespace().collect()
}

/// Every check of the module doc, through the first control-plane node; the pod is placed on
/// the first worker.
pub(crate) fn check_nodes(control_plane: &[Node<'_>], workers: &[Node<'_>], pool: &Pool) {
    let first = control_plane[0].0;
    let node = |name: &str| -> Value {
        serde_json::from_str(&get(first, &["get", "node", name, "-o", "json"])).unwrap()
    };

    // The cluster's pod CIDR, as the controller-manager was told.
    let manifest = std::fs::read_to_string(
        first
            .root
            .join("etc/kubernetes/manifests/kube-controller-manager.yaml"),
    )
    .unwrap();
    let manifest: yaml_serde::Value = yaml_serde::from_str(&manifest).unwrap();
    let cluster_cidr: ipnet::Ipv4Net = manifest["spec"]["containers"][0]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .find_map(|arg| arg.as_str()?.strip_prefix("--cluster-cidr="))
        .expect("--cluster-cidr")
        .parse()
        .unwrap();

    let mut blocks = Vec::new();
    for (machine, name, ip) in control_plane.iter().chain(workers) {
        let object = node(name);
        let ready = object["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        assert!(ready, "{name}: {}", object["status"]);
        let addresses = object["status"]["addresses"].as_array().unwrap();
        assert!(
            addresses.contains(&json!({"type": "InternalIP", "address": ip})),
            "{name}: {addresses:?}"
        );
        let block: ipnet::Ipv4Net = object["spec"]["podCIDR"].as_str().unwrap().parse().unwrap();
        assert!(
            cluster_cidr.contains(&block) && block.prefix_len() > cluster_cidr.prefix_len(),
            "{name}: {block} in {cluster_cidr}"
        );
        assert!(!blocks.contains(&block), "{name}: {block} given twice");
        blocks.push(block);

        // The kubelet serves the certificate its bundle carried.
        let shown = first
            .on_lan("openssl")
            .args(["s_client", "-connect", &format!("{ip}:10250")])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let bundle =
            std::fs::read_to_string(machine.root.join("etc/exk8s/pki/kubelet.pem")).unwrap();
        assert_eq!(
            first_pem(&String::from_utf8_lossy(&shown.stdout)),
            first_pem(&bundle),
            "{name}: the kubelet serves its bundle's certificate"
        );
    }

    // The control-plane nodes keep workloads off with Kubernetes' own taint.
    for (_, name, _) in control_plane {
        let taints = node(name)["spec"]["taints"].clone();
        assert!(
            taints.as_array().unwrap().contains(
                &json!({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
            ),
            "{name}: {taints}"
        );
    }
    // Each worker carries exactly what its pool asked for (taints under node.kubernetes.io/
    // are the node lifecycle controller's).
    for (_, name, _) in workers {
        let object = node(name);
        let labels = &object["metadata"]["labels"];
        for (key, value) in pool.labels.as_object().unwrap() {
            assert_eq!(&labels[key], value, "{name}: {key} in {labels}");
        }
        assert_eq!(labels["kubernetes.io/hostname"], json!(name), "{labels}");
        let asked: Vec<Value> = object["spec"]["taints"]
            .as_array()
            .map(|taints| {
                taints
                    .iter()
                    .filter(|t| {
                        !t["key"]
                            .as_str()
                            .unwrap()
                            .starts_with("node.kubernetes.io/")
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(json!(asked), pool.taints, "{name}");
    }

    // A pod placed on the pool's first worker by its labels and the pool's taints tolerated.
    let (worker, worker_name, _) = workers[0];
    let tolerations: Vec<Value> = pool
        .taints
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!({"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}))
        .collect();
    let mut selector = pool.labels.clone();
    selector["kubernetes.io/hostname"] = json!(worker_name);
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeSelector": selector,
            "tolerations": tolerations,
            "containers": [{"name": "hello",
                "image": "registry.k8s.io/e2e-test-images/busybox:1.37.0-1",
                "command": ["/bin/sh", "-c", "echo hello from $(hostname); exec sleep 3600"]}]}});
    let dir = first.root.join("var/tmp/exk8s-checks");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("hello.json"), pod.to_string()).unwrap();
    get(first, &["apply", "-f", "/var/tmp/exk8s-checks/hello.json"]);
    std::fs::remove_dir_all(&dir).unwrap();
    get(
        first,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/hello",
            "--timeout=120s",
        ],
    );
    let running: Value =
        serde_json::from_str(&get(first, &["get", "pod", "hello", "-o", "json"])).unwrap();
    assert_eq!(running["spec"]["nodeName"], json!(worker_name));
    // containerd wrote the bridge configuration from the rendered template with the block the
    // controller-manager gave the worker's Node: the pod's address is in it.
    let conflist =
        std::fs::read_to_string(worker.root.join("etc/cni/net.d/10-containerd-net.conflist"))
            .unwrap();
    let conflist: Value = serde_json::from_str(&conflist).unwrap();
    let block = node(worker_name)["spec"]["podCIDR"].clone();
    assert_eq!(
        conflist["plugins"][0]["ipam"]["ranges"],
        json!([[{"subnet": block}]])
    );
    let block: ipnet::Ipv4Net = block.as_str().unwrap().parse().unwrap();
    let pod_ip: std::net::Ipv4Addr = running["status"]["podIP"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(block.contains(&pod_ip), "{pod_ip} in {block}");

    // logs and exec: the apiserver reaches the worker's kubelet with its client certificate.
    assert_eq!(get(first, &["logs", "hello"]), "hello from hello\n");
    assert_eq!(
        get(first, &["exec", "hello", "--", "echo", "exec works"]),
        "exec works\n"
    );
    get(first, &["delete", "pod", "hello", "--wait=false"]);
}

/// Powers every machine off through the compute API, all at once. Each kubelet holds the
/// machine's shutdown (a logind delay lock) to stop its pods first (without it two of a
/// control-plane node's scopes waited out systemd's 90 s stop timeout); a container that
/// ignores SIGTERM (the workload check's `hello`, deleted just before, whose SIGKILL comes
/// as the kubelet's grace period ends) is then stopped by systemd within the bundle's 5 s
/// (`cri-containerd-.scope.d`): no unit waits toward systemd's default 90 s. (A retried
/// first boot restarts the kubelet, which takes its lock again: asked until it holds it.)
pub(crate) fn power_off(machines: Vec<Machine>) {
    // A unit that merely takes a few seconds to end is no defect: an etcd leader hands its
    // leadership over on SIGTERM for up to its request timeout (about 7 s; seen at 6 s when
    // every member powers off at once). A unit held toward the 90 s default waits far longer.
    const HELD: Duration = Duration::from_secs(30);
    for machine in &machines {
        exk8s_tests::procs::wait_until(
            "the kubelet's shutdown lock",
            Duration::from_secs(60),
            || {
                let locks = machine.ok("systemd-inhibit", &["--list", "--no-legend"]);
                locks.lines().any(|l| {
                    l.starts_with("kubelet ") && l.contains("shutdown") && l.ends_with("delay")
                })
            },
        );
    }
    std::thread::scope(|s| {
        for machine in machines {
            s.spawn(move || {
                let (console, name) = (machine.console.clone(), machine.name.clone());
                machine.stop();
                let console = std::fs::read_to_string(console).unwrap();
                let waits = exk8s_tests::console::stop_waits(&console).unwrap();
                let held: Vec<_> = waits.iter().filter(|(w, _)| *w >= HELD).collect();
                assert!(
                    held.is_empty(),
                    "{name}: systemd waited on a unit toward its 90 s stop timeout: {held:?}"
                );
            });
        }
    });
}

/// The first node (`first`, named `name`) whose boot is tried again while its addons fail:
/// each attempt resumes with the bundle the first one fetched, so its files stay as they were
/// and the kubelet never restarts the control plane (a fresh bundle's new certificates would
/// change them all).
pub(crate) fn resumed_without_restarts(first: &Machine, name: &str) {
    exk8s_tests::procs::wait_until("a resumed attempt", Duration::from_secs(120), || {
        first
            .journal_grep("exk8s-agent.service", "resuming with the bundle")
            .contains("resuming with the bundle a failed attempt fetched")
    });
    let restarts = kubectl(
        first,
        &[
            "get",
            "pods",
            "--namespace",
            "kube-system",
            "--field-selector",
            &format!("spec.nodeName={name}"),
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount}{"\n"}{end}"#,
        ],
    );
    assert!(restarts.status.success(), "{restarts:?}");
    let restarts = String::from_utf8_lossy(&restarts.stdout);
    // The control plane's three static pods (kube-proxy and CoreDNS, applied before the
    // pod network's failing step, are on the node too).
    let static_pods: Vec<&str> = restarts
        .lines()
        .filter(|l| {
            [
                "kube-apiserver-",
                "kube-controller-manager-",
                "kube-scheduler-",
            ]
            .iter()
            .any(|pod| l.starts_with(pod))
        })
        .collect();
    assert_eq!(static_pods.len(), 3, "{restarts}");
    for line in static_pods {
        assert!(
            line.ends_with("=0"),
            "restarted by a retried boot: {restarts}"
        );
    }
}
