//! Every node-signed route refuses what the generation route refuses, before it looks at what
//! it is asked: no signature, a malformed one, another VM's key, a stale timestamp (401, one
//! body for all), and another VM's path signed by this VM (404: nothing about it revealed). (An
//! upload is signed over the digest it declares in a header: it names that digest, as the
//! agent's uploads do.) The
//! routes added for snapshots and restores (`PUT /nodes/{vm}/snapshots/{sid}`, `GET
//! /nodes/{vm}/snapshots/{sid}/content`, `PUT /nodes/{vm}/restores/{rid}`) and the older ones,
//! on SQLite and PostgreSQL.

use exk8s_common::names::Sha256Digest;
use exk8s_common::node_auth::{CONTENT_SHA256_HEADER, NodeKey};

use crate::app::{Backend, both_backends, cluster_with_credentials, spawn_app};
use crate::sync::{Signing, register, send};

async fn every_node_route_refuses_a_bad_signature(backend: Backend) {
    let app = spawn_app(backend).await;
    let nodes = cluster_with_credentials(&app, 7, 3).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let (key_a, key_b) = (NodeKey::generate().unwrap(), NodeKey::generate().unwrap());
    register(&app, a, &key_a).await;
    register(&app, b, &key_b).await;
    let ack = br#"{"step":"stop","failure":""}"#.as_slice();
    let routes: [(&str, String, &[u8]); 6] = [
        ("GET", "generation".into(), b""),
        ("GET", "bundle".into(), b""),
        (
            "POST",
            "status".into(),
            br#"{"phase":"complete","state":"succeeded"}"#,
        ),
        ("PUT", "snapshots/1".into(), b"snapshot bytes"),
        ("GET", "snapshots/1/content".into(), b""),
        ("PUT", "restores/1".into(), ack),
    ];
    let mut bodies = Vec::new();
    for (method, route, body) in routes {
        let path = format!("/nodes/{}/{route}", a.vm);
        let headers = if route.starts_with("snapshots/") && method == "PUT" {
            vec![(CONTENT_SHA256_HEADER, Sha256Digest::of(body).to_hex())]
        } else {
            Vec::new()
        };
        let signing = |key: &'static str| {
            let (key, imds) = match key {
                "a" => (&key_a, &a.imds),
                _ => (&key_b, &a.imds),
            };
            Signing {
                headers: headers.clone(),
                ..Signing::new(key, imds)
            }
        };
        let absent = Signing {
            key: None,
            ..signing("a")
        };
        let malformed = Signing {
            signature: Some("not-a-signature".into()),
            ..signing("a")
        };
        let stale = Signing {
            timestamp: exk8s_api::db::now() - 301,
            ..signing("a")
        };
        for (case, signing) in [
            ("absent", &absent),
            ("malformed", &malformed),
            ("another VM's key", &signing("b")),
            ("stale", &stale),
        ] {
            let response = send(&app, method, &path, body, signing).await;
            assert_eq!(response.status(), 401, "{method} {path}: {case}");
            bodies.push(response.text().await.unwrap());
        }
        let other = format!("/nodes/{}/{route}", b.vm);
        let response = send(&app, method, &other, body, &signing("a")).await;
        assert_eq!(
            response.status(),
            404,
            "{method} {other} signed by another VM"
        );
    }
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 1, "one 401 body for every case: {bodies:?}");
}

both_backends!(every_node_route_refuses_a_bad_signature);
