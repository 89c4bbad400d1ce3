//! Control-plane remediation's gate on SQLite and PostgreSQL, with an injected clock and the
//! compute simulator killing a member's VM (booted machines prove the removal and the join in
//! tests/tests/boot_cluster/remediation.rs): while an upgrade, a CA rotation or a restore runs, the dead
//! member is only watched and `RemediationAllowed` says what it waits for; once the upgrade is
//! rolled back the member leaves etcd first, removed by the oldest healthy member, recorded with its
//! reason and streamed as a `remediation` change. Taken to its end, a remediation's removal,
//! then its replacement's join, then its end are changes on the stream, in that order. Two of
//! three members lost at once are left for an operator, even by a policy that tolerates every
//! machine unhealthy: removing one would leave one healthy member of two.

use std::sync::Arc;

use exk8s_api::clock::ManualClock;
use exk8s_api::db::events::Change;
use exk8s_api::sim::VmEvent;
use exk8s_common::payload::PlanStep;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, spawn_clocked, test_config};
use crate::rotation::rotate;
use crate::sync::{fetch_update, update_payload};
use crate::upgrade::{booted, condition, patch_with, view};

async fn health(app: &TestApp) {
    exk8s_api::founding::reconcile::health(&app.state.reconciler()).await;
}

fn membership_of(view: &Value, vm: i64) -> String {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .map(|n| n["etcd_membership"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_default()
}

/// Kills `vm` and lets the health pass watch it past the policy's `vm_down_after_secs`.
async fn dead_past_its_timeout(app: &TestApp, clock: &ManualClock, vm: i64) {
    assert!(app.sims.compute.befall(vm, VmEvent::Destroy));
    health(app).await;
    clock.advance(time::Duration::minutes(3));
}

async fn a_dead_member_waits_for_an_upgrade_then_leaves_first(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec!["v1.35.3".to_owned(), "v1.36.3".to_owned()],
        ..test_config()
    };
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let dead = nodes[2].0.vm;

    let (status, started) = patch_with(
        &app,
        cluster,
        json!({"kubernetes_version": "v1.36.3", "snapshot_first": false}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    dead_past_its_timeout(&app, &clock, dead).await;
    health(&app).await;
    let waiting = view(&app, cluster).await;
    let allowed = condition(&waiting, "RemediationAllowed");
    assert_eq!(
        (&allowed["status"], &allowed["reason"]),
        (&json!("False"), &json!("ChangeInProgress")),
        "{allowed}"
    );
    assert!(
        allowed["message"].as_str().unwrap().contains("v1.36.3"),
        "names the upgrade: {allowed}"
    );
    assert_eq!(membership_of(&waiting, dead), "voter", "nothing removed");

    // The upgrade is rolled back (no member took it): the dead member goes, first.
    let (status, back) = patch_with(&app, cluster, json!({"kubernetes_version": "v1.35.3"})).await;
    assert!(status == 200 || status == 202, "{status} {back}");
    health(&app).await;
    let remedied = view(&app, cluster).await;
    assert_eq!(membership_of(&remedied, dead), "leaving", "{remedied}");
    assert_eq!(condition(&remedied, "RemediationAllowed")["status"], "True");
    // The oldest healthy member's next bundle removes it from etcd.
    let (remover, key) = &nodes[0];
    let update = update_payload(&app, fetch_update(&app, remover, key).await).await;
    assert!(
        update
            .plan
            .iter()
            .any(|s| matches!(s, PlanStep::EtcdRemove { .. })),
        "{:?}",
        update.plan
    );
    let recorded = exk8s_api::db::remediations::since(&app.state.db.pool, cluster, 0)
        .await
        .unwrap();
    assert_eq!(recorded.len(), 1);
    assert_eq!(
        (
            recorded[0].vm_id,
            recorded[0].pool_id,
            recorded[0].reason.as_str()
        ),
        (dead, None, "MachineDeleted")
    );
    let changes = exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
        .await
        .unwrap();
    assert!(
        changes.iter().any(|e| matches!(&e.change,
            Change::Remediation { vm_id, set, .. } if *vm_id == dead && set == "control-plane")),
        "{changes:?}"
    );
    // One at a time: with the member leaving, another dead one waits.
    dead_past_its_timeout(&app, &clock, nodes[1].0.vm).await;
    health(&app).await;
    let one = view(&app, cluster).await;
    assert_eq!(membership_of(&one, nodes[1].0.vm), "voter", "{one}");
    assert_eq!(
        exk8s_api::db::remediations::since(&app.state.db.pool, cluster, 0)
            .await
            .unwrap()
            .len(),
        1
    );
}

both_backends!(a_dead_member_waits_for_an_upgrade_then_leaves_first);

/// `dead` dies and stays past its timeout: the health pass leaves it a voter, records nothing,
/// and `RemediationAllowed` says it waits for the change `named`.
async fn waits_for(app: &TestApp, clock: &ManualClock, cluster: i64, dead: i64, named: &str) {
    dead_past_its_timeout(app, clock, dead).await;
    health(app).await;
    let waiting = view(app, cluster).await;
    let allowed = condition(&waiting, "RemediationAllowed");
    assert_eq!(allowed["reason"], "ChangeInProgress", "{allowed}");
    assert!(
        allowed["message"].as_str().unwrap().contains(named),
        "names the {named}: {allowed}"
    );
    assert_eq!(membership_of(&waiting, dead), "voter");
    assert!(
        exk8s_api::db::remediations::since(&app.state.db.pool, cluster, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_dead_member_waits_for_a_ca_rotation(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let dead = nodes[2].0.vm;
    let rotating = rotate(&app, cluster, json!({"ca": "cluster"})).await;
    assert_eq!(rotating.status(), 202);
    waits_for(&app, &clock, cluster, dead, "rotation").await;
}

both_backends!(a_dead_member_waits_for_a_ca_rotation);

async fn a_dead_member_waits_for_a_restore(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let dead = nodes[2].0.vm;
    let (snapshot, _) = crate::restore::stored(&app, cluster, (&nodes[0].0, &nodes[0].1)).await;
    let restoring = crate::restore::start(&app, cluster, json!({"snapshot_id": snapshot})).await;
    assert_eq!(restoring.status(), 202);
    waits_for(&app, &clock, cluster, dead, "restore").await;
}

both_backends!(a_dead_member_waits_for_a_restore);

async fn a_remediation_is_streamed_from_start_to_end(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let (cluster, mut members) = crate::replace::founded(&app, 3).await;
    let (dead, _) = members.remove(2);
    let name = crate::upgrade::view(&app, cluster).await["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == dead.vm)
        .unwrap()["name"]
        .as_str()
        .unwrap()
        .to_owned();
    dead_past_its_timeout(&app, &clock, dead.vm).await;
    health(&app).await;
    crate::replace::removed_by(&app, cluster, &members[0], dead.vm).await;
    crate::membership::roll(&app, &members).await;
    let newcomer = crate::replace::joins(&app, cluster, &mut members).await;
    let changes = || async {
        exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
            .await
            .unwrap()
    };
    crate::crash::wait_until(
        "the remediation's end on the stream",
        std::time::Duration::from_secs(30),
        || async {
            changes()
                .await
                .iter()
                .any(|e| matches!(e.change, Change::Remediation { finished: true, .. }))
        },
    )
    .await;
    let changes = changes().await;
    let at = |wanted: &dyn Fn(&Change) -> bool| changes.iter().position(|e| wanted(&e.change));
    let started = at(&|c| {
        matches!(c, Change::Remediation { vm_id, set, finished: false, reason, .. }
            if *vm_id == dead.vm && set == "control-plane" && reason == "MachineDeleted")
    });
    let removed = at(&|c| {
        *c == Change::Removed {
            vm_id: dead.vm,
            set: "control-plane".into(),
            message: format!("{name}: removed from etcd, its VM deleted"),
        }
    });
    let joined = at(&|c| matches!(c, Change::Node { vm_id, .. } if *vm_id == newcomer));
    let finished = at(&|c| {
        matches!(c, Change::Remediation { vm_id, finished: true, message, .. }
            if *vm_id == dead.vm && *message == format!("{name}: replaced"))
    });
    assert!(
        started.is_some() && started < removed && removed < joined && joined < finished,
        "started, removed, its replacement, finished, in that order: {changes:#?}"
    );
    assert_eq!(
        changes
            .iter()
            .filter(|e| matches!(e.change, Change::Remediation { finished: true, .. }))
            .count(),
        1,
        "it ends once"
    );
}

both_backends!(a_remediation_is_streamed_from_start_to_end);

async fn two_members_lost_at_once_are_left_for_an_operator(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = booted(&app).await;
    let cluster = nodes[0].0.cluster;
    let policy = app
        .put(&format!("/clusters/{cluster}/health-policy"))
        .json(&json!({"max_unhealthy": "100%"}))
        .send()
        .await
        .unwrap();
    assert_eq!(policy.status(), 200);
    for (node, _) in &nodes[..2] {
        assert!(app.sims.compute.befall(node.vm, VmEvent::Destroy));
    }
    health(&app).await;
    clock.advance(time::Duration::minutes(3));
    health(&app).await;
    let refused = view(&app, cluster).await;
    let allowed = condition(&refused, "RemediationAllowed");
    assert_eq!(
        (&allowed["status"], &allowed["reason"]),
        (&json!("False"), &json!("QuorumAtRisk")),
        "{allowed}"
    );
    assert!(
        allowed["message"]
            .as_str()
            .unwrap()
            .contains("only 1 of 3 etcd members are healthy"),
        "{allowed}"
    );
    for (node, _) in &nodes {
        assert_eq!(membership_of(&refused, node.vm), "voter", "nothing removed");
    }
    assert!(
        exk8s_api::db::remediations::since(&app.state.db.pool, cluster, 0)
            .await
            .unwrap()
            .is_empty()
    );
}

both_backends!(two_members_lost_at_once_are_left_for_an_operator);
