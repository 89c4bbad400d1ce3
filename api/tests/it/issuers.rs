//! The issuer cache on SQLite and PostgreSQL: a cluster's opened trust is reused until any
//! stored trust column changes (then opened again, never served stale), it holds at most its
//! capacity, and its `Debug` shows counts, never key material. The rotation tests prove the
//! same through the API: after a CA rotation every bundle is signed by the new CA.

use std::num::NonZeroUsize;
use std::sync::Arc;

use exk8s_api::db;
use exk8s_api::records::issuers::IssuerCache;
use serde_json::json;

use crate::app::{Backend, both_backends, json_of, spawn_app};

async fn opened_trust_is_reused_until_a_trust_column_changes(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut rows = Vec::new();
    for _ in 0..3 {
        let created = json_of(app.found(1, json!({"control_plane_image_id": 42})).await).await;
        let id = created["cluster_id"].as_i64().unwrap();
        rows.push(
            db::clusters::get_by_id(&app.state.db.pool, id)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let cache = IssuerCache::new(NonZeroUsize::new(2).unwrap());
    let keks = &app.state.keks;
    let first = cache.open(keks, &rows[0]).unwrap();
    let again = cache.open(keks, &rows[0]).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the opened trust is reused");

    // Any trust column changed (a rotation, a re-key): opened again from the row.
    let mut rekeyed = rows[0].clone();
    rekeyed.sa_public = Some("-----BEGIN PUBLIC KEY-----\nrekeyed\n".into());
    let fresh = cache.open(keks, &rekeyed).unwrap();
    assert!(!Arc::ptr_eq(&first, &fresh));
    assert_eq!(
        fresh.service_account.public_pem,
        "-----BEGIN PUBLIC KEY-----\nrekeyed\n"
    );
    let mut rotated = rows[0].clone();
    rotated.etcd_ca_cert = rows[1].etcd_ca_cert.clone();
    assert!(
        cache.open(keks, &rotated).is_err(),
        "a certificate that does not match its sealed key is refused, not served from the cache"
    );

    for row in &rows {
        cache.open(keks, row).unwrap();
    }
    assert_eq!(cache.len(), 2, "never more than its capacity");
    let shown = format!("{cache:?}");
    assert!(
        !shown.contains("BEGIN") && !shown.contains("PRIVATE"),
        "{shown}"
    );
    assert!(shown.contains("capacity"), "{shown}");
}

both_backends!(opened_trust_is_reused_until_a_trust_column_changes);
