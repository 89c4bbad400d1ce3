//! The node image boots: the dev stack's compute boots every VM it makes from the image an
//! image builder bakes (Debian 12, the agent baked in by `packaging/bake-image.sh`) under
//! systemd-nspawn with systemd as PID 1 (`exk8s-api dev --machines nspawn`): two VMs at once,
//! each with its own hostname (the VM's name), machine-id, the address the compute API gave it
//! and its CPU time capped (`--machine-cpus`), and every unit of their boot succeeds. The agent's boot unit and sync timer are enabled;
//! without `api_url` the boot unit is skipped, not failed; once an image names an API it cannot
//! reach, the failed first boot waits to be tried again (`Restart=on-failure`), as systemd
//! itself reports it. Stopped through the compute API, a machine powers off and says `stopped`;
//! deleted, its disk is gone.
//!
//! (A node that boots for real from its bundle, with every host action performed and a first
//! boot retried, is `boot_cluster.rs`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::dev::http;
use exk8s_tests::machine::{BOOT, Machine, bake_image, dev_args, signing_key};
use exk8s_tests::procs::free_port;
use serde_json::{Value, json};

#[test]
fn the_baked_node_image_boots_under_systemd_and_its_agent_waits_for_an_api() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let data = dir.join("dev");
    let keys = signing_key(&data, dir);
    let packaged = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/agent.toml");
    let image = bake_image(
        dir,
        &keys,
        &std::fs::read_to_string(packaged).unwrap(),
        |_| {},
    );
    // Each machine capped at half a core, as a VM's vCPUs cap it.
    let mut args = dev_args(&image, &[]);
    args.extend(["--machine-cpus".to_owned(), "0.5".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stack = exk8s_tests::dev::start_dev_on(
        free_port(),
        &data,
        "10.238.0.0/24",
        &dir.join("api.log"),
        &args,
        &[],
    );
    // Two VMs at once, as the compute API's clients ask for them.
    let vms: Vec<Value> = ["node-a", "node-b"]
        .into_iter()
        .map(|name| {
            http()
                .post(&format!("{}/sim/compute/v1/vms", stack.base))
                .send_json(
                    json!({"name": name, "image_id": 1, "instance_type": "dev.small",
                    "zone_id": 1, "subnet_id": 1, "security_group_ids": [],
                    "allocate_public_ipv4": false, "root_volume_size_gib": 10,
                    "userdata": "", "tags": {}, "client_token": name}),
                )
                .unwrap()
                .into_json()
                .unwrap()
        })
        .collect();
    let machines: Vec<Machine> = vms
        .iter()
        .map(|vm| Machine::of(&stack, vm["id"].as_i64().unwrap()))
        .collect();
    let addresses = ["10.238.0.11", "10.238.0.12"];
    for (machine, address) in machines.iter().zip(addresses) {
        let state = machine.wait_booted();
        assert_eq!(state, "running", "{}: {}", machine.name, machine.failures());
        assert_eq!(machine.ok("hostname", &[]), machine.name);
        assert_eq!(
            machine.cpu_quota_us(),
            "50000",
            "{}: half a core",
            machine.name
        );
        let vm: Value = http()
            .get(&format!("{}/sim/compute/v1/vms/{}", stack.base, machine.vm))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        assert_eq!(vm["state"], "running", "{vm}");
        assert_eq!(vm["private_ipv4"], address, "{vm}");
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

    // Stopped through the compute API: powered off, `stopped`; deleted: its disk is gone.
    let mut machines = machines.into_iter();
    let (first, second) = (machines.next().unwrap(), machines.next().unwrap());
    let (vm, disk) = (first.vm, first.root.clone());
    first.stop();
    let shown: Value = http()
        .get(&format!("{}/sim/compute/v1/vms/{vm}", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(shown["state"], "stopped", "{shown}");
    http()
        .delete(&format!("{}/sim/compute/v1/vms/{vm}", stack.base))
        .call()
        .unwrap();
    exk8s_tests::procs::wait_until("the deleted VM's disk gone", BOOT, || !disk.exists());
    second.stop();
}
