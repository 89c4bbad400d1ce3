//! A minor upgrade that fails on booted machines: the release's images are not in the site's
//! registry (an air-gapped mirror that lost them), so the first member's kubelet cannot start
//! its new kube-apiserver. Its agent, waiting for real, gives up when the update wait
//! (`exk8s-api --update-wait-secs`) runs out, puts every previous file back — the old
//! apiserver and etcd run again — and reports the sync failed; the upgrade stops at that
//! member, saying so, and no other member is handed the release, while the first machine
//! samples every apiserver (never two down) and requests through the balancers and HAProxy
//! (every one answered). The operator rolls back by asking for the release the others run.

use std::time::Duration;

use exk8s_tests::bins::{ETCD_VERSION, KUBERNETES_VERSION, NEXT_KUBERNETES_VERSION};
use exk8s_tests::cluster::{operator, view};
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use exk8s_tests::registry::Registry;
use serde_json::{Value, json};

use super::control_plane::etcdctl;
use super::day2::{kubectl, syncing};
use super::sampler::{assert_two_ready, sampling};
use exk8s_tests::site::nodes;

/// How long the 3-member cluster's stack lets an update wait for each component it restarted
/// (`--update-wait-secs`): long enough for a working apiserver on two loaded cores, short
/// enough that the broken one's wait does not dominate the test.
pub(crate) const UPDATE_WAIT_SECS: &str = "150";

/// The cluster's `RollingOut` condition.
pub(crate) fn rolling_out(view: &Value) -> Value {
    view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RollingOut")
        .cloned()
        .unwrap_or_else(|| panic!("no RollingOut condition: {view}"))
}

/// The release the apiserver at `ip` reports, asked from `sampler`.
pub(crate) fn apiserver_release(sampler: &Machine, ip: &str) -> String {
    let out = kubectl(
        sampler,
        &[
            &format!("--server=https://{ip}:6443"),
            "get",
            "--raw",
            "/version",
        ],
    );
    let version: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{ip}'s /version: {e}: {out:?}"));
    version["gitVersion"].as_str().unwrap().to_owned()
}

/// The etcd release the member at `ip` on `machine` reports (`v3.6.10`).
pub(crate) fn etcd_release(machine: &Machine, ip: &str) -> String {
    let out = etcdctl(machine, ip, &["endpoint", "status", "-w", "json"]);
    assert!(out.status.success(), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    format!("v{}", status[0]["Status"]["version"].as_str().unwrap())
}

/// The failed upgrade and its rollback on the members `cp` (address and node name each, on
/// `machines` in the same order), with `registry` away while the first member tries; the
/// registry serves again when it returns.
pub(crate) fn fail_and_roll_back(
    stack: &Stack,
    cluster: i64,
    registry: &mut Registry,
    machines: &[Machine],
    cp: &[(String, String)],
) {
    let ips: Vec<String> = cp.iter().map(|(ip, _)| ip.clone()).collect();
    let members = &machines[..cp.len()];
    let patch = |version: &str| -> Value {
        operator(stack, "PATCH", &format!("/clusters/{cluster}"))
            .send_json(json!({ "kubernetes_version": version }))
            .unwrap()
            .into_json()
            .unwrap()
    };
    registry.stop();
    let started = patch(NEXT_KUBERNETES_VERSION);
    assert_eq!(started["upgrade"], "upgrading", "{started}");
    let failed_member = || {
        nodes(stack, cluster)
            .into_iter()
            .find(|n| n["role"] == "control-plane" && n["phase"] == "sync:failed")
    };
    let stopped = || {
        let message = rolling_out(&view(stack, cluster))["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        failed_member().is_some() && message.contains("stopped")
    };
    let ((), rounds) = sampling(&machines[0], &ips, members, || {
        syncing(members, stopped);
    });
    assert_two_ready("a failed upgrade", &rounds);

    // The member that tried says where and why, and runs what it ran before.
    let failed = failed_member().unwrap();
    let name = failed["name"].as_str().unwrap();
    let i = cp.iter().position(|(_, n)| n == name).unwrap();
    let condition = rolling_out(&view(stack, cluster));
    let message = condition["message"].as_str().unwrap();
    assert!(
        message.contains("stopped") && message.contains(name),
        "the upgrade stops at the member that failed: {condition}"
    );
    let journal = members[i].journal("exk8s-agent-sync.service", 300);
    assert!(
        journal.contains("wait for static pod kube-apiserver") && journal.contains("not healthy"),
        "the agent names the wait that failed: {journal}"
    );
    assert!(
        journal.contains("the previous files are back and their units restarted"),
        "the agent put the previous files back: {journal}"
    );
    // Why, in the agent's words: the kubelet's last error for the pod, which could not pull
    // the release's image.
    let image = format!("registry.k8s.io/kube-apiserver:{NEXT_KUBERNETES_VERSION}");
    let said = journal
        .lines()
        .find(|l| l.contains("the kubelet's last error for the pod"))
        .unwrap_or_else(|| panic!("the kubelet's words in the agent's: {journal}"));
    assert!(
        (said.contains("ErrImagePull") || said.contains("ImagePullBackOff"))
            && said.contains(&image),
        "the kubelet could not pull {image}: {said}"
    );
    exk8s_tests::procs::wait_until(
        "the old apiserver back on the member that failed",
        Duration::from_secs(120),
        || {
            let out = kubectl(
                &machines[0],
                &[
                    &format!("--server=https://{}:6443", ips[i]),
                    "get",
                    "--raw",
                    "/readyz",
                ],
            );
            out.status.success()
        },
    );
    for (machine, ip) in members.iter().zip(&ips) {
        assert_eq!(
            apiserver_release(&machines[0], ip),
            KUBERNETES_VERSION,
            "{ip}"
        );
        assert_eq!(etcd_release(machine, ip), ETCD_VERSION, "{ip}");
    }
    // No other member was handed the release.
    let stopped_view = view(stack, cluster);
    assert_eq!(stopped_view["version"], KUBERNETES_VERSION);
    for node in stopped_view["nodes"].as_array().unwrap() {
        assert_eq!(node["kubernetes_version"], KUBERNETES_VERSION, "{node}");
        if node["role"] == "control-plane" && node["name"] != name {
            assert_ne!(node["phase"], "sync:failed", "{node}");
        }
    }

    // The operator rolls back: every member runs the release it ran, and the change ends.
    let back = patch(KUBERNETES_VERSION);
    assert_eq!(back["upgrade"], "rolling-back", "{back}");
    let rolled_back =
        || {
            let now = view(stack, cluster);
            rolling_out(&now)["status"] == "False"
                && now["nodes"].as_array().unwrap().iter().all(|n| {
                    n["up_to_date"] == true && n["kubernetes_version"] == KUBERNETES_VERSION
                })
        };
    let ((), rounds) = sampling(&machines[0], &ips, members, || {
        syncing(members, rolled_back);
    });
    assert_two_ready("a rollback", &rounds);
    registry.start();
}
