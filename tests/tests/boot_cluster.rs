//! A control plane boots for real: the machine the compute API made for a one-node cluster boots
//! the node image under systemd, and its agent's boot unit runs `exk8s-agent run` at `/` — etcd
//! installed from its release tarball and started by systemd, the kubelet starting
//! kube-apiserver, kube-controller-manager and kube-scheduler as containers from the images the
//! static pods name, pulled through the image's mirror of registry.k8s.io (a real registry,
//! `tests/src/registry.rs`), the node registered and Ready, the bootstrap RBAC applied by the
//! agent's kubectl. The addons step runs as the agent runs it and fails here for the one reason
//! these machines impose: Cilium's chart lives at quay.io, which nothing here reaches; the
//! failure is reported to the API and systemd tries the boot again.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::time::Duration;

use exk8s_tests::bins::KUBERNETES_VERSION;
use exk8s_tests::cluster::{found, trusted_keys, view};
use exk8s_tests::machine::{Bake, Machine};
use exk8s_tests::mirror::Mirror;
use exk8s_tests::netns::Lan;
use exk8s_tests::registry::Registry;
use serde_json::json;

#[test]
fn a_control_plane_boots_and_runs_its_components_as_containers() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let mirror = Mirror::serve(&dir.join("mirror"), true);
    let catalog = dir.join("artifacts.toml");
    mirror.catalog(&catalog);
    let registry = Registry::serve(dir);

    let stack = exk8s_tests::dev::start_dev(
        &dir.join("dev"),
        "10.237.0.0/24",
        &dir.join("api.log"),
        &["--artifact-catalog", catalog.to_str().unwrap()],
    );
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let vm = founded.vms[0];
    let ip = founded.ip_of[&vm].clone();
    let dns_name = founded.created["control_plane_dns_name"].as_str().unwrap();

    let lan = Lan::new(&[&ip], 24, "");
    let api_port: u16 = stack.base.rsplit(':').next().unwrap().parse().unwrap();
    let _forwards = [api_port, mirror.port, registry.port].map(|p| lan.forward_loopback(0, p));
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "api_url = \"http://127.0.0.1:{api_port}\"\n\
             imds_url = \"http://127.0.0.1:{api_port}/sim/imds/{vm}\"\ninsecure_http = true\n"
        ),
    )
    .unwrap();
    let keys = trusted_keys(&stack, dir);
    let root = Machine::bake(
        dir,
        &format!("cp-{vm}"),
        &Bake {
            keys_dir: &keys,
            config: Some(&config),
        },
    );
    // What the image carries for its network: the package mirror, the registry mirror, and
    // the control plane's name as the cloud's DNS answers it.
    std::fs::write(root.join("etc/apt/sources.list"), mirror.apt_source()).unwrap();
    let hosts_dir = root.join("etc/containerd/certs.d/registry.k8s.io");
    std::fs::create_dir_all(&hosts_dir).unwrap();
    std::fs::write(hosts_dir.join("hosts.toml"), registry.hosts_toml()).unwrap();
    let mut hosts = std::fs::read_to_string(root.join("etc/hosts")).unwrap_or_default();
    hosts += &format!("{ip} {dns_name}\n");
    std::fs::write(root.join("etc/hosts"), hosts).unwrap();

    let machine = Machine::boot(&root, &lan, 0);
    machine.wait_booted();
    // Everything up to the addons runs; Cilium's chart is at quay.io, which no machine here
    // reaches: the addons phase fails, says why, is reported, and the boot is tried again.
    let failed = "phase addons: failed";
    exk8s_tests::procs::wait_until("the first boot's addons", Duration::from_secs(400), || {
        machine.assert_up();
        machine.journal("exk8s-agent.service", 400).contains(failed)
    });
    let journal = machine.journal("exk8s-agent.service", 400);
    for step in [
        "phase etcd: succeeded",
        "phase apiserver: succeeded",
        "kubectl apply -f /etc/exk8s/manifests/rbac.yaml",
        "helm upgrade --install cilium oci://quay.io/cilium/charts/cilium",
        "lookup quay.io",
    ] {
        assert!(journal.contains(step), "{step} in {journal}");
    }
    let agent = machine.show("exk8s-agent.service", &["ActiveState"]);
    assert_eq!(agent, "ActiveState=activating", "tried again: {agent}");
    let node = &view(&stack, founded.cluster)["nodes"][0];
    assert_eq!(node["phase"], "addons:failed", "{node}");
    assert!(
        !root.join("var/lib/exk8s/recorded-actions.log").exists(),
        "nothing was recorded"
    );

    // systemd runs etcd, containerd and the kubelet; the kubelet runs the control plane as
    // containers of the images the static pods name, pulled through the registry mirror.
    for unit in ["etcd.service", "containerd.service", "kubelet.service"] {
        assert_eq!(
            machine.ok("systemctl", &["is-active", unit]),
            "active",
            "{unit}"
        );
    }
    let images = machine.ok("ctr", &["--namespace", "k8s.io", "containers", "list"]);
    for image in [
        format!("registry.k8s.io/kube-apiserver:{KUBERNETES_VERSION}"),
        format!("registry.k8s.io/kube-controller-manager:{KUBERNETES_VERSION}"),
        format!("registry.k8s.io/kube-scheduler:{KUBERNETES_VERSION}"),
        "registry.k8s.io/pause:3.10".to_owned(),
    ] {
        assert!(images.contains(&image), "{image} in {images}");
    }
    let kubectl = |args: &[&str]| {
        let kubectl = format!("/opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubectl");
        let mut all = vec!["--kubeconfig", "/etc/exk8s/kubeconfig/admin.kubeconfig"];
        all.extend_from_slice(args);
        machine.ok(&kubectl, &all)
    };
    let ready = r#"{.items[*].status.conditions[?(@.type=="Ready")].status}"#;
    exk8s_tests::procs::wait_until("the node Ready", Duration::from_secs(120), || {
        kubectl(&["get", "nodes", "-o", &format!("jsonpath={ready}")]) == "True"
    });
    let phases = kubectl(&[
        "get",
        "pods",
        "--namespace",
        "kube-system",
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name}={.status.phase}{"\n"}{end}"#,
    ]);
    let node_name = node["name"].as_str().unwrap();
    for component in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        let line = format!("{component}-{node_name}=Running");
        assert!(phases.lines().any(|l| l == line), "{line} in {phases}");
    }
    // No pressure, and none ever (the kubelet's eviction manager has run a few times since
    // the node registered: the addons step alone retries for 20 s).
    let pressures = kubectl(&[
        "get",
        "nodes",
        "-o",
        r#"jsonpath={range .items[*].status.conditions[*]}{.type}={.status}{"\n"}{end}"#,
    ]);
    for pressure in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        let line = format!("{pressure}=False");
        assert!(
            pressures.lines().any(|l| l == line),
            "{line} in {pressures}"
        );
    }
    let kubelet = machine.journal("kubelet.service", 5000);
    assert!(
        !kubelet.contains("Eviction manager: attempting to reclaim"),
        "the kubelet found pressure: {kubelet}"
    );
    // Not `power_off`: at shutdown two of the pods' scopes wait out systemd's 90 s stop
    // timeout here (each stops in milliseconds on its own; to be understood with the reboot
    // scenario), and this test is about the boot.
    machine.pull_the_plug();
}
