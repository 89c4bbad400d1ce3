//! A crash while a pool's workers are being made, with the real `exk8s-api` binary and the
//! compute simulator as its own process, on SQLite and PostgreSQL: SIGKILL once some of six
//! workers exist, then a restart whose reconciler releases what the dead process left half-made
//! and finishes the pool — exactly six workers, every one a node, nothing leaked.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::app::{Backend, both_backends, fresh_database};
use crate::crash::{stack, token, wait_until};
use crate::pools::pool_body;

fn workers(vms: &[Value]) -> BTreeSet<i64> {
    vms.iter()
        .filter(|vm| vm["tags"]["exk8s.io/role"] == "worker")
        .map(|vm| vm["id"].as_i64().unwrap())
        .collect()
}

/// The VMs the database records as workers of the pool.
async fn recorded_workers(db_url: &str, pool: i64) -> BTreeSet<i64> {
    use sqlx::Row as _;
    let db = exk8s_api::db::Db::connect(db_url).unwrap();
    let rows = sqlx::query("SELECT vm_id FROM cluster_nodes WHERE pool_id = $1")
        .bind(pool)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    rows.iter().map(|r| r.get::<i64, _>("vm_id")).collect()
}

/// A stack on a fresh database with one API running and a founded 1-node cluster.
struct Founded {
    dir: tempfile::TempDir,
    db_url: String,
    stack: crate::crash::Stack,
    operator: String,
    first: exk8s_tests::procs::Proc,
    cluster: i64,
}

async fn founded(backend: Backend) -> Founded {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(backend, dir.path()).await;
    // The provisioning deadline stays at its default (ten minutes): what lets the restarted API
    // take a change over is the dead holder's lease running out (seconds, lease::TTL).
    let stack = stack(dir.path(), &db_url, 600).await;
    let operator = token(&db_url, "7", "operator");
    let first = stack.start_api(&dir.path().join("api-1.log")).await;
    let created: Value = stack
        .found(&stack.api_url, &operator, 1)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();
    Founded {
        dir,
        db_url,
        stack,
        operator,
        first,
        cluster,
    }
}

async fn killed_while_making_workers_then_the_pool_is_finished(backend: Backend) {
    let Founded {
        dir,
        db_url,
        stack,
        operator,
        mut first,
        cluster,
    } = founded(backend).await;
    // Every compute call is slow and addresses come late: creations overlap the kill.
    stack
        .set_faults(json!({"latency_ms": 100, "address_after_polls": 5}))
        .await;
    let pools = format!("{}/clusters/{cluster}/node-pools", stack.api_url);
    let accepted = stack
        .http
        .post(&pools)
        .bearer_auth(&operator)
        .json(&pool_body("blue", 6))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let id = accepted.json::<Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    wait_until("the first workers", Duration::from_secs(30), || async {
        !workers(&stack.sim_list("vms").await).is_empty()
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let at_kill = workers(&stack.sim_list("vms").await);
    let recorded = recorded_workers(&db_url, id).await;
    assert!(
        recorded.len() < 6,
        "killed before every worker was recorded: {recorded:?}"
    );
    assert!(
        at_kill.len() > recorded.len(),
        "some VMs exist that no node records: {at_kill:?} {recorded:?}"
    );

    stack.set_faults(json!({})).await;
    let _second = stack.start_api(&dir.path().join("api-2.log")).await;
    let pool_url = format!("{pools}/{id}");
    let get_pool = || async {
        stack
            .http
            .get(&pool_url)
            .bearer_auth(&operator)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    wait_until("the pool finished", Duration::from_secs(60), || async {
        let p = get_pool().await;
        p["replicas"] == 6 && p["nodes"].as_array().unwrap().len() == 6
    })
    .await;
    let pool = get_pool().await;
    let nodes: BTreeSet<i64> = pool["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["vm_id"].as_i64().unwrap())
        .collect();
    wait_until(
        "no worker VM outside the pool",
        Duration::from_secs(30),
        || async { workers(&stack.sim_list("vms").await) == nodes },
    )
    .await;
    assert!(nodes.is_superset(&recorded), "recorded workers are kept");
    let half_made: BTreeSet<i64> = at_kill.difference(&recorded).copied().collect();
    assert!(
        nodes.is_disjoint(&half_made),
        "half-made VMs are released, never adopted"
    );
    assert_eq!(pool["nodes"].as_array().unwrap().len(), 6);
}

both_backends!(killed_while_making_workers_then_the_pool_is_finished);

/// SIGKILL in the middle of `DELETE /clusters/{id}` while a pool makes its workers — the
/// delete accepted (the cluster `deleting`) and held by the compute simulator at its first VM
/// deletion: the restarted API's reconciler finishes the delete — no VM, no security group, no
/// cluster row.
async fn killed_during_a_delete_then_the_delete_is_finished(backend: Backend) {
    let Founded {
        dir,
        db_url,
        stack,
        operator,
        mut first,
        cluster,
    } = founded(backend).await;
    stack
        .set_faults(json!({"latency_ms": 50, "address_after_polls": 3}))
        .await;
    let accepted = stack
        .http
        .post(format!("{}/clusters/{cluster}/node-pools", stack.api_url))
        .bearer_auth(&operator)
        .json(&pool_body("doomed", 10))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    wait_until("the first workers", Duration::from_secs(30), || async {
        !workers(&stack.sim_list("vms").await).is_empty()
    })
    .await;
    stack
        .set_faults(json!({"latency_ms": 50, "address_after_polls": 3, "hold_vm_delete": true}))
        .await;
    let delete = {
        let request = stack
            .http
            .delete(format!("{}/clusters/{cluster}", stack.api_url))
            .bearer_auth(&operator);
        tokio::spawn(async move { request.send().await })
    };
    let db = exk8s_api::db::Db::connect(&db_url).unwrap();
    wait_until("the delete accepted", Duration::from_secs(30), || async {
        let phase: String = sqlx::query_scalar("SELECT phase FROM clusters WHERE id = $1")
            .bind(cluster)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        phase == "deleting"
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    let _ = delete.await;
    assert!(
        !stack.sim_list("vms").await.is_empty(),
        "the delete had not finished when the API died"
    );

    stack.set_faults(json!({})).await;
    let _second = stack.start_api(&dir.path().join("api-2.log")).await;
    wait_until("the delete finished", Duration::from_secs(90), || async {
        let rows: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM clusters WHERE id = $1 AND phase <> 'deleted'",
        )
        .bind(cluster)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        rows == 0
            && stack.sim_list("vms").await.is_empty()
            && stack.sim_list("security-groups").await.is_empty()
    })
    .await;
}

both_backends!(killed_during_a_delete_then_the_delete_is_finished);
