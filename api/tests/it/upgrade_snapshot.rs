//! The upgrade's preflight etcd snapshot on SQLite and PostgreSQL, the members played by the
//! test: an upgrade names the snapshot it waits for and no member (the taker included) is
//! handed the new release before it is stored; a snapshot that fails, misses its deadline (an
//! injected clock) or is deleted stops the upgrade, saying so in the wait and in `RollingOut`;
//! asked again, the upgrade takes another; `snapshot_first: false` goes on without one; a
//! snapshot a voter is already taking is the one the upgrade waits for.

use std::sync::Arc;

use exk8s_api::clock::ManualClock;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_clocked, test_config};
use crate::bootstrap::Node;
use crate::snapshots::{etcd_snapshot, one, put, task_of};
use crate::sync::{fetch_update, update_payload};
use crate::upgrade::{booted, condition, patch, patch_with, release, view};

/// What a member asking for its update is told.
async fn held(app: &TestApp, (node, key): (&Node, &NodeKey)) -> String {
    let answer = fetch_update(app, node, key).await;
    assert_eq!(answer.status(), 409, "member {} was not held", node.vm);
    json_of(answer).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The member asked to take snapshot `id`.
async fn taker<'a>(app: &TestApp, nodes: &'a [(Node, NodeKey)], id: i64) -> &'a (Node, NodeKey) {
    for member in nodes {
        if task_of(app, (&member.0, &member.1)).await["id"] == id {
            return member;
        }
    }
    panic!("no member is asked to take snapshot {id}");
}

fn rolling_out(view: &Value) -> String {
    condition(view, "RollingOut")["message"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The snapshot the upgrade `started` names holds every member until its taker stores it;
/// then it is stored, and the view no longer speaks of it. The snapshot's view.
pub(crate) async fn stored_by_its_taker(
    app: &TestApp,
    nodes: &[(Node, NodeKey)],
    started: &Value,
) -> Value {
    let cluster = nodes[0].0.cluster;
    let id = started["snapshot_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("the upgrade names no snapshot: {started}"));
    for (node, key) in nodes {
        let said = held(app, (node, key)).await;
        assert!(
            said.contains(&format!("the upgrade waits for etcd snapshot {id}, which")),
            "{said}"
        );
    }
    let message = rolling_out(&view(app, cluster).await);
    assert!(
        message.contains(&format!("* the upgrade waits for etcd snapshot {id}")),
        "{message}"
    );
    let (node, key) = taker(app, nodes, id).await;
    let stored = put(app, (node, key), id, &etcd_snapshot(4), None, None).await;
    assert_eq!(stored.status(), 204);
    let snapshot = one(app, cluster, id).await;
    assert_eq!(snapshot["state"], "stored", "{snapshot}");
    let message = rolling_out(&view(app, cluster).await);
    assert!(!message.contains("snapshot"), "{message}");
    snapshot
}

async fn a_failed_snapshot_stops_the_upgrade_until_asked_again(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec!["v1.35.3".into(), "v1.36.3".into()],
        ..test_config()
    };
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let member = |i: usize| (&nodes[i].0, &nodes[i].1);

    let (code, started) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 202, "{started}");
    let first = started["snapshot_id"].as_i64().unwrap();
    let (node, key) = taker(&app, &nodes, first).await;
    let reason = "etcd snapshot at https://127.0.0.1:2379: no space left on device";
    let failed = put(&app, (node, key), first, b"", None, Some(reason)).await;
    assert_eq!(failed.status(), 204);
    let said = held(&app, member(0)).await;
    assert!(
        said.contains(&format!("its etcd snapshot {first} failed ("))
            && said.contains("no space left on device")
            && said.contains("PATCH the version again"),
        "{said}"
    );
    let message = rolling_out(&view(&app, cluster).await);
    assert!(
        message.contains(&format!("stopped: its etcd snapshot {first} failed")),
        "{message}"
    );

    // Asked again: another snapshot, and the same wait.
    let (code, again) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(
        (code, &again["upgrade"]),
        (202, &json!("upgrading")),
        "{again}"
    );
    let second = again["snapshot_id"].as_i64().unwrap();
    assert_ne!(second, first);
    let asked = one(&app, cluster, second).await;
    assert_eq!(
        (&asked["state"], &asked["trigger"]),
        (&json!("requested"), &json!("upgrade"))
    );
    // Asked once more while it is being taken: the same one.
    let (_, same) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(same["snapshot_id"], second, "{same}");
    // Its member never uploads: past the deadline the upgrade is stopped.
    clock.advance(time::Duration::minutes(21));
    let said = held(&app, member(0)).await;
    assert!(
        said.contains(&format!("its etcd snapshot {second} failed"))
            && said.contains("before its deadline"),
        "{said}"
    );

    // The operator goes on without one: the first member takes the new release.
    let body = json!({"kubernetes_version": "v1.36.3", "snapshot_first": false});
    let (code, skipped) = patch_with(&app, cluster, body).await;
    assert_eq!(code, 202, "{skipped}");
    assert_eq!(skipped["snapshot_id"], Value::Null, "{skipped}");
    let (node, key) = member(0);
    let payload = update_payload(&app, fetch_update(&app, node, key).await).await;
    assert_eq!(release(&payload), "v1.36.3");

    // snapshot_first says how an upgrade starts: with nothing else.
    let body = json!({"control_plane_count": 3, "snapshot_first": true});
    let (code, refused) = patch_with(&app, cluster, body).await;
    assert_eq!(
        (code, &refused["error"]["field"]),
        (422, &json!("snapshot_first")),
        "{refused}"
    );
}

async fn a_snapshot_being_taken_is_waited_for_and_deleting_it_stops_the_upgrade(backend: Backend) {
    let app = crate::upgrade::app_offering(backend, &["v1.35.3", "v1.36.3"]).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let taking = crate::snapshots::ask(&app, cluster).await;
    let (code, started) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 202, "{started}");
    assert_eq!(
        started["snapshot_id"], taking["id"],
        "the operator's snapshot is the upgrade's"
    );
    let id = taking["id"].as_i64().unwrap();
    let deleted = app
        .delete(&format!("/clusters/{cluster}/snapshots/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let said = held(&app, (&nodes[0].0, &nodes[0].1)).await;
    assert!(
        said.contains(&format!(
            "its etcd snapshot {id} was deleted before it was stored"
        )),
        "{said}"
    );

    let (code, again) = patch(&app, cluster, "v1.36.3").await;
    assert_eq!(code, 202, "{again}");
    stored_by_its_taker(&app, &nodes, &again).await;
    let (node, key) = (&nodes[0].0, &nodes[0].1);
    let payload = update_payload(&app, fetch_update(&app, node, key).await).await;
    assert_eq!(release(&payload), "v1.36.3");
}

both_backends!(
    a_failed_snapshot_stops_the_upgrade_until_asked_again,
    a_snapshot_being_taken_is_waited_for_and_deleting_it_stops_the_upgrade,
);
