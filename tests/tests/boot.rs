//! The node image boots: two machines from the image an image builder bakes (Debian 12, the
//! agent baked in by `packaging/bake-image.sh`) boot at once under systemd-nspawn with systemd
//! as PID 1, each with its own name, machine-id and address on a LAN, and every unit of their
//! boot succeeds. The agent's boot unit and sync timer are enabled; without `api_url` the boot
//! unit is skipped, not failed; once an image names an API it cannot reach, the failed first
//! boot waits to be tried again (`Restart=on-failure`), as systemd itself reports it.
//!
//! And a worker boots for real: the agent's boot unit runs `exk8s-agent run` at `/` against the
//! dev stack, every host action performed — Debian's packages installed by `apt-get` from a
//! local mirror (`scripts/node-packages.sh`), the kubelet downloaded as the artifact catalog
//! pins it, containerd and the kubelet started by systemd — and the API sees it complete, after
//! a first boot that failed while the mirror was away and was tried again by systemd.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::machine::{Bake, Machine};
use exk8s_tests::mirror::Mirror;
use exk8s_tests::netns::Lan;
use exk8s_tests::procs::binary;

/// `exk8s-api keys generate`'s public line, as `dir/signing.pub` (the image's trusted key).
fn trusted_keys(dir: &Path) -> std::path::PathBuf {
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let out = std::process::Command::new(binary("exk8s-api"))
        .args(["keys", "generate", "--out"])
        .arg(dir.join("signing-key"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::fs::write(keys.join("signing.pub"), &out.stdout).unwrap();
    keys
}

#[test]
fn the_baked_node_image_boots_under_systemd_and_its_agent_waits_for_an_api() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let keys = trusted_keys(dir);
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/agent.toml");
    let addresses = ["10.238.0.11", "10.238.0.12"];
    let lan = Lan::new(&addresses, 24, "");
    let bake = Bake {
        keys_dir: &keys,
        config: Some(&config),
    };
    // Both at once, as a compute API starts a cluster's machines.
    let machines: Vec<Machine> = std::thread::scope(|s| {
        let booting: Vec<_> = ["node-a", "node-b"]
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let (lan, bake) = (&lan, &bake);
                s.spawn(move || Machine::boot(&Machine::bake(dir, name, bake), lan, i))
            })
            .collect();
        booting.into_iter().map(|b| b.join().unwrap()).collect()
    });
    for (machine, address) in machines.iter().zip(addresses) {
        let state = machine.wait_booted();
        assert_eq!(state, "running", "{}: {}", machine.name, machine.failures());
        assert_eq!(machine.ok("hostname", &[]), machine.name);
        let addresses = machine.ok("ip", &["-4", "-brief", "address", "show", "dev", "eth0"]);
        assert!(addresses.contains(&format!("{address}/24")), "{addresses}");
        assert_eq!(
            machine.ok(
                "systemctl",
                &[
                    "is-enabled",
                    "exk8s-agent.service",
                    "exk8s-agent-sync.timer"
                ]
            ),
            "enabled\nenabled"
        );
        // No api_url in the packaged agent.toml: the boot unit's condition skips it.
        let agent = machine.show(
            "exk8s-agent.service",
            &["ActiveState", "Result", "ExecMainStatus"],
        );
        assert!(
            agent.contains("ActiveState=inactive") && agent.contains("Result=exec-condition"),
            "{}: {agent}",
            machine.name
        );
        assert_eq!(
            machine.ok("systemctl", &["is-active", "exk8s-agent-sync.timer"]),
            "active"
        );
    }
    let ids: Vec<String> = machines
        .iter()
        .map(|m| m.ok("cat", &["/etc/machine-id"]))
        .collect();
    assert_eq!(ids[0].len(), 32, "{ids:?}");
    assert_ne!(ids[0], ids[1], "each machine has its own machine-id");

    // An image that names an API nobody answers for (and an instance-metadata service that
    // is not there): the first boot fails, and systemd holds it to be tried again.
    let machine = &machines[0];
    std::fs::write(
        machine.root.join("etc/exk8s/agent.toml"),
        "api_url = \"http://10.238.0.1:9\"\nimds_url = \"http://10.238.0.1:9\"\n\
         insecure_http = true\nimds_timeout_secs = 1\nfetch_timeout_secs = 1\n",
    )
    .unwrap();
    let started = machine.run("systemctl", &["start", "exk8s-agent.service"]);
    assert!(!started.status.success(), "the agent cannot succeed here");
    let agent = machine.show(
        "exk8s-agent.service",
        &[
            "ActiveState",
            "SubState",
            "Result",
            "Restart",
            "RestartUSec",
        ],
    );
    for expected in [
        "ActiveState=activating",
        "SubState=auto-restart",
        "Result=exit-code",
        "Restart=on-failure",
        "RestartUSec=30s",
    ] {
        assert!(agent.contains(expected), "{expected} in: {agent}");
    }

    for machine in machines {
        machine.power_off();
    }
}

/// VM `vm`'s node in `GET /clusters/{cluster}`.
fn node_of(stack: &exk8s_tests::dev::Stack, cluster: i64, vm: i64) -> serde_json::Value {
    exk8s_tests::cluster::view(stack, cluster)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .cloned()
        .unwrap_or_else(|| panic!("vm {vm} is no node of cluster {cluster}"))
}

/// A worker boots for real: the machine the API asked for runs `exk8s-agent run` from its boot
/// unit at `/` — its bundle fetched with its instance identity, `apt-get` installing the
/// prerequisites from a Debian mirror (the packages the node image lacks), the kubelet
/// downloaded as the artifact catalog pins it, containerd and the kubelet enabled and started
/// by systemd — and reports every phase to the API. Nothing is recorded; the bundle's
/// containerd configuration survives Debian's containerd package, whose conffile it is. The
/// mirror is away when the machine first boots: the failed prerequisites are reported, and
/// systemd's retry completes the node once the mirror is back, with no operator.
#[test]
fn a_worker_boots_from_its_bundle_with_every_host_action_performed() {
    use exk8s_tests::bins::{KUBERNETES_VERSION, kubernetes};
    use exk8s_tests::cluster::{found, operator, trusted_keys as api_keys, view};
    use serde_json::{Value, json};

    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // The mirror: Debian's packages and the release's kubelet, pinned by the catalog.
    let mirror = Mirror::serve(&dir.join("mirror"), false);
    let mirror_port = mirror.port;
    let catalog = dir.join("artifacts.toml");
    mirror.catalog(&catalog);
    let digest =
        exk8s_common::names::Sha256Digest::of(&std::fs::read(kubernetes("kubelet")).unwrap());

    let stack = exk8s_tests::dev::start_dev(
        &dir.join("dev"),
        "10.239.0.0/24",
        &dir.join("api.log"),
        &["--artifact-catalog", catalog.to_str().unwrap()],
    );
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let cluster = founded.cluster;
    let created: Value = operator(&stack, "POST", &format!("/clusters/{cluster}/node-pools"))
        .send_json(
            json!({"name": "blue", "count": 1, "instance_type": "dev.small",
                          "image_id": 1, "subnet_id": 1}),
        )
        .unwrap()
        .into_json()
        .unwrap();
    assert!(created["id"].is_i64(), "{created}");
    let mut worker = None;
    exk8s_tests::procs::wait_until(
        "the pool's worker",
        std::time::Duration::from_secs(60),
        || {
            worker = view(&stack, cluster)["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["role"] == "worker")
                .map(|n| {
                    (
                        n["vm_id"].as_i64().unwrap(),
                        n["private_ipv4"].as_str().unwrap().to_owned(),
                    )
                });
            worker.is_some()
        },
    );
    let (vm, ip) = worker.unwrap();

    // The machine: on the cluster's LAN at the address the compute API gave the VM, the API
    // and the mirror reached at the loopback addresses its configuration names.
    let lan = Lan::new(&[&ip], 24, "");
    let api_port: u16 = stack.base.rsplit(':').next().unwrap().parse().unwrap();
    let _api = lan.forward_loopback(0, api_port);
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "api_url = \"http://127.0.0.1:{api_port}\"\n\
             imds_url = \"http://127.0.0.1:{api_port}/sim/imds/{vm}\"\ninsecure_http = true\n"
        ),
    )
    .unwrap();
    let keys = api_keys(&stack, dir);
    let root = Machine::bake(
        dir,
        &format!("worker-{vm}"),
        &Bake {
            keys_dir: &keys,
            config: Some(&config),
        },
    );
    // The image's package source: the mirror, as a VM's is its cloud's (debootstrap wrote
    // Debian's own into sources.list).
    std::fs::write(root.join("etc/apt/sources.list"), mirror.apt_source()).unwrap();
    let machine = Machine::boot(&root, &lan, 0);
    machine.wait_booted();

    // The mirror is away at first (nothing forwards to it yet): the first boot fails in its
    // prerequisites, reports so, and waits to be tried again.
    exk8s_tests::procs::wait_until(
        "the first boot's failure reported",
        std::time::Duration::from_secs(120),
        || node_of(&stack, cluster, vm)["phase"] == "prereqs:failed",
    );
    let journal = machine.journal("exk8s-agent.service", 100);
    assert!(journal.contains("phase prereqs: failed"), "{journal}");
    // The mirror back: systemd's retry (30 s later) boots the node without an operator.
    let _mirror_inside = lan.forward_loopback(0, mirror_port);
    exk8s_tests::procs::wait_until(
        "the agent's retried first boot",
        std::time::Duration::from_secs(300),
        || {
            let Ok(agent) = machine.try_show("exk8s-agent.service", &["ActiveState", "NRestarts"])
            else {
                // systemd re-executing itself while a package is set up: asked again.
                machine.assert_up();
                return false;
            };
            assert!(
                !agent.contains("NRestarts=2"),
                "the retry failed too: {}",
                machine.journal("exk8s-agent.service", 40)
            );
            agent.contains("ActiveState=active")
        },
    );
    let agent = machine.show("exk8s-agent.service", &["Result", "NRestarts"]);
    assert_eq!(agent, "Result=success\nNRestarts=1", "{agent}");
    assert!(root.join("var/lib/exk8s/bootstrap.done").is_file());
    assert!(
        !root.join("var/lib/exk8s/recorded-actions.log").exists(),
        "nothing was recorded"
    );
    for package in ["containerd", "runc", "conntrack", "socat"] {
        assert_eq!(
            machine.ok("dpkg-query", &["-W", "-f=${Status}", package]),
            "install ok installed",
            "{package}"
        );
    }
    let containerd = std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap();
    assert!(
        containerd.contains("/etc/containerd/bridge-cni.conflist.tmpl"),
        "the bundle's containerd configuration, not the package's: {containerd}"
    );
    assert_eq!(
        machine.ok("systemctl", &["is-active", "containerd.service"]),
        "active"
    );
    assert_eq!(
        machine.ok("systemctl", &["is-enabled", "kubelet.service"]),
        "enabled"
    );
    // The kubelet runs under systemd on the machine's cgroups, with the systemd driver, and
    // asks the cluster's API (which this dev stack only simulates) to register its node.
    let node_name = node_of(&stack, cluster, vm)["name"].clone();
    let registering = format!(
        "\"Attempting to register node\" node=\"{}\"",
        node_name.as_str().unwrap()
    );
    exk8s_tests::procs::wait_until(
        "the kubelet registering its node",
        std::time::Duration::from_secs(120),
        || {
            machine
                .journal_grep("kubelet.service", "Attempting to register node")
                .contains(&registering)
        },
    );
    let kubelet = machine.show("kubelet.service", &["ActiveState", "NRestarts"]);
    assert!(
        kubelet.contains("ActiveState=active") && kubelet.contains("NRestarts=0"),
        "{kubelet}: {}",
        machine.journal("kubelet.service", 40)
    );
    let installed =
        std::fs::read(root.join(format!("opt/exk8s/kubernetes/{KUBERNETES_VERSION}/kubelet")))
            .unwrap();
    assert_eq!(exk8s_common::names::Sha256Digest::of(&installed), digest);
    let node = node_of(&stack, cluster, vm);
    assert_eq!(node["phase"], "complete", "{node}");
    machine.power_off();
}
