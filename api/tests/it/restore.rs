//! In-place restores on SQLite and PostgreSQL, the members played by the test: a stored
//! snapshot whose object was changed is refused before anything stops (no restore recorded, no
//! member told anything); a good one starts a restore whose members are told, through their
//! generation answers only, to stop (all), then restore (all: only then may each fetch the
//! snapshot, exactly as etcd wrote it, signed with its own key), then start one at a time in
//! ordinal order; a replayed acknowledgement changes nothing and one for a step the restore is
//! not at is refused; every other change of the cluster (rotation, scaling, rollout, renewal,
//! upgrade, snapshot, a second restore) is refused while it runs. The API is replaced by
//! another process on the same database mid-restore, which goes on from the journal. A member
//! that cannot do its step fails the restore, which says which member and why, and frees the
//! cluster for other changes.

use exk8s_common::names::Sha256Digest;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{Backend, Node, TestApp, both_backends, json_of, spawn_app, spawn_replica};
use crate::snapshots::{ask, etcd_snapshot, put, stored_object};
use crate::sync::{Signing, booted_cluster, send};

/// A node's signed `method path` with `body`, on `app`.
pub(crate) async fn signed(
    app: &TestApp,
    (node, key): (&Node, &NodeKey),
    method: &str,
    path: &str,
    body: &[u8],
) -> reqwest::Response {
    send(app, method, path, body, &Signing::new(key, &node.imds)).await
}

/// The restore step `node`'s generation answer names, if any.
pub(crate) async fn task(app: &TestApp, member: (&Node, &NodeKey)) -> Value {
    let path = format!("/nodes/{}/generation", member.0.vm);
    json_of(signed(app, member, "GET", &path, b"").await).await["restore"].clone()
}

pub(crate) async fn ack(
    app: &TestApp,
    member: (&Node, &NodeKey),
    id: i64,
    step: &str,
    failure: &str,
) -> u16 {
    let path = format!("/nodes/{}/restores/{id}", member.0.vm);
    let body = serde_json::to_vec(&json!({"step": step, "failure": failure})).unwrap();
    signed(app, member, "PUT", &path, &body)
        .await
        .status()
        .as_u16()
}

pub(crate) async fn restore_view(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}/restore"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

pub(crate) async fn start(app: &TestApp, cluster: i64, body: Value) -> reqwest::Response {
    app.post(&format!("/clusters/{cluster}/restore"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// A stored snapshot of `cluster`, uploaded by `member`: its id and bytes.
pub(crate) async fn stored(
    app: &TestApp,
    cluster: i64,
    member: (&Node, &NodeKey),
) -> (i64, Vec<u8>) {
    let id = ask(app, cluster).await["id"].as_i64().unwrap();
    let snapshot = etcd_snapshot(300);
    assert_eq!(
        put(app, member, id, &snapshot, None, None).await.status(),
        204
    );
    (id, snapshot)
}

/// The cluster's console page, as an operator signed in with the app's token sees it.
async fn console_page(app: &TestApp, cluster: i64) -> String {
    let signed_in = crate::console::login(app, &app.token, None).await;
    let (cookie, _) = crate::console::session(&signed_in);
    let page = crate::console::page(app, &format!("/ui/clusters/{cluster}"), &cookie).await;
    assert_eq!(page.status(), 200);
    page.text().await.unwrap()
}

/// Every change the cluster could be asked for is refused (409) naming the restore.
async fn others_refused(app: &TestApp, cluster: i64, snapshot: i64) {
    let asks = [
        (
            "POST",
            format!("/clusters/{cluster}/certificates/rotate-ca"),
            json!({"ca": "etcd"}),
        ),
        (
            "PATCH",
            format!("/clusters/{cluster}"),
            json!({"control_plane_count": 5}),
        ),
        (
            "PATCH",
            format!("/clusters/{cluster}"),
            json!({"kubernetes_version": "v1.36.3"}),
        ),
        ("POST", format!("/clusters/{cluster}/rollout"), Value::Null),
        (
            "POST",
            format!("/clusters/{cluster}/certificates/renew"),
            Value::Null,
        ),
        (
            "POST",
            format!("/clusters/{cluster}/snapshots"),
            Value::Null,
        ),
        (
            "POST",
            format!("/clusters/{cluster}/restore"),
            json!({"snapshot_id": snapshot}),
        ),
    ];
    for (method, path, body) in asks {
        let request = match method {
            "PATCH" => app.patch(&path),
            _ => app.post(&path),
        };
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let refused = request.send().await.unwrap();
        let status = refused.status();
        let said = json_of(refused).await;
        // An upgrade the API does not offer is refused for that first (422); every other ask
        // is a conflict with the restore.
        if status == 422 {
            assert!(
                body.get("kubernetes_version").is_some(),
                "{method} {path}: {said}"
            );
            continue;
        }
        assert_eq!(status, 409, "{method} {path}: {said}");
        let message = said["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("restore"), "{method} {path}: {message}");
    }
}

async fn a_restore_stops_every_member_then_restores_then_starts_one_at_a_time(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = booted_cluster(&app).await;
    let member = |i: usize| (&nodes[i].0, &nodes[i].1);
    let cluster = nodes[0].0.cluster;
    let (snapshot_id, snapshot) = stored(&app, cluster, member(0)).await;

    // Bad requests name what is wrong.
    let missing = start(&app, cluster, json!({})).await;
    assert_eq!(missing.status(), 400);
    assert_eq!(json_of(missing).await["error"]["field"], "snapshot_id");
    assert_eq!(
        start(&app, cluster, json!({"snapshot_id": 999_999}))
            .await
            .status(),
        404
    );
    assert_eq!(
        restore_view(&app, cluster).await["error"]["code"],
        "not_found"
    );

    // A changed object is refused before anything stops.
    let object = stored_object(
        &app._dir
            .path()
            .join(format!("snapshots/clusters/{cluster}/snapshots")),
        snapshot_id,
    );
    let sealed = std::fs::read(&object).unwrap();
    let mut changed = sealed.clone();
    let middle = changed.len() / 2;
    changed[middle] ^= 0x01;
    std::fs::write(&object, &changed).unwrap();
    let refused = start(&app, cluster, json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(refused.status(), 409);
    let said = json_of(refused).await;
    assert!(
        said["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not read back"),
        "{said}"
    );
    std::fs::write(&object, &sealed[..sealed.len() - 100]).unwrap();
    assert_eq!(
        start(&app, cluster, json!({"snapshot_id": snapshot_id}))
            .await
            .status(),
        409,
        "a truncated object too"
    );
    for i in 0..3 {
        assert_eq!(
            task(&app, member(i)).await,
            Value::Null,
            "nothing was stopped"
        );
    }
    assert_eq!(
        restore_view(&app, cluster).await["error"]["code"],
        "not_found"
    );
    assert!(
        console_page(&app, cluster)
            .await
            .contains("<p>Never restored.</p>")
    );
    std::fs::write(&object, &sealed).unwrap();

    // Started: every member stops first.
    let started = start(&app, cluster, json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(started.status(), 202);
    let started = json_of(started).await;
    let id = started["id"].as_i64().unwrap();
    assert_eq!(started["phase"], "stop");
    assert_eq!(started["members"].as_array().unwrap().len(), 3);
    assert!(
        started["bump_revision"].as_i64().unwrap() >= 1_000_000,
        "{started}"
    );
    others_refused(&app, cluster, snapshot_id).await;
    let mut names = Vec::new();
    for i in 0..3 {
        let told = task(&app, member(i)).await;
        assert_eq!(told["step"], "stop", "{told}");
        assert_eq!(told["id"], id);
        assert_eq!(told["sha256"], Sha256Digest::of(&snapshot).to_hex());
        assert_eq!(
            told["initial_cluster"].as_str().unwrap().split(',').count(),
            3,
            "{told}"
        );
        assert!(
            told["initial_cluster_token"]
                .as_str()
                .unwrap()
                .starts_with("exk8s-")
        );
        names.push(told["member_name"].as_str().unwrap().to_owned());
    }
    // Not yet to be fetched, and no step but the current one.
    let content = |i: usize| format!("/nodes/{}/snapshots/{snapshot_id}/content", nodes[i].0.vm);
    assert_eq!(
        signed(&app, member(0), "GET", &content(0), b"")
            .await
            .status(),
        404
    );
    assert_eq!(ack(&app, member(0), id, "restore", "").await, 409);
    assert_eq!(ack(&app, member(0), id, "stop", "").await, 204);
    assert_eq!(
        ack(&app, member(0), id, "stop", "").await,
        204,
        "a replay changes nothing"
    );
    assert_eq!(
        task(&app, member(0)).await,
        Value::Null,
        "member 0 waits for the others"
    );
    assert_eq!(ack(&app, member(1), id, "stop", "").await, 204);
    assert_eq!(restore_view(&app, cluster).await["phase"], "stop");
    // The cluster's console page shows it, each member where it is.
    let shown = console_page(&app, cluster).await;
    assert!(
        shown.contains(&format!(
            "Restore {id} of snapshot {snapshot_id}: <strong>stop</strong>"
        )),
        "{shown}"
    );
    for (i, state) in ["stopped", "stopped", "waiting"].iter().enumerate() {
        let row = format!("<th scope=\"row\">{}</th><td>{state}</td>", names[i]);
        assert!(shown.contains(&row), "{row} in {shown}");
    }
    assert_eq!(ack(&app, member(2), id, "stop", "").await, 204);

    // Another API process takes over on the same database: the journal says where it is.
    let replica = spawn_replica(&app, backend).await;
    drop(app);
    let app = replica;
    assert_eq!(restore_view(&app, cluster).await["phase"], "restore");
    for i in 0..3 {
        assert_eq!(task(&app, member(i)).await["step"], "restore");
        let fetched = signed(&app, member(i), "GET", &content(i), b"").await;
        assert_eq!(fetched.status(), 200);
        assert_eq!(
            fetched.bytes().await.unwrap().as_ref(),
            snapshot.as_slice(),
            "as etcd wrote it"
        );
    }
    let other_snapshot = format!(
        "/nodes/{}/snapshots/{}/content",
        nodes[0].0.vm,
        snapshot_id + 1
    );
    assert_eq!(
        signed(&app, member(0), "GET", &other_snapshot, b"")
            .await
            .status(),
        404
    );
    for i in 0..3 {
        assert_eq!(ack(&app, member(i), id, "restore", "").await, 204);
    }

    // Then the static pods come back one member at a time, in ordinal order.
    for i in 0..3 {
        assert_eq!(
            task(&app, member(i)).await["step"],
            "start",
            "member {i}'s turn"
        );
        for j in (i + 1)..3 {
            assert_eq!(task(&app, member(j)).await, Value::Null, "member {j} waits");
        }
        assert_eq!(ack(&app, member(i), id, "start", "").await, 204);
    }
    let done = restore_view(&app, cluster).await;
    assert_eq!(done["phase"], "done", "{done}");
    let states: Vec<&str> = done["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["started"; 3]);
    let mut listed: Vec<String> = done["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["member"].as_str().unwrap().to_owned())
        .collect();
    let told = names.clone();
    listed.sort();
    names.sort();
    assert_eq!(listed, names);
    for i in 0..3 {
        assert_eq!(task(&app, member(i)).await, Value::Null);
    }

    // A member that cannot do its step fails the restore, saying which and why.
    let again = json_of(start(&app, cluster, json!({"snapshot_id": snapshot_id})).await).await;
    let second = again["id"].as_i64().unwrap();
    assert_ne!(second, id);
    assert_ne!(
        task(&app, member(0)).await["initial_cluster_token"],
        json!(null),
    );
    assert_eq!(
        ack(
            &app,
            member(1),
            second,
            "stop",
            "etcd.service would not stop"
        )
        .await,
        204
    );
    let failed = restore_view(&app, cluster).await;
    assert_eq!(failed["phase"], "failed");
    let error = failed["error"].as_str().unwrap();
    assert_eq!(
        error,
        format!("{} could not stop: etcd.service would not stop", told[1]),
        "the member and its reason"
    );
    assert_eq!(task(&app, member(0)).await, Value::Null);
    let shown = console_page(&app, cluster).await;
    assert!(
        shown.contains(&format!(
            "Restore {second} of snapshot {snapshot_id}: <strong>failed</strong>"
        )) && shown.contains(&format!("<p class=\"message\">{error}</p>")),
        "{shown}"
    );
    // Each restore is on the cluster's event stream as it enters each phase, the failure with
    // why.
    let mut stream = crate::events::Stream::open(&app, cluster, None).await;
    let seen = stream
        .until(|e| e.kind == "restore" && e.data["phase"] == "failed")
        .await;
    let restores: Vec<(&str, &str)> = seen
        .iter()
        .filter(|e| e.kind == "restore")
        .map(|e| {
            assert_eq!(e.data["snapshot_id"], snapshot_id, "{e:?}");
            (
                e.data["phase"].as_str().unwrap(),
                e.data["message"].as_str().unwrap(),
            )
        })
        .collect();
    let (of_first, of_second) = (
        format!("restore {id} of snapshot {snapshot_id} of cluster {cluster}"),
        format!("restore {second} of snapshot {snapshot_id} of cluster {cluster}"),
    );
    let first = format!("restore {id}");
    assert_eq!(
        restores,
        [
            ("stop", of_first.as_str()),
            ("restore", first.as_str()),
            ("start", first.as_str()),
            ("done", first.as_str()),
            ("stop", of_second.as_str()),
            ("failed", error),
        ]
    );
    let failure = seen.last().unwrap();
    assert_eq!(failure.data["error_reason"], "RestoreFailed", "{failure:?}");
    // The cluster is free for other changes again.
    assert_eq!(
        app.post(&format!("/clusters/{cluster}/rollout"))
            .send()
            .await
            .unwrap()
            .status(),
        202
    );
}

both_backends!(a_restore_stops_every_member_then_restores_then_starts_one_at_a_time);

async fn replace_since(app: &TestApp, vm: i64) -> Option<i64> {
    use sqlx::Row as _;
    sqlx::query("SELECT replace_since FROM cluster_nodes WHERE vm_id = $1")
        .bind(vm)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap()
        .get::<Option<i64>, _>("replace_since")
}

async fn a_restore_leaves_out_a_member_whose_vm_is_gone_then_replaces_it(backend: Backend) {
    use exk8s_api::compute::Compute as _;
    let app = spawn_app(backend).await;
    let nodes = booted_cluster(&app).await;
    let member = |i: usize| (&nodes[i].0, &nodes[i].1);
    let cluster = nodes[0].0.cluster;
    let (snapshot_id, _) = stored(&app, cluster, member(0)).await;
    app.sims.compute.delete_vm(nodes[2].0.vm).await.unwrap();

    let started = json_of(start(&app, cluster, json!({"snapshot_id": snapshot_id})).await).await;
    let id = started["id"].as_i64().unwrap();
    assert_eq!(started["members"].as_array().unwrap().len(), 2, "{started}");
    assert_eq!(
        task(&app, member(2)).await,
        Value::Null,
        "the gone member is left out"
    );
    let told = task(&app, member(0)).await;
    assert_eq!(
        told["initial_cluster"].as_str().unwrap().split(',').count(),
        2,
        "{told}"
    );
    for step in ["stop", "restore"] {
        for i in 0..2 {
            assert_eq!(ack(&app, member(i), id, step, "").await, 204);
        }
    }
    assert_eq!(
        replace_since(&app, nodes[2].0.vm).await,
        None,
        "not before the restore ends"
    );
    for i in 0..2 {
        assert_eq!(ack(&app, member(i), id, "start", "").await, 204);
    }
    assert_eq!(restore_view(&app, cluster).await["phase"], "done");
    // The left-out member is replaced through the membership machinery.
    assert!(replace_since(&app, nodes[2].0.vm).await.is_some());

    // With no member's VM running, nothing can be restored in place.
    let others = booted_cluster(&app).await;
    let other = others[0].0.cluster;
    let (other_snapshot, _) = stored(&app, other, (&others[0].0, &others[0].1)).await;
    for (node, _) in &others {
        app.sims.compute.delete_vm(node.vm).await.unwrap();
    }
    let refused = start(&app, other, json!({"snapshot_id": other_snapshot})).await;
    assert_eq!(refused.status(), 409);
    let said = json_of(refused).await;
    assert!(
        said["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no control-plane member's VM runs"),
        "{said}"
    );
}

both_backends!(a_restore_leaves_out_a_member_whose_vm_is_gone_then_replaces_it);
