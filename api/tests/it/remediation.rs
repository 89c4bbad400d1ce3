//! Worker remediation on SQLite and PostgreSQL, with an injected clock and the compute
//! simulator killing machines: a pool's worker whose VM is destroyed is, past the policy's
//! wait and with no operator call, drained, released and replaced (the record kept); the retry
//! limit and `max_unhealthy` each stop it (and lifting them lets it go on); a policy with
//! remediation off only watches. Each remediation is a change on the cluster's stream when it
//! starts and when its replacement came up, and so is the removal of the node it replaced.

use std::sync::Arc;

use exk8s_api::clock::ManualClock;
use exk8s_api::db::events::Change;
use exk8s_api::sim::VmEvent;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{
    Backend, TestApp, both_backends, credentials_for, json_of, spawn_clocked, test_config,
};
use crate::bootstrap::report;
use crate::pools::{pool, pool_body, settled, vm_ids as vms};
use crate::sync::{fetch_update, register, sync_report, update_payload};

async fn health(app: &TestApp) {
    exk8s_api::founding::reconcile::health(&app.state.reconciler()).await;
}

async fn remediations(app: &TestApp, cluster: i64) -> Vec<(i64, String)> {
    let rows = exk8s_api::db::remediations::since(&app.state.db.pool, cluster, 0)
        .await
        .unwrap();
    rows.into_iter().map(|r| (r.vm_id, r.reason)).collect()
}

/// The cluster's `RemediationAllowed`: reason and message (its status follows the reason).
/// The cluster's remediation events: (vm, set, finished, reason, message).
async fn remediated(app: &TestApp, cluster: i64) -> Vec<(i64, String, bool, String, String)> {
    let changes = exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
        .await
        .unwrap();
    changes
        .into_iter()
        .filter_map(|e| match e.change {
            Change::Remediation {
                vm_id,
                set,
                finished,
                reason,
                message,
            } => Some((vm_id, set, finished, reason, message)),
            _ => None,
        })
        .collect()
}

async fn remediation_allowed(app: &TestApp, cluster: i64) -> (String, String) {
    let view = crate::upgrade::view(app, cluster).await;
    let condition = crate::upgrade::condition(&view, "RemediationAllowed");
    let status = if condition["reason"] == "Allowed" {
        "True"
    } else {
        "False"
    };
    assert_eq!(condition["status"], status, "{condition}");
    let text = |k: &str| condition[k].as_str().unwrap().to_owned();
    (text("reason"), text("message"))
}

async fn put_policy(app: &TestApp, cluster: i64, policy: Value) {
    let path = format!("/clusters/{cluster}/health-policy");
    let answer = app.put(&path).json(&policy).send().await.unwrap();
    assert_eq!(answer.status(), 200, "{}", json_of(answer).await);
}

/// A founded one-member cluster (its member booted) with a pool `blue` of `count` booted
/// workers, on an injected clock: the app, the clock, the member and its key, the cluster, the
/// pool and its workers' VM ids.
async fn pool_of(
    backend: Backend,
    count: i64,
) -> (
    TestApp,
    Arc<ManualClock>,
    (crate::app::Node, NodeKey),
    i64,
    i64,
    Vec<i64>,
) {
    let (app, clock, member, cluster, id, workers) = pool_with(backend, count, test_config()).await;
    let workers = workers.iter().map(|(worker, _)| worker.vm).collect();
    (app, clock, member, cluster, id, workers)
}

/// [`pool_of`] on `config`, each worker with its day-2 key.
async fn pool_with(
    backend: Backend,
    count: i64,
    config: exk8s_api::app::ApiConfig,
) -> (
    TestApp,
    Arc<ManualClock>,
    (crate::app::Node, NodeKey),
    i64,
    i64,
    Vec<(crate::app::Node, NodeKey)>,
) {
    let clock = Arc::new(ManualClock::starting_at(time::OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, config, None, clock.clone()).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let member = credentials_for(&app, 7, &created).await.remove(0);
    let key = NodeKey::generate().unwrap();
    register(&app, &member, &key).await;
    assert_eq!(report(&app, &member, "complete", "succeeded").await, 204);
    let made = app
        .post(&format!("/clusters/{cluster}/node-pools"))
        .json(&pool_body("blue", count))
        .send()
        .await
        .unwrap();
    let id = json_of(made).await["id"].as_i64().unwrap();
    let mut workers = Vec::new();
    for vm in vms(&settled(&app, cluster, id, usize::try_from(count).unwrap()).await) {
        let (_, worker, key) = crate::pool_upgrade::boot_worker_keyed(&app, cluster, vm).await;
        workers.push((worker, key));
    }
    (app, clock, (member, key), cluster, id, workers)
}

async fn a_dead_worker_is_replaced_as_the_policy_allows(backend: Backend) {
    let (app, clock, (member, key), cluster, id, workers) = pool_of(backend, 3).await;
    let three: std::collections::BTreeSet<i64> = workers.iter().copied().collect();

    // With remediation off, a destroyed worker is only watched.
    put_policy(&app, cluster, json!({"remediation": false})).await;
    assert!(app.sims.compute.befall(workers[0], VmEvent::Destroy));
    health(&app).await;
    clock.advance(time::Duration::minutes(3));
    health(&app).await;
    assert_eq!(vms(&pool(&app, cluster, id).await), three);
    assert!(remediations(&app, cluster).await.is_empty());

    // On (the default): drained by the control-plane member's agent (played here: it syncs
    // the generation that carries the drain), released and replaced, with no operator call.
    put_policy(&app, cluster, json!({})).await;
    health(&app).await;
    let draining = pool(&app, cluster, id).await;
    let gone = draining["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == workers[0])
        .unwrap_or_else(|| panic!("{draining}"));
    assert_eq!(gone["removal"], "draining", "{draining}");
    let drain = update_payload(&app, fetch_update(&app, &member, &key).await).await;
    sync_report(&app, &member, &key, "succeeded", drain.identity.generation).await;
    let replaced = vms(&settled(&app, cluster, id, 3).await);
    assert!(!replaced.contains(&workers[0]), "{replaced:?}");
    assert!(replaced.contains(&workers[1]) && replaced.contains(&workers[2]));
    assert_eq!(
        remediations(&app, cluster).await,
        vec![(workers[0], "MachineDeleted".to_owned())]
    );
    // It is a change on the cluster's stream, with its reason and the node it replaced; so is
    // that node's removal. It ends once the replacement came up.
    let name = gone["name"].as_str().unwrap();
    let started = remediated(&app, cluster).await;
    assert_eq!(started.len(), 1, "{started:?}");
    let (vm, set, finished, reason, message) = &started[0];
    assert_eq!(
        (*vm, set.as_str(), *finished, reason.as_str()),
        (workers[0], "worker", false, "MachineDeleted")
    );
    assert!(
        message.contains(name) && message.contains("no longer exists"),
        "{message}"
    );
    let newcomer = *replaced.iter().find(|vm| !three.contains(vm)).unwrap();
    crate::pool_upgrade::boot_worker_keyed(&app, cluster, newcomer).await;
    crate::crash::wait_until(
        "the remediation's end on the stream",
        std::time::Duration::from_secs(30),
        || async { remediated(&app, cluster).await.len() == 2 },
    )
    .await;
    let changes = exk8s_api::db::events::after(&app.state.db.pool, cluster, 0, 10_000)
        .await
        .unwrap();
    let at = |wanted: &dyn Fn(&Change) -> bool| changes.iter().position(|e| wanted(&e.change));
    let removed = at(&|c| {
        matches!(c, Change::Removed { vm_id, set, message }
            if *vm_id == workers[0] && set == "worker"
                && *message == format!("{name}: removed from its pool, its VM deleted"))
    });
    let start = at(&|c| {
        matches!(
            c,
            Change::Remediation {
                finished: false,
                ..
            }
        )
    });
    let end = at(&|c| {
        matches!(c, Change::Remediation { vm_id, finished: true, reason, message, .. }
            if *vm_id == workers[0] && reason == "MachineDeleted"
                && *message == format!("{name}: replaced"))
    });
    assert!(
        start.is_some() && start < removed && removed < end,
        "started, removed, finished in that order: {changes:#?}"
    );
    assert!(app.sims.compute.vms().iter().all(|vm| vm.id != workers[0]));

    // One remediation a day allowed: the next dead worker waits.
    put_policy(&app, cluster, json!({"max_remediations": 1})).await;
    assert!(app.sims.compute.befall(workers[1], VmEvent::Stop));
    health(&app).await;
    clock.advance(time::Duration::minutes(3));
    health(&app).await;
    assert_eq!(vms(&pool(&app, cluster, id).await), replaced);
    assert_eq!(remediations(&app, cluster).await.len(), 1);
    let (reason, message) = remediation_allowed(&app, cluster).await;
    assert_eq!(reason, "RetriesExhausted", "{message}");
    assert!(
        message.starts_with("pool blue: 1 machines were replaced"),
        "{message}"
    );

    // A day on, every worker has fallen silent (no agent runs here): three of three
    // unhealthy is more than max_unhealthy allows, so none goes. (Remediation is off while
    // the silence builds up: at the first pass only the stopped worker is unhealthy.)
    put_policy(&app, cluster, json!({"remediation": false})).await;
    clock.advance(time::Duration::hours(25));
    // No pass ran for a day: the watch resumes, and silence counts from now.
    health(&app).await;
    clock.advance(time::Duration::minutes(16));
    put_policy(&app, cluster, json!({"max_unhealthy": "1"})).await;
    health(&app).await;
    assert_eq!(vms(&pool(&app, cluster, id).await), replaced);
    assert_eq!(remediations(&app, cluster).await.len(), 1);
    // The lone control-plane member is silent too: its refusal comes first, the pool's after.
    let (reason, message) = remediation_allowed(&app, cluster).await;
    assert_eq!(reason, "QuorumAtRisk", "{message}");
    assert!(
        message
            .contains("; pool blue: 3 machines are unhealthy, more than max_unhealthy allows (1)"),
        "{message}"
    );
    // The limit was what held them: allowing all, the longest unhealthy go first: the stopped
    // one, seen down since the first day — not the silent one, whose silence counts from when
    // the passes resumed.
    put_policy(&app, cluster, json!({"max_unhealthy": "100%"})).await;
    health(&app).await;
    let done = remediations(&app, cluster).await;
    assert!(
        done.len() > 1 && done.contains(&(workers[1], "MachineNotRunning".to_owned())),
        "{done:?}"
    );
    let (_, message) = remediation_allowed(&app, cluster).await;
    assert!(
        !message.contains("pool blue"),
        "the pool holds nothing back: {message}"
    );
}

both_backends!(a_dead_worker_is_replaced_as_the_policy_allows);

/// A pool's own policy rules its workers instead of the cluster's: with the cluster's
/// remediation off a dead worker is only watched, until its pool turns remediation on for
/// itself; `DELETE` makes it follow the cluster's again. Refused as the cluster's is.
async fn a_pool_follows_its_own_policy_instead_of_the_clusters(backend: Backend) {
    let (app, clock, _, cluster, id, two) = pool_of(backend, 2).await;
    let path = format!("/clusters/{cluster}/node-pools/{id}/health-policy");
    let inherited = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(inherited["own"], false, "{inherited}");

    put_policy(&app, cluster, json!({"remediation": false})).await;
    assert!(app.sims.compute.befall(two[0], VmEvent::Destroy));
    health(&app).await;
    clock.advance(time::Duration::minutes(3));
    health(&app).await;
    assert!(
        remediations(&app, cluster).await.is_empty(),
        "the cluster's policy: off"
    );

    // Its own: remediation on (the default), and one of its two workers may be unhealthy
    // (the default 40% of two rounds down to none, as Cluster API's maxUnhealthy does).
    let own = app
        .put(&path)
        .json(&json!({"max_unhealthy": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    let own = json_of(own).await;
    assert_eq!(
        (
            &own["own"],
            &own["policy"]["remediation"],
            &own["policy"]["max_unhealthy"]
        ),
        (&json!(true), &json!(true), &json!("1"))
    );
    health(&app).await;
    assert_eq!(
        remediations(&app, cluster).await,
        vec![(two[0], "MachineDeleted".to_owned())]
    );
    let draining = pool(&app, cluster, id).await;
    let gone = draining["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == two[0])
        .unwrap_or_else(|| panic!("{draining}"));
    assert_eq!(gone["removal"], "draining", "{draining}");

    let back = app.delete(&path).send().await.unwrap();
    assert_eq!(back.status(), 200);
    let back = json_of(back).await;
    assert_eq!(
        (&back["own"], &back["policy"]["remediation"]),
        (&json!(false), &json!(false))
    );
    let again = json_of(app.get(&path).send().await.unwrap()).await;
    assert_eq!(again, back);

    let refused = app
        .put(&path)
        .json(&json!({"unreachable_after_secs": 60}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 422);
    let refused = json_of(refused).await;
    assert!(
        refused.to_string().contains("unreachable_after_secs"),
        "{refused}"
    );
    let missing = app
        .get(&format!(
            "/clusters/{cluster}/node-pools/999999/health-policy"
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    // The credential matrix of the policy routes: no token 401; another org's token 404
    // (nothing about this cluster revealed, nothing changed).
    let other =
        crate::app::operator_token(&app.state, 8, exk8s_api::tokens::Scope::Operator, 3600).await;
    let cluster_path = format!("/clusters/{cluster}/health-policy");
    let body = json!({"remediation": true});
    let routes = [
        ("GET", &cluster_path, None),
        ("PUT", &cluster_path, Some(&body)),
        ("GET", &path, None),
        ("PUT", &path, Some(&body)),
        ("DELETE", &path, None),
    ];
    for (method, route, body) in routes {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        for (token, status) in [(None, 401), (Some(&other), 404)] {
            let mut request = app
                .http
                .request(method.clone(), format!("{}{route}", app.url));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), status, "{method} {route}");
        }
    }
    assert_eq!(json_of(app.get(&path).send().await.unwrap()).await, back);
    let kept = json_of(app.get(&cluster_path).send().await.unwrap()).await;
    assert_eq!(kept["remediation"], false, "unchanged: {kept}");
}

both_backends!(a_pool_follows_its_own_policy_instead_of_the_clusters);

/// Polls the API as a node's sync timer does (a signed generation request: its heartbeat).
async fn poll(app: &TestApp, node: &crate::app::Node, key: &NodeKey) {
    let path = format!("/nodes/{}/generation", node.vm);
    let signing = crate::sync::Signing::new(key, &node.imds);
    let answer = crate::sync::send(app, "GET", &path, b"", &signing).await;
    assert_eq!(answer.status(), 200, "{path}");
}

/// The API is away for two hours (no pass, no poll heard), then back: its nodes poll back in
/// one by one over seven minutes, as their timers fall, and none is replaced — although every
/// one was silent far past the policy's timeout when the API came back — while a worker that
/// never polls again is replaced once the timeout has passed since the API could hear it.
async fn an_api_away_replaces_no_machine_that_polls_back(backend: Backend) {
    // Passes every minute, as `serve` runs them: a pause of five minutes or more is a gap.
    let config = exk8s_api::app::ApiConfig {
        reconcile_interval: std::time::Duration::from_secs(60),
        ..test_config()
    };
    let (app, clock, member, cluster, id, workers) = pool_with(backend, 3, config).await;
    let mut nodes = vec![member];
    nodes.extend(workers);
    // Nothing holds a remediation back but the judgement itself.
    put_policy(&app, cluster, json!({"max_unhealthy": "100%"})).await;
    for (node, key) in &nodes {
        poll(&app, node, key).await;
    }
    health(&app).await;

    // Two hours without the API; back, and every node's last poll is two hours old.
    clock.advance(time::Duration::hours(2));
    health(&app).await;
    let (silent, _) = nodes.last().unwrap();
    for (node, key) in &nodes[..nodes.len() - 1] {
        clock.advance(time::Duration::seconds(140));
        poll(&app, node, key).await;
        health(&app).await;
    }
    clock.advance(time::Duration::minutes(5));
    health(&app).await;
    let done = remediations(&app, cluster).await;
    assert!(
        done.is_empty(),
        "no machine that polled back is replaced: {done:?}"
    );
    assert_eq!(vms(&pool(&app, cluster, id).await).len(), 3);

    // The one that never polls: unhealthy once the timeout (15 minutes) has passed since the
    // API came back, and replaced.
    clock.advance(time::Duration::minutes(3));
    health(&app).await;
    let done = remediations(&app, cluster).await;
    assert_eq!(done, vec![(silent.vm, "NodeUnreachable".to_owned())]);
    // On its way out (being drained, or gone already), and no other machine is.
    let leaving = pool(&app, cluster, id).await;
    for node in leaving["nodes"].as_array().unwrap() {
        let removed = !node["removal"].is_null();
        assert_eq!(removed, node["vm_id"] == silent.vm, "{leaving}");
    }
}

both_backends!(an_api_away_replaces_no_machine_that_polls_back);
