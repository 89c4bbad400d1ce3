//! `Idempotency-Key` on `POST /clusters`, on SQLite and PostgreSQL: a retry replays the first
//! answer, another request with the key is refused, a concurrent one waits its turn (409); a
//! transient refusal is never kept for the key, a final one replays exactly; a claim whose
//! ending the database refused is ended once it allows; a founding accepted is answered even
//! when its view cannot be read, so that no retry founds a second cluster.

use std::time::Duration;

use exk8s_api::sim::Faults;
use serde_json::{Value, json};

use crate::app::{Backend, WAIT, both_backends, json_of, spawn_app, valid_body};
use crate::crash::wait_until;

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

/// Makes every change to `idempotency_keys` fail while `test_hold` has a row: the database
/// refusing the write that ends a claim.
async fn hold_claim_endings(app: &crate::app::TestApp, backend: Backend) {
    let statements: &[&str] = match backend {
        Backend::Sqlite => &[
            "CREATE TABLE test_hold (x INTEGER)",
            "CREATE TRIGGER test_hold_update BEFORE UPDATE ON idempotency_keys \
             WHEN EXISTS (SELECT 1 FROM test_hold) BEGIN SELECT RAISE(ABORT, 'held'); END",
            "CREATE TRIGGER test_hold_delete BEFORE DELETE ON idempotency_keys \
             WHEN EXISTS (SELECT 1 FROM test_hold) BEGIN SELECT RAISE(ABORT, 'held'); END",
        ],
        Backend::Postgres => &[
            "CREATE TABLE test_hold (x INTEGER)",
            "CREATE FUNCTION test_hold() RETURNS trigger AS $$ BEGIN \
             IF EXISTS (SELECT 1 FROM test_hold) THEN RAISE EXCEPTION 'held'; END IF; \
             RETURN COALESCE(NEW, OLD); END $$ LANGUAGE plpgsql",
            "CREATE TRIGGER test_hold BEFORE UPDATE OR DELETE ON idempotency_keys \
             FOR EACH ROW EXECUTE FUNCTION test_hold()",
        ],
    };
    for statement in statements {
        sqlx::query(statement)
            .execute(&app.state.db.pool)
            .await
            .unwrap();
    }
}

async fn set_hold(app: &crate::app::TestApp, held: bool) {
    let statement = if held {
        "INSERT INTO test_hold (x) VALUES (1)"
    } else {
        "DELETE FROM test_hold"
    };
    sqlx::query(statement)
        .execute(&app.state.db.pool)
        .await
        .unwrap();
}

async fn a_claim_the_database_would_not_end_is_ended_when_it_will(backend: Backend) {
    let app = spawn_app(backend).await;
    let founded = json_of(app.found(1, json!({})).await).await;
    let path = format!("/clusters/{}/node-pools", founded["cluster_id"]);
    let send = |key: &str, name: &str| {
        let body = json!({"name": name, "count": 0, "instance_type": "e2.small", "image_id": 77, "subnet_id": 5});
        app.post(&path)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    // The message of the refusal a request under `key` gets.
    let refusal = |key: &'static str| {
        let answer = send(key, "blue");
        async move {
            let body = json_of(answer.await.unwrap()).await;
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        }
    };
    hold_claim_endings(&app, backend).await;

    // The work is done though its answer cannot be kept yet: the client gets it, a retry waits
    // (409) until the answer is kept, then replays it.
    set_hold(&app, true).await;
    let first = send("made", "blue").await.unwrap();
    assert_eq!(first.status(), 202);
    let first = json_of(first).await;
    let refused = refusal("made").await;
    assert!(refused.contains("still in progress"), "{refused}");
    // Told to wait, and for how long (the ending is tried again every second).
    let waiting = send("made", "blue").await.unwrap();
    assert_eq!(waiting.status(), 409);
    assert_eq!(waiting.headers()["retry-after"], "1");
    assert_eq!(json_of(waiting).await["error"]["code"], "wait");
    set_hold(&app, false).await;
    wait_until("the answer kept", Duration::from_secs(10), || async {
        send("made", "blue").await.unwrap().status() == 202
    })
    .await;
    assert_eq!(json_of(send("made", "blue").await.unwrap()).await, first);

    // A refusal a retry may fix (409: the name is taken) is let go once the database allows:
    // until then the key is in progress; then the retry runs anew (and is refused anew).
    set_hold(&app, true).await;
    let refused = refusal("again").await;
    assert!(refused.contains("already has a pool named"), "{refused}");
    let refused = refusal("again").await;
    assert!(refused.contains("still in progress"), "{refused}");
    set_hold(&app, false).await;
    wait_until("the claim let go", Duration::from_secs(10), || async {
        refusal("again").await.contains("already has a pool named")
    })
    .await;
}

/// The database refuses the read of an accepted cluster's view (a table it reads is away): the
/// cluster exists, so the request is still answered 202 with the cluster as accepted, and a
/// retry of its key replays that answer instead of founding a second cluster.
async fn an_accepted_founding_is_answered_though_its_view_cannot_be_read(backend: Backend) {
    let app = spawn_app(backend).await;
    let send = || {
        app.post("/clusters")
            .header("Idempotency-Key", "accepted")
            .json(&valid_body(1))
            .send()
    };
    let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
    let db = &app.state.db.pool;
    sqlx::query(&rename("snapshots", "snapshots_away"))
        .execute(db)
        .await
        .unwrap();
    let first = send().await.unwrap();
    assert_eq!(first.status(), 202, "{:?}", first.text().await);
    let first = json_of(first).await;
    assert_eq!(first["phase"], "provisioning", "{first}");
    assert_eq!(first["nodes"], json!([]), "{first}");
    let again = send().await.unwrap();
    assert_eq!(again.status(), 202);
    assert_eq!(
        json_of(again).await,
        first,
        "a retry must replay the answer"
    );
    sqlx::query(&rename("snapshots_away", "snapshots"))
        .execute(db)
        .await
        .unwrap();
    assert_eq!(
        app.cluster_count().await,
        1,
        "a retry founded a second cluster"
    );
    let id = first["id"].as_i64().unwrap();
    wait_until(
        "the accepted cluster founded",
        Duration::from_secs(30),
        || async {
            let view = json_of(app.get(&format!("/clusters/{id}")).send().await.unwrap()).await;
            view["phase"] == "founded"
        },
    )
    .await;
}

both_backends!(
    a_claim_the_database_would_not_end_is_ended_when_it_will,
    an_accepted_founding_is_answered_though_its_view_cannot_be_read,
);
