//! The CLI's day 2, on the cluster day 1 founded: a worker pool, a rollout watched as it
//! goes, a refusal for removing the last member, an upgrade followed to its end with a pool
//! that follows it, a CA rotation the merged kubeconfig follows, the credential plugin run
//! concurrently, and deleting.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use exk8s_tests::cluster::{Founded, agent_ok, view};
use exk8s_tests::dev::Stack;
use exk8s_tests::procs::wait_until;
use exk8s_tests::workers::{pool_view, pool_workers};
use serde_json::Value;

use crate::{Watch, exk8s, ok};

pub(crate) fn run(dir: &Path, stack: &Stack, founded: &Founded, cluster_name: &str) {
    let (cluster, vm) = (founded.cluster, founded.vms[0]);
    let kubectl = |args: &[&str]| crate::kubectl(dir, args);
    // Day 2: a worker pool, a rollout, and a refusal for removing the last member.
    let pool: Value = serde_json::from_str(&ok(&exk8s(dir)
        .args(["node-pools", "create", cluster_name, "blue", "--count", "1"])
        .args([
            "--instance-type",
            "dev.small",
            "--image",
            "1",
            "--subnet",
            "1",
        ])
        .args(["--label", "node.kubernetes.io/pool=blue"])
        .args(["--taint", "dedicated=blue:NoSchedule", "-o", "json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(pool["name"], "blue", "{pool}");
    assert_eq!(pool["taints"][0]["effect"], "NoSchedule", "{pool}");
    let pools = ok(&exk8s(dir)
        .args(["node-pools", "list", cluster_name])
        .output()
        .unwrap());
    assert!(pools.contains("blue"), "{pools}");
    ok(&exk8s(dir)
        .args(["node-pools", "delete", cluster_name, "blue", "--yes"])
        .output()
        .unwrap());
    // `nodes --watch` and `certs --watch` show their lists, then again as the rollout and the
    // sync change them.
    let watching = Watch::start(exk8s(dir).args(["nodes", cluster_name, "--watch", "-o", "json"]));
    let certs = Watch::start(exk8s(dir).args(["certs", cluster_name, "--watch", "-o", "json"]));
    let documents = || watching.documents();
    wait_until("the first list", Duration::from_secs(30), || {
        !documents().is_empty()
    });
    let rollout: Value = serde_json::from_str(&ok(&exk8s(dir)
        .args(["rollout", cluster_name, "-o", "json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(rollout["nodes"][0]["vm_id"].as_i64(), Some(vm), "{rollout}");

    // An upgrade waits for the rollout: the member is not up to date yet.
    let out = exk8s(dir)
        .args(["upgrade", cluster_name, "--to", "v1.36.3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("healthy and up to date before an upgrade"),
        "{said}"
    );
    let root = dir.join(format!("vm-{vm}"));
    agent_ok(stack, founded, &root, vm, "sync");
    let start = Instant::now();
    // (The rollout's generation, and the one that drained the blue pool's worker.)
    while !documents().last().is_some_and(|nodes| {
        nodes[0]["up_to_date"] == true && nodes[0]["applied_generation"].as_i64() > Some(1)
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the list after the sync: {:?}",
            documents()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = documents();
    assert!(seen.len() >= 2, "{seen:?}");
    assert_eq!(seen[0][0]["applied_generation"], 1, "{seen:?}");
    watching.stop();
    // The node's leaves of its new generation replaced those of its first.
    let newest = |inventory: &Value| {
        inventory["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["generation"].as_i64())
            .max()
    };
    wait_until(
        "the certificates after the sync",
        Duration::from_secs(40),
        || {
            certs
                .documents()
                .last()
                .is_some_and(|inv| newest(inv) > Some(1))
        },
    );
    assert_eq!(newest(&certs.documents()[0]), Some(1), "the first list");
    certs.stop();
    // A pool that follows the control plane, its worker booted (named the old way: `--name`
    // still works, with a deprecation warning).
    let made = exk8s(dir)
        .args(["node-pools", "create", cluster_name, "--name", "green"])
        .args([
            "--count",
            "1",
            "--max-surge",
            "1",
            "--instance-type",
            "dev.small",
        ])
        .args(["--image", "1", "--subnet", "1", "-o", "json"])
        .output()
        .unwrap();
    let warned = String::from_utf8_lossy(&made.stderr);
    assert!(
        warned.contains("--name is deprecated; the name is positional"),
        "{warned}"
    );
    let green: Value = serde_json::from_str(&ok(&made)).unwrap();
    assert_eq!(green["max_surge"], 1, "{green}");
    let green_id = green["id"].as_i64().unwrap();
    let green_vms = || pool_workers(&pool_view(stack, cluster, green_id));
    let mut old_worker = None;
    wait_until("the green worker", Duration::from_secs(30), || {
        old_worker = green_vms().first().map(|(vm, _)| *vm);
        old_worker.is_some()
    });
    let old_worker = old_worker.unwrap();
    let worker_root = |vm: i64| dir.join(format!("worker-{vm}"));
    agent_ok(stack, founded, &worker_root(old_worker), old_worker, "run");
    // Then it goes, and --wait follows it on the event stream until the member runs it; with
    // --pools, then until the pool's workers run it too. (Without the etcd snapshot first:
    // these agents record host steps and take none — it::upgrade_snapshot and the booted
    // upgrade of boot_cluster prove the wait.)
    let upgrade = exk8s(dir)
        .args([
            "upgrade",
            cluster_name,
            "--to",
            "v1.36.3",
            "--wait",
            "--pools",
            "--no-snapshot",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while view(stack, cluster)["kubernetes_version"] != "v1.36.3" {
        std::thread::sleep(Duration::from_millis(100));
    }
    agent_ok(stack, founded, &root, vm, "sync");
    // The pool follows: a new worker first, then the old one drained by the member's agent.
    let mut new_worker = None;
    wait_until(
        "the green pool's new worker",
        Duration::from_secs(30),
        || {
            new_worker = green_vms()
                .iter()
                .map(|(vm, _)| *vm)
                .find(|vm| *vm != old_worker);
            new_worker.is_some()
        },
    );
    let new_worker = new_worker.unwrap();
    agent_ok(stack, founded, &worker_root(new_worker), new_worker, "run");
    wait_until("the old worker draining", Duration::from_secs(30), || {
        green_vms()
            .iter()
            .any(|(vm, removal)| *vm == old_worker && removal == "draining")
    });
    agent_ok(stack, founded, &root, vm, "sync");
    let upgraded = upgrade.wait_with_output().unwrap();
    let shown: Value = serde_json::from_str(&ok(&upgraded)).unwrap();
    assert_eq!(shown["version"], "v1.36.3", "{shown}");
    assert_eq!(
        shown["nodes"][0]["kubernetes_version"], "v1.36.3",
        "{shown}"
    );
    let progress = String::from_utf8_lossy(&upgraded.stderr);
    assert!(
        progress.contains("upgrading cluster shop's control plane from v1.35.3 to v1.36.3"),
        "{progress}"
    );
    assert!(
        progress.contains("pool green: 1/1 workers run v1.36.3, 1 in all"),
        "{progress}"
    );
    assert_eq!(green_vms(), vec![(new_worker, Value::Null)]);
    let nodes = ok(&exk8s(dir).args(["nodes", cluster_name]).output().unwrap());
    assert!(nodes.contains("v1.36.3"), "{nodes}");
    let out = exk8s(dir)
        .args(["members", "remove", cluster_name, &vm.to_string(), "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("409"), "{said}");

    // A rotation of the cluster CA begins: the entry already trusts both CAs — the new one is
    // the standby it trusted from the start — so --refresh keeps it, and leaves the current
    // context where the operator put it.
    ok(&exk8s(dir)
        .args(["rotate-ca", cluster_name, "--ca", "cluster"])
        .output()
        .unwrap());
    kubectl(&["config", "use-context", "other"]);
    let refreshed = exk8s(dir)
        .args(["kubeconfig", cluster_name, "--refresh"])
        .output()
        .unwrap();
    ok(&refreshed);
    let said = String::from_utf8_lossy(&refreshed.stderr);
    assert!(
        said.contains(&format!("kept exk8s-admin@{cluster_name}: valid until"))
            && said.contains("trusting the cluster's CA"),
        "{said}"
    );
    assert_eq!(kubectl(&["config", "current-context"]).trim(), "other");
    let ca = kubectl(&[
        "config",
        "view",
        "--raw",
        "-o",
        &format!(
            "jsonpath={{.clusters[?(@.name==\"{cluster_name}\")].cluster.certificate-authority-data}}"
        ),
    ]);
    let ca = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, ca.trim()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ca)
            .matches("BEGIN CERTIFICATE")
            .count(),
        2,
        "the old CA and the new one (its standby)"
    );

    // kubectl runs the credential plugin once per invocation and scripts run many at once: 32
    // concurrent runs on an empty cache each print a whole ExecCredential, and leave one valid
    // cache file and its trust file, nothing half-written and no temporary.
    let cache = dir.join(".cache/exk8s/credentials");
    let _ = std::fs::remove_dir_all(&cache);
    let runs: Vec<_> = (0..32)
        .map(|_| {
            exk8s(dir)
                .args(["credential", cluster_name])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let printed: Value = serde_json::from_str(&ok(&run.wait_with_output().unwrap())).unwrap();
        assert_eq!(printed["kind"], "ExecCredential", "{printed}");
        let status = &printed["status"];
        assert!(
            status["clientCertificateData"]
                .as_str()
                .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")),
            "{status}"
        );
        assert!(
            status["clientKeyData"]
                .as_str()
                .is_some_and(|k| k.contains("PRIVATE KEY"))
        );
    }
    let mut left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left.len(),
        2,
        "the credential and its trust file, no temporary: {left:?}"
    );
    let cached: Value =
        serde_json::from_slice(&std::fs::read(cache.join(&left[1])).unwrap()).unwrap();
    assert!(
        cached["client_certificate_pem"].as_str().is_some(),
        "{left:?}"
    );
    let trust = std::fs::read_to_string(cache.join(&left[0])).unwrap();
    assert!(trust.starts_with("-----BEGIN CERTIFICATE-----"), "{left:?}");

    // delete asks for --yes, then deletes.
    let out = exk8s(dir)
        .args(["clusters", "delete", cluster_name])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    ok(&exk8s(dir)
        .args(["clusters", "delete", cluster_name, "--yes"])
        .output()
        .unwrap());

    // Kept, listed with --deleted; the purge asks for --yes, then it is gone.
    let listed = ok(&exk8s(dir)
        .args(["clusters", "list", "--deleted", "-o", "json"])
        .output()
        .unwrap());
    let kept: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(kept[0]["name"], cluster_name, "{kept}");
    assert_eq!(kept[0]["kept"][0], "trust", "{kept}");
    let table = ok(&exk8s(dir)
        .args(["clusters", "list", "--deleted"])
        .output()
        .unwrap());
    assert!(
        table.contains(cluster_name) && table.contains("KEPT UNTIL"),
        "{table}"
    );
    let out = exk8s(dir)
        .args(["clusters", "purge", cluster_name])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--yes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ok(&exk8s(dir)
        .args(["clusters", "purge", cluster_name, "--yes"])
        .output()
        .unwrap());
    let listed = ok(&exk8s(dir)
        .args(["clusters", "list", "--deleted", "-o", "json"])
        .output()
        .unwrap());
    assert_eq!(listed.trim(), "[]", "purged");
    let out = exk8s(dir)
        .args(["clusters", "purge", cluster_name, "--yes"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no deleted cluster"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
