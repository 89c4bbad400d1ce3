//! `GET /clusters/{id}/events` on SQLite and PostgreSQL: every phase of a founding in order
//! (accepted, each node, founded), a node's reports, a `status` event that follows readiness,
//! a reconnect with `Last-Event-ID` that gets exactly what followed, `deleted` at the end, and
//! the refusals (another org's cluster, a bad `Last-Event-ID`).

use std::time::Duration;

use exk8s_api::sim::Faults;
use exk8s_api::tokens::Scope;
use serde_json::{Value, json};

use crate::app::{Backend, TestApp, both_backends, credentials_for, json_of, operator_token};
use crate::bootstrap::report;

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub(crate) struct Sse {
    pub id: Option<i64>,
    pub kind: String,
    pub data: Value,
}

/// An open event stream, read event by event.
pub(crate) struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    pub(crate) async fn open(app: &TestApp, cluster: i64, last: Option<i64>) -> Self {
        let mut request = app.get(&format!("/clusters/{cluster}/events"));
        if let Some(last) = last {
            request = request.header("Last-Event-ID", last.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped); `None` when the stream ended.
    async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut kind, mut data) = (None, String::from("message"), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        kind = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                return Some(Sse {
                    id,
                    kind,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("an event within 30 s")
                .unwrap()?;
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Events up to and including the first one `until` accepts.
    pub(crate) async fn until(&mut self, until: impl Fn(&Sse) -> bool) -> Vec<Sse> {
        let mut seen = Vec::new();
        loop {
            let event = self.next().await.expect("the stream ended early");
            let done = until(&event);
            seen.push(event);
            if done {
                return seen;
            }
        }
    }
}

fn changes(events: &[Sse]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e.id.is_some())
        .map(|e| (e.kind.clone(), e.data["phase"].as_str().unwrap().to_owned()))
        .collect()
}

async fn the_stream_follows_a_founding_and_resumes(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    app.sims.set_faults(Faults {
        hold_vm_create: true,
        ..Faults::default()
    });
    let accepted = app
        .post("/clusters")
        .json(&crate::app::valid_body(3))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let cluster = json_of(accepted).await["id"].as_i64().unwrap();

    let mut stream = Stream::open(&app, cluster, None).await;
    let opening = stream.until(|e| e.kind == "status").await;
    assert_eq!(
        changes(&opening),
        [("cluster".to_owned(), "provisioning".to_owned())]
    );
    let first_id = opening[0].id.unwrap();
    let status = &opening.last().unwrap().data;
    assert_eq!(status["phase"], "provisioning");
    assert_eq!(status["ready"], false);

    app.sims.set_faults(Faults::default());
    let founding = stream
        .until(|e| e.kind == "cluster" && e.data["phase"] == "founded")
        .await;
    let nodes: Vec<i64> = founding
        .iter()
        .filter(|e| e.kind == "node")
        .map(|e| {
            assert_eq!(e.data["phase"], "pending");
            e.data["vm_id"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(nodes.len(), 3, "{founding:?}");
    assert_eq!(
        changes(&founding).last().unwrap(),
        &("cluster".to_owned(), "founded".to_owned()),
        "founded after its nodes"
    );

    let created = json!({"cluster_id": cluster, "control_plane_vm_ids": nodes});
    let members = credentials_for(&app, 7, &created).await;
    for node in &members {
        assert_eq!(report(&app, node, "etcd", "started").await, 204);
        assert_eq!(report(&app, node, "complete", "succeeded").await, 204);
    }
    let booted = stream
        .until(|e| e.kind == "status" && e.data["ready"] == true)
        .await;
    let reports: Vec<(i64, String)> = booted
        .iter()
        .filter(|e| e.kind == "report")
        .map(|e| {
            (
                e.data["vm_id"].as_i64().unwrap(),
                e.data["phase"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(i64, String)> = nodes
        .iter()
        .flat_map(|vm| {
            [
                (*vm, "etcd:started".to_owned()),
                (*vm, "complete".to_owned()),
            ]
        })
        .collect();
    assert_eq!(reports, expected, "every report, in order");
    let ready = booted.last().unwrap();
    assert_eq!(ready.data["ready_replicas"], 3);
    assert!(
        ready.data["conditions"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );

    // Disconnected, then resumed after the first event: exactly the same changes follow.
    let all: Vec<Sse> = opening
        .iter()
        .chain(&founding)
        .chain(&booted)
        .filter(|e| e.id.is_some())
        .cloned()
        .collect();
    drop(stream);
    let mut resumed = Stream::open(&app, cluster, Some(first_id)).await;
    let again = resumed.until(|e| e.id == all.last().unwrap().id).await;
    let ids = |events: &[Sse]| events.iter().filter_map(|e| e.id).collect::<Vec<_>>();
    assert_eq!(
        ids(&again),
        ids(&all[1..]),
        "what followed the first event, once each"
    );
    assert_eq!(changes(&again), changes(&all[1..]));

    let deleted = app
        .delete(&format!("/clusters/{cluster}"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let end = resumed.until(|e| e.kind == "deleted").await;
    assert_eq!(end.last().unwrap().kind, "deleted");
    assert!(resumed.next().await.is_none(), "the stream ends");
}
both_backends!(the_stream_follows_a_founding_and_resumes);

async fn the_stream_refuses_what_it_cannot_serve(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    for bad in ["x", "-1", "1.5", ""] {
        let refused = app
            .get(&format!("/clusters/{cluster}/events"))
            .header("Last-Event-ID", bad)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 400, "Last-Event-ID {bad:?}");
        assert_eq!(json_of(refused).await["error"]["field"], "Last-Event-ID");
    }
    let other = operator_token(&app.state, 8, Scope::Operator, 3600).await;
    let hidden = app
        .http
        .get(format!("{}/clusters/{cluster}/events", app.url))
        .bearer_auth(other)
        .send()
        .await
        .unwrap();
    assert_eq!(hidden.status(), 404, "another org's cluster");
    let missing = app.get("/clusters/999999/events").send().await.unwrap();
    assert_eq!(missing.status(), 404);
}
both_backends!(the_stream_refuses_what_it_cannot_serve);

/// A `Last-Event-ID` beyond the cluster's last event is refused (a stream resumed there would
/// never deliver), and one at the last event is served.
async fn a_resume_point_beyond_the_last_event_is_refused(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut stream = Stream::open(&app, cluster, None).await;
    let opening = stream.until(|e| e.kind == "status").await;
    let last = opening.iter().filter_map(|e| e.id).max().unwrap();
    drop(stream);
    let beyond = app
        .get(&format!("/clusters/{cluster}/events"))
        .header("Last-Event-ID", (last + 1000).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(beyond.status(), 400);
    let error = json_of(beyond).await;
    assert_eq!(error["error"]["field"], "Last-Event-ID");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("last event ({last})")),
        "{error}"
    );
    Stream::open(&app, cluster, Some(last)).await;
}
both_backends!(a_resume_point_beyond_the_last_event_is_refused);

/// A change of a kind this API does not know — written by a newer API beside it during a
/// rolling deploy — is left out of the stream, live and on a resume, and what follows it
/// still comes, each event once.
async fn a_kind_from_a_newer_api_is_left_out(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut stream = Stream::open(&app, cluster, None).await;
    let opening = stream
        .until(|e| e.kind == "cluster" && e.data["phase"] == "founded")
        .await;
    let last = opening.iter().filter_map(|e| e.id).max().unwrap();
    let newer = || async {
        sqlx::query(
            "INSERT INTO cluster_events (cluster_id, kind, phase, created_at) \
             VALUES ($1, 'from-a-newer-api', 'anything', $2)",
        )
        .bind(cluster)
        .bind(exk8s_api::db::now())
        .execute(&app.state.db.pool)
        .await
        .unwrap();
    };
    newer().await;
    let vm = credentials_for(&app, 7, &created).await.remove(0);
    assert_eq!(report(&app, &vm, "etcd", "started").await, 204);
    let live = stream.until(|e| e.kind == "report").await;
    assert!(
        live.iter().all(|e| e.kind != "from-a-newer-api"),
        "{live:?}"
    );
    drop(stream);
    let mut resumed = Stream::open(&app, cluster, Some(last)).await;
    let again = resumed.until(|e| e.kind == "report").await;
    assert_eq!(
        again.iter().filter(|e| e.id.is_some()).count(),
        1,
        "only the report follows the resume point: {again:?}"
    );
}
both_backends!(a_kind_from_a_newer_api_is_left_out);

/// A stream that catches up on more changes than it reads from the store at once (200) sends
/// its first `status` after all of them, not after the first page: a status never comes ahead
/// of a change it reflects (it is held until that change is sent).
async fn a_status_follows_every_change_it_reflects(backend: Backend) {
    let app = crate::app::spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let vm = credentials_for(&app, 7, &created).await.remove(0);
    const REPORTS: usize = 250;
    for _ in 0..REPORTS / 2 {
        assert_eq!(report(&app, &vm, "etcd", "started").await, 204);
        assert_eq!(report(&app, &vm, "etcd", "succeeded").await, 204);
    }
    let last = exk8s_api::db::events::last_of(&app.state.db.pool, cluster)
        .await
        .unwrap();
    let mut stream = Stream::open(&app, cluster, None).await;
    let opening = stream.until(|e| e.kind == "status").await;
    assert_eq!(
        opening.iter().filter_map(|e| e.id).max(),
        Some(last),
        "the status came after change {:?} of {last}",
        opening.iter().filter_map(|e| e.id).max()
    );
    assert_eq!(
        opening.iter().filter(|e| e.kind == "report").count(),
        REPORTS
    );
}
both_backends!(a_status_follows_every_change_it_reflects);

/// Streams are bounded per token (429 with Retry-After beyond, naming the bound) while another
/// token still opens one; a revoked token's stream ends with `end` (reason `token`); every
/// stream ends with `end` (reason `lifetime`) once it reaches the server's stream lifetime.
async fn streams_are_bounded_and_end_with_their_token(backend: Backend) {
    let config = exk8s_api::app::ApiConfig {
        event_streams: exk8s_api::feed::StreamLimits {
            per_token: 2,
            per_process: 100,
        },
        event_stream_token_recheck: Duration::from_millis(200),
        event_stream_lifetime: Duration::from_secs(4),
        ..crate::app::test_config()
    };
    let app = crate::app::spawn_with(backend, config, None).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let open_with = |token: String| {
        app.http
            .get(format!("{}/clusters/{cluster}/events", app.url))
            .bearer_auth(token)
            .send()
    };
    let mut first = Stream::open(&app, cluster, None).await;
    let mut second = Stream::open(&app, cluster, None).await;
    let third = open_with(app.token.clone()).await.unwrap();
    assert_eq!(third.status(), 429);
    assert_eq!(third.headers()["retry-after"], "30");
    let error = json_of(third).await;
    assert_eq!(error["error"]["code"], "too_many_streams");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 event streams"),
        "{error}"
    );

    let other = operator_token(&app.state, 7, Scope::Operator, 3600).await;
    let response = open_with(other.clone()).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut revoked = Stream {
        response,
        buffer: String::new(),
    };
    revoked.until(|e| e.kind == "status").await;
    let id: i64 = sqlx::query_scalar("SELECT id FROM api_tokens WHERE token_hash = $1")
        .bind(exk8s_api::tokens::hash(&other))
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap();
    assert!(
        exk8s_api::db::tokens::revoke_api_token(&app.state.db.pool, id)
            .await
            .unwrap()
    );
    let end = revoked.until(|e| e.kind == "end").await;
    assert_eq!(end.last().unwrap().data["reason"], "token");
    assert!(
        revoked.next().await.is_none(),
        "the revoked token's stream ends"
    );

    for stream in [&mut first, &mut second] {
        let end = stream.until(|e| e.kind == "end").await;
        assert_eq!(end.last().unwrap().data["reason"], "lifetime");
        assert!(stream.next().await.is_none());
    }
    // Ended streams free their places.
    Stream::open(&app, cluster, None).await;
}
both_backends!(streams_are_bounded_and_end_with_their_token);
