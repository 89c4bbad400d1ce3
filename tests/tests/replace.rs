//! Replacing a dead control-plane member, end to end: the real `exk8s-api` (SQLite dev stack,
//! and `serve` on PostgreSQL), the real agent performing its etcd steps
//! (`EXK8S_AGENT_TEST_PERFORM_ETCD`) and three real etcd members run from the node roots.
//! One member's etcd is killed for good; its agent's next sync finds it unhealthy and says so;
//! `POST /clusters/{id}/nodes/{vm}/replace` then removes it first — etcd refuses even a learner
//! while a voter is unreachable — through the oldest healthy member's agent, releases its VM,
//! and a new member joins as a learner and is promoted. Throughout, a voting majority stays
//! healthy (sampled); at the end etcd lists exactly three healthy voters holding every key.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::cluster::{ETCD_CLIENT, agent_ok, found, operator, run_each};
use exk8s_tests::dev::{MANY_AGENTS, Stack, start_dev, start_postgres_serve};
use exk8s_tests::etcd::{EtcdCluster, put_keys};
use exk8s_tests::members::{
    HEALTHCHECK, agent_command, agent_performing, check_members, control_plane, join_one, members,
    sampler, sim_vm_ids, voter_urls, wait_for,
};
use serde_json::json;

fn replace_a_dead_member(stack: Stack, dir: &Path) {
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 3, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let roots = run_each(&stack, &founded, dir, "vm");
    let mut etcd = EtcdCluster::start(&roots);
    let all = voter_urls(&stack, founded.cluster);
    etcd.wait_healthy(&all, HEALTHCHECK.0, HEALTHCHECK.1, Duration::from_secs(60));
    let first_url = format!("https://{}:2379", founded.ip_of[&founded.vms[0]]);
    put_keys(&roots[0], &first_url, ETCD_CLIENT.0, ETCD_CLIENT.1, 1000);
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = sampler(roots[0].clone(), first_url.clone(), Arc::clone(&stop));

    // The third member's etcd dies for good; its agent's sync notices and reports it.
    let dead = founded.vms[2];
    etcd.stop(2);
    let out = agent_command(&stack, &founded, &roots[2], dead, "sync")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    wait_for("the dead member reported unhealthy", || {
        control_plane(&stack, founded.cluster)
            .iter()
            .any(|n| n["vm_id"] == dead && n["phase"] == "sync:failed")
    });

    let replace = operator(
        &stack,
        "POST",
        &format!("/clusters/{}/nodes/{dead}/replace", founded.cluster),
    )
    .call()
    .unwrap();
    assert_eq!(replace.status(), 202);
    wait_for("the dead member leaving", || {
        control_plane(&stack, founded.cluster)
            .iter()
            .any(|n| n["vm_id"] == dead && n["etcd_membership"] == "leaving")
    });
    assert_eq!(sim_vm_ids(&stack).len(), 3, "no new VM before the removal");
    // The oldest member's agent removes it from etcd on its sync; then its VM goes.
    agent_performing(&stack, &founded, &roots[0], founded.vms[0], "sync");
    wait_for("the dead member gone", || {
        !sim_vm_ids(&stack).contains(&dead) && control_plane(&stack, founded.cluster).len() == 2
    });
    let listed = members(&roots[0], &first_url).unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    for (vm, root) in founded.vms.iter().zip(&roots).take(2) {
        agent_ok(&stack, &founded, root, *vm, "sync");
    }

    // Its replacement joins as a learner through the two voters and is promoted.
    let voters = voter_urls(&stack, founded.cluster);
    join_one(&stack, &founded, dir, &mut etcd, &voters);
    for node in control_plane(&stack, founded.cluster) {
        let vm = node["vm_id"].as_i64().unwrap();
        agent_ok(&stack, &founded, &dir.join(format!("vm-{vm}")), vm, "sync");
    }
    stop.store(true, Ordering::SeqCst);
    let (samples, longest) = watcher.join().expect("quorum held throughout");
    assert!(samples > 3, "the sampler ran ({samples} samples)");
    eprintln!("{samples} health samples; longest leaderless moment {longest:?}");
    let nodes = control_plane(&stack, founded.cluster);
    check_members(&roots[0], &nodes, 3, ETCD_CLIENT);
    assert!(nodes.iter().all(|n| n["vm_id"] != dead));
    let vms = sim_vm_ids(&stack);
    let mut expected: Vec<i64> = nodes.iter().map(|n| n["vm_id"].as_i64().unwrap()).collect();
    expected.sort_unstable();
    assert_eq!(vms, expected, "the dead VM released, nothing leaked");
}

#[test]
fn a_dead_member_is_replaced_on_real_etcd_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_dev(
        &dir.path().join("dev"),
        "127.0.23.0/24",
        &dir.path().join("api.log"),
        &MANY_AGENTS,
    );
    replace_a_dead_member(stack, dir.path());
}

#[test]
fn a_dead_member_is_replaced_on_real_etcd_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.24.0/24", &[]);
    replace_a_dead_member(stack, dir.path());
}
