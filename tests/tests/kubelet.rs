//! The kubelet, for real: a cluster founded on the dev stack with one control-plane node and a
//! worker pool of one (labels and a taint asked for), both booted by the real agent. The control
//! plane runs from its bundle as in `control_plane.rs`; then each node's real kubelet runs from
//! its rendered unit and configuration against Debian's containerd, runc and CNI plugins
//! (`exk8s_tests::kubelet`). It proves: both Nodes register and become Ready with the rendered
//! addresses, the worker with the pool's labels and taint, the control-plane node with
//! `node-role.kubernetes.io/control-plane:NoSchedule`; the kubelet serves the certificate
//! its bundle carried; the control-plane node's kubelet accepts every rendered static-pod
//! manifest (their mirror pods appear); the scheduler places a pod on the worker by the pool's
//! label and toleration; the controller-manager gives each Node its block of the pod CIDR and
//! containerd writes the rendered bridge template with it, so the pod's address is in the
//! worker's block; and `kubectl logs` and `exec` reach it through the apiserver's kubelet client certificate.
//! Then the control plane is upgraded to the next minor: its kubelet, restarted from its new unit
//! at the new release, re-registers its Node at it, while the worker stays at its release (the
//! skew policy allows it). The pool's replacement at the new release, with real kubelets and a
//! real drain, is `control_plane_upgrade.rs`'s, on three members under the availability sampler.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::time::Duration;

use exk8s_tests::bins::{KUBERNETES_VERSION, NEXT_KUBERNETES_VERSION};
use exk8s_tests::cluster::{agent_ok, found, operator};
use exk8s_tests::control_plane::{Node, STATIC_PODS, kubectl, kubectl_until};
use exk8s_tests::dev::start_dev;
use exk8s_tests::kubelet::{BUSYBOX, Runtime};
use exk8s_tests::netns::Lan;
use exk8s_tests::procs::wait_until;
use exk8s_tests::workers::{kubelet_flag, pool_view, pool_workers};
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(180);

/// The first PEM block of `text`, whitespace removed.
fn first_pem(text: &str) -> String {
    let begin = text
        .find("-----BEGIN CERTIFICATE-----")
        .expect("a certificate");
    let end = text[begin..].find("-----END CERTIFICATE-----").unwrap() + begin;
    text[begin..end].split_whitespace().collect()
}

#[test]
fn each_nodes_kubelet_runs_from_its_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = start_dev(
        &dir.join("dev"),
        "10.219.0.0/24",
        &dir.join("api.log"),
        &["--kubernetes-versions", "v1.35.3,v1.36.3"],
    );
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let cp_vm = founded.vms[0];
    let cp_root = dir.join(format!("vm-{cp_vm}"));
    agent_ok(&stack, &founded, &cp_root, cp_vm, "run");

    let cluster = founded.cluster;
    let created: Value = operator(&stack, "POST", &format!("/clusters/{cluster}/node-pools"))
        .send_json(
            json!({"name": "blue", "count": 1, "instance_type": "dev.small",
            "image_id": 1, "subnet_id": 1,
            "labels": {"node.kubernetes.io/pool": "blue", "example.com/tier": "batch"},
            "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}]}),
        )
        .unwrap()
        .into_json()
        .unwrap();
    let pool = created["id"].as_i64().unwrap();
    let mut worker_vm = None;
    wait_until("the pool's worker", Duration::from_secs(60), || {
        worker_vm = pool_workers(&pool_view(&stack, cluster, pool))
            .first()
            .map(|(vm, _)| *vm);
        worker_vm.is_some()
    });
    let worker_vm = worker_vm.unwrap();
    let worker_root = dir.join(format!("worker-{worker_vm}"));
    agent_ok(&stack, &founded, &worker_root, worker_vm, "run");

    let cp_ip = kubelet_flag(&cp_root, "node-ip");
    let worker_ip = kubelet_flag(&worker_root, "node-ip");
    let cp_name = kubelet_flag(&cp_root, "hostname-override");
    let worker_name = kubelet_flag(&worker_root, "hostname-override");
    let dns_name = founded.created["control_plane_dns_name"]
        .as_str()
        .unwrap()
        .to_owned();
    let lan = Lan::new(&[&cp_ip, &worker_ip], 24, &format!("{cp_ip} {dns_name}\n"));

    // The control plane, as control_plane.rs proves it, with the first node's addons.
    let mut node = Node::new(&cp_root, 0);
    node.start_etcd(&lan);
    node.sync_static_pods(&lan);
    let kubeconfig = |name: &str| cp_root.join("etc/exk8s/kubeconfig").join(name);
    let (super_admin, admin) = (
        kubeconfig("super-admin.kubeconfig"),
        kubeconfig("admin.kubeconfig"),
    );
    for (config, manifest) in [
        (&super_admin, "rbac.yaml"),
        (&admin, "coredns.yaml"),
        (&admin, "kube-proxy.yaml"),
    ] {
        let file = cp_root.join("etc/exk8s/manifests").join(manifest);
        kubectl_until(
            &lan,
            &mut [&mut node],
            0,
            config,
            &[
                "apply",
                "--server-side",
                "--field-manager=exk8s",
                "-f",
                &file.display().to_string(),
            ],
            READY,
        );
    }

    let mut runtimes = vec![
        Runtime::start(&lan, 0, &cp_root),
        Runtime::start(&lan, 1, &worker_root),
    ];
    let mut get = |args: &[&str]| {
        let start = std::time::Instant::now();
        loop {
            let (ok, out, err) = kubectl(&lan, 0, &admin, args);
            if ok {
                return out;
            }
            node.assert_running();
            runtimes.iter_mut().for_each(Runtime::assert_running);
            assert!(start.elapsed() < READY, "kubectl {}: {err}", args.join(" "));
            std::thread::sleep(Duration::from_millis(500));
        }
    };

    // Both Nodes register under their rendered names and addresses and become Ready.
    for (name, ip) in [(&cp_name, &cp_ip), (&worker_name, &worker_ip)] {
        get(&[
            "wait",
            "--for=condition=Ready",
            &format!("node/{name}"),
            "--timeout=5s",
        ]);
        let node: Value = serde_json::from_str(&get(&["get", "node", name, "-o", "json"])).unwrap();
        let addresses = &node["status"]["addresses"];
        assert!(
            addresses
                .as_array()
                .unwrap()
                .contains(&json!({"type": "InternalIP", "address": ip})),
            "{name}: {addresses}"
        );
    }

    // The controller-manager gives each Node its own block of the cluster's pod CIDR: the one
    // source of pod ranges (the bridge CNI and Cilium read it from the Node).
    let cluster_cidr = std::fs::read_to_string(
        cp_root.join("etc/kubernetes/manifests/kube-controller-manager.yaml"),
    )
    .unwrap()
    .lines()
    .find_map(|l| {
        l.trim()
            .trim_start_matches("- ")
            .trim_matches('"')
            .strip_prefix("--cluster-cidr=")
            .map(str::to_owned)
    })
    .unwrap();
    let mut pod_cidrs = std::collections::BTreeMap::new();
    for name in [&cp_name, &worker_name] {
        let cidr = get(&["get", "node", name, "-o", "jsonpath={.spec.podCIDR}"]);
        assert!(cidr.ends_with(".0/24"), "{name}: {cidr}");
        pod_cidrs.insert(name.clone(), cidr);
    }
    assert_ne!(pod_cidrs[&cp_name], pod_cidrs[&worker_name]);
    assert_eq!(cluster_cidr, "172.16.0.0/12");
    for cidr in pod_cidrs.values() {
        let octets: Vec<u8> = cidr[..cidr.len() - 3]
            .split('.')
            .map(|o| o.parse().unwrap())
            .collect();
        assert!(
            octets[0] == 172 && (16..32).contains(&octets[1]),
            "{cidr} in {cluster_cidr}"
        );
    }

    // The worker carries exactly what its pool asked for.
    let worker: Value =
        serde_json::from_str(&get(&["get", "node", &worker_name, "-o", "json"])).unwrap();
    let labels = &worker["metadata"]["labels"];
    assert_eq!(labels["node.kubernetes.io/pool"], "blue", "{labels}");
    assert_eq!(labels["example.com/tier"], "batch", "{labels}");
    assert_eq!(
        labels["kubernetes.io/hostname"],
        json!(worker_name),
        "{labels}"
    );
    // (Taints under node.kubernetes.io/ are the node lifecycle controller's, such as
    // `not-ready` until it sees the Ready condition.)
    let asked: Vec<&Value> = worker["spec"]["taints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| {
            !t["key"]
                .as_str()
                .unwrap()
                .starts_with("node.kubernetes.io/")
        })
        .collect();
    assert_eq!(
        asked,
        [&json!({"key": "dedicated", "value": "batch", "effect": "NoSchedule"})]
    );

    // The control-plane node keeps workloads off with Kubernetes' own taint.
    let cp: Value = serde_json::from_str(&get(&["get", "node", &cp_name, "-o", "json"])).unwrap();
    assert!(
        cp["spec"]["taints"].as_array().unwrap().contains(
            &json!({"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"})
        ),
        "{}",
        cp["spec"]
    );

    // Each kubelet serves the certificate its bundle carried.
    for (root, ip) in [(&cp_root, &cp_ip), (&worker_root, &worker_ip)] {
        let shown = lan
            .command(0, "openssl")
            .args(["s_client", "-connect", &format!("{ip}:10250")])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let bundle = std::fs::read_to_string(root.join("etc/exk8s/pki/kubelet.pem")).unwrap();
        assert_eq!(
            first_pem(&String::from_utf8_lossy(&shown.stdout)),
            first_pem(&bundle),
            "the kubelet at {ip} serves its bundle's certificate"
        );
    }

    // The control-plane node's kubelet accepted every rendered static pod: their mirror pods.
    for pod in STATIC_PODS {
        get(&[
            "-n",
            "kube-system",
            "get",
            "pod",
            &format!("{pod}-{cp_name}"),
        ]);
    }

    // A pod scheduled onto the worker by the pool's label and toleration.
    let manifest = dir.join("hello.json");
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": {
            "nodeSelector": {"node.kubernetes.io/pool": "blue"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "hello", "image": BUSYBOX, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "echo hello from $(hostname); exec sleep 3600"]}]}});
    std::fs::write(&manifest, pod.to_string()).unwrap();
    get(&["apply", "-f", &manifest.display().to_string()]);
    get(&["wait", "--for=condition=Ready", "pod/hello", "--timeout=5s"]);
    let running: Value =
        serde_json::from_str(&get(&["get", "pod", "hello", "-o", "json"])).unwrap();
    assert_eq!(running["spec"]["nodeName"], json!(worker_name));
    // containerd wrote the bridge configuration from the rendered template with the range the
    // controller-manager gave the worker's Node: the pod's address is in it.
    let conflist =
        std::fs::read_to_string(worker_root.join("etc/cni/net.d/10-containerd-net.conflist"))
            .unwrap();
    let conflist: Value = serde_json::from_str(&conflist).unwrap();
    let range = &pod_cidrs[&worker_name];
    assert_eq!(
        conflist["plugins"][0]["ipam"]["ranges"],
        json!([[{"subnet": range}]])
    );
    let prefix = range.strip_suffix(".0/24").unwrap();
    let pod_ip = running["status"]["podIP"].as_str().unwrap();
    assert!(
        pod_ip.starts_with(&format!("{prefix}.")),
        "{pod_ip} in {range}"
    );

    // logs and exec: the apiserver reaches the worker's kubelet with its client certificate.
    assert_eq!(get(&["logs", "hello"]), "hello from hello\n");
    assert_eq!(
        get(&["exec", "hello", "--", "echo", "exec works"]),
        "exec works\n"
    );

    // An upgrade of the control plane: its node syncs, its static pods and then its kubelet
    // restart at the new release (as its kubelet and systemd would), and the kubelet
    // re-registers its Node at it. (Without the etcd snapshot first: this node's agent records
    // its host steps and takes none; control_plane_upgrade.rs takes it with the real agent.)
    let started: Value = operator(&stack, "PATCH", &format!("/clusters/{cluster}"))
        .send_json(json!({
            "kubernetes_version": NEXT_KUBERNETES_VERSION,
            "snapshot_first": false
        }))
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(started["upgrade"], "upgrading", "{started}");
    agent_ok(&stack, &founded, &cp_root, cp_vm, "sync");
    assert_eq!(node.sync_static_pods(&lan).len(), STATIC_PODS.len());
    runtimes[0].start_kubelet();
    let kubelet_version = || {
        get_once(
            &lan,
            &admin,
            &[
                "get",
                "node",
                &cp_name,
                "-o",
                "jsonpath={.status.nodeInfo.kubeletVersion}",
            ],
        )
    };
    wait_until(
        "the kubelet to re-register at the new release",
        READY,
        || kubelet_version() == NEXT_KUBERNETES_VERSION,
    );
    let (ok, _, err) = kubectl(
        &lan,
        0,
        &admin,
        &[
            "wait",
            "--for=condition=Ready",
            &format!("node/{cp_name}"),
            "--timeout=60s",
        ],
    );
    assert!(ok, "{err}");
    let (ok, version, err) = kubectl(&lan, 0, &admin, &["get", "--raw", "/version"]);
    assert!(
        ok && version.contains(NEXT_KUBERNETES_VERSION),
        "{version} {err}"
    );
    // The worker keeps its release until its pool is replaced: the skew policy allows it.
    let (_, worker_version, _) = kubectl(
        &lan,
        0,
        &admin,
        &[
            "get",
            "node",
            &worker_name,
            "-o",
            "jsonpath={.status.nodeInfo.kubeletVersion}",
        ],
    );
    assert_eq!(worker_version, KUBERNETES_VERSION);

    drop(runtimes);
    node.assert_running();
}

/// `kubectl args` once through node 0; its output, or nothing when it failed.
fn get_once(lan: &Lan, kubeconfig: &Path, args: &[&str]) -> String {
    let (ok, out, _) = kubectl(lan, 0, kubeconfig, args);
    if ok { out } else { String::new() }
}
