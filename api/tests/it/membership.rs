//! Growing a running control plane through the API, on SQLite and PostgreSQL (the agents'
//! side acted by the test; real etcd proves the agent's side in tests/tests/etcd_membership.rs):
//! `PATCH /clusters/{id}` from 1 to 3 adds one member at a time — a new VM whose bundle joins
//! etcd as a learner through the voters — and only after every member applied the generation
//! the last join gave them. A join that fails, or outlasts its timeout (injected clock), is
//! released and the change ends with its reason; bad and untimely requests are refused.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api::clock::ManualClock;
use exk8s_api::tokens::Scope;
use exk8s_common::node_auth::NodeKey;
use exk8s_common::payload::PlanStep;
use serde_json::{Value, json};

use crate::app::{
    Backend, Node, TestApp, both_backends, credentials_for, imds_token, json_of, operator_token,
    spawn_clocked, test_config,
};
use crate::bootstrap::report;
use crate::crash::wait_until;
use crate::helpers::text;
use crate::sync::{fetch_update, register, sync_report, update_payload};

pub(crate) async fn view(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

pub(crate) fn control_plane(view: &Value) -> Vec<Value> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["role"] == "control-plane")
        .cloned()
        .collect()
}

pub(crate) async fn scale(app: &TestApp, cluster: i64, body: Value) -> reqwest::Response {
    app.patch(&format!("/clusters/{cluster}"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Waits for the joining member; its credentials.
pub(crate) async fn joining(app: &TestApp, cluster: i64) -> Node {
    wait_until("a member joining", Duration::from_secs(20), || async {
        control_plane(&view(app, cluster).await)
            .iter()
            .any(|n| n["etcd_membership"] == "joining")
    })
    .await;
    let node = control_plane(&view(app, cluster).await)
        .into_iter()
        .find(|n| n["etcd_membership"] == "joining")
        .unwrap();
    let vm = node["vm_id"].as_i64().unwrap();
    Node {
        vm,
        cluster,
        imds: imds_token(&app.state, vm, 7, 600).await,
        bootstrap: operator_token(&app.state, 7, Scope::Bootstrap, 600).await,
    }
}

/// Waits until no process is changing the cluster's membership.
pub(crate) async fn idle(app: &TestApp, cluster: i64) {
    use sqlx::Row as _;
    wait_until(
        "the membership change to pause",
        Duration::from_secs(30),
        || async {
            sqlx::query("SELECT membership_lease_until FROM clusters WHERE id = $1")
                .bind(cluster)
                .fetch_one(&app.state.db.pool)
                .await
                .unwrap()
                .get::<Option<i64>, _>("membership_lease_until")
                .is_none()
        },
    )
    .await;
}

pub(crate) fn condition(view: &Value, kind: &str) -> Value {
    view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
        .unwrap()
}

/// Every member applies its newest generation (one at a time, as their timers would).
pub(crate) async fn roll(app: &TestApp, members: &[(Node, NodeKey)]) {
    for (node, key) in members {
        let response = fetch_update(app, node, key).await;
        if response.status() == 204 {
            continue;
        }
        let update = update_payload(app, response).await;
        sync_report(app, node, key, "succeeded", update.identity.generation).await;
    }
}

/// An abandoned join leaves like any member: the oldest voter's update removes its learner
/// (whatever its own agent managed), and only once that is applied does its VM go.
async fn withdrawn(app: &TestApp, cluster: i64, members: &[(Node, NodeKey)], vm: i64) {
    let abandoned = control_plane(&view(app, cluster).await)
        .into_iter()
        .find(|n| n["vm_id"] == vm)
        .expect("the abandoned member is recorded until its learner is removed");
    assert_eq!(abandoned["etcd_membership"], "leaving");
    let counted = &view(app, cluster).await["control_plane_members"];
    assert_eq!(counted["leaving"], 1, "{counted}");
    assert_eq!(counted["joining"], 0, "{counted}");
    assert!(app.sims.compute.vms().iter().any(|v| v.id == vm));
    let peer = format!(
        "https://{}:2380",
        abandoned["private_ipv4"].as_str().unwrap()
    );
    let (remover, key) = &members[0];
    let update = update_payload(app, fetch_update(app, remover, key).await).await;
    assert!(
        update.plan.iter().any(|step| matches!(step,
            PlanStep::EtcdRemove { member_peer_url, .. } if member_peer_url.as_str() == peer)),
        "{:?}",
        update.plan
    );
    sync_report(app, remover, key, "succeeded", update.identity.generation).await;
    wait_until(
        "the abandoned VM released",
        Duration::from_secs(20),
        || async { app.sims.compute.vms().iter().all(|v| v.id != vm) },
    )
    .await;
    // Its row goes after its VM, and the change ends (its lease released) after that: the
    // members' next generations exist only then.
    wait_until(
        "the abandoned member forgotten",
        Duration::from_secs(20),
        || async {
            control_plane(&view(app, cluster).await)
                .iter()
                .all(|n| n["vm_id"] != vm)
        },
    )
    .await;
    idle(app, cluster).await;
    roll(app, members).await;
}

async fn a_control_plane_grows_one_member_at_a_time(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let config = test_config();
    let join_timeout = config.member_join_timeout;
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let created = json_of(app.found(1, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut members = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        members.push((node, key));
    }
    let first_ip = control_plane(&view(&app, cluster).await)[0]["private_ipv4"]
        .as_str()
        .unwrap()
        .to_owned();

    for (body, field) in [
        (json!({"control_plane_count": 2}), "control_plane_count"),
        (json!({"control_plane_count": 9}), "control_plane_count"),
        (json!({}), "control_plane_count"),
    ] {
        let refused = scale(&app, cluster, body).await;
        assert_eq!(refused.status(), 422);
        assert_eq!(json_of(refused).await["error"]["field"], field);
    }
    assert_eq!(
        scale(&app, 999_999, json!({"control_plane_count": 3}))
            .await
            .status(),
        404
    );
    // A member whose etcd went down (its sync said so) holds every change until it recovers.
    let (a, a_key) = &members[0];
    sync_report(&app, a, a_key, "failed", 1).await;
    let unhealthy = scale(&app, cluster, json!({"control_plane_count": 3})).await;
    assert_eq!(unhealthy.status(), 409);
    let said = json_of(unhealthy).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(said.contains("not healthy"), "{said}");
    sync_report(&app, a, a_key, "succeeded", 1).await;
    let same = scale(&app, cluster, json!({"control_plane_count": 1})).await;
    assert_eq!(same.status(), 200, "already that size");

    let keyed = |count: i64| {
        app.patch(&format!("/clusters/{cluster}"))
            .header("Idempotency-Key", "grow-to-three")
            .json(&json!({"control_plane_count": count}))
            .send()
    };
    let started = keyed(3).await.unwrap();
    assert_eq!(started.status(), 202);
    let first_answer = json_of(started).await;
    assert_eq!(first_answer["voters"], 1);
    // A retry with its key gets the first answer (not "in progress"); the key with another
    // body is refused.
    let retried = keyed(3).await.unwrap();
    assert_eq!(retried.status(), 202);
    assert_eq!(json_of(retried).await, first_answer);
    assert_eq!(keyed(5).await.unwrap().status(), 422);
    let b = joining(&app, cluster).await;
    let busy = scale(&app, cluster, json!({"control_plane_count": 5})).await;
    assert_eq!(busy.status(), 409);
    assert!(
        json_of(busy).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("in progress")
    );
    let growing = view(&app, cluster).await;
    assert_eq!(
        growing["control_plane_members"],
        json!({"desired": 3, "voters": 1, "joining": 1, "leaving": 0})
    );
    let scaling = condition(&growing, "ScalingUp");
    assert_eq!(scaling["status"], "True");
    assert_eq!(scaling["reason"], "MemberJoining");

    // The new member's bundle joins through the one voter.
    let b_key = NodeKey::generate().unwrap();
    let bundle = register(&app, &b, &b_key).await;
    let voters: Vec<String> = bundle
        .plan
        .iter()
        .find_map(|s| match s {
            PlanStep::EtcdJoin { voters, .. } => {
                Some(voters.iter().map(ToString::to_string).collect())
            }
            _ => None,
        })
        .expect("a join step");
    assert_eq!(voters, [format!("https://{first_ip}:2379")]);
    assert!(
        text(&bundle, "/etc/exk8s/config/etcd-bootstrap.env")
            .contains("\nETCD_INITIAL_CLUSTER_STATE=existing\n")
    );
    // Its agent promoted it before saying complete: it votes, and everyone gets a generation.
    assert_eq!(report(&app, &b, "complete", "succeeded").await, 204);
    members.push((b, b_key));
    wait_until(
        "the second member voting",
        Duration::from_secs(20),
        || async {
            control_plane(&view(&app, cluster).await)
                .iter()
                .all(|n| n["etcd_membership"] == "voter" && n["desired_generation"] == 2)
        },
    )
    .await;
    assert_eq!(
        control_plane(&view(&app, cluster).await).len(),
        2,
        "the third waits for the rollout"
    );
    // The shared name listed it before any member rolled to follow it.
    let dns_name = created["control_plane_dns_name"].as_str().unwrap();
    assert_eq!(
        app.sims.dns.records()[dns_name].len(),
        2,
        "{:?}",
        app.sims.dns.records()
    );
    let (a, a_key) = &members[0];
    let update = update_payload(&app, fetch_update(&app, a, a_key).await).await;
    let manifest = text(&update, "/etc/kubernetes/manifests/kube-apiserver.yaml");
    assert_eq!(manifest.matches(":2379").count(), 2, "{manifest}");
    sync_report(&app, a, a_key, "succeeded", update.identity.generation).await;
    roll(&app, &members[1..]).await;

    // The third joins; its agent fails: the join is released and the change ends, saying why.
    let c = joining(&app, cluster).await;
    let c_vm = c.vm;
    register(&app, &c, &NodeKey::generate().unwrap()).await;
    assert_eq!(report(&app, &c, "etcd", "failed").await, 204);
    wait_until(
        "the failed join released",
        Duration::from_secs(20),
        || async { view(&app, cluster).await.get("membership_error").is_some() },
    )
    .await;
    withdrawn(&app, cluster, &members, c_vm).await;
    let stopped = view(&app, cluster).await;
    assert_eq!(control_plane(&stopped).len(), 2);
    assert!(app.sims.compute.vms().iter().all(|vm| vm.id != c_vm));
    let error = stopped["membership_error"].as_str().unwrap();
    assert!(error.contains("its agent reported etcd:failed"), "{error}");
    assert_eq!(condition(&stopped, "ScalingUp")["reason"], "ChangeStopped");

    // Asked again; this join never reports and outlasts its timeout.
    assert_eq!(
        scale(&app, cluster, json!({"control_plane_count": 3}))
            .await
            .status(),
        202
    );
    let d = joining(&app, cluster).await;
    idle(&app, cluster).await;
    exk8s_api::founding::reconcile::memberships(&app.state.reconciler()).await;
    assert_eq!(
        control_plane(&view(&app, cluster).await).len(),
        3,
        "within its timeout"
    );
    clock.advance(time::Duration::seconds(
        i64::try_from(join_timeout.as_secs()).unwrap() + 1,
    ));
    exk8s_api::founding::reconcile::memberships(&app.state.reconciler()).await;
    withdrawn(&app, cluster, &members, d.vm).await;
    let late = view(&app, cluster).await;
    assert_eq!(control_plane(&late).len(), 2);
    assert!(app.sims.compute.vms().iter().all(|vm| vm.id != d.vm));
    assert!(
        late["membership_error"]
            .as_str()
            .unwrap()
            .contains("did not finish within")
    );

    // And a third time it works.
    assert_eq!(
        scale(&app, cluster, json!({"control_plane_count": 3}))
            .await
            .status(),
        202
    );
    let e = joining(&app, cluster).await;
    let e_key = NodeKey::generate().unwrap();
    register(&app, &e, &e_key).await;
    assert_eq!(report(&app, &e, "complete", "succeeded").await, 204);
    members.push((e, e_key));
    wait_until("three voters", Duration::from_secs(20), || async {
        let v = view(&app, cluster).await;
        let cp = control_plane(&v);
        cp.len() == 3 && cp.iter().all(|n| n["etcd_membership"] == "voter")
    })
    .await;
    roll(&app, &members).await;
    let done = view(&app, cluster).await;
    assert_eq!(done["desired_control_plane_count"], 3);
    assert_eq!(
        done["control_plane_members"],
        json!({"desired": 3, "voters": 3, "joining": 0, "leaving": 0})
    );
    assert_eq!(condition(&done, "ScalingUp")["reason"], "AtDesiredSize");
    assert_eq!(app.sims.compute.vms().len(), 3, "no VM leaked");
}

both_backends!(a_control_plane_grows_one_member_at_a_time);
