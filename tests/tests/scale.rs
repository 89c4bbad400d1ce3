//! Changing a control plane 1 → 3 → 5 → 3, end to end: the real `exk8s-api` (SQLite dev
//! stack, and `serve` on PostgreSQL), the real agent, and real etcd members run from the node
//! roots. The agent records host actions under `--root` but performs its etcd membership steps
//! for real (`EXK8S_AGENT_TEST_PERFORM_ETCD`): each new member joins as a learner through the
//! voters, the test starts its etcd from the root the agent wrote (what `systemctl start` would
//! do), and the agent promotes it once caught up. On the way to five, one join's etcd never
//! starts: at the API's join deadline its learner is removed by the oldest voter's agent, its VM
//! released, and the cluster says why; asked again, the change finishes. Throughout, a sampler
//! checks that a majority of voters stays healthy (a leader change may blind it for an
//! election's length, never longer than three seconds). Shrinking, the oldest member's agent
//! removes the newest member from etcd on its sync (leadership moved off it first) before the
//! test stops that member's etcd, as deleting its VM would. After each change etcd lists
//! exactly the expected voters, every member is healthy and serves all 1,000 keys written
//! before the first change.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::cluster::{Founded, agent_ok, found, operator, view};
use exk8s_tests::dev::{Stack, start_dev, start_postgres_serve};
use exk8s_tests::etcd::{EtcdCluster, put_keys};
use exk8s_tests::members::{
    HEALTHCHECK, agent_command, agent_performing, check_members, control_plane, join_one,
    joining_member, member_in, members, sampler, sim_vm_ids, voter_urls, wait_for,
};
use serde_json::json;

/// The API's join deadline in these tests: far above a join's few seconds, short enough to wait
/// out once.
const JOIN_TIMEOUT_SECS: &str = "40";

/// A short join deadline, and a reconciler that notices it quickly.
const JOIN_FLAGS: [&str; 4] = [
    "--member-join-timeout-secs",
    JOIN_TIMEOUT_SECS,
    "--reconcile-interval-secs",
    "1",
];

const CLIENT: (&str, &str) = (
    "/etc/exk8s/pki/apiserver-etcd-client.pem",
    "/etc/exk8s/pki/apiserver-etcd-client-key.pem",
);

fn scale(stack: &Stack, founded: &Founded, count: i64) {
    let started = operator(stack, "PATCH", &format!("/clusters/{}", founded.cluster))
        .send_json(json!({"control_plane_count": count}))
        .unwrap();
    assert_eq!(started.status(), 202, "PATCH to {count}");
}

/// Every member takes its generation, one at a time.
fn sync_all(stack: &Stack, founded: &Founded, dir: &Path) {
    for node in control_plane(stack, founded.cluster) {
        let vm = node["vm_id"].as_i64().unwrap();
        agent_ok(stack, founded, &dir.join(format!("vm-{vm}")), vm, "sync");
    }
}

/// `joins` members join one after another, each followed by every member's sync.
fn grow(stack: &Stack, founded: &Founded, dir: &Path, etcd: &mut EtcdCluster, joins: usize) {
    for _ in 0..joins {
        let voters = voter_urls(stack, founded.cluster);
        join_one(stack, founded, dir, etcd, &voters);
        sync_all(stack, founded, dir);
    }
}

/// The newest members leave one by one until `to` remain, each removed from etcd by the oldest
/// member's agent on its sync; then its VM goes (the test stops its etcd, as deleting it would).
fn shrink(
    stack: &Stack,
    founded: &Founded,
    dir: &Path,
    etcd: &mut EtcdCluster,
    from: usize,
    to: usize,
) {
    let first = founded.vms[0];
    let first_root = dir.join(format!("vm-{first}"));
    for remaining in (to..from).rev() {
        let leaving = member_in(stack, founded.cluster, "leaving");
        let vm = leaving["vm_id"].as_i64().unwrap();
        agent_performing(stack, founded, &first_root, first, "sync");
        wait_for("the member removed", || {
            control_plane(stack, founded.cluster).len() == remaining
        });
        let index = etcd
            .roots
            .iter()
            .position(|r| r.ends_with(format!("vm-{vm}")))
            .unwrap();
        etcd.stop(index);
        sync_all(stack, founded, dir);
    }
}

/// A join whose etcd never starts: its agent adds the learner and waits to promote it; at the
/// API's deadline the join is abandoned, the oldest voter's agent removes the learner, the VM
/// is released and the cluster says why — while the voters keep their quorum.
fn abandoned_join(stack: &Stack, founded: &Founded, dir: &Path, first_url: &str) {
    let vm = joining_member(stack, founded.cluster);
    let root = dir.join(format!("vm-{vm}"));
    let first_root = dir.join(format!("vm-{}", founded.vms[0]));
    let mut stuck = agent_command(stack, founded, &root, vm, "run")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("agent-{vm}.log"))).unwrap())
        .spawn()
        .unwrap();
    wait_for("etcd to list the learner", || {
        members(&first_root, first_url).is_some_and(|list| list.iter().any(|(_, learner)| *learner))
    });
    let counted = view(stack, founded.cluster)["control_plane_members"].clone();
    assert_eq!(
        counted,
        json!({"desired": 5, "voters": 3, "joining": 1, "leaving": 0})
    );
    // Its etcd is never started. The API gives up at the deadline and hands the learner's
    // removal to the oldest voter.
    let mut leaving = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !leaving {
        assert!(
            std::time::Instant::now() < deadline,
            "the join was never abandoned"
        );
        std::thread::sleep(Duration::from_millis(500));
        leaving = control_plane(stack, founded.cluster)
            .iter()
            .any(|n| n["vm_id"] == vm && n["etcd_membership"] == "leaving");
    }
    agent_performing(stack, founded, &first_root, founded.vms[0], "sync");
    // Its VM goes first, then its row (api/src/membership/converge.rs): both, in that order.
    wait_for("the abandoned VM released", || {
        !sim_vm_ids(stack).contains(&vm)
    });
    wait_for("the abandoned node's row gone", || {
        control_plane(stack, founded.cluster).len() == 3
    });
    stuck.kill().unwrap();
    stuck.wait().unwrap();
    let listed = members(&first_root, first_url).unwrap();
    assert_eq!(listed.len(), 3, "the learner is gone: {listed:?}");
    assert!(listed.iter().all(|(_, learner)| !learner), "{listed:?}");
    let stopped = view(stack, founded.cluster);
    let why = stopped["membership_error"].as_str().unwrap();
    assert!(
        why.contains(&format!("did not finish within {JOIN_TIMEOUT_SECS}s")),
        "{why}"
    );
    let condition = stopped["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ScalingUp")
        .unwrap()
        .clone();
    assert_eq!(condition["reason"], "ChangeStopped", "{condition}");
    assert_eq!(control_plane(stack, founded.cluster).len(), 3);
    sync_all(stack, founded, dir);
}

fn scale_through_three_and_five(stack: Stack, dir: &Path) {
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
    put_keys(&first_root, &first_url, CLIENT.0, CLIENT.1, 1000);

    let stop = Arc::new(AtomicBool::new(false));
    let watcher = sampler(first_root.clone(), first_url.clone(), Arc::clone(&stop));
    scale(&stack, &founded, 3);
    grow(&stack, &founded, dir, &mut etcd, 2);
    check_members(
        &first_root,
        &control_plane(&stack, founded.cluster),
        3,
        CLIENT,
    );

    scale(&stack, &founded, 5);
    abandoned_join(&stack, &founded, dir, &first_url);
    scale(&stack, &founded, 5);
    grow(&stack, &founded, dir, &mut etcd, 2);
    check_members(
        &first_root,
        &control_plane(&stack, founded.cluster),
        5,
        CLIENT,
    );

    scale(&stack, &founded, 3);
    shrink(&stack, &founded, dir, &mut etcd, 5, 3);
    stop.store(true, Ordering::SeqCst);
    let (samples, longest) = watcher.join().expect("quorum held throughout");
    assert!(samples > 5, "the sampler ran ({samples} samples)");
    eprintln!("{samples} health samples; longest leaderless moment {longest:?}");
    let shrunk = control_plane(&stack, founded.cluster);
    check_members(&first_root, &shrunk, 3, CLIENT);
    let mut recorded: Vec<i64> = shrunk
        .iter()
        .map(|n| n["vm_id"].as_i64().unwrap())
        .collect();
    recorded.sort_unstable();
    assert_eq!(
        sim_vm_ids(&stack),
        recorded,
        "every VM released with its member"
    );
    let done = view(&stack, founded.cluster);
    assert_eq!(
        done["control_plane_members"],
        json!({"desired": 3, "voters": 3, "joining": 0, "leaving": 0})
    );
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
fn a_control_plane_goes_one_three_five_three_on_real_etcd_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.21.0/24",
        &dir.path().join("api.log"),
        &[
            JOIN_FLAGS.as_slice(),
            // A test's many agent runs, seconds apart: more than a real node sends.
            &[
                "--bootstrap-rate-per-vm",
                "600",
                "--bootstrap-rate-per-source",
                "6000",
            ],
        ]
        .concat(),
    );
    scale_through_three_and_five(stack, dir.path());
}

#[test]
fn a_control_plane_goes_one_three_five_three_on_real_etcd_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.22.0/24", &JOIN_FLAGS);
    scale_through_three_and_five(stack, dir.path());
}
