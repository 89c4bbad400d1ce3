//! Replacing a control-plane member through the API, on SQLite and PostgreSQL (the agents'
//! side acted by the test; real etcd proves it in tests/tests/replace.rs):
//! `POST /clusters/{id}/nodes/{vm_id}/replace` on a healthy member adds the new member first
//! and removes the old one after it (a surge of one); on a member whose agent reported its
//! etcd down it removes the old one first — etcd refuses even a learner while a voter is
//! unreachable — and the replacement joins after. Either way the cluster ends at its size, the
//! old VM released, nothing leaked; untimely or impossible replacements are refused with 409.

use std::time::Duration;

use exk8s_common::node_auth::NodeKey;
use exk8s_common::payload::PlanStep;
use serde_json::{Value, json};

use crate::app::{Backend, Node, TestApp, both_backends, credentials_for, json_of, spawn_app};
use crate::bootstrap::report;
use crate::crash::wait_until;
use crate::membership::{condition, control_plane, joining, roll, scale, view};
use crate::sync::{fetch_update, register, sync_report, update_payload};

async fn replace(app: &TestApp, cluster: i64, vm: i64) -> reqwest::Response {
    app.post(&format!("/clusters/{cluster}/nodes/{vm}/replace"))
        .send()
        .await
        .unwrap()
}

async fn message(response: reqwest::Response) -> String {
    json_of(response).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A cluster of `count` members, each booted and registered.
pub(crate) async fn founded(app: &TestApp, count: i64) -> (i64, Vec<(Node, NodeKey)>) {
    let created = json_of(
        app.found(count, json!({"control_plane_image_id": 42}))
            .await,
    )
    .await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut members = Vec::new();
    for node in credentials_for(app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(app, &node, &key).await;
        assert_eq!(report(app, &node, "complete", "succeeded").await, 204);
        members.push((node, key));
    }
    (cluster, members)
}

fn member(view: &Value, vm: i64) -> Option<Value> {
    control_plane(view).into_iter().find(|n| n["vm_id"] == vm)
}

/// The remover's next update removes `vm`'s etcd member; applied, `vm` leaves for good.
pub(crate) async fn removed_by(app: &TestApp, cluster: i64, remover: &(Node, NodeKey), vm: i64) {
    // The last report's convergence marks it leaving in the background.
    wait_until(
        "the old member leaving",
        Duration::from_secs(20),
        || async {
            member(&view(app, cluster).await, vm).is_some_and(|n| n["etcd_membership"] == "leaving")
        },
    )
    .await;
    let ip = member(&view(app, cluster).await, vm).unwrap()["private_ipv4"]
        .as_str()
        .unwrap()
        .to_owned();
    let (node, key) = remover;
    let response = fetch_update(app, node, key).await;
    let update = update_payload(app, response).await;
    let removes = update.plan.iter().any(|s| {
        matches!(s, PlanStep::EtcdRemove { member_peer_url, .. }
            if member_peer_url.as_str() == format!("https://{ip}:2380"))
    });
    assert!(removes, "{:?}", update.plan);
    sync_report(app, node, key, "succeeded", update.identity.generation).await;
    wait_until("the old member gone", Duration::from_secs(20), || async {
        member(&view(app, cluster).await, vm).is_none()
    })
    .await;
    assert!(app.sims.compute.vms().iter().all(|v| v.id != vm));
}

/// The joining member boots; once it votes every member applies the generation it gave them.
pub(crate) async fn joins(app: &TestApp, cluster: i64, members: &mut Vec<(Node, NodeKey)>) -> i64 {
    let new = joining(app, cluster).await;
    let key = NodeKey::generate().unwrap();
    register(app, &new, &key).await;
    assert_eq!(report(app, &new, "complete", "succeeded").await, 204);
    let vm = new.vm;
    wait_until("the new member voting", Duration::from_secs(20), || async {
        member(&view(app, cluster).await, vm).is_some_and(|n| n["etcd_membership"] == "voter")
    })
    .await;
    members.push((new, key));
    roll(app, members).await;
    vm
}

async fn a_healthy_member_is_replaced_new_one_first(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, mut members) = founded(&app, 3).await;
    assert_eq!(replace(&app, cluster, 999_999).await.status(), 404);
    let old = members[1].0.vm;
    let keyed = |vm: i64| {
        app.post(&format!("/clusters/{cluster}/nodes/{vm}/replace"))
            .header("Idempotency-Key", "replace-once")
            .send()
    };
    let started = keyed(old).await.unwrap();
    assert_eq!(started.status(), 202);
    let body = json_of(started).await;
    assert_eq!(
        (body["desired"].as_i64(), body["voters"].as_i64()),
        (Some(3), Some(3))
    );
    // A retry with its key gets the first answer; the key on another member is refused.
    let retried = keyed(old).await.unwrap();
    assert_eq!(retried.status(), 202);
    assert_eq!(json_of(retried).await, body);
    assert_eq!(keyed(members[2].0.vm).await.unwrap().status(), 422);
    // One change at a time.
    let again = replace(&app, cluster, members[2].0.vm).await;
    assert_eq!(again.status(), 409);
    assert!(message(again).await.contains("being replaced"));
    assert_eq!(
        scale(&app, cluster, json!({"control_plane_count": 5}))
            .await
            .status(),
        409
    );

    // The new member joins while the old one still votes: four members for a moment.
    let during = view(&app, cluster).await;
    assert_eq!(member(&during, old).unwrap()["replacing"], true);
    let new = joins(&app, cluster, &mut members).await;
    assert_eq!(control_plane(&view(&app, cluster).await).len(), 4);
    // Then the old one leaves, removed by the oldest member.
    removed_by(&app, cluster, &members[0], old).await;
    members.retain(|(n, _)| n.vm != old);
    roll(&app, &members).await;
    let done = view(&app, cluster).await;
    let cp = control_plane(&done);
    assert_eq!(cp.len(), 3);
    assert!(
        cp.iter()
            .all(|n| n["etcd_membership"] == "voter" && n.get("replacing").is_none())
    );
    assert!(member(&done, new).is_some());
    assert_eq!(condition(&done, "ScalingUp")["reason"], "AtDesiredSize");
    assert_eq!(condition(&done, "ScalingDown")["reason"], "AtDesiredSize");
    let mut vms: Vec<i64> = app.sims.compute.vms().iter().map(|v| v.id).collect();
    vms.sort_unstable();
    let mut expected: Vec<i64> = members.iter().map(|(n, _)| n.vm).collect();
    expected.sort_unstable();
    assert_eq!(vms, expected, "no VM leaked");
}

both_backends!(a_healthy_member_is_replaced_new_one_first);

async fn a_dead_member_leaves_before_its_replacement_joins(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, mut members) = founded(&app, 3).await;
    // The oldest member's etcd dies: its agent's sync says so.
    let (dead, dead_key) = &members[0];
    sync_report(&app, dead, dead_key, "failed", 1).await;
    let dead_vm = dead.vm;
    // With a second member down there would be no majority to remove it through.
    let (other, other_key) = &members[1];
    sync_report(&app, other, other_key, "failed", 1).await;
    let refused = replace(&app, cluster, dead_vm).await;
    assert_eq!(refused.status(), 409);
    assert!(message(refused).await.contains("without a majority"));
    sync_report(&app, other, other_key, "succeeded", 1).await;

    assert_eq!(replace(&app, cluster, dead_vm).await.status(), 202);
    // No new VM before the dead member is out of etcd; the next oldest member removes it.
    wait_until(
        "the dead member leaving",
        Duration::from_secs(20),
        || async {
            member(&view(&app, cluster).await, dead_vm)
                .is_some_and(|n| n["etcd_membership"] == "leaving")
        },
    )
    .await;
    assert_eq!(app.sims.compute.vms().len(), 3);
    let leaving = view(&app, cluster).await;
    let down = condition(&leaving, "ScalingDown");
    assert!(
        down["message"].as_str().unwrap().contains(
            member(&leaving, members[1].0.vm).unwrap()["name"]
                .as_str()
                .unwrap()
        ),
        "{down}"
    );
    assert_eq!(member(&leaving, dead_vm).unwrap()["is_initial"], true);
    let dead_name = member(&leaving, dead_vm).unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    removed_by(&app, cluster, &members[1], dead_vm).await;
    // Its removal is a change on the cluster's stream.
    let changes = exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
        .await
        .unwrap();
    assert!(
        changes.iter().any(|e| e.change
            == exk8s_api::db::events::Change::Removed {
                vm_id: dead_vm,
                set: "control-plane".into(),
                message: format!("{dead_name}: removed from etcd, its VM deleted"),
            }),
        "{changes:#?}"
    );
    members.remove(0);
    roll(&app, &members).await;
    // The oldest member left installs the addons from now on.
    let after = view(&app, cluster).await;
    assert_eq!(member(&after, members[0].0.vm).unwrap()["is_initial"], true);
    assert_eq!(
        member(&after, members[1].0.vm).unwrap()["is_initial"],
        false
    );
    // Then the replacement joins.
    joins(&app, cluster, &mut members).await;
    let done = view(&app, cluster).await;
    let cp = control_plane(&done);
    assert_eq!(cp.len(), 3);
    assert!(cp.iter().all(|n| n["etcd_membership"] == "voter"));
    assert_eq!(app.sims.compute.vms().len(), 3, "no VM leaked");

    // The only member of a cluster, down, cannot be replaced: there is no quorum to do it.
    let (single, solo) = founded(&app, 1).await;
    let (node, key) = &solo[0];
    sync_report(&app, node, key, "failed", 1).await;
    let refused = replace(&app, single, node.vm).await;
    assert_eq!(refused.status(), 409);
    assert!(message(refused).await.contains("only control-plane member"));
}

both_backends!(a_dead_member_leaves_before_its_replacement_joins);
