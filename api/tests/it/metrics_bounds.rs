//! What a client cannot grow: the request metrics' series are bounded by the API (a fixed set
//! of methods, route templates, the statuses it answers), whatever methods and paths clients send
//! before any authentication; a deleted cluster's gauges go with it.

use futures_util::StreamExt as _;
use serde_json::json;

use crate::app::{Backend, TestApp, both_backends, spawn_app};

/// The `/metrics` exposition's request series (the lines of `exk8s_http_requests_total`).
async fn request_series(app: &TestApp) -> Vec<String> {
    let text = app.metrics().await;
    text.lines()
        .filter(|l| l.starts_with("exk8s_http_requests_total{"))
        .map(|l| {
            l.rsplit_once(' ')
                .map_or(l, |(labels, _)| labels)
                .to_owned()
        })
        .collect()
}

async fn clients_cannot_add_series(backend: Backend) {
    let app = spawn_app(backend).await;
    // Every method token and path kind once, so each bounded series exists before the count.
    let send = |method: &str, path: String| {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        app.http
            .request(method, format!("{}{path}", app.url))
            .send()
    };
    for path in [
        "/healthz".to_owned(),
        "/clusters/1".to_owned(),
        "/nope/0".to_owned(),
    ] {
        send("FOO0", path.clone()).await.unwrap();
        send("GET", path).await.unwrap();
    }
    let before = request_series(&app).await;
    assert!(
        before.iter().any(|s| s.contains("method=\"other\"")),
        "an unknown method is counted as `other`: {before:?}"
    );
    let requests = futures_util::stream::iter(0..10_000).map(|i| {
        let path = match i % 3 {
            0 => "/healthz".to_owned(),
            1 => format!("/clusters/{i}"),
            _ => format!("/nope/{i}"),
        };
        let method = reqwest::Method::from_bytes(format!("FOO{i}").as_bytes()).unwrap();
        let request = app.http.request(method, format!("{}{path}", app.url));
        async move { request.send().await.unwrap().status() }
    });

    let statuses: Vec<_> = requests.buffer_unordered(32).collect().await;
    assert_eq!(statuses.len(), 10_000);
    let after = request_series(&app).await;
    let grown: Vec<_> = after.iter().filter(|s| !before.contains(s)).collect();
    assert!(
        grown.iter().all(|s| s.contains("route=\"/metrics\"")),
        "10,000 requests with distinct methods and paths added series: {grown:?}"
    );
    assert!(
        after
            .iter()
            .all(|s| !s.contains("FOO") && !s.contains("/nope/")),
        "no method token or raw path is a label: {after:?}"
    );
}

async fn a_deleted_clusters_gauges_go(backend: Backend) {
    let app = spawn_app(backend).await;
    let founded = crate::app::json_of(app.found(1, json!({})).await).await;
    let id = founded["cluster_id"].as_i64().unwrap();
    let gauge = format!(
        "exk8s_cluster_certificate_soonest_expiry_timestamp_seconds{{cluster_id=\"{id}\"}}"
    );
    exk8s_api::renewal::pass(&app.state.renewer())
        .await
        .unwrap();
    assert!(
        app.metrics().await.contains(&gauge),
        "the founded cluster has its gauge"
    );
    assert_eq!(
        app.delete(&format!("/clusters/{id}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    exk8s_api::renewal::pass(&app.state.renewer())
        .await
        .unwrap();
    assert!(
        !app.metrics().await.contains(&gauge),
        "a deleted cluster's gauge is gone"
    );
}

both_backends!(clients_cannot_add_series, a_deleted_clusters_gauges_go);
