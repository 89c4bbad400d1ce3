//! A control-plane member lost and remediated with no operator call, on the booted
//! three-member cluster after its upgrade:
//!
//! - the last member's VM is destroyed behind exk8s's back (the compute API's `destroy`, as a
//!   cloud losing a host does);
//! - the API's health pass (every two seconds on this stack) sees the VM gone and watches it
//!   for the health policy's `vm_down_after_secs` — its clock moved past that through its test
//!   hook (`EXK8S_API_TEST_CLOCK_OFFSET_FILE`) instead of slept through;
//! - then it remediates on its own: the oldest healthy member's agent removes the lost member
//!   from etcd first (etcd refuses even a learner while a voter is unreachable), a new machine
//!   boots from the image, its etcd joins as a learner through the two voters and is promoted,
//!   and every member takes its new generation one at a time (each node's sync unit started as
//!   its timer starts it).
//!
//! Throughout, the first machine samples the two surviving apiservers' `/readyz` and sends
//! requests through its balancer, HAProxy and every other node's balancer: every request is
//! answered and in every round at least one survivor is ready (but for etcd's brief elections,
//! [`super::sampler`]). At the end etcd lists three voters without the lost member's peer URL,
//! the lost VM is gone, the cluster's change stream holds the remediation (`MachineDeleted`)
//! and `RemediationAllowed` is True again, the new member's node is Ready, and the ConfigMap
//! written before the upgrade is read through every apiserver.

use std::io::BufRead as _;
use std::path::Path;
use std::time::Duration;

use exk8s_tests::cluster::{operator, view};
use exk8s_tests::dev::{Stack, http};
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::wait_until;
use exk8s_tests::site::nodes;
use serde_json::{Value, json};

use super::control_plane::etcdctl;
use super::day2::kubectl;
use super::sampler::{assert_one_ready, sampling};

/// The API's clock hook: the file whose seconds move its clock forward.
pub(crate) const CLOCK_HOOK: &str = "EXK8S_API_TEST_CLOCK_OFFSET_FILE";

/// The file the hook names, in the test's directory.
pub(crate) fn clock_file(dir: &Path) -> std::path::PathBuf {
    dir.join("clock-offset")
}

/// Past the default `vm_down_after_secs` (120), and well inside the five minutes certificates
/// are backdated by (a member minted after the jump verifies at the machines' real time).
const PAST_VM_DOWN: i64 = 130;

/// The lost node's `HealthCheckSucceeded` reason, if it is still listed.
fn health_reason(stack: &Stack, cluster: i64, vm: i64) -> Option<String> {
    let node = nodes(stack, cluster)
        .into_iter()
        .find(|n| n["vm_id"] == vm)?;
    node["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "HealthCheckSucceeded")
        .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
}

/// The cluster's condition `kind`.
pub(crate) fn condition(stack: &Stack, cluster: i64, kind: &str) -> Value {
    view(stack, cluster)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no {kind} condition"))
}

/// The first `remediation` event of the cluster's change stream (it replays from the start).
fn remediation_event(stack: &Stack, cluster: i64) -> Value {
    let response = operator(stack, "GET", &format!("/clusters/{cluster}/events"))
        .call()
        .unwrap();
    let mut kind = String::new();
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(k) = line.strip_prefix("event:") {
            k.trim().clone_into(&mut kind);
        } else if let Some(data) = line.strip_prefix("data:")
            && kind == "remediation"
        {
            return serde_json::from_str(data.trim()).unwrap();
        }
    }
    panic!("the stream ended without a remediation event");
}

/// Every control-plane member a voter at its newest generation, its last report a success,
/// and `count` of them; the workers too.
fn settled(stack: &Stack, cluster: i64, count: usize) -> bool {
    let cluster = view(stack, cluster);
    let want = json!({"desired": count, "voters": count, "joining": 0, "leaving": 0});
    cluster["control_plane_members"] == want
        && cluster["nodes"].as_array().unwrap().iter().all(|n| {
            n["up_to_date"] == true && matches!(n["phase"].as_str(), Some("complete" | "sync"))
        })
}

/// Starts every listed node's sync unit (what its timer runs, without waiting for it) every
/// three seconds, as systemd's start limit (5 in 10 s) allows, until `done`: machines that
/// come are found, machines that go are forgotten.
pub(crate) fn syncing(stack: &Stack, cluster: i64, done: impl Fn() -> bool) {
    let mut machines: Vec<Machine> = Vec::new();
    wait_until("the remediation", Duration::from_secs(900), || {
        let listed: Vec<i64> = nodes(stack, cluster)
            .iter()
            .map(|n| n["vm_id"].as_i64().unwrap())
            .collect();
        machines.retain(|m| listed.contains(&m.vm));
        for vm in listed {
            if !machines.iter().any(|m| m.vm == vm)
                && let Some(machine) = Machine::try_of(stack, vm)
            {
                machines.push(machine);
            }
        }
        for machine in &machines {
            let _ = machine.run(
                "systemctl",
                &["start", "--no-block", "exk8s-agent-sync.service"],
            );
        }
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_secs(3));
        false
    });
}

/// The module doc's remediation of the last of the three members (`machines[..3]` are the
/// control plane, `cp` their addresses and names; the API's clock hook file in `dir`);
/// `machines` then holds the new member in the lost one's place.
pub(crate) fn remediate_a_lost_member(
    stack: &Stack,
    cluster: i64,
    dir: &Path,
    machines: &mut Vec<Machine>,
    cp: &[(String, String)],
) {
    let clock = &clock_file(dir);
    let lost = machines.remove(2);
    let (lost_vm, (lost_ip, lost_name)) = (lost.vm, cp[2].clone());
    let survivors: Vec<String> = cp[..2].iter().map(|(ip, _)| ip.clone()).collect();
    let allowed = condition(stack, cluster, "RemediationAllowed");
    assert_eq!(allowed["status"], "True", "{allowed}");
    let sampler = &machines[0];
    let (new_vm, rounds) = sampling(sampler, &survivors, machines, || {
        let url = format!("{}/sim/compute/sim/vms/{lost_vm}/destroy", stack.base);
        let status = http().post(&url).call().unwrap().status();
        assert_eq!(status, 204, "destroying VM {lost_vm}");
        drop(lost);
        wait_until(
            "the health pass to watch the lost VM",
            Duration::from_secs(120),
            || health_reason(stack, cluster, lost_vm).as_deref() == Some("Watching"),
        );
        assert!(
            nodes(stack, cluster)
                .iter()
                .all(|n| n["role"] != "control-plane" || n["etcd_membership"] == "voter"),
            "watched, not yet remediated"
        );
        std::fs::write(clock, PAST_VM_DOWN.to_string()).unwrap();
        syncing(stack, cluster, || {
            nodes(stack, cluster).iter().all(|n| n["vm_id"] != lost_vm)
                && settled(stack, cluster, 3)
        });
        let members: Vec<i64> = nodes(stack, cluster)
            .iter()
            .filter(|n| n["role"] == "control-plane")
            .map(|n| n["vm_id"].as_i64().unwrap())
            .collect();
        assert_eq!(members.len(), 3, "{members:?}");
        members
            .into_iter()
            .find(|vm| !machines.iter().any(|m| m.vm == *vm))
            .expect("a new member")
    });
    assert_one_ready("a lost member's remediation", &rounds);

    let sims = exk8s_tests::site::sim_vm_ids(stack);
    assert!(
        !sims.contains(&lost_vm),
        "the lost VM is still there: {sims:?}"
    );
    let sampler = &machines[0];
    let voters = etcdctl(sampler, &cp[0].0, &["member", "list", "-w", "json"]);
    assert!(voters.status.success(), "{voters:?}");
    let voters: Value = serde_json::from_slice(&voters.stdout).unwrap();
    let voters = voters["members"].as_array().unwrap();
    assert_eq!(voters.len(), 3, "{voters:?}");
    assert!(voters.iter().all(|m| m["isLearner"] != true), "{voters:?}");
    let lost_peer = format!("https://{lost_ip}:2380");
    assert!(
        voters.iter().all(|m| m["peerURLs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| *u != *lost_peer)),
        "the lost member is still in etcd: {voters:?}"
    );
    let event = remediation_event(stack, cluster);
    assert_eq!(
        (&event["phase"], &event["vm_id"], &event["error_reason"]),
        (
            &json!("control-plane"),
            &json!(lost_vm),
            &json!("MachineDeleted")
        ),
        "{event}"
    );
    let allowed = condition(stack, cluster, "RemediationAllowed");
    assert_eq!(allowed["status"], "True", "{allowed}");

    let new = Machine::of(stack, new_vm);
    new.wait_booted();
    let node = nodes(stack, cluster)
        .into_iter()
        .find(|n| n["vm_id"] == new_vm)
        .unwrap();
    let (new_ip, new_name) = (
        node["private_ipv4"].as_str().unwrap().to_owned(),
        node["name"].as_str().unwrap().to_owned(),
    );
    wait_until(
        "the new member's node Ready",
        Duration::from_secs(120),
        || {
            let ready = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
            let out = kubectl(sampler, &["get", "node", &new_name, "-o", ready]);
            String::from_utf8_lossy(&out.stdout).trim() == "True"
        },
    );
    for ip in survivors.iter().chain([&new_ip]) {
        let kept = kubectl(
            sampler,
            &[
                &format!("--server=https://{ip}:6443"),
                "get",
                "configmap",
                "before-upgrade",
                "-o",
                "jsonpath={.data.kept}",
            ],
        );
        assert_eq!(
            String::from_utf8_lossy(&kept.stdout),
            "yes",
            "{ip}: {kept:?}"
        );
    }
    for unit in ["etcd.service", "containerd.service", "kubelet.service"] {
        assert_eq!(
            new.ok("systemctl", &["is-active", unit]),
            "active",
            "{unit}"
        );
    }
    // The lost member's Node is gone with it.
    let listed = kubectl(sampler, &["get", "nodes", "-o", "name"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        !listed.lines().any(|l| l == format!("node/{lost_name}")),
        "{lost_name} is still a Node: {listed}"
    );
    machines.insert(2, new);
}
