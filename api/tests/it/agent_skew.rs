//! Agent and API skew over HTTP, on SQLite and PostgreSQL: an agent says which bundle formats
//! it reads (`Accept`) and its release (`User-Agent`) on its first fetch and its signed update
//! fetch. One that reads only a format this API does not render is refused (406) with the
//! reason its node reports, and no serial is spent; one that says nothing (every agent before
//! the announcement) gets the v2 bundle; the release it names is shown on its node.

use exk8s_common::BUNDLE_PAYLOAD_TYPE;

use crate::app::{
    Backend, Node, TestApp, both_backends, cluster_with_credentials, json_of, spawn_app,
};
use crate::sync::{Signing, register, send};
use exk8s_common::node_auth::NodeKey;

const V3_ONLY: &str = "application/vnd.exk8s.bundle.v3+json";

async fn first_fetch(app: &TestApp, node: &Node, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = app
        .http
        .get(format!("{}/bootstrap/{}", app.url, node.vm))
        .header("X-Exk8s-Nonce", crate::sync::nonce())
        .header("X-exc-imds-token", &node.imds)
        .bearer_auth(&node.bootstrap);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

async fn node_view(app: &TestApp, node: &Node) -> serde_json::Value {
    let cluster = app
        .get(&format!("/clusters/{}", node.cluster))
        .send()
        .await
        .unwrap();
    let cluster = json_of(cluster).await;
    cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == node.vm)
        .unwrap()
        .clone()
}

async fn an_agent_gets_a_bundle_it_reads_or_the_reason_it_gets_none(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 1).await;
    let node = &nodes[0];

    // A newer agent that reads only a format this API does not render: refused, by reason.
    let refused = first_fetch(
        &app,
        node,
        &[("Accept", V3_ONLY), ("User-Agent", "exk8s-agent/9.0.0")],
    )
    .await;
    assert_eq!(refused.status(), 406);
    let said = json_of(refused).await;
    let message = said["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(V3_ONLY)
            && message.contains(BUNDLE_PAYLOAD_TYPE)
            && message.contains("put an agent"),
        "{said}"
    );
    assert_eq!(said["error"]["code"], "not_acceptable");
    let viewed = node_view(&app, node).await;
    assert_eq!(
        viewed["serial"], 0,
        "no serial spent on a refusal: {viewed}"
    );

    // An agent from before the announcement (no Accept, no release) gets the v2 bundle.
    let served = first_fetch(&app, node, &[]).await;
    assert_eq!(served.status(), 200);
    let envelope: serde_json::Value = served.json().await.unwrap();
    assert_eq!(envelope["payloadType"], BUNDLE_PAYLOAD_TYPE);
    assert!(node_view(&app, node).await.get("agent_version").is_none());

    // Today's agent: it reads v2 and names its release, which its node then shows.
    let key = NodeKey::generate().unwrap();
    register(&app, node, &key).await;
    let current = first_fetch(
        &app,
        node,
        &[
            ("Accept", BUNDLE_PAYLOAD_TYPE),
            ("User-Agent", "exk8s-agent/0.1.0"),
        ],
    )
    .await;
    assert_eq!(current.status(), 200);
    assert_eq!(node_view(&app, node).await["agent_version"], "0.1.0");
    assert_eq!(
        crate::bootstrap::report(&app, node, "complete", "succeeded").await,
        204
    );

    // The signed update fetch says the same: a rollout's bundle goes to an agent that reads it,
    // and one that does not is told why.
    let started = app
        .post(&format!("/clusters/{}/rollout", node.cluster))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    let update = |accept: &'static str, agent: &'static str| {
        let mut signing = Signing::new(&key, &node.imds);
        signing.headers = vec![
            ("Accept", accept.to_owned()),
            ("User-Agent", agent.to_owned()),
        ];
        let path = format!("/nodes/{}/bundle", node.vm);
        let app = &app;
        async move { send(app, "GET", &path, b"", &signing).await }
    };
    let refused = update(V3_ONLY, "exk8s-agent/9.0.0").await;
    assert_eq!(refused.status(), 406);
    assert!(
        json_of(refused).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains(V3_ONLY)
    );
    let served = update(BUNDLE_PAYLOAD_TYPE, "exk8s-agent/0.2.0").await;
    assert_eq!(served.status(), 200);
    assert_eq!(node_view(&app, node).await["agent_version"], "0.2.0");
}

both_backends!(an_agent_gets_a_bundle_it_reads_or_the_reason_it_gets_none);
