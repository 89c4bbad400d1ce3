//! A node's request reads its credentials, its node and its cluster in one statement
//! (`db::callers`): the same rows the single-table reads give, judged by org and phase as before
//! (`issuance::auth::member_of`).

use exk8s_api::db;
use exk8s_api::db::phase::ClusterPhase;
use exk8s_api::issuance::{Refused, auth::member_of};
use exk8s_api::pki::CaRole;
use serde_json::json;

use exk8s_api::tokens::hash;

use crate::app::{Backend, both_backends, cluster_with_credentials, json_of, spawn_app};

async fn a_callers_records_are_read_together_and_judged_by_org(backend: Backend) {
    let app = spawn_app(backend).await;
    // A second cluster, so no node shares its cluster's id, and a creation time of its own, so
    // a node's column read in its cluster's place shows.
    cluster_with_credentials(&app, 7, 3).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let cluster_id = nodes[0].cluster;
    let pool = &app.state.db.pool;
    sqlx::query("UPDATE clusters SET created_at = created_at - 1000 WHERE id = $1")
        .bind(cluster_id)
        .execute(pool)
        .await
        .unwrap();
    let cluster = db::clusters::get_by_id(pool, cluster_id)
        .await
        .unwrap()
        .unwrap();
    let rows = db::nodes::list(pool, cluster_id).await.unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|n| n.id != cluster_id));
    let bearer = hash(&nodes[0].bootstrap);
    let principal = db::tokens::find_api_token(pool, &bearer)
        .await
        .unwrap()
        .unwrap();
    for (node, row) in nodes.iter().zip(&rows) {
        assert_eq!(node.vm, row.vm_id);
        let imds = hash(&node.imds);
        let session = db::tokens::find_imds_token(pool, &imds)
            .await
            .unwrap()
            .unwrap();
        let read = db::callers::bootstrap(pool, &imds, &bearer, node.vm)
            .await
            .unwrap();
        let signed = db::callers::signed(pool, &imds, node.vm).await.unwrap();
        assert!(signed.principal.is_none());
        for read in [&read, &signed] {
            // Every column, each where its own table's read puts it.
            assert_eq!(
                format!("{:?}", read.session),
                format!("{:?}", Some(&session))
            );
            let (read_node, read_cluster) = read.member.clone().unwrap();
            assert_eq!(format!("{read_node:?}"), format!("{row:?}"));
            assert_eq!(format!("{read_cluster:?}"), format!("{cluster:?}"));
        }
        assert_eq!(
            format!("{:?}", read.principal),
            format!("{:?}", Some(&principal))
        );
        let vm = member_of(read.member.clone(), cluster.org_id).unwrap();
        assert_eq!((vm.node.id, vm.cluster.id), (row.id, cluster_id));
        let other_org = member_of(read.member, cluster.org_id + 1).unwrap_err();
        assert_eq!(other_org.class, Refused::Hidden);
        assert_eq!(other_org.reason, "the VM's cluster belongs to another org");
    }

    // Each record is looked up on its own: an unknown one is `None`, the others still read.
    let imds = hash(&nodes[1].imds);
    let read = db::callers::bootstrap(pool, &hash("unknown"), &bearer, nodes[1].vm)
        .await
        .unwrap();
    assert!(read.session.is_none());
    assert_eq!(read.principal.map(|p| p.id), Some(principal.id));
    assert_eq!(read.member.map(|(n, _)| n.vm_id), Some(nodes[1].vm));
    let read = db::callers::bootstrap(pool, &imds, &hash("unknown"), 999_999)
        .await
        .unwrap();
    assert_eq!(read.session.map(|s| s.vm_id), Some(nodes[1].vm));
    assert!(read.principal.is_none());
    assert!(read.member.is_none());
    // The path's VM is read, whoever the token names: the caller judges the two apart.
    let read = db::callers::signed(pool, &imds, nodes[2].vm).await.unwrap();
    assert_eq!(read.session.map(|s| s.vm_id), Some(nodes[1].vm));
    assert_eq!(read.member.map(|(n, _)| n.vm_id), Some(nodes[2].vm));
    let read = db::callers::signed(pool, &hash("unknown"), 999_999)
        .await
        .unwrap();
    assert!(read.session.is_none() && read.member.is_none());
    assert_eq!(
        member_of(None, cluster.org_id).unwrap_err().reason,
        "the VM is no node of any cluster"
    );

    // A cluster that is not founded yet answers "retry", one that is gone "not found".
    let node = rows[0].clone();
    let mut provisioning = cluster.clone();
    provisioning.phase = ClusterPhase::Provisioning;
    let refused = member_of(Some((node.clone(), provisioning)), cluster.org_id).unwrap_err();
    assert!(
        matches!(refused.class, Refused::NotYet { .. }),
        "{refused:?}"
    );
    let mut deleting = cluster.clone();
    deleting.phase = ClusterPhase::Deleting;
    let refused = member_of(Some((node, deleting)), cluster.org_id).unwrap_err();
    assert_eq!(refused.class, Refused::Hidden);
}

both_backends!(a_callers_records_are_read_together_and_judged_by_org);

/// A control-plane bundle reads its cluster's nodes, its own serving certificates and the CA
/// rotation in one statement (`db::nodes::control_plane_view`): the rows each table's own read
/// gives, the serving certificates of the node asked for only.
async fn a_control_plane_view_is_the_tables_own_rows(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({})).await).await;
    let cluster_id = created["cluster_id"].as_i64().unwrap();
    let pool = &app.state.db.pool;
    let nodes = db::nodes::list(pool, cluster_id).await.unwrap();
    let mut serving_certs = Vec::new();
    for rotating in [false, true] {
        if rotating {
            let mut tx = app.state.db.begin().await.unwrap();
            let started = db::rotations::insert(
                &mut tx,
                cluster_id,
                CaRole::Etcd,
                "new cert pem",
                "sealed new key",
                1_234,
            )
            .await
            .unwrap();
            assert!(started);
            tx.commit().await.unwrap();
        }
        let rotation = db::rotations::get(pool, cluster_id).await.unwrap();
        assert_eq!(rotation.is_some(), rotating);
        for node in &nodes {
            let view = db::nodes::control_plane_view(pool, cluster_id, node.id)
                .await
                .unwrap();
            assert_eq!(format!("{:?}", view.nodes), format!("{nodes:?}"));
            assert_eq!(view.rotation, rotation);
            let serving = view
                .serving
                .expect("a control-plane node's serving certificates");
            let own: (String, String) = sqlx::query_as(
                "SELECT e.server_cert, a.serving_cert FROM etcd_members e \
                 JOIN apiserver_nodes a ON a.node_id = e.node_id WHERE e.node_id = $1",
            )
            .bind(node.id)
            .fetch_one(pool)
            .await
            .unwrap();
            assert_eq!((serving.etcd_server_cert, serving.apiserver_cert), own);
            serving_certs.push(own);
        }
    }
    // Three nodes, three sets of certificates.
    serving_certs.sort();
    serving_certs.dedup();
    assert_eq!(serving_certs.len(), 3);
}

both_backends!(a_control_plane_view_is_the_tables_own_rows);
