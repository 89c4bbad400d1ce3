//! The certificate inventory on SQLite and PostgreSQL, under an injected clock: what founding
//! and every bundle issued is recorded (checked against openssl reading the bundle's own
//! files), soonest expiry first, with the cluster's leaf lifetime; days left follow the clock;
//! a node's entries follow the generation it applied; the gauge reports the soonest expiry.

use std::collections::BTreeSet;
use std::sync::Arc;

use base64::Engine as _;
use exk8s_api::clock::ManualClock;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_clocked, test_config};
use crate::bootstrap::report;
use crate::helpers::openssl;
use crate::sync::{fetch_update, register, sync_report, update_payload};

async fn inventory(app: &TestApp, cluster: i64) -> Value {
    let response = app
        .http
        .get(format!("{}/clusters/{cluster}/certificates", app.url))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// Every certificate in a bundle — PEM files and kubeconfigs' client certificates — as
/// openssl reports its serial (normalised to lowercase hex with colons), CA files apart.
fn bundle_serials(payload: &exk8s_common::BundlePayload) -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = tempfile::tempdir().unwrap();
    let serial_of = |pem: &[u8]| {
        std::fs::write(dir.path().join("c.pem"), pem).unwrap();
        let (ok, out) = openssl(&["x509", "-noout", "-serial", "-in", "c.pem"], dir.path());
        assert!(ok, "{out}");
        let hex = out.trim().trim_start_matches("serial=").to_lowercase();
        let hex = if hex.len() % 2 == 1 {
            format!("0{hex}")
        } else {
            hex
        };
        hex.as_bytes()
            .chunks(2)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect::<Vec<_>>()
            .join(":")
    };
    let (mut cas, mut leaves) = (BTreeSet::new(), BTreeSet::new());
    for file in &payload.files {
        let path = file.path.as_str();
        let content = file.content.as_bytes();
        if path.ends_with(".kubeconfig") {
            let doc: yaml_serde::Value = yaml_serde::from_slice(content).unwrap();
            let data = doc["users"][0]["user"]["client-certificate-data"]
                .as_str()
                .unwrap();
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            leaves.insert(serial_of(&pem));
        } else if path.ends_with(".pem") && content.starts_with(b"-----BEGIN CERTIFICATE") {
            if path.ends_with("ca.pem") {
                cas.insert(serial_of(content));
            } else {
                leaves.insert(serial_of(content));
            }
        }
    }
    (cas, leaves)
}

fn serials(entries: &[&Value]) -> BTreeSet<String> {
    entries
        .iter()
        .map(|e| e["serial"].as_str().unwrap().to_owned())
        .collect()
}

fn of_vm(inventory: &Value, vm: Option<i64>) -> Vec<&Value> {
    inventory["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["vm_id"].as_i64() == vm)
        .collect()
}

async fn inventory_records_what_was_issued(backend: Backend) {
    let clock = Arc::new(ManualClock::starting_at(OffsetDateTime::now_utc()));
    let app = spawn_clocked(backend, test_config(), None, clock.clone()).await;
    let mut body = crate::app::valid_body(3);
    body["leaf_lifetime_days"] = json!(3);
    let created: Value = app
        .http
        .post(format!("{}/clusters", app.url))
        .header(crate::app::WAIT.0, crate::app::WAIT.1)
        .bearer_auth(&app.token)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();

    // Founding: the three CAs and the operator kubeconfig, nothing on a node yet.
    let founded = inventory(&app, cluster).await;
    let own = of_vm(&founded, None);
    let names: BTreeSet<&str> = own.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        BTreeSet::from([
            "cluster-ca",
            "etcd-ca",
            "front-proxy-ca",
            "operator.kubeconfig"
        ])
    );
    assert_eq!(founded["certificates"].as_array().unwrap().len(), 4);
    let operator = own
        .iter()
        .find(|e| e["name"] == "operator.kubeconfig")
        .unwrap();
    assert_eq!(
        operator["days_left"], 3,
        "the clock stands still: {operator}"
    );
    assert_eq!(founded["service_account_key_age_days"], 0);

    // Each node's first bundle: 14 leaves, exactly the certificates its files hold.
    let nodes = crate::bootstrap::credentials_for(&app, 7, &created).await;
    let mut keys = Vec::new();
    for (i, node) in nodes.iter().enumerate() {
        let key = NodeKey::generate().unwrap();
        let mut payload = register(&app, node, &key).await;
        if i == 0 {
            // A re-fetch of the same generation: its rows replace the first bundle's.
            payload = register(&app, node, &key).await;
            let rows: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM issued_certificates WHERE node_id = \
                 (SELECT id FROM cluster_nodes WHERE vm_id = $1)",
            )
            .bind(node.vm)
            .fetch_one(&app.state.db.pool)
            .await
            .unwrap();
            assert_eq!(rows, 14, "one bundle's rows per generation");
        }
        let now = inventory(&app, cluster).await;
        let (cas, leaves) = bundle_serials(&payload);
        let entries = of_vm(&now, Some(node.vm));
        assert_eq!(entries.len(), 14, "{now}");
        assert_eq!(serials(&entries), leaves, "vm {}", node.vm);
        let own = of_vm(&now, None);
        let ca_entries: Vec<&Value> = own.iter().copied().filter(|e| e["kind"] == "ca").collect();
        assert_eq!(serials(&ca_entries), cas);
        assert!(
            entries
                .iter()
                .all(|e| e["generation"] == 1 && e["days_left"] == 3)
        );
        assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
        keys.push(key);
    }
    let all = inventory(&app, cluster).await;
    let not_after: Vec<i64> = all["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["not_after"].as_i64().unwrap())
        .collect();
    assert!(
        not_after.windows(2).all(|w| w[0] <= w[1]),
        "not sorted soonest first"
    );
    assert_eq!(not_after.len(), 4 + 3 * 14);
    let metrics = app.metrics().await;
    // The nodes' gauge counts what nodes run; the operator's kubeconfig has a gauge of its own.
    let soonest_of = |operator: bool| {
        all["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| (e["name"] == "operator.kubeconfig") == operator)
            .map(|e| e["not_after"].as_i64().unwrap())
            .min()
            .unwrap()
    };
    for (gauge, value) in [
        ("certificate_soonest_expiry", soonest_of(false)),
        ("operator_credential_soonest_expiry", soonest_of(true)),
    ] {
        let line =
            format!("exk8s_cluster_{gauge}_timestamp_seconds{{cluster_id=\"{cluster}\"}} {value}");
        assert!(metrics.contains(&line), "no {line} in {metrics}");
    }

    // Days left follow the clock.
    clock.advance(Duration::days(1));
    let later = inventory(&app, cluster).await;
    assert!(
        of_vm(&later, Some(nodes[0].vm))
            .iter()
            .all(|e| e["days_left"] == 2)
    );

    // A re-minted operator kubeconfig replaces the recorded one.
    let kubeconfig = app
        .http
        .get(format!("{}/clusters/{cluster}/kubeconfig", app.url))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let reminted = inventory(&app, cluster).await;
    let operators: Vec<&Value> = of_vm(&reminted, None)
        .into_iter()
        .filter(|e| e["name"] == "operator.kubeconfig")
        .collect();
    assert_eq!(operators.len(), 1);
    assert_ne!(operators[0]["serial"], operator["serial"]);
    assert_eq!(
        operators[0]["days_left"], 3,
        "the same lifetime from the clock's now"
    );

    // The cluster says its certificates are available, and that they expire soon.
    let condition = |view: &Value| {
        view["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "CertificatesAvailable")
            .cloned()
            .unwrap()
    };
    let view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let available = condition(&view);
    assert_eq!(available["status"], "True", "{available}");
    assert_eq!(
        available["reason"], "CertificatesExpiringSoon",
        "{available}"
    );
    // The view reads its certificates packed, the inventory row by row: both name the same
    // soonest one (42 leaves share its expiry; the VM, then the name, break the tie).
    let soonest = reminted["certificates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] != "operator.kubeconfig")
        .unwrap();
    assert_eq!(
        available["message"],
        format!(
            "{} of vm {} expires in {} day(s) and its renewal has not succeeded yet",
            soonest["name"].as_str().unwrap(),
            soonest["vm_id"],
            soonest["days_left"]
        ),
        "{soonest}"
    );

    // A rollout: the node's entries follow the generation it applied.
    let started = app
        .http
        .post(format!("{}/clusters/{cluster}/rollout", app.url))
        .bearer_auth(&app.token)
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let (node, key) = (&nodes[0], &keys[0]);
    let payload = update_payload(&app, fetch_update(&app, node, key).await).await;
    let handed = inventory(&app, cluster).await;
    assert!(
        of_vm(&handed, Some(node.vm))
            .iter()
            .all(|e| e["generation"] == 1),
        "the node still runs generation 1"
    );
    sync_report(&app, node, key, "succeeded", 2).await;
    let applied = inventory(&app, cluster).await;
    let entries = of_vm(&applied, Some(node.vm));
    assert_eq!(entries.len(), 14);
    assert!(entries.iter().all(|e| e["generation"] == 2));
    assert_eq!(serials(&entries), bundle_serials(&payload).1);

    // Nothing renews them here (no reconciler runs): three days on, they have expired.
    clock.advance(Duration::days(3));
    let view = json_of(
        app.get(&format!("/clusters/{cluster}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let expired = condition(&view);
    assert_eq!(expired["status"], "False", "{expired}");
    assert_eq!(expired["reason"], "CertificatesExpired", "{expired}");
}

both_backends!(inventory_records_what_was_issued);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaf_lifetime_out_of_range_is_refused_naming_the_field() {
    let app = crate::app::spawn_app(Backend::Sqlite).await;
    for days in [0, -1, 3651] {
        let response = app.found(1, json!({"leaf_lifetime_days": days})).await;
        let status = response.status();
        let said: Value = response.json().await.unwrap();
        assert_eq!(status, 400, "{days}: {said}");
        assert_eq!(said["error"]["field"], "leaf_lifetime_days", "{said}");
    }
}

/// The packed read that pages of views and renewal passes judge certificates from gives each
/// cluster's rows as the row-by-row read does: every row, in recording (id) order — which
/// `certificates::current` relies on when a later row of a name replaces an earlier one.
/// Rows are recorded against the index's order (a later generation first, a name twice), so a
/// read in index order would differ.
async fn packed_certificates_read_as_rows_in_id_order(backend: Backend) {
    use exk8s_api::db::{self, certificates::CertKind, certificates::NewCert, pages::Clusters};
    use exk8s_api::pki::CertFacts;

    let app = crate::app::spawn_app(backend).await;
    let founded = json_of(app.found(1, json!({})).await).await;
    let cluster = founded["cluster_id"].as_i64().unwrap();
    let node = db::nodes::list(&app.state.db.pool, cluster).await.unwrap()[0].id;
    let facts = |n: i64| CertFacts {
        subject: format!("CN=s{n}"),
        issuer: "CN=i".into(),
        serial: format!("{n:02x}"),
        not_before: 1_000 + n,
        not_after: 9_000 - n,
    };
    let all = [facts(1), facts(2), facts(3), facts(4), facts(5)];
    let record = |i: usize, generation: i64, name: &'static str| NewCert {
        cluster_id: cluster,
        node_id: Some(node),
        generation,
        name,
        kind: CertKind::Client,
        facts: &all[i],
    };
    let mut conn = app.state.db.pool.acquire().await.unwrap();
    for batch in [
        vec![
            record(0, 9, "kubelet.pem"),
            record(1, 9, "admin.kubeconfig"),
        ],
        vec![record(2, 8, "kubelet.pem")],
        vec![
            record(3, 9, "kubelet.pem"),
            record(4, 8, "a name with spaces"),
        ],
    ] {
        db::certificates::insert(&mut conn, &batch, 50)
            .await
            .unwrap();
    }
    drop(conn);

    let by_row: Vec<_> = db::certificates::list(&app.state.db.pool, cluster)
        .await
        .unwrap()
        .into_iter()
        .map(|row| db::certificates::CertRow {
            details: None,
            ..row
        })
        .collect();
    let mine: Vec<_> = by_row.iter().filter(|r| r.node_id == Some(node)).collect();
    let order: Vec<_> = mine.iter().map(|r| (r.generation, &*r.name)).collect();
    assert_eq!(
        order,
        [
            (9, "kubelet.pem"),
            (9, "admin.kubeconfig"),
            (8, "kubelet.pem"),
            (9, "kubelet.pem"),
            (8, "a name with spaces"),
        ]
    );
    for clusters in [
        Clusters::Ids(vec![cluster].into()),
        Clusters::Span {
            org_id: Some(7),
            first: cluster,
            last: cluster,
        },
    ] {
        let mut packed = db::pages::certificates(&app.state.db.pool, &clusters)
            .await
            .unwrap();
        let read = packed.remove(&cluster).unwrap();
        assert_eq!(read.rows, by_row, "{clusters:?}");
        let nodes = db::nodes::list(&app.state.db.pool, cluster).await.unwrap();
        let version = db::clusters::get_by_id(&app.state.db.pool, cluster)
            .await
            .unwrap()
            .unwrap()
            .certificates_version;
        assert_eq!(
            version, 1,
            "founding recorded the cluster's own certificates once"
        );
        assert_eq!(read.stamp, db::certificates::Stamp::of(version, &nodes));
        assert!(packed.is_empty(), "{packed:?}");
    }
}

both_backends!(packed_certificates_read_as_rows_in_id_order);
