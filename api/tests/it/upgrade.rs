//! `PATCH /clusters/{id} {"kubernetes_version"}` on SQLite and PostgreSQL, with agents played by
//! the test: every skew refusal, the preflight, a minor upgrade handed one control-plane member
//! at a time (each bundle rendering the new release, the cluster's `version` the oldest member's
//! until the last one reports it, `RollingOut` naming the step; after the first member another
//! API process takes over on the same database and goes on), a patch upgrade, and a failed
//! member rolled back by PATCHing the version the others run.

use exk8s_common::BundlePayload;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use std::sync::Arc;

use exk8s_api::clock::ManualClock;

use crate::app::{
    Backend, TestApp, both_backends, json_of, spawn_clocked, spawn_replica_with, spawn_with,
    test_config,
};
use crate::bootstrap::{Node, cluster_with_credentials, report};
use crate::sync::{fetch_update, register, sync_report, update_payload};

pub(crate) async fn app_offering(backend: Backend, versions: &[&str]) -> TestApp {
    spawn_with(backend, offering(versions), None).await
}

/// The tests' settings, offering `versions`.
fn offering(versions: &[&str]) -> exk8s_api::app::ApiConfig {
    exk8s_api::app::ApiConfig {
        kubernetes_versions: versions.iter().map(|v| (*v).to_owned()).collect(),
        ..test_config()
    }
}

/// A 3-member control plane at the default release, every member booted with a day-2 key.
pub(crate) async fn booted(app: &TestApp) -> Vec<(Node, NodeKey)> {
    let mut booted = Vec::new();
    for node in cluster_with_credentials(app, 7, 3).await {
        let key = NodeKey::generate().unwrap();
        register(app, &node, &key).await;
        assert_eq!(report(app, &node, "complete", "succeeded").await, 204);
        booted.push((node, key));
    }
    booted
}

pub(crate) async fn patch(app: &TestApp, cluster: i64, version: &str) -> (u16, Value) {
    patch_with(app, cluster, json!({ "kubernetes_version": version })).await
}

pub(crate) async fn patch_with(app: &TestApp, cluster: i64, body: Value) -> (u16, Value) {
    let answer = app
        .patch(&format!("/clusters/{cluster}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), json_of(answer).await)
}

pub(crate) async fn view(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

pub(crate) fn condition<'a>(view: &'a Value, type_: &str) -> &'a Value {
    view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} in {view}"))
}

/// The release a bundle installs: its kubelet's version, installed beside other releases
/// (`/opt/exk8s/kubernetes/<version>/kubelet`) and named by the kubelet's unit.
pub(crate) fn release(payload: &BundlePayload) -> String {
    let kubelet = payload
        .artifacts
        .iter()
        .find(|a| a.name.as_str() == "kubelet")
        .expect("every bundle installs the kubelet");
    let version = kubelet.version.to_string();
    let binary = format!("/opt/exk8s/kubernetes/{version}/kubelet");
    assert_eq!(kubelet.dest.as_str(), binary);
    let unit = crate::helpers::text(payload, "/etc/systemd/system/kubelet.service");
    assert!(unit.contains(&format!("ExecStart={binary} ")), "{unit}");
    version
}

fn versions_of(view: &Value) -> Vec<String> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            n["kubernetes_version"]
                .as_str()
                .unwrap_or("none")
                .to_owned()
        })
        .collect()
}

async fn every_skew_rule_refuses_with_its_reason(backend: Backend) {
    let app = app_offering(backend, &["v1.35.3", "v1.36.3", "v1.34.6", "v1.37.2"]).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let refusals = [
        ("v1.37.2", 409, "skips a minor: upgrade to v1.36.x first"),
        (
            "v1.34.6",
            409,
            "going down a minor to v1.34.6 is not supported",
        ),
        ("v1.36.9", 422, "v1.36.9 is not offered by this API"),
        ("1.36", 422, "`1.36` is not a Kubernetes release"),
    ];
    for (version, status, says) in refusals {
        let (code, body) = patch(&app, cluster, version).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(code, status, "{version}: {body}");
        assert!(message.contains(says), "{version}: {message}");
        if status == 422 {
            assert_eq!(body["error"]["field"], "kubernetes_version", "{body}");
        }
    }
    let both = app
        .patch(&format!("/clusters/{cluster}"))
        .json(&json!({"kubernetes_version": "v1.36.3", "control_plane_count": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), 422);
    assert!(
        json_of(both).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("one thing at a time")
    );
    // Nothing moved: every member is up to date at the release it was founded with.
    let view = view(&app, cluster).await;
    assert_eq!(view["kubernetes_version"], "v1.35.3");
    assert_eq!(view["up_to_date_replicas"], 3);
    assert_eq!(condition(&view, "RollingOut")["status"], "False");

    // The preflight: a member that is not healthy holds every upgrade.
    let (a, ka) = &nodes[0];
    app.post(&format!("/clusters/{cluster}/rollout"))
        .send()
        .await
        .unwrap();
    update_payload(&app, fetch_update(&app, a, ka).await).await;
    sync_report(&app, a, ka, "failed", 2).await;
    let (code, body) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must be healthy and up to date before an upgrade"),
        "{body}"
    );
    // A request that can never be valid is refused for what it is, before the cluster's state:
    // the operator is not sent to wait for the member only to be refused afterwards.
    for (version, status, says) in refusals {
        let (code, body) = patch(&app, cluster, version).await;
        assert_eq!(code, status, "{version} with a member unhealthy: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(says),
            "{version} with a member unhealthy: {message}"
        );
    }
}

async fn a_minor_upgrade_goes_one_member_at_a_time(backend: Backend) {
    let versions = ["v1.35.3", "v1.36.3", "v1.37.2"];
    let mut app = app_offering(backend, &versions).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    assert_eq!(versions_of(&view(&app, cluster).await), ["v1.35.3"; 3]);

    let (code, started) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 202, "{started}");
    assert_eq!(
        (
            &started["upgrade"],
            &started["from_version"],
            &started["to_version"]
        ),
        (&json!("upgrading"), &json!("v1.35.3"), &json!("v1.36.3"))
    );
    assert_eq!(
        (&started["done"], &started["members"]),
        (&json!(0), &json!(3))
    );
    // No member changes before a voter stored an etcd snapshot.
    let snapshot = crate::upgrade_snapshot::stored_by_its_taker(&app, &nodes, &started).await;
    assert_eq!(snapshot["trigger"], "upgrade", "{snapshot}");

    for (i, (node, key)) in nodes.iter().enumerate() {
        let payload = update_payload(&app, fetch_update(&app, node, key).await).await;
        assert_eq!(release(&payload), "v1.36.3", "member {i}'s bundle");
        for (other, other_key) in nodes.iter().skip(i + 1) {
            assert_eq!(
                fetch_update(&app, other, other_key).await.status(),
                409,
                "the others wait while member {i} applies it"
            );
        }
        let during = view(&app, cluster).await;
        assert_eq!(during["version"], "v1.35.3", "the oldest member's release");
        let rolling = condition(&during, "RollingOut");
        assert_eq!(rolling["status"], "True");
        let message = rolling["message"].as_str().unwrap();
        let name = during["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["vm_id"] == node.vm)
            .unwrap()["name"]
            .as_str()
            .unwrap();
        assert!(
            message.contains(&format!(
                "* Version v1.36.3 required ({i} of 3 members run it)"
            )) && message.contains(&format!("* {name} is applying its update")),
            "{message}"
        );
        if i == 1 {
            // Asked again: where it stands. A third release: refused, naming the way back.
            let (code, again) = patch(&app, cluster, "v1.36.3").await;
            assert_eq!((code, &again["done"]), (202, &json!(1)), "{again}");
            let (code, third) = patch(&app, cluster, "v1.37.2").await;
            assert_eq!(code, 409, "{third}");
            assert!(
                third["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("PATCH back to v1.35.3 to roll it back"),
                "{third}"
            );
        }
        sync_report(&app, node, key, "succeeded", 2).await;
        if i == 0 {
            // The API process is gone and another takes over on the same database: the
            // upgrade goes on from its rows, with no operator call.
            let replica = spawn_replica_with(&app, backend, offering(&versions)).await;
            app = replica;
            assert_eq!(
                condition(&view(&app, cluster).await, "RollingOut")["status"],
                "True"
            );
        }
    }
    let after = view(&app, cluster).await;
    assert_eq!(versions_of(&after), ["v1.36.3"; 3]);
    assert_eq!(after["version"], "v1.36.3");
    assert_eq!(condition(&after, "RollingOut")["status"], "False");
    // Each step was a change on the cluster's stream: the target, each member in turn, the end.
    let steps: Vec<(String, Option<i64>, String)> =
        exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.change {
                exk8s_api::db::events::Change::Upgrade {
                    step,
                    vm_id,
                    message,
                } => Some((step, vm_id, message)),
                _ => None,
            })
            .collect();
    let name = |vm: i64| {
        after["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["vm_id"] == vm)
            .unwrap()["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let mut expected = vec![(
        "started".to_owned(),
        None,
        "from v1.35.3 to v1.36.3".to_owned(),
    )];
    for (node, _) in &nodes {
        let runs = format!("{} runs v1.36.3", name(node.vm));
        expected.push(("member".to_owned(), Some(node.vm), runs));
    }
    let done = "every control-plane member runs v1.36.3".to_owned();
    expected.push(("done".to_owned(), None, done));
    assert_eq!(steps, expected);
    let (code, current) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(
        (code, &current["upgrade"]),
        (200, &json!("current")),
        "{current}"
    );
}

async fn a_failed_member_is_rolled_back_by_asking_for_the_old_release(backend: Backend) {
    let app = app_offering(backend, &["v1.35.3", "v1.35.4", "v1.36.3"]).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    // A newer patch of the running minor exists: it comes first.
    let (code, body) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upgrade to v1.35.4, the newest patch of its minor, before v1.36.3"),
        "{body}"
    );
    // (Without its snapshot: it::upgrade_snapshot proves the wait.)
    let body = json!({ "kubernetes_version": "v1.35.4", "snapshot_first": false });
    let (code, started) = patch_with(&app, cluster, body).await;
    assert_eq!(code, 202);
    assert_eq!(started["snapshot_id"], Value::Null, "{started}");
    let (a, ka) = &nodes[0];
    let payload = update_payload(&app, fetch_update(&app, a, ka).await).await;
    assert_eq!(release(&payload), "v1.35.4");
    // Its new apiserver never became healthy: the agent put the old files back and says so.
    sync_report(&app, a, ka, "failed", 2).await;
    let stopped = view(&app, cluster).await;
    let message = condition(&stopped, "RollingOut")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("stopped:") && message.contains("reported sync:failed"),
        "{message}"
    );
    assert_eq!(
        fetch_update(&app, &nodes[1].0, &nodes[1].1).await.status(),
        409
    );

    let (code, back) = patch(&app, cluster, "v1.35.3").await;
    assert_eq!(code, 202, "{back}");
    assert_eq!(back["upgrade"], "rolling-back");
    for (node, key) in &nodes {
        let payload = update_payload(&app, fetch_update(&app, node, key).await).await;
        assert_eq!(release(&payload), "v1.35.3");
        sync_report(&app, node, key, "succeeded", payload.identity.generation).await;
    }
    let after = view(&app, cluster).await;
    assert_eq!(versions_of(&after), ["v1.35.3"; 3]);
    assert_eq!(after["kubernetes_version"], "v1.35.3");
    assert_eq!(after["up_to_date_replicas"], 3);
    assert_eq!(condition(&after, "RollingOut")["status"], "False");
}

async fn certificates_near_their_end_hold_an_upgrade(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec!["v1.35.3".into(), "v1.36.3".into()],
        ..test_config()
    };
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    // Leaves last 365 days: 340 days on, 25 are left.
    clock.advance(time::Duration::days(340));
    let (code, body) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 409, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("day(s) left; renew the certificates"),
        "{message}"
    );
    assert_eq!(view(&app, cluster).await["kubernetes_version"], "v1.35.3");
}

both_backends!(
    certificates_near_their_end_hold_an_upgrade,
    every_skew_rule_refuses_with_its_reason,
    a_minor_upgrade_goes_one_member_at_a_time,
    a_failed_member_is_rolled_back_by_asking_for_the_old_release,
);
