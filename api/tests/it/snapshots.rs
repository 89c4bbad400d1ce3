//! etcd snapshots on SQLite and PostgreSQL, the members played by the test: a snapshot asked of
//! the oldest healthy voter (one at a time), named in that node's generation answer only; its
//! upload refused from another node, when the body is not what was signed, or when it is not an
//! etcd snapshot (no trailing checksum) — each failing the snapshot with the reason; a good one
//! stored sealed (the store never holds the plaintext), read back exactly, refused once its
//! object is tampered with, deleted with its object; a member that never uploads fails its
//! snapshot at the deadline (an injected clock); a member that cannot take it says why.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api::clock::Clock as _;
use exk8s_common::names::Sha256Digest;
use exk8s_common::node_auth::{NodeKey, request_message_for_digest};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::app::{Backend, Node, TestApp, both_backends, json_of, spawn_clocked, test_config};
use crate::sync::{booted_cluster, nonce};

/// `PUT /nodes/{vm}/snapshots/{id}` by `node`, signed over `declared` (the body's digest unless
/// a test lies), with `failure` as the member's reason when given.
pub(crate) async fn put(
    app: &TestApp,
    (node, key): (&Node, &NodeKey),
    id: i64,
    body: &[u8],
    declared: Option<Sha256Digest>,
    failure: Option<&str>,
) -> reqwest::Response {
    let path = format!("/nodes/{}/snapshots/{id}", node.vm);
    let digest = declared.unwrap_or_else(|| Sha256Digest::of(body));
    let (timestamp, nonce) = (exk8s_api::db::now(), nonce());
    let signature = key.sign(&request_message_for_digest(
        "PUT", &path, timestamp, &nonce, &digest,
    ));
    let mut request = app
        .http
        .put(format!("{}{path}", app.url))
        .header("X-exc-imds-token", &node.imds)
        .header("X-Exk8s-Nonce", nonce)
        .header("X-Exk8s-Timestamp", timestamp.to_string())
        .header("X-Exk8s-Signature", signature)
        .header("X-Exk8s-Content-Sha256", digest.to_hex())
        .header("X-Exk8s-Etcd-Revision", "1234")
        .header("X-Exk8s-Etcd-Version", "3.6.14")
        .body(body.to_vec());
    if let Some(failure) = failure {
        request = request.header("X-Exk8s-Snapshot-Failure", failure);
    }
    request.send().await.unwrap()
}

/// The generation answer's snapshot task for `node`.
pub(crate) async fn task_of(app: &TestApp, (node, key): (&Node, &NodeKey)) -> Value {
    let path = format!("/nodes/{}/generation", node.vm);
    let (timestamp, nonce) = (exk8s_api::db::now(), nonce());
    let signature = key.sign(&exk8s_common::node_auth::request_message(
        "GET", &path, timestamp, &nonce, b"",
    ));
    let answer = app
        .http
        .get(format!("{}{path}", app.url))
        .header("X-exc-imds-token", &node.imds)
        .header("X-Exk8s-Nonce", nonce)
        .header("X-Exk8s-Timestamp", timestamp.to_string())
        .header("X-Exk8s-Signature", signature)
        .send()
        .await
        .unwrap();
    json_of(answer).await["snapshot"].clone()
}

/// The one object of snapshot `id` in `dir` (`<id>-<upload>`).
pub(crate) fn stored_object(dir: &std::path::Path, id: i64) -> std::path::PathBuf {
    let objects: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{id}-")))
        })
        .collect();
    assert_eq!(objects.len(), 1, "{objects:?}");
    objects[0].clone()
}

/// A body shaped as etcd streams a snapshot: pages, then the SHA-256 of them.
pub(crate) fn etcd_snapshot(pages: usize) -> Vec<u8> {
    let mut body: Vec<u8> = (0..pages * 4096)
        .map(|i| u8::try_from(i % 251).unwrap())
        .collect();
    body.extend_from_slice(b"the-secret-marker");
    let checksum = Sha256::digest(&body);
    body.extend_from_slice(&checksum);
    body
}

pub(crate) async fn ask(app: &TestApp, cluster: i64) -> Value {
    let asked = app
        .post(&format!("/clusters/{cluster}/snapshots"))
        .send()
        .await
        .unwrap();
    assert_eq!(asked.status(), 202);
    json_of(asked).await
}

pub(crate) async fn one(app: &TestApp, cluster: i64, id: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}/snapshots/{id}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn a_snapshot_is_taken_by_a_voter_stored_sealed_and_read_back(backend: Backend) {
    let clock = Arc::new(exk8s_api::clock::ManualClock::starting_at(
        time::OffsetDateTime::now_utc(),
    ));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = booted_cluster(&app).await;
    let member = |i: usize| (&nodes[i].0, &nodes[i].1);
    let cluster = nodes[0].0.cluster;
    let path = format!("/clusters/{cluster}/snapshots");

    let asked = ask(&app, cluster).await;
    let id = asked["id"].as_i64().unwrap();
    let mut ids = vec![id];
    assert_eq!(asked["state"], "requested");
    assert_eq!(asked["trigger"], "operator");
    let again = app.post(&path).send().await.unwrap();
    assert_eq!(again.status(), 409);
    let said = json_of(again).await["error"]["message"].clone();
    assert!(
        said.as_str()
            .unwrap()
            .contains(&format!("snapshot {id} is being taken")),
        "{said}"
    );
    // Only the member asked sees the task, and only it may upload.
    assert_eq!(task_of(&app, member(0)).await["id"], id);
    assert_eq!(task_of(&app, member(1)).await, Value::Null);
    let snapshot = etcd_snapshot(600);
    // (Refused before its body is read: a short body, all sent before the answer comes.)
    let declared = Some(Sha256Digest::of(&snapshot));
    assert_eq!(
        put(&app, member(1), id, &snapshot[..100], declared, None)
            .await
            .status(),
        404
    );

    // A body that is not what was signed: refused, and the snapshot fails saying so.
    let lying = put(
        &app,
        member(0),
        id,
        &snapshot,
        Some(Sha256Digest::of(b"x")),
        None,
    )
    .await;
    assert_eq!(lying.status(), 422);
    let failed = one(&app, cluster, id).await;
    assert_eq!(failed["state"], "failed");
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("signature declared"),
        "{failed}"
    );
    assert_eq!(task_of(&app, member(0)).await, Value::Null);

    // A body without etcd's checksum.
    let id = ask(&app, cluster).await["id"].as_i64().unwrap();
    ids.push(id);
    let not_etcd = &snapshot[..snapshot.len() - 1];
    assert_eq!(
        put(&app, member(0), id, not_etcd, None, None)
            .await
            .status(),
        422
    );
    let failed = one(&app, cluster, id).await;
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("not an etcd snapshot"),
        "{failed}"
    );

    // A good one: stored sealed, read back as it was.
    let id = ask(&app, cluster).await["id"].as_i64().unwrap();
    ids.push(id);
    assert_eq!(
        put(&app, member(0), id, &snapshot, None, None)
            .await
            .status(),
        204
    );
    let stored = one(&app, cluster, id).await;
    assert_eq!(stored["state"], "stored", "{stored}");
    assert_eq!(stored["size_bytes"], snapshot.len());
    assert_eq!(stored["sha256"], Sha256Digest::of(&snapshot).to_hex());
    assert_eq!(
        (&stored["revision"], &stored["etcd_version"]),
        (&json!(1234), &json!("3.6.14"))
    );
    assert_eq!(stored["ca_sha256"].as_str().unwrap().len(), 64);
    let object = stored_object(
        &app._dir
            .path()
            .join(format!("snapshots/clusters/{cluster}/snapshots")),
        id,
    );
    let sealed = std::fs::read(&object).unwrap();
    assert!(sealed.starts_with(exk8s_api::snapshots::cipher::MAGIC));
    assert!(
        !sealed.windows(17).any(|w| w == b"the-secret-marker"),
        "the store holds only ciphertext"
    );
    let content = app
        .get(&format!("{path}/{id}/content"))
        .send()
        .await
        .unwrap();
    assert_eq!(content.status(), 200);
    assert_eq!(content.bytes().await.unwrap().as_ref(), snapshot.as_slice());
    assert_eq!(
        put(&app, member(0), id, &snapshot, None, None)
            .await
            .status(),
        404,
        "taken once"
    );

    // A tampered object does not come back as a snapshot.
    let mut tampered = sealed.clone();
    let at = tampered.len() / 2;
    tampered[at] ^= 1;
    std::fs::write(&object, &tampered).unwrap();
    let broken = app.get(&format!("{path}/{id}/content")).send().await;
    // Whether the error comes before the answer's head or within its body.
    let read = match broken {
        Ok(answer) => answer.bytes().await.map(|b| b.len()),
        Err(e) => Err(e),
    };
    assert!(
        read.is_err(),
        "a tampered object is never read whole: {read:?}"
    );
    std::fs::write(&object, &sealed).unwrap();

    let deleted = app.delete(&format!("{path}/{id}")).send().await.unwrap();
    assert_eq!(deleted.status(), 204);
    assert!(!object.exists());
    let gone = app.get(&format!("{path}/{id}")).send().await.unwrap();
    assert_eq!(gone.status(), 404);

    // A member that never uploads: failed at the deadline, and no longer asked.
    let id = ask(&app, cluster).await["id"].as_i64().unwrap();
    ids.push(id);
    clock.advance(time::Duration::seconds(
        exk8s_api::snapshots::UPLOAD_WINDOW_SECS + 1,
    ));
    let listed = json_of(app.get(&path).send().await.unwrap()).await;
    let expired = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap();
    assert_eq!(expired["state"], "failed");
    assert!(
        expired["error"].as_str().unwrap().contains("deadline"),
        "{expired}"
    );
    assert_eq!(task_of(&app, member(0)).await, Value::Null);

    // A member that cannot take it says why.
    let id = ask(&app, cluster).await["id"].as_i64().unwrap();
    ids.push(id);
    let cannot = put(
        &app,
        member(0),
        id,
        b"",
        None,
        Some("etcd snapshot at https://127.0.0.1:2379: connection refused"),
    )
    .await;
    assert_eq!(cannot.status(), 204);
    let failed = one(&app, cluster, id).await;
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .contains("connection refused"),
        "{failed}"
    );

    // Each snapshot is on the cluster's event stream when asked for and when it ended, with
    // the member asked, what was stored or why it failed.
    let mut stream = crate::events::Stream::open(&app, cluster, None).await;
    let seen = stream
        .until(|e| {
            e.kind == "snapshot" && e.data["snapshot_id"] == id && e.data["phase"] != "requested"
        })
        .await;
    let snapshots: Vec<(i64, &str)> = seen
        .iter()
        .filter(|e| e.kind == "snapshot")
        .map(|e| {
            (
                e.data["snapshot_id"].as_i64().unwrap(),
                e.data["phase"].as_str().unwrap(),
            )
        })
        .collect();
    let ended = ["failed", "failed", "stored", "failed", "failed"];
    let expected: Vec<(i64, &str)> = ids
        .iter()
        .zip(ended)
        .flat_map(|(id, end)| [(*id, "requested"), (*id, end)])
        .collect();
    assert_eq!(snapshots, expected);
    let of = |id: i64, phase: &str| {
        seen.iter()
            .find(|e| {
                e.kind == "snapshot" && e.data["snapshot_id"] == id && e.data["phase"] == phase
            })
            .unwrap()
            .data
            .clone()
    };
    let asked = of(ids[0], "requested");
    assert_eq!(asked["vm_id"], nodes[0].0.vm, "{asked}");
    assert!(
        asked["message"].as_str().unwrap().contains("(operator)"),
        "{asked}"
    );
    let stored = of(ids[2], "stored");
    assert_eq!(
        stored["message"],
        format!("revision 1234, {} bytes, etcd 3.6.14", snapshot.len()),
        "{stored}"
    );
    let expired = of(ids[3], "failed");
    assert_eq!(expired["error_reason"], "SnapshotFailed", "{expired}");
    assert!(
        expired["message"].as_str().unwrap().contains("deadline"),
        "{expired}"
    );
    assert_eq!(
        expired["at"],
        clock.unix(),
        "the deadline's failure is dated by the clock"
    );
    let refused = of(ids[4], "failed");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("connection refused"),
        "{refused}"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
}

async fn a_cluster_without_a_healthy_voter_cannot_be_snapshotted(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let nodes = crate::app::cluster_with_credentials(&app, 7, 1).await;
    let cluster = nodes[0].cluster;
    let refused = app
        .post(&format!("/clusters/{cluster}/snapshots"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 409);
    let said = json_of(refused).await["error"]["message"].clone();
    assert!(said.as_str().unwrap().contains("no etcd voter"), "{said}");
    let missing = app.post("/clusters/999/snapshots").send().await.unwrap();
    assert_eq!(missing.status(), 404);
}

both_backends!(a_snapshot_is_taken_by_a_voter_stored_sealed_and_read_back);
both_backends!(a_cluster_without_a_healthy_voter_cannot_be_snapshotted);
both_backends!(the_schedule_takes_one_every_interval_and_keeps_the_retention);

fn condition(view: &Value) -> Value {
    view["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "SnapshotsUpToDate")
        .unwrap()
        .clone()
}

/// Ten injected days, an hour at a time, the reconciler's pass at each: a snapshot every 12
/// hours, each uploaded by the member asked; the newest 5 kept (objects of the others
/// deleted); then the member stops answering and the condition says the schedule was missed.
async fn the_schedule_takes_one_every_interval_and_keeps_the_retention(backend: Backend) {
    let clock = Arc::new(exk8s_api::clock::ManualClock::starting_at(
        time::OffsetDateTime::now_utc(),
    ));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let nodes = booted_cluster(&app).await;
    let member = (&nodes[0].0, &nodes[0].1);
    let cluster = nodes[0].0.cluster;
    let schedule = format!("/clusters/{cluster}/snapshots/schedule");
    let default = json_of(app.get(&schedule).send().await.unwrap()).await;
    assert_eq!(default, json!({"every_hours": 12, "retain": 14}));
    for bad in [
        json!({"every_hours": -1, "retain": 5}),
        json!({"every_hours": 12, "retain": 0}),
    ] {
        let refused = app.put(&schedule).json(&bad).send().await.unwrap();
        assert_eq!(refused.status(), 422, "{bad}");
    }
    let set = app
        .put(&schedule)
        .json(&json!({"every_hours": 12, "retain": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(set).await, json!({"every_hours": 12, "retain": 5}));
    let view = || async {
        json_of(
            app.get(&format!("/clusters/{cluster}"))
                .send()
                .await
                .unwrap(),
        )
        .await
    };
    assert_eq!(condition(&view().await)["reason"], "NotYetTaken");

    let ctx = app.state.snapshots();
    let snapshot = etcd_snapshot(4);
    let mut taken = 0;
    for _ in 0..240 {
        clock.advance(time::Duration::hours(1));
        exk8s_api::snapshots::schedule::pass(&ctx).await;
        let task = task_of(&app, member).await;
        if let Some(id) = task["id"].as_i64() {
            assert_eq!(
                put(&app, member, id, &snapshot, None, None).await.status(),
                204
            );
            taken += 1;
        }
    }
    exk8s_api::snapshots::schedule::pass(&ctx).await;
    assert_eq!(taken, 20, "one every 12 hours for 10 days");
    let listed = json_of(
        app.get(&format!("/clusters/{cluster}/snapshots"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let stored: Vec<i64> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "stored")
        .map(|s| s["id"].as_i64().unwrap())
        .collect();
    assert_eq!(stored, [20, 19, 18, 17, 16], "the newest 5 are kept");
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["trigger"] == "schedule")
    );
    let objects = std::fs::read_dir(
        app._dir
            .path()
            .join(format!("snapshots/clusters/{cluster}/snapshots")),
    )
    .unwrap()
    .count();
    assert_eq!(objects, 5, "the others' objects are deleted");
    let kept = condition(&view().await);
    assert_eq!(
        (&kept["status"], &kept["reason"]),
        (&json!("True"), &json!("Taken")),
        "{kept}"
    );

    // The member stops answering: the next one is asked, never uploaded, and the schedule is
    // missed once its window is past.
    for _ in 0..12 {
        clock.advance(time::Duration::hours(1));
        exk8s_api::snapshots::schedule::pass(&ctx).await;
    }
    assert_eq!(
        condition(&view().await)["status"],
        "True",
        "still within its window"
    );
    clock.advance(time::Duration::seconds(
        exk8s_api::snapshots::UPLOAD_WINDOW_SECS + 1,
    ));
    let missed = condition(&view().await);
    assert_eq!(
        (&missed["status"], &missed["reason"]),
        (&json!("False"), &json!("ScheduleMissed")),
        "{missed}"
    );
    assert!(
        missed["message"]
            .as_str()
            .unwrap()
            .contains("snapshot 20 was stored"),
        "{missed}"
    );
    assert!(
        missed["message"]
            .as_str()
            .unwrap()
            .contains("did not upload it before its deadline"),
        "{missed}"
    );
}
