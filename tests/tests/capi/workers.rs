//! The cluster's workers as Cluster API asks for them: docs/cluster-api.md's MachinePool and
//! `ExK8sMachinePool`, applied verbatim. exk8s makes a worker pool of the MachinePool's count
//! whose machines the `ExK8sMachinePool` lists by provider ID, and Cluster API's MachinePool
//! controller takes it as provisioned; a paused Cluster leaves it alone; the pool scales, keeps
//! its workers at the MachinePool's version through the control plane's upgrade, is upgraded
//! when the MachinePool's version changes, and is deleted with the MachinePool.

use std::path::Path;
use std::time::Duration;

use exk8s_tests::cluster::{operator, view as cluster_view};
use exk8s_tests::dev::Stack;
use exk8s_tests::management::{Management, example_workers_manifest};
use exk8s_tests::procs::wait_until;
use exk8s_tests::timeline::mark;
use serde_json::Value;

use super::{agents_pass, condition};

const NAME: &str = "shop-workers";

/// exk8s's view of the pool, if it exists.
pub(crate) fn pool(stack: &Stack, id: i64) -> Option<Value> {
    let pools: Value = operator(stack, "GET", &format!("/clusters/{id}/node-pools"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    pools
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == NAME)
        .cloned()
}

fn machine_pool(management: &Management) -> Option<Value> {
    management.get("exk8smachinepool", NAME)
}

/// Passes of the agents until the `ExK8sMachinePool` says `done` (or panics after `limit`).
fn until(
    management: &Management,
    stack: &Stack,
    dir: &Path,
    id: i64,
    what: &str,
    limit: Duration,
    done: impl Fn(&Value) -> bool,
) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        agents_pass(stack, dir, id);
        let object = machine_pool(management).unwrap();
        if done(&object) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not after {limit:?}:\n{:#}\nexk8s: {:#}\n{}",
            object["status"],
            pool(stack, id).unwrap_or_default(),
            management.controller_logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The MachinePool at `version` with 2 workers: made, booted, listed, provisioned.
pub(crate) fn made(management: &Management, stack: &Stack, dir: &Path, id: i64, version: &str) {
    mark("kubectl apply: MachinePool, ExK8sMachinePool");
    management
        .apply(&example_workers_manifest(version, 2))
        .unwrap();
    until(
        management,
        stack,
        dir,
        id,
        "2 workers ready",
        Duration::from_secs(300),
        |o| {
            o["status"]["readyReplicas"] == 2
                && condition(o, "Ready").is_some_and(|c| c["status"] == "True")
        },
    );
    let object = machine_pool(management).unwrap();
    let exk8s = pool(stack, id).unwrap();
    assert_eq!(object["status"]["poolID"], exk8s["id"], "{object}");
    assert_eq!(exk8s["desired"], 2, "{exk8s}");
    assert_eq!(exk8s["labels"]["tier"], "web", "{exk8s}");
    let nodes = exk8s["nodes"].as_array().unwrap();
    let ids: Vec<Value> = nodes.iter().map(|n| n["provider_id"].clone()).collect();
    for node in nodes {
        assert_eq!(
            node["provider_id"],
            format!("exk8s://{id}/{}", node["vm_id"]),
            "{node}"
        );
    }
    assert_eq!(
        object["spec"]["providerIDList"],
        Value::from(ids),
        "{object}"
    );
    assert_eq!(object["status"]["replicas"], 2);
    assert_eq!(object["status"]["initialization"]["provisioned"], true);
    assert_eq!(object["status"]["ready"], true);
    let names: Vec<&Value> = nodes.iter().map(|n| &n["name"]).collect();
    let instances: Vec<&Value> = object["status"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["instanceName"])
        .collect();
    assert_eq!(instances, names);
    assert_eq!(
        object["metadata"]["finalizers"][0],
        "infrastructure.cluster.x-k8s.io/exk8s-machinepool"
    );
    // Cluster API's side: it owns the object and takes its infrastructure as provisioned.
    let owner = &object["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["name"]),
        (&"MachinePool".into(), &NAME.into())
    );
    wait_until(
        "the MachinePool's infrastructure provisioned",
        Duration::from_secs(180),
        || {
            let mp = management
                .get("machinepool.cluster.x-k8s.io", NAME)
                .unwrap();
            mp["status"]["initialization"]["infrastructureProvisioned"] == true
        },
    );
}

/// Paused: its `Paused` condition, and a new count not asked of exk8s.
pub(crate) fn paused(management: &Management, stack: &Stack, id: i64, version: &str) {
    wait_until(
        "the ExK8sMachinePool Paused",
        Duration::from_secs(180),
        || {
            condition(&machine_pool(management).unwrap(), "Paused")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "Paused")
        },
    );
    management
        .apply(&example_workers_manifest(version, 3))
        .unwrap();
    std::thread::sleep(Duration::from_secs(8));
    let exk8s = pool(stack, id).unwrap();
    assert_eq!(exk8s["desired"], 2, "a paused pool was scaled: {exk8s}");
}

/// Unpaused: the count asked while paused is carried out.
pub(crate) fn scaled(management: &Management, stack: &Stack, dir: &Path, id: i64) {
    until(
        management,
        stack,
        dir,
        id,
        "3 workers ready",
        Duration::from_secs(300),
        |o| {
            o["status"]["readyReplicas"] == 3
                && o["spec"]["providerIDList"]
                    .as_array()
                    .is_some_and(|l| l.len() == 3)
                && condition(o, "Ready").is_some_and(|c| c["status"] == "True")
        },
    );
    assert_eq!(pool(stack, id).unwrap()["desired"], 3);
}

/// After the control plane's upgrade: the workers still run the MachinePool's `version`.
pub(crate) fn held(stack: &Stack, id: i64, version: &str) {
    let exk8s = pool(stack, id).unwrap();
    assert_eq!(exk8s["follow_control_plane"], false, "{exk8s:#}");
    assert_eq!(exk8s["kubernetes_version"], version, "{exk8s:#}");
    let view: Value = cluster_view(stack, id);
    for node in view["nodes"].as_array().unwrap() {
        if node["role"] == "worker" {
            assert_eq!(node["kubernetes_version"], version, "{node:#}");
        }
    }
}

/// The MachinePool's version moved to `version`: every worker replaced by one of it.
pub(crate) fn upgraded(management: &Management, stack: &Stack, dir: &Path, id: i64, version: &str) {
    mark("the MachinePool's version one minor up: the workers replaced");
    management
        .apply(&example_workers_manifest(version, 3))
        .unwrap();
    until(
        management,
        stack,
        dir,
        id,
        "3 workers of the new version",
        Duration::from_secs(300),
        |o| {
            o["status"]["version"] == version
                && o["status"]["upToDateReplicas"] == 3
                && o["status"]["replicas"] == 3
                && condition(o, "Ready").is_some_and(|c| c["status"] == "True")
                && condition(o, "SpecApplied").is_some_and(|c| c["status"] == "True")
        },
    );
    // The replicas count no worker being removed (as a Deployment's count no terminating pod):
    // the last old one may still be draining when the MachinePool says it is done; the agents'
    // next passes remove it.
    until(
        management,
        stack,
        dir,
        id,
        "the old workers removed",
        Duration::from_secs(300),
        |_| {
            pool(stack, id).is_some_and(|p| {
                p["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().all(|n| n["kubernetes_version"] == version))
            })
        },
    );
    let exk8s = pool(stack, id).unwrap();
    // Pinned at the MachinePool's version, now the control plane's too.
    assert_eq!(exk8s["follow_control_plane"], false, "{exk8s:#}");
    let versions: Vec<&Value> = exk8s["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| &n["kubernetes_version"])
        .collect();
    assert_eq!(versions, [&Value::from(version); 3], "{exk8s:#}");
}

/// Deleting the MachinePool deletes the exk8s pool, then both objects go.
pub(crate) fn deleted(management: &Management, stack: &Stack, dir: &Path, id: i64) {
    mark("deleting the MachinePool deletes the exk8s pool");
    management.kubectl_ok(&[
        "delete",
        "machinepool.cluster.x-k8s.io",
        NAME,
        "--wait=false",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while machine_pool(management).is_some()
        || management
            .get("machinepool.cluster.x-k8s.io", NAME)
            .is_some()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the MachinePool is still there: {:#}\n{}",
            pool(stack, id).unwrap_or_default(),
            management.controller_logs()
        );
        // Control-plane agents drain the workers before their machines go.
        agents_pass(stack, dir, id);
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(pool(stack, id), None);
    let view: Value = cluster_view(stack, id);
    let workers: Vec<&Value> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "worker")
        .collect();
    assert!(workers.is_empty(), "workers left: {workers:?}");
}
