//! Control-plane remediation with no operator call, end to end: the real `exk8s-api` (SQLite
//! dev stack, and `serve` on PostgreSQL) reconciling every second, its clock moved past the
//! health policy's timeout through its test hook (`EXK8S_API_TEST_CLOCK_OFFSET_FILE`) instead of
//! slept through, the real agent performing its etcd steps and three real etcd members run
//! from the node roots.
//!
//! One member's VM is destroyed in the compute simulator and its etcd killed: the health pass
//! sees the VM gone, watches it for the policy's `vm_down_after_secs`, then removes the member
//! first (etcd refuses even a learner while a voter is unreachable) through the oldest healthy
//! member's agent; its replacement joins as a learner and is promoted. On the dev stack the
//! API is killed (SIGKILL) twice on the way and goes on from its rows. A voting majority stays healthy
//! throughout (sampled); etcd ends with exactly three healthy voters holding every key, and the
//! remediation is on the cluster's change stream.
//! Then two of the three die at once: remediation refuses — quorum would be lost — the
//! cluster's `RemediationAllowed` says so, and nothing is removed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use exk8s_tests::cluster::{ETCD_CLIENT, Founded, agent_ok, found, operator, run_each, view};
use exk8s_tests::dev::{
    MANY_AGENTS, Stack, http, start_dev_with_env, start_postgres_serve_with_env,
};
use exk8s_tests::etcd::{EtcdCluster, put_keys};
use exk8s_tests::members::{
    HEALTHCHECK, agent_performing, check_members, control_plane, join_one, sampler, sim_vm_ids,
    voter_urls, wait_for,
};
use serde_json::{Value, json};

/// The API's clock hook.
const CLOCK_HOOK: &str = "EXK8S_API_TEST_CLOCK_OFFSET_FILE";

/// Past the default `vm_down_after_secs` (120), and with two of them still inside the 5 minutes
/// certificates are backdated by (a member minted after the jump verifies at the real time).
const PAST_VM_DOWN: i64 = 130;

/// The node's `HealthCheckSucceeded` reason.
fn health_reason(stack: &Stack, cluster: i64, vm: i64) -> String {
    control_plane(stack, cluster)
        .iter()
        .find(|n| n["vm_id"] == vm)
        .and_then(|n| {
            n["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "HealthCheckSucceeded")
                .map(|c| c["reason"].as_str().unwrap_or_default().to_owned())
        })
        .unwrap_or_default()
}

/// The cluster's `RemediationAllowed`.
fn remediation_allowed(stack: &Stack, cluster: i64) -> Value {
    view(stack, cluster)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RemediationAllowed")
        .cloned()
        .unwrap()
}

/// The first `remediation` event of the cluster's change stream (it replays from the start).
fn remediation_event(stack: &Stack, cluster: i64) -> Value {
    use std::io::BufRead as _;
    let response = operator(stack, "GET", &format!("/clusters/{cluster}/events"))
        .call()
        .unwrap();
    let mut kind = String::new();
    for line in std::io::BufReader::new(response.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(k) = line.strip_prefix("event:") {
            k.trim().clone_into(&mut kind);
        } else if let Some(data) = line.strip_prefix("data:") {
            if kind == "remediation" {
                return serde_json::from_str(data.trim()).unwrap();
            }
        }
    }
    panic!("the stream ended without a remediation event");
}

/// The compute simulator destroys `vm`, as a cloud losing a host would.
fn destroy(stack: &Stack, vm: i64) {
    let url = format!("{}/sim/compute/sim/vms/{vm}/destroy", stack.base);
    let status = http().post(&url).call().unwrap().status();
    assert_eq!(status, 204, "destroying VM {vm}");
}

/// Moves the API's clock to `secs` ahead of the real time.
fn clock_ahead(file: &Path, secs: i64) {
    std::fs::write(file, secs.to_string()).unwrap();
}

/// `vm`'s VM is destroyed and its etcd killed; waits until the health pass watches it.
fn kill(stack: &Stack, founded: &Founded, etcd: &mut EtcdCluster, index: usize) {
    let vm = founded.vms[index];
    etcd.stop(index);
    destroy(stack, vm);
    wait_for("the health pass to watch the VM gone", || {
        health_reason(stack, founded.cluster, vm) == "Watching"
    });
}

/// `crash`: kill the API twice on the way (the dev stack only: `serve`'s compute simulator
/// keeps its VMs in memory, so a restart would lose them).
fn remediate_a_dead_member(stack: Stack, dir: &Path, clock: &Path, crash: bool) {
    let kill_and_restart = || {
        if crash {
            stack.kill_and_restart();
        }
    };
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 3, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let cluster = founded.cluster;
    let roots = run_each(&stack, &founded, dir, "vm");
    let mut etcd = EtcdCluster::start(&roots);
    let all = voter_urls(&stack, cluster);
    etcd.wait_healthy(&all, HEALTHCHECK.0, HEALTHCHECK.1, Duration::from_secs(60));
    let first_url = format!("https://{}:2379", founded.ip_of[&founded.vms[0]]);
    put_keys(&roots[0], &first_url, ETCD_CLIENT.0, ETCD_CLIENT.1, 1000);
    assert_eq!(remediation_allowed(&stack, cluster)["status"], "True");
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = sampler(roots[0].clone(), first_url.clone(), Arc::clone(&stop));

    // The third member dies: its VM is gone and its etcd with it. Nobody calls the API.
    let dead = founded.vms[2];
    kill(&stack, &founded, &mut etcd, 2);
    assert!(
        control_plane(&stack, cluster)
            .iter()
            .all(|n| n["etcd_membership"] == "voter"),
        "watched, not yet remediated"
    );
    clock_ahead(clock, PAST_VM_DOWN);
    wait_for("the dead member remediated: leaving first", || {
        control_plane(&stack, cluster)
            .iter()
            .any(|n| n["vm_id"] == dead && n["etcd_membership"] == "leaving")
    });
    // The API dies (SIGKILL) with the remediation recorded: it goes on from its rows.
    kill_and_restart();
    // The oldest member's agent removes it from etcd on its sync; the API dies again, before or
    // after it released the VM and forgot the row; its reconciler finishes that after.
    agent_performing(&stack, &founded, &roots[0], founded.vms[0], "sync");
    kill_and_restart();
    wait_for("the dead member gone", || {
        control_plane(&stack, cluster).len() == 2
    });
    for (vm, root) in founded.vms.iter().zip(&roots).take(2) {
        agent_ok(&stack, &founded, root, *vm, "sync");
    }
    // Its replacement joins as a learner through the two voters and is promoted.
    let voters = voter_urls(&stack, cluster);
    join_one(&stack, &founded, dir, &mut etcd, &voters);
    for node in control_plane(&stack, cluster) {
        let vm = node["vm_id"].as_i64().unwrap();
        agent_ok(&stack, &founded, &dir.join(format!("vm-{vm}")), vm, "sync");
    }
    stop.store(true, Ordering::SeqCst);
    let (samples, longest) = watcher.join().expect("quorum held throughout");
    assert!(samples > 3, "the sampler ran ({samples} samples)");
    eprintln!("{samples} health samples; longest leaderless moment {longest:?}");
    let nodes = control_plane(&stack, cluster);
    check_members(&roots[0], &nodes, 3, ETCD_CLIENT);
    assert!(nodes.iter().all(|n| n["vm_id"] != dead));
    let vms = sim_vm_ids(&stack);
    let mut expected: Vec<i64> = nodes.iter().map(|n| n["vm_id"].as_i64().unwrap()).collect();
    expected.sort_unstable();
    assert_eq!(vms, expected, "the dead VM gone, nothing leaked");
    let allowed = remediation_allowed(&stack, cluster);
    assert_eq!(allowed["status"], "True", "{allowed}");
    let event = remediation_event(&stack, cluster);
    assert_eq!(
        (&event["phase"], &event["vm_id"], &event["error_reason"]),
        (
            &json!("control-plane"),
            &json!(dead),
            &json!("MachineDeleted")
        ),
        "{event}"
    );

    // Two of the three die at once. Even a policy that tolerates every machine unhealthy
    // replaces none: removing one would leave one healthy member of two, no quorum.
    let policy = operator(&stack, "PUT", &format!("/clusters/{cluster}/health-policy"))
        .send_json(json!({"max_unhealthy": "100%"}))
        .unwrap();
    assert_eq!(policy.status(), 200);
    let before: Vec<i64> = nodes.iter().map(|n| n["vm_id"].as_i64().unwrap()).collect();
    for index in 0..2 {
        kill(&stack, &founded, &mut etcd, index);
    }
    clock_ahead(clock, 2 * PAST_VM_DOWN);
    wait_for("RemediationAllowed False: quorum", || {
        remediation_allowed(&stack, cluster)["reason"] == "QuorumAtRisk"
    });
    let refused = remediation_allowed(&stack, cluster);
    assert_eq!(refused["status"], "False", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("only 1 of 3 etcd members are healthy"),
        "{refused}"
    );
    for vm in &founded.vms[..2] {
        assert_eq!(health_reason(&stack, cluster, *vm), "MachineDeleted");
    }
    let after = control_plane(&stack, cluster);
    let mut still: Vec<i64> = after.iter().map(|n| n["vm_id"].as_i64().unwrap()).collect();
    still.sort_unstable();
    let mut before = before;
    before.sort_unstable();
    assert_eq!(still, before, "nothing removed");
    assert!(
        after.iter().all(|n| n["etcd_membership"] == "voter"),
        "no member leaving: {after:?}"
    );
}

#[test]
fn a_dead_member_is_remediated_on_real_etcd_on_the_sqlite_dev_stack() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock-offset");
    let clock_env = clock.display().to_string();
    let stack = start_dev_with_env(
        &dir.path().join("dev"),
        "127.0.27.0/24",
        &dir.path().join("api.log"),
        &[&MANY_AGENTS[..], &["--reconcile-interval-secs", "1"]].concat(),
        &[(CLOCK_HOOK, &clock_env)],
    );
    remediate_a_dead_member(stack, dir.path(), &clock, true);
}

#[test]
fn a_dead_member_is_remediated_on_real_etcd_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("clock-offset");
    let clock_env = clock.display().to_string();
    let stack = start_postgres_serve_with_env(
        dir.path(),
        "127.0.28.0/24",
        &["--reconcile-interval-secs", "1"],
        &[(CLOCK_HOOK, &clock_env)],
    );
    remediate_a_dead_member(stack, dir.path(), &clock, false);
}
