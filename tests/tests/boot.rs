//! The node image boots: two machines from the image an image builder bakes (Debian 12, the
//! agent baked in by `packaging/bake-image.sh`) boot at once under systemd-nspawn with systemd
//! as PID 1, each with its own name, machine-id and address on a LAN, and every unit of their
//! boot succeeds. The agent's boot unit and sync timer are enabled; without `api_url` the boot
//! unit is skipped, not failed; once an image names an API it cannot reach, the failed first
//! boot waits to be tried again (`Restart=on-failure`), as systemd itself reports it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use exk8s_tests::machine::{Bake, Machine};
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
                s.spawn(move || Machine::boot(dir, name, lan, i, bake))
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
