//! A pool's release on SQLite and PostgreSQL, with agents played by the test: a pool may not run a
//! kubelet newer than the oldest apiserver; once the control plane's upgrade ends, a pool that
//! follows it takes its release and is replaced one surge worker at a time (the new worker boots
//! at the new release before the oldest worker is drained by the control plane's agent and its
//! VM released), never fewer healthy workers than it asks for; with `max_surge` 0, each old
//! worker goes before its replacement is made, never a VM beyond the count; so too for an org
//! with no room under its VM quota.

use std::time::Duration;

use exk8s_api::tokens::Scope;
use exk8s_common::BundlePayload;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{
    Backend, Node, TestApp, both_backends, credentials_for, imds_token, json_of, operator_token,
    spawn_with, test_config,
};
use crate::bootstrap::report;
use crate::crash::wait_until;
use crate::pools::{pool, pool_body, settled, worker_vms};
use crate::sync::{fetch_update, register, sync_report, update_payload};

const OLD: &str = "v1.35.3";
const NEW: &str = "v1.36.3";

/// Registers worker `vm` and reports it complete, as its agent would; the release its bundle
/// installs.
pub(crate) async fn boot_worker(app: &TestApp, cluster: i64, vm: i64) -> String {
    boot_worker_keyed(app, cluster, vm).await.0
}

/// [`boot_worker`], also giving the worker and its day-2 key (its polls are signed with it).
pub(crate) async fn boot_worker_keyed(
    app: &TestApp,
    cluster: i64,
    vm: i64,
) -> (String, Node, NodeKey) {
    let bootstrap = operator_token(&app.state, 7, Scope::Bootstrap, 3600).await;
    let worker = Node {
        vm,
        cluster,
        imds: imds_token(&app.state, vm, 7, 600).await,
        bootstrap,
    };
    let key = NodeKey::generate().unwrap();
    let payload = register(app, &worker, &key).await;
    assert_eq!(report(app, &worker, "complete", "succeeded").await, 204);
    (kubelet_release(&payload), worker, key)
}

fn kubelet_release(payload: &BundlePayload) -> String {
    let kubelet = payload
        .artifacts
        .iter()
        .find(|a| a.name.as_str() == "kubelet");
    kubelet.unwrap().version.to_string()
}

fn workers(view: &Value) -> Vec<(i64, Option<String>, Option<String>)> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["vm_id"].as_i64().unwrap(),
                n["kubernetes_version"].as_str().map(str::to_owned),
                n["removal"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

async fn a_pool_follows_its_control_plane_one_surge_worker_at_a_time(backend: Backend) {
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec![OLD.into(), NEW.into(), "v1.37.2".into()],
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let member = credentials_for(&app, 7, &created).await.remove(0);
    let key = NodeKey::generate().unwrap();
    register(&app, &member, &key).await;
    assert_eq!(report(&app, &member, "complete", "succeeded").await, 204);

    let path = format!("/clusters/{cluster}/node-pools");
    let created = app
        .post(&path)
        .json(&pool_body("blue", 2))
        .send()
        .await
        .unwrap();
    let id = json_of(created).await["id"].as_i64().unwrap();
    let two = settled(&app, cluster, id, 2).await;
    assert_eq!(
        (&two["kubernetes_version"], &two["follow_control_plane"]),
        (&json!(OLD), &json!(true))
    );
    for (vm, _, _) in workers(&two) {
        assert_eq!(boot_worker(&app, cluster, vm).await, OLD);
    }
    let patch_pool = |version: &str| {
        app.patch(&format!("{path}/{id}"))
            .json(&json!({ "kubernetes_version": version }))
            .send()
    };
    let ahead = patch_pool(NEW).await.unwrap();
    assert_eq!(ahead.status(), 409);
    let message = json_of(ahead).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("upgrade the control plane first"),
        "{message}"
    );

    // The control plane goes first; its one member's healthy report moves the pool on.
    let started = app
        .patch(&format!("/clusters/{cluster}"))
        // The pools are what is under test: the control plane goes without its snapshot
        // (it::upgrade_snapshot proves the wait).
        .json(&json!({ "kubernetes_version": NEW, "snapshot_first": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let update = update_payload(&app, fetch_update(&app, &member, &key).await).await;
    sync_report(&app, &member, &key, "succeeded", update.identity.generation).await;

    let mut replaced = Vec::new();
    for round in 0..2 {
        let surged = wait_until_view(&app, cluster, id, |v| {
            workers(v)
                .iter()
                .filter(|(_, _, removal)| removal.is_none())
                .count()
                == 3
        })
        .await;
        assert_eq!(surged["kubernetes_version"], NEW);
        // A worker of the old release runs its desired generation, yet is not up to date: in the
        // pool's view and in the cluster's.
        let view = crate::upgrade::view(&app, cluster).await;
        let old: Vec<&Value> = view["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .chain(surged["nodes"].as_array().unwrap())
            .filter(|n| n["kubernetes_version"] == OLD)
            .collect();
        assert!(!old.is_empty(), "{view:#}");
        assert!(old.iter().all(|n| n["up_to_date"] == false), "{old:#?}");
        let (new_vm, _, _) = *workers(&surged)
            .iter()
            .max_by_key(|(vm, _, _)| *vm)
            .unwrap();
        // Nothing goes while the new worker has not booted.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            workers(&pool(&app, cluster, id).await)
                .iter()
                .all(|(_, _, r)| r.is_none())
        );
        assert_eq!(
            boot_worker(&app, cluster, new_vm).await,
            NEW,
            "round {round}"
        );
        let draining = wait_until_view(&app, cluster, id, |v| {
            workers(v).iter().any(|(_, _, removal)| removal.is_some())
        })
        .await;
        let (old_vm, old_release, _) = workers(&draining)
            .into_iter()
            .find(|(_, _, removal)| removal.is_some())
            .unwrap();
        assert_eq!(
            old_release.as_deref(),
            Some(OLD),
            "the oldest release goes first"
        );
        // The control plane's agent drains it; then its VM goes.
        let drain = update_payload(&app, fetch_update(&app, &member, &key).await).await;
        sync_report(&app, &member, &key, "succeeded", drain.identity.generation).await;
        wait_until_view(&app, cluster, id, |v| {
            workers(v).iter().all(|(vm, _, _)| *vm != old_vm)
        })
        .await;
        replaced.push(old_vm);
    }
    let done = settled(&app, cluster, id, 2).await;
    assert!(
        workers(&done)
            .iter()
            .all(|(_, release, _)| release.as_deref() == Some(NEW)),
        "{done}"
    );
    assert_eq!(
        worker_vms(&app, "blue").len(),
        2,
        "the replaced VMs are released"
    );
    assert!(
        replaced
            .iter()
            .all(|vm| !worker_vms(&app, "blue").contains(vm))
    );

    let newer = patch_pool("v1.37.2").await.unwrap();
    assert_eq!(newer.status(), 409);
    let unoffered = patch_pool("v1.34.0").await.unwrap();
    assert_eq!(unoffered.status(), 422);
    assert_eq!(
        json_of(unoffered).await["error"]["field"],
        "kubernetes_version"
    );
}

async fn a_pool_pinned_at_the_control_planes_release_stays_there_through_its_upgrade(
    backend: Backend,
) {
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec![OLD.into(), NEW.into()],
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let member = credentials_for(&app, 7, &created).await.remove(0);
    let key = NodeKey::generate().unwrap();
    register(&app, &member, &key).await;
    assert_eq!(report(&app, &member, "complete", "succeeded").await, 204);
    let path = format!("/clusters/{cluster}/node-pools");
    let made = app
        .post(&path)
        .json(&pool_body("blue", 0))
        .send()
        .await
        .unwrap();
    let id = json_of(made).await["id"].as_i64().unwrap();
    let patch_pool = |body: Value| app.patch(&format!("{path}/{id}")).json(&body).send();

    // Following at another release than the control plane's is refused, naming the field.
    let refused = patch_pool(json!({ "kubernetes_version": NEW, "follow_control_plane": true }))
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let error = json_of(refused).await;
    assert_eq!(error["error"]["field"], "follow_control_plane", "{error}");
    let pinned = patch_pool(json!({ "follow_control_plane": false }))
        .await
        .unwrap();
    assert_eq!(pinned.status(), 202);
    let pinned = json_of(pinned).await;
    assert_eq!(
        (
            &pinned["kubernetes_version"],
            &pinned["follow_control_plane"]
        ),
        (&json!(OLD), &json!(false))
    );

    // The control plane's upgrade ends; the pool stays at its release.
    let started = app
        .patch(&format!("/clusters/{cluster}"))
        .json(&json!({ "kubernetes_version": NEW, "snapshot_first": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let update = update_payload(&app, fetch_update(&app, &member, &key).await).await;
    sync_report(&app, &member, &key, "succeeded", update.identity.generation).await;
    let view = crate::upgrade::view(&app, cluster).await;
    assert_eq!(view["version"], NEW, "{view}");
    let held = pool(&app, cluster, id).await;
    assert_eq!(
        (&held["kubernetes_version"], &held["follow_control_plane"]),
        (&json!(OLD), &json!(false)),
        "{held}"
    );
    // Following again takes the control plane's release.
    let follows = json_of(
        patch_pool(json!({ "follow_control_plane": true }))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (
            &follows["kubernetes_version"],
            &follows["follow_control_plane"]
        ),
        (&json!(NEW), &json!(true)),
        "{follows}"
    );
}

async fn without_a_surge_each_old_worker_goes_before_its_replacement_is_made(backend: Backend) {
    replaced_old_first(upgrading(backend, 0).await).await;
}

/// An org at its VM quota (the member and the two workers) has no room for a surge worker: the
/// pool is replaced as with `max_surge` 0, never past the quota.
async fn at_the_vm_quota_a_pool_is_replaced_old_worker_first(backend: Backend) {
    let quotas = exk8s_api::quotas::Quotas {
        vms: 3,
        ..exk8s_api::quotas::Quotas::default()
    };
    replaced_old_first(upgrading_within(backend, 1, quotas).await).await;
}

/// Each old worker goes (oldest first) before its replacement is made, and the next only once
/// that one is healthy; never a VM beyond the pool's count.
async fn replaced_old_first(upgrading: Upgrading) {
    let Upgrading {
        app,
        cluster,
        member,
        key,
        pool: id,
        old,
    } = upgrading;
    let mut new = Vec::new();
    for &oldest in &old {
        // The oldest old worker goes first, while the pool has no VM beyond its count.
        let draining = wait_until_view(&app, cluster, id, |v| {
            workers(v).iter().any(|(_, _, removal)| removal.is_some())
        })
        .await;
        let going: Vec<i64> = workers(&draining)
            .into_iter()
            .filter(|(_, _, removal)| removal.is_some())
            .map(|(vm, _, _)| vm)
            .collect();
        assert_eq!(going, vec![oldest], "one at a time, oldest first");
        assert_eq!(workers(&draining).len(), 2, "no surge: {draining}");
        let drain = update_payload(&app, fetch_update(&app, &member, &key).await).await;
        sync_report(&app, &member, &key, "succeeded", drain.identity.generation).await;
        // Once its VM is released, its replacement is made at the new release.
        let replaced = wait_until_view(&app, cluster, id, |v| {
            let vms: Vec<i64> = workers(v).iter().map(|(vm, _, _)| *vm).collect();
            !vms.contains(&oldest) && vms.len() == 2
        })
        .await;
        assert!(worker_vms(&app, "blue").len() <= 2, "{replaced}");
        let made = workers(&replaced)
            .iter()
            .map(|(vm, _, _)| *vm)
            .find(|vm| !old.contains(vm) && !new.contains(vm))
            .unwrap();
        // Nothing else goes before it is healthy.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            workers(&pool(&app, cluster, id).await)
                .iter()
                .all(|(_, _, r)| r.is_none()),
            "the new worker has not booted: nothing goes"
        );
        assert_eq!(boot_worker(&app, cluster, made).await, NEW);
        new.push(made);
    }
    let done = settled(&app, cluster, id, 2).await;
    let mut left: Vec<i64> = workers(&done).iter().map(|(vm, _, _)| *vm).collect();
    left.sort_unstable();
    assert_eq!(left, new, "{done}");
    assert!(
        workers(&done)
            .iter()
            .all(|(_, release, _)| release.as_deref() == Some(NEW)),
        "{done}"
    );
}

/// Polls the pool until `ready` holds; its view.
async fn wait_until_view(
    app: &TestApp,
    cluster: i64,
    id: i64,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    wait_until(
        "the pool's replacement to move on",
        Duration::from_secs(20),
        || async { ready(&pool(app, cluster, id).await) },
    )
    .await;
    pool(app, cluster, id).await
}

/// A one-member cluster with a pool of two workers (`max_surge` as given), both booted at
/// [`OLD`], whose control plane was then upgraded to [`NEW`] (its member synced): the pool's
/// replacement begins.
struct Upgrading {
    app: TestApp,
    cluster: i64,
    member: Node,
    key: NodeKey,
    pool: i64,
    old: Vec<i64>,
}

async fn upgrading(backend: Backend, max_surge: i64) -> Upgrading {
    upgrading_within(backend, max_surge, exk8s_api::quotas::Quotas::default()).await
}

/// [`upgrading`] with the org's `quotas`.
async fn upgrading_within(
    backend: Backend,
    max_surge: i64,
    quotas: exk8s_api::quotas::Quotas,
) -> Upgrading {
    let config = exk8s_api::app::ApiConfig {
        kubernetes_versions: vec![OLD.into(), NEW.into()],
        quotas,
        ..test_config()
    };
    let app = spawn_with(backend, config, None).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let member = credentials_for(&app, 7, &created).await.remove(0);
    let key = NodeKey::generate().unwrap();
    register(&app, &member, &key).await;
    assert_eq!(report(&app, &member, "complete", "succeeded").await, 204);

    let path = format!("/clusters/{cluster}/node-pools");
    let mut body = pool_body("blue", 2);
    body["max_surge"] = json!(max_surge);
    let created = app.post(&path).json(&body).send().await.unwrap();
    let pool = json_of(created).await["id"].as_i64().unwrap();
    let two = settled(&app, cluster, pool, 2).await;
    assert_eq!(two["max_surge"], max_surge);
    for (vm, _, _) in workers(&two) {
        boot_worker(&app, cluster, vm).await;
    }
    let bad = app
        .patch(&format!("{path}/{pool}"))
        .json(&json!({ "max_surge": -1 }))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 422);
    assert_eq!(json_of(bad).await["error"]["field"], "max_surge");

    let started = app
        .patch(&format!("/clusters/{cluster}"))
        // The pools are what is under test: the control plane goes without its snapshot
        // (it::upgrade_snapshot proves the wait).
        .json(&json!({ "kubernetes_version": NEW, "snapshot_first": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let update = update_payload(&app, fetch_update(&app, &member, &key).await).await;
    sync_report(&app, &member, &key, "succeeded", update.identity.generation).await;
    let old = workers(&two).iter().map(|(vm, _, _)| *vm).collect();
    Upgrading {
        app,
        cluster,
        member,
        key,
        pool,
        old,
    }
}

async fn a_larger_surge_makes_every_new_worker_before_an_old_one_goes(backend: Backend) {
    let Upgrading {
        app,
        cluster,
        member,
        key,
        pool: id,
        old,
    } = upgrading(backend, 2).await;

    // Both new workers come first; nothing goes before they are healthy.
    let surged = wait_until_view(&app, cluster, id, |v| workers(v).len() == 4).await;
    let new: Vec<i64> = workers(&surged)
        .iter()
        .map(|(vm, _, _)| *vm)
        .filter(|vm| !old.contains(vm))
        .collect();
    assert_eq!(new.len(), 2, "{surged}");
    assert_eq!(boot_worker(&app, cluster, new[0]).await, NEW);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        workers(&pool(&app, cluster, id).await)
            .iter()
            .all(|(_, _, r)| r.is_none()),
        "one new worker is not healthy yet: nothing goes"
    );
    assert_eq!(boot_worker(&app, cluster, new[1]).await, NEW);
    for &oldest in &old {
        let draining = wait_until_view(&app, cluster, id, |v| {
            workers(v).iter().any(|(_, _, removal)| removal.is_some())
        })
        .await;
        let going: Vec<i64> = workers(&draining)
            .into_iter()
            .filter(|(_, _, removal)| removal.is_some())
            .map(|(vm, _, _)| vm)
            .collect();
        assert_eq!(
            going,
            vec![oldest],
            "the old ones go one at a time, oldest first"
        );
        let drain = update_payload(&app, fetch_update(&app, &member, &key).await).await;
        sync_report(&app, &member, &key, "succeeded", drain.identity.generation).await;
        wait_until_view(&app, cluster, id, |v| {
            workers(v).iter().all(|(vm, _, _)| *vm != oldest)
        })
        .await;
    }
    let done = settled(&app, cluster, id, 2).await;
    let mut left: Vec<i64> = workers(&done).iter().map(|(vm, _, _)| *vm).collect();
    left.sort_unstable();
    assert_eq!(left, new, "{done}");
}

both_backends!(a_pool_follows_its_control_plane_one_surge_worker_at_a_time);
both_backends!(a_larger_surge_makes_every_new_worker_before_an_old_one_goes);
both_backends!(without_a_surge_each_old_worker_goes_before_its_replacement_is_made);
both_backends!(at_the_vm_quota_a_pool_is_replaced_old_worker_first);
both_backends!(a_pool_pinned_at_the_control_planes_release_stays_there_through_its_upgrade);
