//! Driving a control plane's membership changes against real etcd members run from node
//! roots: etcd's own member list, a background sampler asserting a voting majority stays
//! healthy, the real agent performing its etcd steps, and one member joining end to end
//! (used by tests/tests/scale.rs and tests/tests/remediation.rs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{Founded, agent_with, view};
use crate::dev::Stack;
use crate::etcd::{EtcdCluster, etcdctl};
use crate::procs::binary;

pub const HEALTHCHECK: (&str, &str) = (
    "/etc/exk8s/pki/etcd-healthcheck-client.pem",
    "/etc/exk8s/pki/etcd-healthcheck-client-key.pem",
);

/// etcd's members as `member list -w json` shows them: (client URLs, is learner).
pub fn members(root: &Path, endpoints: &str) -> Option<Vec<(Vec<String>, bool)>> {
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
pub const LONGEST_BLIP: Duration = Duration::from_secs(3);

/// Samples, until stopped, whether a majority of voters answers `endpoint health`; panics when
/// none has for longer than [`LONGEST_BLIP`]. Returns (samples, the longest blip seen).
pub fn sampler(
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
                // Every voter at once, within 2 s: a dead one takes etcdctl's whole timeout to say so.
                let healthy = std::thread::scope(|scope| {
                    let checks: Vec<_> = voters
                        .iter()
                        .map(|url| {
                            let root = &root;
                            scope.spawn(move || {
                                etcdctl(
                                    root,
                                    url,
                                    HEALTHCHECK.0,
                                    HEALTHCHECK.1,
                                    &["endpoint", "health", "--command-timeout=2s"],
                                )
                                .0
                            })
                        })
                        .collect();
                    checks
                        .into_iter()
                        .map(|check| check.join().unwrap_or(false))
                        .filter(|healthy| *healthy)
                        .count()
                });
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

pub fn control_plane(stack: &Stack, cluster: i64) -> Vec<Value> {
    view(stack, cluster)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "control-plane")
        .cloned()
        .collect()
}

pub fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
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
pub fn agent_command(
    stack: &Stack,
    founded: &Founded,
    root: &Path,
    vm: i64,
    command: &str,
) -> Command {
    agent_with(
        Command::new(binary("exk8s-agent")),
        stack,
        founded,
        root,
        vm,
        command,
    )
}

/// Runs `agent_command` and panics with its log unless it succeeds.
pub fn agent_performing(stack: &Stack, founded: &Founded, root: &Path, vm: i64, command: &str) {
    let out = agent_command(stack, founded, root, vm, command)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exk8s-agent {command} for vm {vm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits for a control-plane member whose etcd membership is `membership` (`joining`,
/// `leaving`); its node as the cluster view shows it.
pub fn member_in(stack: &Stack, cluster: i64, membership: &str) -> Value {
    let mut found = None;
    wait_for(&format!("a member {membership}"), || {
        found = control_plane(stack, cluster)
            .into_iter()
            .find(|n| n["etcd_membership"] == membership);
        found.is_some()
    });
    found.unwrap()
}

/// Waits for the control plane's joining member; its VM id.
pub fn joining_member(stack: &Stack, cluster: i64) -> i64 {
    member_in(stack, cluster, "joining")["vm_id"]
        .as_i64()
        .unwrap()
}

/// One member joins: the agent runs (performing its etcd steps), the test starts etcd from the
/// root once etcd lists the learner, the agent promotes it and completes.
pub fn join_one(
    stack: &Stack,
    founded: &Founded,
    dir: &Path,
    etcd: &mut EtcdCluster,
    voters: &str,
) {
    let vm = joining_member(stack, founded.cluster);
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

/// etcd lists exactly the control plane's `count` nodes, all voting, each healthy and serving
/// every key.
pub fn check_members(root: &Path, nodes: &[Value], count: usize, client: (&str, &str)) {
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

/// The voting members' etcd client URLs, comma-separated, as the API lists them.
pub fn voter_urls(stack: &Stack, cluster: i64) -> String {
    control_plane(stack, cluster)
        .iter()
        .filter(|n| n["etcd_membership"] == "voter")
        .map(|n| format!("https://{}:2379", n["private_ipv4"].as_str().unwrap()))
        .collect::<Vec<_>>()
        .join(",")
}

/// The simulator's VM ids.
pub fn sim_vm_ids(stack: &Stack) -> Vec<i64> {
    let vms: Vec<Value> = crate::dev::http()
        .get(&format!("{}/sim/compute/v1/vms", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let mut ids: Vec<i64> = vms.iter().map(|vm| vm["id"].as_i64().unwrap()).collect();
    ids.sort_unstable();
    ids
}
