//! A dead control-plane member replaced on the booted three-member cluster (`exk8s members
//! replace`), sampled as [`super::scale`] samples its changes — not one request through the
//! first machine's balancer or HAProxy fails:
//!
//! - the newest member's etcd dies for good (every start of it fails, as a broken disk leaves
//!   it); its agent's next sync finds it unhealthy and reports the failure;
//! - the operator asks for its replacement: etcd refuses even a learner while a voter is
//!   unreachable, so the oldest healthy member's agent removes it first; its VM goes; a new
//!   machine boots from the image, its etcd joins as a learner through the two voters and is
//!   promoted, and every member takes its new generation one at a time.
//!
//! At the end etcd lists three voters, none of them the dead one, the dead VM is gone from the
//! compute API, and the ConfigMap written before the changes is read through every member's
//! apiserver.

use std::time::Duration;

use exk8s_tests::cluster::view;
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::wait_until;
use exk8s_tests::site::nodes;
use exk8s_tests::site::sim_vm_ids;
use serde_json::Value;

use super::control_plane::etcdctl;
use super::one_node::OneNode;
use super::scale::{read_through, sampled, settled};

/// The module doc's replacement of the last of `members`.
pub(crate) fn replace_a_dead_member(node: &OneNode<'_>, members: &[(Machine, String)]) {
    let (dead, dead_ip) = members.last().unwrap();
    assert_ne!(dead.vm, node.machine.vm, "the sampling machine stays");
    let cluster = node.cluster.to_string();
    let replaced = sampled(node, "a dead member's replacement", || {
        // A drop-in in /run (which the agent never writes) whose every start fails.
        dead.ok(
            "sh",
            &[
                "-c",
                "mkdir -p /run/systemd/system/etcd.service.d && printf \
                 '[Service]\\nExecStartPre=/bin/false\\n' \
                 > /run/systemd/system/etcd.service.d/dead.conf && systemctl daemon-reload",
            ],
        );
        let restarted = dead.run("systemctl", &["restart", "etcd.service"]);
        assert!(
            !restarted.status.success(),
            "etcd started again: {restarted:?}"
        );
        wait_until(
            "the dead member's sync reports its failure",
            Duration::from_secs(300),
            || {
                node.machine.assert_up();
                nodes(node.stack, node.cluster)
                    .iter()
                    .any(|n| n["vm_id"] == dead.vm && n["phase"] == "sync:failed")
            },
        );
        // The CLI shows the cluster as the request left it: the dead member to be replaced.
        let said = node.exk8s(&["members", "replace", &cluster, &dead.vm.to_string()]);
        assert_eq!(said["control_plane_members"]["desired"], 3, "{said}");
        assert!(
            said["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n["vm_id"] == dead.vm && n["replacing"] == true),
            "{said}"
        );
        wait_until("the dead member gone", Duration::from_secs(600), || {
            node.machine.assert_up();
            nodes(node.stack, node.cluster)
                .iter()
                .all(|n| n["vm_id"] != dead.vm)
        });
        settled(node, 3)
    });
    let vms = sim_vm_ids(node.stack);
    assert!(
        !vms.contains(&dead.vm),
        "the dead VM is still there: {vms:?}"
    );
    let voters = etcdctl(&node.machine, &node.ip, &["member", "list", "-w", "json"]);
    assert!(voters.status.success(), "{voters:?}");
    let voters: Value = serde_json::from_slice(&voters.stdout).unwrap();
    let voters = voters["members"].as_array().unwrap();
    assert_eq!(voters.len(), 3, "{voters:?}");
    assert!(voters.iter().all(|m| m["isLearner"] != true), "{voters:?}");
    let dead_peer = format!("https://{dead_ip}:2380");
    assert!(
        voters.iter().all(|m| m["peerURLs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|u| *u != *dead_peer)),
        "the dead member is still in etcd: {voters:?}"
    );
    for (member, ip) in &replaced {
        assert_ne!(member.vm, dead.vm);
        assert_eq!(
            read_through(&node.machine, ip).as_deref(),
            Ok("yes"),
            "{}",
            member.name
        );
    }
    let members = view(node.stack, node.cluster)["control_plane_members"].clone();
    assert_eq!(members["voters"], 3, "{members}");
}
