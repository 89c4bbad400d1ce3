//! Operators' short-lived credentials on SQLite and PostgreSQL (`POST
//! /clusters/{id}/credentials`, `GET /clusters/{id}/trust`, what `exk8s credential` calls):
//! an admin client certificate of eight hours that openssl verifies against the CA the answer
//! names, whose key matches it, recorded in the inventory; the trust a client needs carries the
//! cluster CA's standby and follows a cluster-CA rotation (old and new — the standby — while
//! trust-both and sign-new, then the new alone, then the new and a new standby), and the CA
//! that signs a credential is the one that signs leaves in each phase. Another org's
//! cluster is 404, no token 401.

use serde_json::Value;

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::helpers::openssl;
use crate::rotation::{booted, every_node_syncs, phase, rotate};

async fn mint(app: &TestApp, cluster: i64) -> Value {
    let response = app
        .post(&format!("/clusters/{cluster}/credentials"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

async fn trust(app: &TestApp, cluster: i64) -> Value {
    json_of(
        app.get(&format!("/clusters/{cluster}/trust"))
            .send()
            .await
            .unwrap(),
    )
    .await
}

fn certificates(pem: &str) -> Vec<String> {
    pem.split_inclusive("-----END CERTIFICATE-----")
        .filter(|c| c.contains("-----BEGIN CERTIFICATE-----"))
        .map(|c| c.trim_start().to_owned())
        .collect()
}

/// `openssl x509 -text` of one PEM certificate: whether it read, and what it said.
fn openssl_text(pem: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("c.pem"), pem).unwrap();
    openssl(&["x509", "-noout", "-text", "-in", "c.pem"], dir.path())
}

/// openssl's word on a minted credential: it verifies against its issuer alone, its key is
/// the certificate's, its subject is the admin identity; its validity in seconds.
fn checked(credential: &Value) -> i64 {
    let dir = tempfile::tempdir().unwrap();
    let put = |name: &str, field: &str| {
        std::fs::write(dir.path().join(name), credential[field].as_str().unwrap()).unwrap();
    };
    put("cert.pem", "client_certificate_pem");
    put("key.pem", "client_key_pem");
    put("issuer.pem", "issuer_pem");
    let (ok, out) = openssl(
        &[
            "verify",
            "-purpose",
            "sslclient",
            "-CAfile",
            "issuer.pem",
            "cert.pem",
        ],
        dir.path(),
    );
    assert!(ok, "{out}");
    let (_, from_cert) = openssl(
        &["x509", "-noout", "-pubkey", "-in", "cert.pem"],
        dir.path(),
    );
    let (_, from_key) = openssl(&["pkey", "-pubout", "-in", "key.pem"], dir.path());
    assert_eq!(from_cert, from_key, "the key is the certificate's");
    let (_, subject) = openssl(
        &[
            "x509", "-noout", "-subject", "-nameopt", "RFC2253", "-in", "cert.pem",
        ],
        dir.path(),
    );
    assert_eq!(
        subject.trim(),
        "subject=CN=exk8s-admin,O=exk8s:cluster-admins"
    );
    let (_, dates) = openssl(
        &[
            "x509",
            "-noout",
            "-startdate",
            "-enddate",
            "-dateopt",
            "iso_8601",
            "-in",
            "cert.pem",
        ],
        dir.path(),
    );
    let at = |key: &str| {
        let text = dates
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .trim()
            .to_owned();
        time::OffsetDateTime::parse(
            &text.replace(' ', "T"),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap_or_else(|e| panic!("{text}: {e}"))
        .unix_timestamp()
    };
    let expires = time::OffsetDateTime::parse(
        credential["expires_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
    .unix_timestamp();
    assert_eq!(expires, at("notAfter="));
    at("notAfter=") - at("notBefore=")
}

async fn a_credential_lives_hours_and_follows_a_rotation(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, nodes, _) = booted(&app).await;

    // The CA in use, and the standby its next rotation will take.
    let before = trust(&app, cluster).await;
    let ca = certificates(before["certificate_authority_pem"].as_str().unwrap());
    assert_eq!(ca.len(), 2, "{before}");
    assert_ne!(ca[0], ca[1]);
    let (_, standby) = openssl_text(&ca[1]);
    assert!(standby.contains("Subject: CN = kubernetes-ca"), "{standby}");
    assert!(standby.contains("CA:TRUE"), "{standby}");
    assert!(
        before["server"].as_str().unwrap().starts_with("https://")
            && before["server"].as_str().unwrap().ends_with(":6443"),
        "{before}"
    );
    let first = mint(&app, cluster).await;
    assert_eq!(first["issuer_pem"].as_str().unwrap().trim(), ca[0].trim());
    assert_eq!(
        first["certificate_authority_pem"],
        before["certificate_authority_pem"]
    );
    let lifetime = checked(&first);
    // Eight hours, and the few minutes leaves are backdated by for clock skew.
    assert!(
        (8 * 3600..=8 * 3600 + 600).contains(&lifetime),
        "lived {lifetime} s"
    );
    let inventory = json_of(
        app.get(&format!("/clusters/{cluster}/certificates"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(
        inventory["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "operator.credential" && c["vm_id"].is_null()),
        "{inventory}"
    );

    // A rotation of the cluster CA: the trust carries both CAs until the old one is dropped,
    // and each phase's credential is signed by the CA that signs leaves in it.
    assert_eq!(
        rotate(&app, cluster, serde_json::json!({"ca": "cluster"}))
            .await
            .status(),
        202
    );
    let mut issuers = Vec::new();
    for expected in ["trust-both", "sign-new", "drop-old"] {
        assert_eq!(phase(&app, cluster).await.as_deref(), Some(expected));
        let now = trust(&app, cluster).await;
        let trusted = certificates(now["certificate_authority_pem"].as_str().unwrap());
        let credential = mint(&app, cluster).await;
        checked(&credential);
        let issuer = credential["issuer_pem"].as_str().unwrap().trim().to_owned();
        assert!(trusted.iter().any(|c| c.trim() == issuer), "{expected}");
        // The standby is the rotation's new CA (beside the old one until drop-old); the next
        // standby is made when the rotation ends.
        let count = if expected == "drop-old" { 1 } else { 2 };
        assert_eq!(trusted.len(), count, "{expected}: {now}");
        assert!(
            trusted.iter().any(|c| c.trim() == ca[1].trim()),
            "{expected}"
        );
        issuers.push(issuer);
        every_node_syncs(&app, &nodes).await;
    }
    assert_eq!(phase(&app, cluster).await, None);
    assert_eq!(
        issuers[0],
        ca[0].trim(),
        "trust-both: the old CA still signs"
    );
    assert_eq!(issuers[1], ca[1].trim(), "sign-new: the standby signs");
    assert_eq!(issuers[2], issuers[1]);
    let after = trust(&app, cluster).await;
    let after: Vec<String> = certificates(after["certificate_authority_pem"].as_str().unwrap())
        .iter()
        .map(|c| c.trim().to_owned())
        .collect();
    assert_eq!(after.len(), 2, "{after:?}");
    assert_eq!(after[0], issuers[2], "the new CA, not the old one");
    assert!(
        !ca.iter().any(|c| c.trim() == after[1]),
        "a new standby for the next rotation"
    );
    // An operator kubeconfig trusts the same.
    let kubeconfig = app
        .get(&format!("/clusters/{cluster}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let kubeconfig = kubeconfig.text().await.unwrap();
    let data = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap();
    use base64::Engine as _;
    let embedded = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    let embedded: Vec<String> = certificates(std::str::from_utf8(&embedded).unwrap())
        .iter()
        .map(|c| c.trim().to_owned())
        .collect();
    assert_eq!(embedded, after);

    // Another org's cluster is not found; without a token, nothing.
    let other =
        crate::app::operator_token(&app.state, 8, exk8s_api::tokens::Scope::Operator, 3600).await;
    for (method, path) in [
        ("POST", format!("/clusters/{cluster}/credentials")),
        ("GET", format!("/clusters/{cluster}/trust")),
        ("POST", "/clusters/999999/credentials".to_owned()),
    ] {
        let url = format!("{}{path}", app.url);
        let request = if method == "POST" {
            app.http.post(&url)
        } else {
            app.http.get(&url)
        };
        let token = if path.contains("999999") {
            &app.token
        } else {
            &other
        };
        let refused = request
            .try_clone()
            .unwrap()
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), 404, "{method} {path}");
        assert_eq!(
            request.send().await.unwrap().status(),
            401,
            "{method} {path}"
        );
    }
}

both_backends!(a_credential_lives_hours_and_follows_a_rotation);
