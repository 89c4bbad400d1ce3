//! Deleting wins over every convergence, on SQLite and PostgreSQL: a cluster deleted while a
//! 40-worker pool is still making its VMs leaves no VM, no security group and no row behind —
//! at once (204) or, when a convergence was still in its step, after the reconciler finished
//! the delete it accepted (202).

use std::time::Duration;

use exk8s_api::sim::Faults;
use serde_json::json;

use crate::app::{Backend, both_backends, json_of, spawn_app};
use crate::founding::assert_nothing_left;
use crate::pools::pool_body;

async fn a_delete_during_a_pool_scale_up_leaves_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    // Every compute call takes a while: the pool is still making VMs when the delete comes.
    app.sims.set_faults(Faults {
        latency_ms: 20,
        ..Faults::default()
    });
    let pool = app
        .post(&format!("/clusters/{cluster}/node-pools"))
        .json(&pool_body("wide", 40))
        .send()
        .await
        .unwrap();
    assert_eq!(pool.status(), 202);
    // The delete comes as soon as the pool's first worker VM exists (the control plane's is
    // the one before it): 39 more are still to be made, eight at a time, 20 ms a call. A fixed
    // sleep here saw no worker yet on a loaded machine.
    crate::crash::wait_until_every(
        "the pool's first worker VM",
        Duration::from_secs(60),
        Duration::from_millis(5),
        || async { app.sims.compute.vms().len() > 1 },
    )
    .await;

    let deleted = app
        .delete(&format!("/clusters/{cluster}"))
        .send()
        .await
        .unwrap();
    let status = deleted.status().as_u16();
    assert!(status == 204 || status == 202, "delete answered {status}");
    if status == 202 {
        let accepted = json_of(deleted).await;
        assert_eq!(accepted["phase"], "deleting", "{accepted}");
        // The reconciler's pass finishes what the delete accepted.
        for _ in 0..100 {
            exk8s_api::founding::delete::finish_all(&app.state.machines()).await;
            if app.cluster_count().await == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    assert_eq!(app.cluster_count().await, 0, "the cluster is deleted");
    for table in ["cluster_nodes", "node_pools", "issued_certificates"] {
        let rows: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {table} WHERE cluster_id = $1"
        ))
        .bind(cluster)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap();
        assert_eq!(rows, 0, "{table}: only what recovery needs is kept");
    }
    // Nothing the pool's convergence was making when the delete came survives it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_nothing_left(&app);
    let gone = app
        .get(&format!("/clusters/{cluster}"))
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404);
}

both_backends!(a_delete_during_a_pool_scale_up_leaves_nothing);
