//! `Idempotency-Key` on `POST /clusters`, on SQLite and PostgreSQL: a retry replays the first
//! answer, another request with the key is refused, a concurrent one waits its turn (409); a
//! transient refusal is never kept for the key, a final one replays exactly.

use std::time::Duration;

use exk8s_api::sim::Faults;
use serde_json::{Value, json};

use crate::app::{Backend, WAIT, both_backends, json_of, spawn_app, valid_body};

async fn idempotency_keys_replay_refuse_and_serialise(backend: Backend) {
    let app = spawn_app(backend).await;
    let send = |key: &str, body: Value| {
        app.post("/clusters")
            .header(WAIT.0, WAIT.1)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    let first = send("k-1", valid_body(1)).await.unwrap();
    assert_eq!(first.status(), 201);
    let first = json_of(first).await;
    let again = send("k-1", valid_body(1)).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(
        json_of(again).await,
        first,
        "a retry must return the first response"
    );
    assert_eq!(app.cluster_count().await, 1);
    assert_eq!(app.sims.compute.vms().len(), 1);

    let other = send("k-1", valid_body(3)).await.unwrap();
    assert_eq!(other.status(), 422);
    assert_eq!(json_of(other).await["error"]["field"], "Idempotency-Key");

    // While the first request is in flight, a retry is refused with 409.
    app.sims.set_faults(Faults {
        latency_ms: 300,
        ..Faults::default()
    });
    let slow = {
        let request = app
            .post("/clusters")
            .header(WAIT.0, WAIT.1)
            .header("Idempotency-Key", "k-2")
            .json(&valid_body(1));
        tokio::spawn(async move { request.send().await.unwrap().status() })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let concurrent = send("k-2", valid_body(1)).await.unwrap();
    assert_eq!(concurrent.status(), 409);
    assert_eq!(slow.await.unwrap(), 201);
    assert_eq!(app.cluster_count().await, 2);
    app.sims.set_faults(Faults::default());

    // A refusal that depends on the moment (409: the name is taken) is not kept for the key:
    // once the name is free, the same key founds.
    let mut named = valid_body(1);
    named["name"] = json!("taken");
    let holder = json_of(app.found(1, json!({"name": "taken"})).await).await;
    let refused = send("k-3", named.clone()).await.unwrap();
    assert_eq!(refused.status(), 409);
    let deleted = app
        .delete(&format!("/clusters/{}", holder["cluster_id"]))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let retried = send("k-3", named).await.unwrap();
    assert_eq!(
        retried.status(),
        201,
        "a transient 409 was kept for the key"
    );

    // A final refusal is replayed exactly as it was first given (its code and message).
    let mut bad = valid_body(1);
    bad["subnet_id"] = json!(5000);
    let first = send("k-4", bad.clone()).await.unwrap();
    assert_eq!(first.status(), 422);
    let first = json_of(first).await;
    let again = send("k-4", bad).await.unwrap();
    assert_eq!(again.status(), 422);
    assert_eq!(json_of(again).await, first);
}

both_backends!(idempotency_keys_replay_refuse_and_serialise);
