//! Growing a control plane 1 → 3 end to end: the real `exk8s-api` (SQLite dev stack, and
//! `serve` on PostgreSQL), the real agent, and real etcd members run from the node roots. The
//! agent records host actions under `--root` but performs its etcd membership steps for real
//! (`EXK8S_AGENT_TEST_PERFORM_ETCD`): each new member joins as a learner through the voters,
//! the test starts its etcd from the root the agent wrote (what `systemctl start` would do),
//! and the agent promotes it once caught up. Throughout, a sampler checks that healthy voters
//! never fall below quorum; at the end etcd lists exactly three voters, every member is healthy
//! and serves all 1,000 keys written before the change.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use exk8s_tests::cluster::{Founded, agent_ok, found, operator, view};
use exk8s_tests::dev::{Stack, start_dev, start_postgres_serve};
use exk8s_tests::etcd::{EtcdCluster, etcdctl, put_keys};
use exk8s_tests::procs::binary;
use serde_json::{Value, json};

const HEALTHCHECK: (&str, &str) = (
    "/etc/exk8s/pki/etcd-healthcheck-client.pem",
    "/etc/exk8s/pki/etcd-healthcheck-client-key.pem",
);

/// etcd's members as `member list -w json` shows them: (client URLs, is learner).
fn members(root: &Path, endpoints: &str) -> Option<Vec<(Vec<String>, bool)>> {
    let (ok, out) = etcdctl(
        root,
        endpoints,
        HEALTHCHECK.0,
        HEALTHCHECK.1,
        &["member", "list", "-w", "json"],
    );
    if !ok {
        return None;
    }
    let doc: Value = serde_json::from_str(&out).ok()?;
    Some(
        doc["members"]
            .as_array()?
            .iter()
            .map(|m| {
                let urls = m["clientURLs"]
                    .as_array()
                    .map(|u| {
                        u.iter()
                            .filter_map(|u| u.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                (urls, m["isLearner"].as_bool().unwrap_or(false))
            })
            .collect(),
    )
}

/// Samples, until stopped, whether the voters that answer `endpoint health` keep a quorum.
fn sampler(root: PathBuf, first: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut samples = 0;
        while !stop.load(Ordering::SeqCst) {
            if let Some(list) = members(&root, &first) {
                let voters: Vec<String> = list
                    .iter()
                    .filter(|(_, learner)| !learner)
                    .flat_map(|(urls, _)| urls.first().cloned())
                    .collect();
                let healthy = voters
                    .iter()
                    .filter(|url| {
                        etcdctl(
                            &root,
                            url,
                            HEALTHCHECK.0,
                            HEALTHCHECK.1,
                            &["endpoint", "health"],
                        )
                        .0
                    })
                    .count();
                assert!(
                    healthy > voters.len() / 2,
                    "quorum lost: {healthy} of {} voters healthy",
                    voters.len()
                );
                samples += 1;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        samples
    })
}

fn control_plane(stack: &Stack, cluster: i64) -> Vec<Value> {
    view(stack, cluster)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "control-plane")
        .cloned()
        .collect()
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One member joins: the agent runs (performing its etcd steps), the test starts etcd from the
/// root once etcd lists the learner, the agent promotes it and completes.
fn join_one(stack: &Stack, founded: &Founded, dir: &Path, etcd: &mut EtcdCluster, voters: &str) {
    let mut joining = None;
    wait_for("a member joining", || {
        joining = control_plane(stack, founded.cluster)
            .into_iter()
            .find(|n| n["etcd_membership"] == "joining");
        joining.is_some()
    });
    let node = joining.unwrap();
    let vm = node["vm_id"].as_i64().unwrap();
    let root = dir.join(format!("vm-{vm}"));
    let agent = Command::new(binary("exk8s-agent"))
        .env("EXK8S_CONFIG", root.with_extension("no-config.toml"))
        .env("EXK8S_AGENT_TEST_PERFORM_ETCD", "1")
        .arg("--keys-dir")
        .arg(&founded.keys)
        .args(["run", "--root"])
        .arg(&root)
        .args([
            "--api-url",
            &stack.base,
            "--imds-url",
            &format!("{}/sim/imds/{vm}", stack.base),
            "--insecure-http",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("agent-{vm}.log"))).unwrap())
        .spawn()
        .unwrap();
    let first_root = &etcd.roots[0].clone();
    wait_for("etcd to list the learner", || {
        members(first_root, voters).is_some_and(|list| list.iter().any(|(_, learner)| *learner))
    });
    etcd.add(&root);
    let out = agent.wait_with_output().unwrap();
    let log = std::fs::read_to_string(dir.join(format!("agent-{vm}.log"))).unwrap();
    assert!(out.status.success(), "the joining agent: {log}");
    assert!(log.contains("performed and recorded"), "{log}");
    wait_for("the new member voting", || {
        control_plane(stack, founded.cluster)
            .iter()
            .any(|n| n["vm_id"] == vm && n["etcd_membership"] == "voter")
    });
}

fn scale_to_three(stack: Stack, dir: &Path) {
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
    stop.store(true, Ordering::SeqCst);
    let samples = watcher.join().expect("quorum held throughout");
    assert!(samples > 5, "the sampler ran ({samples} samples)");

    let nodes = control_plane(&stack, founded.cluster);
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n["etcd_membership"] == "voter"));
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("https://{}:2379", n["private_ipv4"].as_str().unwrap()))
        .collect();
    let list = members(&first_root, &urls.join(",")).unwrap();
    assert_eq!(list.len(), 3);
    assert!(list.iter().all(|(_, learner)| !learner), "{list:?}");
    for url in &urls {
        let (ok, out) = etcdctl(
            &first_root,
            url,
            client.0,
            client.1,
            &["get", "/k/", "--prefix", "--keys-only"],
        );
        let keys = out.lines().filter(|l| l.starts_with("/k/")).count();
        assert!(ok && keys == 1000, "{url}: {keys} keys");
    }
    etcd.wait_healthy(
        &urls.join(","),
        HEALTHCHECK.0,
        HEALTHCHECK.1,
        Duration::from_secs(60),
    );
    let done = view(&stack, founded.cluster);
    let scaling = done["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ScalingUp")
        .unwrap()
        .clone();
    assert_eq!(scaling["reason"], "AtDesiredSize", "{scaling}");
}

#[test]
fn a_control_plane_grows_to_three_on_real_etcd_on_the_sqlite_dev_stack() {
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
    scale_to_three(stack, dir.path());
}

#[test]
fn a_control_plane_grows_to_three_on_real_etcd_on_postgres() {
    let dir = tempfile::tempdir().unwrap();
    let stack = start_postgres_serve(dir.path(), "127.0.22.0/24");
    scale_to_three(stack, dir.path());
}
