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

/// The longest a majority of voters may fail `endpoint health` in a row: a leader change (the
/// removal moves leadership off the leaving member) leaves etcd without a leader for an
/// election's length, which health checks see; losing quorum would last until repaired.
const LONGEST_BLIP: Duration = Duration::from_secs(3);

/// Samples, until stopped, whether a majority of voters answers `endpoint health`; panics when
/// none has for longer than [`LONGEST_BLIP`]. Returns (samples, the longest blip seen).
fn sampler(
    root: PathBuf,
    first: String,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, Duration)> {
    std::thread::spawn(move || {
        let (mut samples, mut longest) = (0, Duration::ZERO);
        let mut failing_since: Option<Instant> = None;
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
                if healthy > voters.len() / 2 {
                    failing_since = None;
                } else {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    longest = longest.max(since.elapsed());
                    assert!(
                        since.elapsed() < LONGEST_BLIP,
                        "quorum lost: {healthy} of {} voters healthy for {:?}",
                        voters.len(),
                        since.elapsed()
                    );
                }
                samples += 1;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        (samples, longest)
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

/// `exk8s-agent <command>` for `vm` in `root`, performing its etcd membership steps for real.
fn agent_command(stack: &Stack, founded: &Founded, root: &Path, vm: i64, command: &str) -> Command {
    let mut agent = Command::new(binary("exk8s-agent"));
    agent
        .env("EXK8S_CONFIG", root.with_extension("no-config.toml"))
        .env("EXK8S_AGENT_TEST_PERFORM_ETCD", "1")
        .arg("--keys-dir")
        .arg(&founded.keys)
        .args([command, "--root"])
        .arg(root)
        .args([
            "--api-url",
            &stack.base,
            "--imds-url",
            &format!("{}/sim/imds/{vm}", stack.base),
            "--insecure-http",
        ]);
    agent
}

/// Runs `agent_command` and panics with its log unless it succeeds.
fn agent_performing(stack: &Stack, founded: &Founded, root: &Path, vm: i64, command: &str) {
    let out = agent_command(stack, founded, root, vm, command)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exk8s-agent {command} for vm {vm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    let agent = agent_command(stack, founded, &root, vm, "run")
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

/// etcd lists exactly the control plane's `count` nodes, all voting, each healthy and serving
/// every key.
fn check_members(root: &Path, nodes: &[Value], count: usize, client: (&str, &str)) {
    assert_eq!(nodes.len(), count);
    assert!(nodes.iter().all(|n| n["etcd_membership"] == "voter"));
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("https://{}:2379", n["private_ipv4"].as_str().unwrap()))
        .collect();
    let list = members(root, &urls.join(",")).unwrap();
    assert_eq!(list.len(), count, "{list:?}");
    assert!(list.iter().all(|(_, learner)| !learner), "{list:?}");
    for url in &urls {
        let (ok, out) = etcdctl(
            root,
            url,
            client.0,
            client.1,
            &["get", "/k/", "--prefix", "--keys-only"],
        );
        let keys = out.lines().filter(|l| l.starts_with("/k/")).count();
        assert!(ok && keys == 1000, "{url}: {keys} keys");
        let (ok, out) = etcdctl(
            root,
            url,
            HEALTHCHECK.0,
            HEALTHCHECK.1,
            &["endpoint", "health"],
        );
        assert!(ok, "{url}: {out}");
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
