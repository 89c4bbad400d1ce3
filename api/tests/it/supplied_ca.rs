//! Bring your own CA, on SQLite and PostgreSQL, with CAs made by openssl (an independent
//! maker): a cluster founded on a supplied RSA cluster CA and a P-384 etcd CA (SEC1 key)
//! issues every leaf under them — the admin kubeconfig, every file of a node's bundle — as
//! `openssl verify -x509_strict` confirms, and its front-proxy CA is its own. Every bad CA is a
//! 422 naming the field, with no cluster, row or VM left behind.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use exk8s_api::clock::ManualClock;
use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};
use time::{Duration, OffsetDateTime};

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app, spawn_clocked, test_config};
use crate::helpers::openssl;
use crate::sync::register;

const CA_USAGE: &str = "keyUsage=critical,keyCertSign,cRLSign,digitalSignature";

/// A self-signed certificate made by `openssl req`: `key` is `rsa:N` or a key file already
/// in `dir`; `ext` the extensions.
fn openssl_cert(dir: &Path, name: &str, key: &str, days: &str, ext: &[&str]) -> (String, String) {
    openssl_cert_of(dir, name, key, days, "/CN=brought-ca", ext)
}

/// [`openssl_cert`] with the subject `subj` (`openssl req -subj` form).
fn openssl_cert_of(
    dir: &Path,
    name: &str,
    key: &str,
    days: &str,
    subj: &str,
    ext: &[&str],
) -> (String, String) {
    let (cert, key_file) = (format!("{name}.pem"), format!("{name}-key.pem"));
    let mut args = vec![
        "req", "-x509", "-nodes", "-sha256", "-days", days, "-subj", subj, "-out", &cert,
    ];
    if key.starts_with("rsa:") {
        args.extend(["-newkey", key, "-keyout", &key_file]);
    } else {
        std::fs::copy(dir.join(key), dir.join(&key_file)).unwrap();
        args.extend(["-key", &key_file]);
    }
    for e in ext {
        args.extend(["-addext", e]);
    }
    let (ok, out) = openssl(&args, dir);
    assert!(ok, "{out}");
    (
        std::fs::read_to_string(dir.join(cert)).unwrap(),
        std::fs::read_to_string(dir.join(key_file)).unwrap(),
    )
}

fn ca(dir: &Path, name: &str, key: &str) -> (String, String) {
    openssl_cert(
        dir,
        name,
        key,
        "3650",
        &["basicConstraints=critical,CA:TRUE", CA_USAGE],
    )
}

/// An EC key in SEC1 form (`EC PRIVATE KEY`), as `openssl ecparam` writes it.
fn ec_key(dir: &Path, name: &str, curve: &str) -> String {
    let file = format!("{name}.key");
    let args = [
        "ecparam", "-name", curve, "-genkey", "-noout", "-out", &file,
    ];
    let (ok, out) = openssl(&args, dir);
    assert!(ok, "{out}");
    file
}

fn pair((cert, key): &(String, String)) -> Value {
    json!({"cert_pem": cert, "key_pem": key})
}

/// Verifies `leaf` against `ca` with openssl, strictly.
fn chains(dir: &Path, ca: &str, leaf: &[u8], what: &str) {
    std::fs::write(dir.join("check-ca.pem"), ca).unwrap();
    std::fs::write(dir.join("check-leaf.pem"), leaf).unwrap();
    let (ok, out) = openssl(
        &[
            "verify",
            "-x509_strict",
            "-CAfile",
            "check-ca.pem",
            "check-leaf.pem",
        ],
        dir,
    );
    assert!(ok, "{what} does not chain to its CA: {out}");
}

/// The client certificate a kubeconfig carries.
fn client_cert(kubeconfig: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let doc: yaml_serde::Value = yaml_serde::from_slice(kubeconfig).unwrap();
    let decode = |v: &yaml_serde::Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };
    (
        decode(&doc["clusters"][0]["cluster"]["certificate-authority-data"]),
        decode(&doc["users"][0]["user"]["client-certificate-data"]),
    )
}

async fn a_cluster_founded_on_brought_cas_issues_every_leaf_under_them(backend: Backend) {
    let logs = crate::app::capture_logs();
    let app = spawn_app(backend).await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let cluster_ca = ca(dir, "cluster", "rsa:2048");
    let etcd_key = ec_key(dir, "etcd", "secp384r1");
    let etcd_ca = ca(dir, "etcd", &etcd_key);
    assert!(etcd_ca.1.contains("BEGIN EC PRIVATE KEY"), "a SEC1 key");

    let created = app
        .found(
            1,
            json!({"certificate_authorities": {
                "cluster": pair(&cluster_ca),
                "etcd": pair(&etcd_ca),
            }}),
        )
        .await;
    assert_eq!(created.status(), 201);
    let created = json_of(created).await;
    let cluster = created["cluster_id"].as_i64().unwrap();

    // The operator's kubeconfig trusts the brought CA, and its client certificate chains to it.
    let kubeconfig = app
        .get(&format!("/clusters/{cluster}/kubeconfig"))
        .send()
        .await
        .unwrap();
    assert_eq!(kubeconfig.status(), 200);
    let (trusted, client) = client_cert(&kubeconfig.bytes().await.unwrap());
    let trusted = String::from_utf8(trusted).unwrap();
    assert!(trusted.starts_with(cluster_ca.0.trim()), "{trusted}");
    assert_eq!(
        trusted.matches("-----BEGIN CERTIFICATE-----").count(),
        2,
        "the brought CA, and the standby its next rotation takes"
    );
    chains(dir, &cluster_ca.0, &client, "the admin kubeconfig");

    // Every leaf of a node's bundle chains to the CA of its trust domain.
    let node = &crate::app::credentials_for(&app, 7, &created).await[0];
    let payload = register(&app, node, &NodeKey::generate().unwrap()).await;
    let file = |name: &str| {
        let content = payload
            .files
            .iter()
            .find(|f| f.path.as_str().ends_with(name))
            .unwrap_or_else(|| panic!("{name} in the bundle"))
            .content
            .as_bytes();
        String::from_utf8(content.to_vec()).unwrap()
    };
    assert_eq!(file("/pki/ca.pem").trim(), cluster_ca.0.trim());
    assert_eq!(file("/pki/etcd-ca.pem").trim(), etcd_ca.0.trim());
    let front_proxy_ca = file("/pki/front-proxy-ca.pem");
    assert_ne!(front_proxy_ca.trim(), cluster_ca.0.trim());
    assert_ne!(front_proxy_ca.trim(), etcd_ca.0.trim());
    let mut checked = 0;
    for f in &payload.files {
        let path = f.path.as_str();
        let name = path.rsplit('/').next().unwrap();
        let leaf = if path.ends_with(".kubeconfig") {
            client_cert(f.content.as_bytes()).1
        } else if name.ends_with(".pem")
            && !name.ends_with("ca.pem")
            && f.content.as_bytes().starts_with(b"-----BEGIN CERTIFICATE")
        {
            f.content.as_bytes().to_vec()
        } else {
            continue;
        };
        let signer = if name.starts_with("etcd-") || name == "apiserver-etcd-client.pem" {
            &etcd_ca.0
        } else if name.starts_with("front-proxy-") {
            &front_proxy_ca
        } else {
            &cluster_ca.0
        };
        chains(dir, signer, &leaf, path);
        checked += 1;
    }
    assert!(checked >= 14, "{checked} leaves checked");

    // The brought keys are sealed at rest like generated ones.
    use sqlx::Row as _;
    let row = sqlx::query("SELECT ca_key_sealed, etcd_ca_key_sealed FROM clusters WHERE id = $1")
        .bind(cluster)
        .fetch_one(&app.state.db.pool)
        .await
        .unwrap();
    for column in ["ca_key_sealed", "etcd_ca_key_sealed"] {
        let sealed: String = row.get(column);
        assert!(!sealed.contains("PRIVATE KEY"), "{column} is sealed");
    }
    let logged = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    for key in [&cluster_ca.1, &etcd_ca.1] {
        let body = key.lines().nth(1).unwrap();
        assert!(!logged.contains(body), "a brought key reached the logs");
    }
}

both_backends!(a_cluster_founded_on_brought_cas_issues_every_leaf_under_them);

/// `POST /clusters` with `cas` is refused with 422 naming `field`, the message containing
/// `why`, and leaves nothing behind.
async fn refused(app: &TestApp, cas: Value, field: &str, why: &str) {
    let answer = app.found(1, json!({"certificate_authorities": cas})).await;
    assert_eq!(answer.status(), 422, "{field}: {why}");
    let body = json_of(answer).await;
    assert_eq!(body["error"]["field"], field, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(why), "{field}: {message}");
    assert!(!message.contains("PRIVATE KEY"), "{message}");
    assert_eq!(app.cluster_count().await, 0, "no cluster row");
    assert!(app.sims.compute.vms().is_empty(), "no VM");
}

async fn every_bad_ca_is_refused_naming_its_field(backend: Backend) {
    // Three days from now: a CA made for one day has expired.
    let later = OffsetDateTime::now_utc() + Duration::days(3);
    let app = spawn_clocked(
        backend,
        test_config(),
        None,
        Arc::new(ManualClock::starting_at(later)),
    )
    .await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let good = ca(dir, "good", "rsa:2048");
    let other = ca(dir, "other", "rsa:2048");
    let cert = "certificate_authorities.cluster.cert_pem";
    let key = "certificate_authorities.cluster.key_pem";

    let leaf = openssl_cert(
        dir,
        "leaf",
        "rsa:2048",
        "3650",
        &["basicConstraints=critical,CA:FALSE"],
    );
    refused(&app, json!({"cluster": pair(&leaf)}), cert, "not a CA").await;
    let no_sign = openssl_cert(
        dir,
        "nosign",
        "rsa:2048",
        "3650",
        &[
            "basicConstraints=critical,CA:TRUE",
            "keyUsage=critical,digitalSignature",
        ],
    );
    refused(
        &app,
        json!({"cluster": pair(&no_sign)}),
        cert,
        "keyCertSign",
    )
    .await;
    let mismatch = json!({"cert_pem": good.0, "key_pem": other.1});
    refused(&app, json!({"cluster": mismatch}), key, "does not match").await;
    let expired = openssl_cert(
        dir,
        "expired",
        "rsa:2048",
        "1",
        &["basicConstraints=critical,CA:TRUE", CA_USAGE],
    );
    refused(&app, json!({"cluster": pair(&expired)}), cert, "expired at").await;
    let short = openssl_cert(
        dir,
        "short",
        "rsa:2048",
        "60",
        &["basicConstraints=critical,CA:TRUE", CA_USAGE],
    );
    refused(
        &app,
        json!({"cluster": pair(&short)}),
        cert,
        "before one leaf lifetime (365 days)",
    )
    .await;
    let twice = openssl_cert_of(
        dir,
        "twice",
        "rsa:2048",
        "3650",
        "/OU=a/OU=b/CN=brought-ca",
        &["basicConstraints=critical,CA:TRUE", CA_USAGE],
    );
    refused(
        &app,
        json!({"cluster": pair(&twice)}),
        cert,
        "names the attribute 2.5.4.11 twice",
    )
    .await;
    let weak = ca(dir, "weak", "rsa:1024");
    refused(&app, json!({"cluster": pair(&weak)}), cert, "RSA-1024").await;
    let p521 = ec_key(dir, "p521", "secp521r1");
    let p521 = ca(dir, "p521", &p521);
    refused(&app, json!({"cluster": pair(&p521)}), cert, "curve P-521").await;
    let (ok, out) = openssl(
        &["genpkey", "-algorithm", "ed25519", "-out", "ed25519.key"],
        dir,
    );
    assert!(ok, "{out}");
    let ed25519 = ca(dir, "ed25519", "ed25519.key");
    refused(
        &app,
        json!({"cluster": pair(&ed25519)}),
        cert,
        "type Ed25519",
    )
    .await;
    let garbage = json!({"cert_pem": "-----BEGIN CERTIFICATE-----\nbm9wZQ==\n-----END CERTIFICATE-----\n", "key_pem": good.1});
    refused(&app, json!({"cluster": garbage}), cert, "not an X.509").await;
    let text = json!({"cert_pem": "hello", "key_pem": good.1});
    refused(&app, json!({"cluster": text}), cert, "is not PEM").await;
    let chain = json!({"cert_pem": format!("{}{}", good.0, other.0), "key_pem": good.1});
    refused(&app, json!({"cluster": chain}), cert, "exactly one").await;
    let no_key = json!({"cert_pem": good.0});
    refused(&app, json!({"cluster": no_key}), key, "is required").await;
    let bad_key = json!({"cert_pem": good.0, "key_pem": "-----BEGIN PRIVATE KEY-----\nbm9wZQ==\n-----END PRIVATE KEY-----\n"});
    refused(
        &app,
        json!({"cluster": bad_key}),
        key,
        "not a PEM private key",
    )
    .await;
    refused(
        &app,
        json!({"cluster": pair(&good), "etcd": pair(&good)}),
        "certificate_authorities.etcd.cert_pem",
        "separate CAs",
    )
    .await;
    refused(
        &app,
        json!({"front_proxy": {"key_pem": good.1}}),
        "certificate_authorities.front_proxy.cert_pem",
        "is required",
    )
    .await;
    refused(&app, json!({}), "certificate_authorities", "names no CA").await;

    // A short-lived CA is fine for short-lived leaves; a PKCS#1 key is read too.
    let (ok, out) = openssl(
        &[
            "rsa",
            "-in",
            "good-key.pem",
            "-traditional",
            "-out",
            "good-pkcs1.pem",
        ],
        dir,
    );
    assert!(ok, "{out}");
    let pkcs1 = std::fs::read_to_string(dir.join("good-pkcs1.pem")).unwrap();
    assert!(pkcs1.contains("BEGIN RSA PRIVATE KEY"), "{}", &pkcs1[..40]);
    let accepted = app
        .found(
            1,
            json!({"leaf_lifetime_days": 30, "certificate_authorities": {
                "cluster": pair(&short),
                "etcd": {"cert_pem": good.0, "key_pem": pkcs1},
            }}),
        )
        .await;
    assert_eq!(accepted.status(), 201, "{}", accepted.text().await.unwrap());
}

both_backends!(every_bad_ca_is_refused_naming_its_field);

#[test]
fn a_brought_key_never_prints() {
    let request: exk8s_api::founding::request::CreateClusterRequest = serde_json::from_value(
        json!({"certificate_authorities": {"cluster": {"cert_pem": "c", "key_pem": "-----BEGIN PRIVATE KEY-----\nsecret\n"}}}),
    )
    .unwrap();
    let printed = format!("{request:?}");
    assert!(!printed.contains("secret"), "{printed}");
    assert!(printed.contains("[redacted]"), "{printed}");
}
