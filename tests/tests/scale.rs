//! Growing a control plane 1 → 3 and shrinking it back to 1, end to end: the real `exk8s-api` (SQLite dev stack, and
//! `serve` on PostgreSQL), the real agent, and real etcd members run from the node roots. The
//! agent records host actions under `--root` but performs its etcd membership steps for real
//! (`EXK8S_AGENT_TEST_PERFORM_ETCD`): each new member joins as a learner through the voters,
//! the test starts its etcd from the root the agent wrote (what `systemctl start` would do),
//! and the agent promotes it once caught up. Throughout, a sampler checks that a majority of
//! voters stays healthy (a leader change may blind it for an election's length, never longer
//! than three seconds). Shrinking, the oldest member's agent removes the newest member
//! from etcd on its sync (leadership moved off it first) before the test stops that member's
//! etcd, as deleting its VM would. After each change etcd lists exactly the expected voters,
//! every member is healthy and serves all 1,000 keys written before the first change.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::cluster::{agent_ok, found, operator, view};
use exk8s_tests::dev::{Stack, start_dev, start_postgres_serve};
use exk8s_tests::etcd::{EtcdCluster, put_keys};
use exk8s_tests::members::{
    HEALTHCHECK, agent_performing, check_members, control_plane, join_one, sampler, wait_for,
};
use serde_json::json;

fn scale_up_and_down(stack: Stack, dir: &Path) {
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let first = founded.vms[0];
    let first_root = dir.join(format!("vm-{first}"));
    agent_ok(&stack, &founded, &first_root, first, "run");
    let mut etcd = EtcdCluster::start(std::slice::from_ref(&first_root));
    let first_url = format!("https://{}:2379", founded.ip_of[&first]);
    etcd.wait_healthy(
        &first_url,
        HEALTHCHECK.0,
        HEALTHCHECK.1,
        Duration::from_secs(60),
    );
    let client = (
        "/etc/exk8s/pki/apiserver-etcd-client.pem",
        "/etc/exk8s/pki/apiserver-etcd-client-key.pem",
    );
    put_keys(&first_root, &first_url, client.0, client.1, 1000);

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = sampler(first_root.clone(), first_url.clone(), Arc::clone(&stop));
    let started = operator(&stack, "PATCH", &format!("/clusters/{}", founded.cluster))
        .send_json(json!({"control_plane_count": 3}))
        .unwrap();
    assert_eq!(started.status(), 202);
    for _ in 0..2 {
        let voters = control_plane(&stack, founded.cluster)
            .iter()
            .filter(|n| n["etcd_membership"] == "voter")
            .map(|n| format!("https://{}:2379", n["private_ipv4"].as_str().unwrap()))
            .collect::<Vec<_>>()
            .join(",");
        join_one(&stack, &founded, dir, &mut etcd, &voters);
        // Every member takes the generation the join gave them, one at a time.
        for node in control_plane(&stack, founded.cluster) {
            let vm = node["vm_id"].as_i64().unwrap();
            agent_ok(&stack, &founded, &dir.join(format!("vm-{vm}")), vm, "sync");
        }
    }
    let grown = control_plane(&stack, founded.cluster);
    check_members(&first_root, &grown, 3, client);

    // And back to one: the newest member leaves first, removed from etcd by the oldest
    // member's agent on its sync (leadership moved off it first); then its VM goes.
    let shrink = operator(&stack, "PATCH", &format!("/clusters/{}", founded.cluster))
        .send_json(json!({"control_plane_count": 1}))
        .unwrap();
    assert_eq!(shrink.status(), 202);
    for remaining in [2, 1] {
        let mut leaving = None;
        wait_for("a member leaving", || {
            leaving = control_plane(&stack, founded.cluster)
                .into_iter()
                .find(|n| n["etcd_membership"] == "leaving");
            leaving.is_some()
        });
        let leaving = leaving.unwrap();
        let vm = leaving["vm_id"].as_i64().unwrap();
        agent_performing(&stack, &founded, &first_root, first, "sync");
        wait_for("the member removed", || {
            control_plane(&stack, founded.cluster).len() == remaining
        });
        let index = etcd
            .roots
            .iter()
            .position(|r| r.ends_with(format!("vm-{vm}")))
            .unwrap();
        etcd.stop(index);
        for node in control_plane(&stack, founded.cluster) {
            let vm = node["vm_id"].as_i64().unwrap();
            agent_ok(&stack, &founded, &dir.join(format!("vm-{vm}")), vm, "sync");
        }
    }
    stop.store(true, Ordering::SeqCst);
    let (samples, longest) = watcher.join().expect("quorum held throughout");
    assert!(samples > 5, "the sampler ran ({samples} samples)");
    eprintln!("{samples} health samples; longest leaderless moment {longest:?}");
    let shrunk = control_plane(&stack, founded.cluster);
    check_members(&first_root, &shrunk, 1, client);
    let done = view(&stack, founded.cluster);
    for kind in ["ScalingUp", "ScalingDown"] {
        let condition = done["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == kind)
            .unwrap()
            .clone();
        assert_eq!(condition["reason"], "AtDesiredSize", "{condition}");
    }
}

#[test]
fn a_control_plane_grows_to_three_and_back_on_real_etcd_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.21.0/24",
        &dir.path().join("api.log"),
        &[
            "--bootstrap-rate-per-vm",
            "600",
            "--bootstrap-rate-per-source",
            "6000",
        ],
    );
    scale_up_and_down(stack, dir.path());
}

#[test]
fn a_control_plane_grows_to_three_and_back_on_real_etcd_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.22.0/24");
    scale_up_and_down(stack, dir.path());
}
