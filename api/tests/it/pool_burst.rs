//! A burst of pool creations on SQLite and PostgreSQL: fifty distinct keys and fifty retries
//! of one key at once make exactly the 51 pools asked for, each worker's VM made once, with
//! every 503 saying when to retry.

use std::collections::BTreeSet;
use std::time::Duration;

use exk8s_api::db;
use serde_json::Value;

use crate::app::{Backend, both_backends, json_of, spawn_app};
use crate::crash::wait_until;
use crate::pools::{founded, pool_body};

async fn fifty_concurrent_creations_make_exactly_the_pools_asked_for(backend: Backend) {
    let app = spawn_app(backend).await;
    let cluster = founded(&app).await;
    let path = format!("/clusters/{cluster}/node-pools");
    let mut requests = Vec::new();
    for i in 0..50 {
        let key = format!("distinct-{i}");
        requests.push(tokio::spawn(create_as_a_client(
            app.post(&path).header("Idempotency-Key", key),
            pool_body(&format!("p{i}"), 1),
        )));
        requests.push(tokio::spawn(create_as_a_client(
            app.post(&path).header("Idempotency-Key", "one-key"),
            pool_body("same", 1),
        )));
    }
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.unwrap());
    }
    let accepted = statuses.iter().filter(|s| **s == 202).count();
    let in_flight = statuses.iter().filter(|s| **s == 409).count();
    assert_eq!(accepted + in_flight, 100, "{statuses:?}");
    assert!(accepted >= 51, "{statuses:?}");

    let pools = json_of(app.get(&path).send().await.unwrap()).await;
    let names: BTreeSet<String> = pools
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    let mut expected: BTreeSet<String> = (0..50).map(|i| format!("p{i}")).collect();
    expected.insert("same".into());
    assert_eq!(names, expected);
    wait_until("51 workers", Duration::from_secs(60), || async {
        let pools = json_of(app.get(&path).send().await.unwrap()).await;
        pools
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["replicas"] == 1 && p["nodes"].as_array().unwrap().len() == 1)
    })
    .await;
    assert_eq!(app.sims.compute.vms().len(), 3 + 51);
    // Each worker's VM was made once: no creation collided, was undone and made again (on
    // PostgreSQL, one that lost 16 races for a pod range used to wait for the reconciler).
    assert_eq!(app.sims.compute.vm_creates(), 3 + 51);
    let nodes = db::nodes::list(&app.state.db.pool, cluster).await.unwrap();
    assert_eq!(nodes.len(), 54);
}

/// Sends a creation as a client does: a 503 (a server short of connections under the burst, on
/// a loaded machine) must say when to retry, and is retried under the same key, as is a 409
/// "in progress" right after it (the refused attempt's claim on the key may still be being let
/// go). Returns the final status.
async fn create_as_a_client(request: reqwest::RequestBuilder, body: Value) -> u16 {
    let mut refused = false;
    for _ in 0..100 {
        let response = request
            .try_clone()
            .expect("a JSON request clones")
            .json(&body)
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            503 => assert!(
                response.headers().contains_key("retry-after"),
                "a 503 says when to retry: {:?}",
                response.headers()
            ),
            409 if refused => {}
            status => return status,
        }
        refused = true;
        // Sooner than `Retry-After` asks (a client may): the test waits for nothing else.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("still refused after 100 tries");
}

both_backends!(fifty_concurrent_creations_make_exactly_the_pools_asked_for);
