//! A join that never finishes, abandoned at the API's join deadline on the booted three-member
//! cluster (after its remediation), sampled as the day-2 changes are — never two apiservers down
//! in one round, every request through a balancer answered:
//!
//! - the operator asks for five members (`exk8s scale`); the first joiner's machine boots from
//!   the image, but its etcd can never start (a drop-in whose `ExecStartPre` fails, put on its
//!   disk as soon as the disk is made, as a broken disk leaves it);
//! - its agent adds its etcd as a learner through the voters and waits for it to catch up;
//! - the API's clock is moved past the join deadline (`--member-join-timeout-secs`) through its
//!   test hook instead of waited through: the join is abandoned, the oldest voter's agent
//!   removes the learner on its sync, the joiner's VM is released, then its row, and the cluster
//!   says why (`membership_error`, `ScalingUp` `ChangeStopped`).
//!
//! At the end etcd lists the three voters and no learner, the compute API no longer knows the
//! joiner's VM, and asked for three again the control plane is at its desired size.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::wait_until;
use exk8s_tests::site::nodes;
use serde_json::{Value, json};

use super::control_plane::etcdctl;
use super::remediation::{clock_file, condition, syncing};
use super::sampler::{assert_two_ready, sampling};

/// The API's join deadline on the day-2 cluster: far above a booted join's minute or two, and
/// — moved past at once — inside the five minutes the agents allow a bundle's clock to be ahead.
pub(crate) const JOIN_TIMEOUT_SECS: &str = "240";

/// etcd's members as `member list` shows them: (peer URLs, learner).
fn members(sampler: &Machine, ip: &str) -> Vec<(Vec<String>, bool)> {
    let listed = etcdctl(sampler, ip, &["member", "list", "-w", "json"]);
    assert!(listed.status.success(), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    listed["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let peers = m["peerURLs"].as_array().unwrap();
            (
                peers
                    .iter()
                    .map(|u| u.as_str().unwrap().to_owned())
                    .collect(),
                m["isLearner"] == true,
            )
        })
        .collect()
}

/// The disk VM `vm`'s machine boots from, once it is made (the simulator copies the image
/// beside it and renames it into place).
fn disk_once_made(stack: &Stack, vm: i64) -> PathBuf {
    let mut disk = PathBuf::new();
    wait_until("the joiner's disk", Duration::from_secs(120), || {
        let Some(made) = Machine::disk_of(stack, vm) else {
            return false;
        };
        disk = made;
        disk.join("etc/hostname").is_file()
    });
    disk
}

/// Three voters, no member joining or leaving, every node at its newest generation and its
/// last report a success (the desired count may still be the one the join stopped short of).
fn three_and_idle(stack: &Stack, cluster: i64) -> bool {
    let view = exk8s_tests::cluster::view(stack, cluster);
    let members = &view["control_plane_members"];
    (&members["voters"], &members["joining"], &members["leaving"])
        == (&json!(3), &json!(0), &json!(0))
        && view["nodes"].as_array().unwrap().iter().all(|n| {
            n["up_to_date"] == true && matches!(n["phase"].as_str(), Some("complete" | "sync"))
        })
}

/// The module doc's abandoned join, the API's clock hook file in `dir`; `machines[..3]` are
/// the members, `ips` their addresses (the first one's machine samples).
pub(crate) fn abandon_a_join(
    stack: &Stack,
    cluster: i64,
    dir: &Path,
    machines: &[Machine],
    ips: &[String],
) {
    let clock = &clock_file(dir);
    let sampler = &machines[0];
    let cluster_arg = cluster.to_string();
    // The real time again (the remediation left the clock ahead): the join's deadline counts
    // from it.
    std::fs::write(clock, "0").unwrap();
    let ((), rounds) = sampling(sampler, ips, &machines[..3], || {
        let asked = stack.exk8s(dir, &["scale", &cluster_arg, "--control-plane", "5"]);
        assert!(asked.status.success(), "exk8s scale: {asked:?}");
        let mut joiner = None;
        wait_until("a joining member", Duration::from_secs(60), || {
            joiner = nodes(stack, cluster)
                .iter()
                .find(|n| n["etcd_membership"] == "joining")
                .and_then(|n| n["vm_id"].as_i64());
            joiner.is_some()
        });
        let joiner = joiner.unwrap();
        let disk = disk_once_made(stack, joiner);
        // Before its agent starts etcd (it writes etcd.service and reloads systemd first).
        let drop_in = disk.join("etc/systemd/system/etcd.service.d");
        std::fs::create_dir_all(&drop_in).unwrap();
        std::fs::write(
            drop_in.join("never.conf"),
            "[Service]\nExecStartPre=/bin/false\n",
        )
        .unwrap();
        wait_until("etcd to list the learner", Duration::from_secs(300), || {
            members(sampler, &ips[0])
                .iter()
                .any(|(_, learner)| *learner)
        });
        let counted = exk8s_tests::cluster::view(stack, cluster)["control_plane_members"].clone();
        assert_eq!(
            counted,
            json!({"desired": 5, "voters": 3, "joining": 1, "leaving": 0})
        );
        std::fs::write(clock, JOIN_TIMEOUT_SECS).unwrap();
        syncing(stack, cluster, || {
            nodes(stack, cluster).iter().all(|n| n["vm_id"] != joiner)
                && three_and_idle(stack, cluster)
        });
        let sims = exk8s_tests::site::sim_vm_ids(stack);
        assert!(!sims.contains(&joiner), "the joiner's VM is left: {sims:?}");
    });
    assert_two_ready("an abandoned join", &rounds);
    let listed = members(sampler, &ips[0]);
    assert_eq!(listed.len(), 3, "the learner is gone: {listed:?}");
    assert!(listed.iter().all(|(_, learner)| !learner), "{listed:?}");
    let stopped = exk8s_tests::cluster::view(stack, cluster);
    let why = stopped["membership_error"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("did not finish within {JOIN_TIMEOUT_SECS}s")),
        "{stopped}"
    );
    assert_eq!(
        condition(stack, cluster, "ScalingUp")["reason"],
        "ChangeStopped"
    );
    // The real time again, and asked for three: nothing left to do.
    std::fs::write(clock, "0").unwrap();
    let asked = stack.exk8s(dir, &["scale", &cluster_arg, "--control-plane", "3"]);
    assert!(asked.status.success(), "exk8s scale: {asked:?}");
    wait_until("three members desired", Duration::from_secs(60), || {
        let view = exk8s_tests::cluster::view(stack, cluster);
        view["control_plane_members"]
            == json!({"desired": 3, "voters": 3, "joining": 0, "leaving": 0})
    });
}
