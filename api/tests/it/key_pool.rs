//! The key pool through the API on SQLite and PostgreSQL: once an RSA cluster is founded its
//! nodes' leaf keys are made ahead; its bundle takes them and makes none on the request's time;
//! every key is its certificate's and none is used twice; then the cluster wants nothing more.
//! An ECDSA cluster is never pooled.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use base64::Engine as _;
use exk8s_common::verify;
use rcgen::PublicKeyData as _;
use serde_json::json;

use crate::app::{Backend, TestApp, WAIT, both_backends, credentials_for, json_of, valid_body};
use crate::bootstrap::{NONCE, fetch, keyring};

/// One value of the API's `/metrics`.
async fn metric(app: &TestApp, name: &str) -> u64 {
    let text = app.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("/metrics has no {name}"))
}

async fn found(app: &TestApp, algorithm: &str) -> serde_json::Value {
    let mut body = valid_body(1);
    body["key_algorithm"] = json!(algorithm);
    let response = app
        .post("/clusters")
        .header(WAIT.0, WAIT.1)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    json_of(response).await
}

/// Every PEM block of `label` in the bundle: in files and in kubeconfigs' `*-data` fields.
fn blocks(bundle: &exk8s_common::BundlePayload, label: &str) -> Vec<pem::Pem> {
    let mut texts = Vec::new();
    for file in &bundle.files {
        let Ok(text) = std::str::from_utf8(file.content.as_bytes()) else {
            continue;
        };
        texts.push(text.to_owned());
        for line in text.lines() {
            let Some((_, data)) = line.trim().split_once("-data: ") else {
                continue;
            };
            if let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(data.trim()) {
                texts.push(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
    }
    texts
        .iter()
        .flat_map(|t| pem::parse_many(t).unwrap_or_default())
        .filter(|p| p.tag() == label)
        .collect()
}

/// The bundle's private keys, by their public keys; each checked to be the key of one of its
/// certificates (or, for the service account, of its public key).
fn keys_matching_certificates(bundle: &exk8s_common::BundlePayload) -> Vec<Vec<u8>> {
    let spkis: BTreeSet<Vec<u8>> = blocks(bundle, "CERTIFICATE")
        .iter()
        .map(|c| {
            let (_, cert) = x509_parser::parse_x509_certificate(c.contents()).unwrap();
            cert.tbs_certificate.subject_pki.raw.to_vec()
        })
        .chain(
            blocks(bundle, "PUBLIC KEY")
                .iter()
                .map(|k| k.contents().to_vec()),
        )
        .collect();
    blocks(bundle, "PRIVATE KEY")
        .iter()
        .map(|k| {
            let pair = rcgen::KeyPair::try_from(k.contents()).unwrap();
            let spki = pair.subject_public_key_info();
            assert!(
                spkis.contains(&spki),
                "a key of the bundle is no certificate's"
            );
            spki
        })
        .collect()
}

async fn an_rsa_clusters_bundle_takes_keys_made_ahead(backend: Backend) {
    // What is checked is where the bundle's keys come from, not load shedding: on a loaded
    // machine (the booted clusters beside this suite) the bundle may outlast the default
    // deadline and be refused with 503, as the agent would be told to come back.
    let mut config = crate::app::test_config();
    config.bootstrap_deadline = Duration::from_secs(120);
    let app = crate::app::spawn_with(backend, config, None).await;
    found(&app, "ecdsa-p256").await;
    let created = found(&app, "rsa-2048").await;
    let node = &credentials_for(&app, 7, &created).await[0];

    // One control-plane node: eleven keys wanted, made by the filler (ECDSA wants none).
    let start = Instant::now();
    while metric(&app, "exk8s_key_pool_ready_keys").await < 11 {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the pool never filled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(metric(&app, "exk8s_key_pool_wanted_keys").await, 11);

    let ring = keyring(&app).await;
    let mut seen = BTreeSet::new();
    for fetched in 1..=2 {
        let bearer = format!("Bearer {}", node.bootstrap);
        let response = fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE).await;
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.unwrap();
        let bundle = verify(&body, &ring).unwrap();
        for spki in keys_matching_certificates(bundle.payload()) {
            // The node's stored serving keys come again; a minted key never does.
            seen.insert(spki);
        }
        let (pooled, fresh) = (
            metric(&app, "exk8s_bundle_keys_pooled_total").await,
            metric(&app, "exk8s_bundle_keys_fresh_total").await,
        );
        if fetched == 1 {
            assert_eq!(
                (pooled, fresh),
                (11, 0),
                "every key of the first bundle was made ahead"
            );
            assert_eq!(metric(&app, "exk8s_key_pool_ready_keys").await, 0);
            assert_eq!(metric(&app, "exk8s_key_pool_wanted_keys").await, 0);
        } else {
            // The node had its generation: nothing was made ahead for a second fetch.
            assert_eq!((pooled, fresh), (11, 11));
        }
    }
    // The stored keys (apiserver, etcd server and peer, service account) twice, 2 × 11 minted.
    assert_eq!(seen.len(), 4 + 2 * 11, "no minted key is used twice");
}

both_backends!(an_rsa_clusters_bundle_takes_keys_made_ahead);
