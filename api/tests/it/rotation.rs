//! CA rotation on SQLite and PostgreSQL, with the nodes' syncs played by the test: the cluster
//! CA rotates through trust-both (trust files carry old and new, the old CA still signs),
//! sign-new (the new CA signs every leaf and serving certificate, the old is still trusted) and
//! drop-old (only the new is trusted), each phase moving on only once every node applied it;
//! one rotation at a time; bad requests name the field.

use exk8s_common::BundlePayload;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::bootstrap::{Node, credentials_for, report};
use crate::helpers::openssl_verify;
use crate::sync::{fetch_update, register, sync_report, update_payload};

fn file(payload: &BundlePayload, path: &str) -> Vec<u8> {
    payload.file(path).unwrap().content.as_bytes().to_vec()
}

fn certificates_in(pem: &[u8]) -> usize {
    String::from_utf8_lossy(pem)
        .matches("-----BEGIN CERTIFICATE-----")
        .count()
}

pub(crate) async fn rotate(app: &TestApp, cluster: i64, body: Value) -> reqwest::Response {
    app.post(&format!("/clusters/{cluster}/certificates/rotate-ca"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

pub(crate) async fn phase(app: &TestApp, cluster: i64) -> Option<String> {
    let view = cluster_view(app, cluster).await;
    view["ca_rotation"]["phase"].as_str().map(str::to_owned)
}

/// A founded 3-node cluster whose nodes registered their keys and booted: the cluster, its
/// nodes with their keys, and the first node's bundle.
pub(crate) async fn booted(app: &TestApp) -> (i64, Vec<(Node, NodeKey)>, BundlePayload) {
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut nodes = Vec::new();
    let mut first = None;
    for node in credentials_for(app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        first.get_or_insert(register(app, &node, &key).await);
        assert_eq!(report(app, &node, "complete", "succeeded").await, 204);
        nodes.push((node, key));
    }
    (cluster, nodes, first.unwrap())
}

/// `GET /clusters/{id}` as JSON.
async fn cluster_view(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Every node syncs once; the payloads, in node order.
pub(crate) async fn every_node_syncs(
    app: &TestApp,
    nodes: &[(Node, NodeKey)],
) -> Vec<BundlePayload> {
    let mut payloads = Vec::new();
    for (node, key) in nodes {
        let payload = update_payload(app, fetch_update(app, node, key).await).await;
        sync_report(app, node, key, "succeeded", payload.identity.generation).await;
        payloads.push(payload);
    }
    payloads
}

async fn the_cluster_ca_rotates_in_three_phases(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, nodes, first) = booted(&app).await;
    let old_ca = file(&first, "/etc/exk8s/pki/ca.pem");
    let etcd_ca = file(&first, "/etc/exk8s/pki/etcd-ca.pem");

    for (body, why) in [(json!({}), "required"), (json!({"ca": "nope"}), "must be")] {
        let response = rotate(&app, cluster, body).await;
        assert_eq!(response.status(), 400);
        let said = json_of(response).await;
        assert_eq!(said["error"]["field"], "ca", "{said}");
        assert!(said.to_string().contains(why), "{said}");
    }
    assert_eq!(
        rotate(&app, 999_999, json!({"ca": "cluster"}))
            .await
            .status(),
        404
    );
    let started = rotate(&app, cluster, json!({"ca": "cluster"})).await;
    assert_eq!(started.status(), 202);
    let started = json_of(started).await;
    assert_eq!(started["phase"], "trust-both", "{started}");
    let again = rotate(&app, cluster, json!({"ca": "etcd"})).await;
    assert_eq!(again.status(), 409, "one rotation at a time");
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("trust-both"));

    // trust-both: old and new CA trusted; the old one still signs.
    let trust_both = every_node_syncs(&app, &nodes).await;
    let bundle = file(&trust_both[0], "/etc/exk8s/pki/ca.pem");
    assert_eq!(certificates_in(&bundle), 2);
    assert!(bundle.starts_with(&old_ca));
    let new_ca = bundle[old_ca.len()..].to_vec();
    for payload in &trust_both {
        let (ok, out) = openssl_verify(
            &old_ca,
            &file(payload, "/etc/exk8s/pki/apiserver.pem"),
            None,
        );
        assert!(ok, "trust-both still signs with the old CA: {out}");
    }
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("sign-new"));

    // sign-new: every cluster-CA leaf and serving certificate under the new CA; both trusted.
    let sign_new = every_node_syncs(&app, &nodes).await;
    for payload in &sign_new {
        let bundle = file(payload, "/etc/exk8s/pki/ca.pem");
        assert_eq!(certificates_in(&bundle), 2);
        assert!(bundle.starts_with(&new_ca), "the signing CA first");
        for leaf in ["/etc/exk8s/pki/apiserver.pem", "/etc/exk8s/pki/kubelet.pem"] {
            let pem = file(payload, leaf);
            assert!(
                openssl_verify(&new_ca, &pem, None).0,
                "{leaf} is not under the new CA"
            );
            assert!(
                !openssl_verify(&old_ca, &pem, None).0,
                "{leaf} is still under the old CA"
            );
        }
        // Another CA is not touched.
        assert_eq!(file(payload, "/etc/exk8s/pki/etcd-ca.pem"), etcd_ca);
        let (ok, out) = openssl_verify(
            &etcd_ca,
            &file(payload, "/etc/exk8s/pki/etcd-server.pem"),
            None,
        );
        assert!(ok, "{out}");
    }
    assert_eq!(phase(&app, cluster).await.as_deref(), Some("drop-old"));

    // drop-old: only the new CA is trusted; the rotation ends.
    let drop_old = every_node_syncs(&app, &nodes).await;
    for payload in &drop_old {
        assert_eq!(file(payload, "/etc/exk8s/pki/ca.pem"), new_ca);
    }
    assert_eq!(phase(&app, cluster).await, None);
    let inventory = json_of(
        app.get(&format!("/clusters/{cluster}/certificates"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let ca = inventory["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "cluster-ca")
        .unwrap();
    let pem = String::from_utf8(new_ca.clone()).unwrap();
    let facts = exk8s_api::pki::facts(&pem).unwrap();
    assert_eq!(ca["serial"], facts.serial, "the inventory shows the new CA");
    // A next rotation may start.
    assert_eq!(
        rotate(&app, cluster, json!({"ca": "etcd"})).await.status(),
        202
    );

    // The certificates' timeline keeps what was: the rotation that ended with when each of
    // its phases began, the CA it replaced, and each node's earlier generations.
    let (cookie, _) =
        crate::console::session(&crate::console::login(&app, &app.token, Some(&app.url)).await);
    let timeline = crate::console::page(
        &app,
        &format!("/ui/clusters/{cluster}/certificates"),
        &cookie,
    )
    .await
    .text()
    .await
    .unwrap();
    let ended = timeline
        .split("<caption>CA rotations that ended, newest first</caption>")
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("no ended rotations: {timeline}"));
    assert_eq!(
        ended.matches("<tr>").count(),
        2,
        "the heading and one rotation: {ended}"
    );
    assert!(ended.contains("<th scope=\"row\">cluster</th>"), "{ended}");
    assert_eq!(
        ended.matches("<time datetime=").count(),
        4,
        "four phases' times: {ended}"
    );
    assert!(
        timeline.contains("The etcd CA is being rotated"),
        "{timeline}"
    );
    let ca_row = timeline
        .split("<tr")
        .find(|row| row.contains("<th scope=\"row\">cluster-ca</th>"))
        .unwrap();
    assert_eq!(
        ca_row.matches("class=\"earlier\"").count(),
        1,
        "the CA the rotation replaced: {ca_row}"
    );
    // Each node synced three times: its apiserver certificate has three earlier generations.
    let apiserver_rows: Vec<&str> = timeline
        .split("<tr")
        .filter(|row| row.contains("<th scope=\"row\">apiserver</th>"))
        .collect();
    assert_eq!(apiserver_rows.len(), nodes.len(), "{timeline}");
    for row in apiserver_rows {
        assert_eq!(row.matches("class=\"earlier\"").count(), 3, "{row}");
        assert!(
            row.contains("generation 1: ") && row.contains("generation 3: "),
            "{row}"
        );
    }
}

both_backends!(the_cluster_ca_rotates_in_three_phases);

/// A worker whose VM never boots (it never took a bundle) does not hold a rotation: while the
/// control plane has not applied a phase, the `CARotating` condition and `ca_rotation` name the
/// node waited for; every phase then moves on with only the nodes that took bundles, and the
/// worker's first bundle, when it finally boots, trusts only the new CA.
async fn a_worker_that_never_boots_does_not_hold_a_rotation(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, nodes, _) = booted(&app).await;
    let worker = crate::workers::record_worker(&app, cluster).await;
    let started = rotate(&app, cluster, json!({"ca": "cluster"})).await;
    assert_eq!(started.status(), 202);

    let view = cluster_view(&app, cluster).await;
    let rotating = crate::membership::condition(&view, "CARotating");
    assert_eq!(rotating["status"], "True", "{rotating}");
    assert_eq!(rotating["reason"], "WaitingForNode", "{rotating}");
    let waiting = view["ca_rotation"]["waiting_for"].as_str().unwrap();
    assert!(
        waiting.contains(&format!("vm {}", nodes[0].0.vm)),
        "waits for the first control-plane node: {waiting}"
    );
    assert!(
        rotating["message"].as_str().unwrap().contains(waiting),
        "{rotating}"
    );

    for expected in ["sign-new", "drop-old"] {
        every_node_syncs(&app, &nodes).await;
        assert_eq!(phase(&app, cluster).await.as_deref(), Some(expected));
    }
    let last = every_node_syncs(&app, &nodes).await;
    assert_eq!(phase(&app, cluster).await, None, "the rotation finished");
    let view = cluster_view(&app, cluster).await;
    assert_eq!(
        crate::membership::condition(&view, "CARotating")["status"],
        "False"
    );

    // The worker boots at last: its first bundle trusts the new CA alone.
    let key = NodeKey::generate().unwrap();
    let bundle = register(&app, &worker, &key).await;
    assert_eq!(
        file(&bundle, "/etc/exk8s/pki/ca.pem"),
        file(&last[0], "/etc/exk8s/pki/ca.pem")
    );
    assert_eq!(certificates_in(&file(&bundle, "/etc/exk8s/pki/ca.pem")), 1);

    // The front-proxy CA, by the name `certificate_authorities` uses, is stored and shown so.
    let started = rotate(&app, cluster, json!({"ca": "front_proxy"})).await;
    assert_eq!(started.status(), 202);
    let view = cluster_view(&app, cluster).await;
    assert_eq!(view["ca_rotation"]["ca"], "front_proxy");
}

both_backends!(a_worker_that_never_boots_does_not_hold_a_rotation);
