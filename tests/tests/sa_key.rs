//! Rotating a cluster's service-account signing key, for real: a founded cluster's node runs
//! etcd, kube-apiserver, kube-controller-manager and kube-scheduler from its bundle in a
//! namespace of its own; a service account's token is minted before anything; then `exk8s
//! rotate-sa-key CLUSTER --drop-old-after 0` and the node's agent, synced once per phase while
//! the harness plays systemd and the kubelet (each phase restarts the apiserver and the
//! controller-manager from the files it brought):
//!
//! - trust-both: the restarted apiserver publishes two keys (`/openid/v1/jwks`); tokens are
//!   still signed by the old key; the old token authenticates.
//! - sign-new: a new token is signed by the new key (another `kid`); both authenticate.
//! - drop-old: the apiserver publishes the new key alone; the token minted before the rotation
//!   is refused, the one minted after authenticates.
//!
//! Once on SQLite (`exk8s-api dev`, the API SIGKILLed and restarted between trust-both and
//! sign-new: it goes on from its journal) and once on PostgreSQL (`exk8s-api serve`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::Path;

use base64::Engine as _;
use exk8s_tests::cluster::agent_inside;
use exk8s_tests::control_plane::kubectl;
use exk8s_tests::dev::{Stack, start_dev, start_postgres_serve};

use exk8s_tests::one_node::{OneNode, READY, boot_one};
use serde_json::{Value, json};

const SERVICE_ACCOUNT: &str = "system:serviceaccount:default:robot";

/// The API's database.
#[derive(Clone, Copy)]
enum Store {
    /// `exk8s-api dev`: SQLite in its data directory.
    Sqlite,
    /// `exk8s-api serve` on a fresh PostgreSQL database.
    Postgres,
}

#[test]
fn the_service_account_key_rotates_under_a_real_apiserver() {
    rotated(Store::Sqlite, "10.232.0.0/24");
}

#[test]
fn the_service_account_key_rotates_under_a_real_apiserver_on_postgresql() {
    rotated(Store::Postgres, "10.234.0.0/24");
}

/// The `kid` a token's JWT header names.
fn kid(token: &str) -> String {
    let header = token.split('.').next().unwrap();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .unwrap();
    let header: Value = serde_json::from_slice(&header).unwrap();
    header["kid"].as_str().unwrap().to_owned()
}

/// The running node, and a directory for the test's own files.
struct Cluster<'a> {
    one: OneNode,
    dir: &'a Path,
}

impl Cluster<'_> {
    /// `exk8s-agent sync` on the node, then its apiserver ready again.
    fn sync(&mut self, stack: &Stack) {
        let one = &mut self.one;
        let (mut agent, _api) = agent_inside(
            &one.lan,
            0,
            stack,
            &one.founded,
            &one.root,
            one.vm,
            "sync",
            READY,
        );
        let out = one.node.run_agent(&one.lan, &mut agent);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        one.ready();
    }

    /// A fresh token of the service account, signed by whichever key the apiserver signs with.
    fn token(&self) -> String {
        let (ok, token, err) = kubectl(
            &self.one.lan,
            0,
            &self.one.super_admin,
            &["create", "token", "robot", "--duration=2h"],
        );
        assert!(ok, "{err}");
        token.trim().to_owned()
    }

    /// Who `token` authenticates as, or kubectl's error.
    fn whoami(&self, token: &str) -> Result<String, String> {
        let config = self.dir.join("token.kubeconfig");
        std::fs::write(
            &config,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{}:6443\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n",
                self.one.dns_name,
                self.one.root.join("etc/exk8s/pki/ca.pem").display()
            ),
        )
        .unwrap();
        let (ok, out, err) = kubectl(
            &self.one.lan,
            0,
            &config,
            &[
                "auth",
                "whoami",
                "-o",
                "jsonpath={.status.userInfo.username}",
            ],
        );
        if ok { Ok(out) } else { Err(err) }
    }

    /// The key ids the apiserver publishes (`/openid/v1/jwks`).
    fn published(&self) -> Vec<String> {
        let (ok, out, err) = kubectl(
            &self.one.lan,
            0,
            &self.one.super_admin,
            &["get", "--raw", "/openid/v1/jwks"],
        );
        assert!(ok, "{err}");
        let jwks: Value = serde_json::from_str(&out).unwrap();
        jwks["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The public keys in the apiserver's `--service-account-key-file`.
    fn key_file_keys(&self) -> usize {
        std::fs::read_to_string(self.one.root.join("etc/exk8s/pki/service-account.pem"))
            .unwrap()
            .matches("-----BEGIN PUBLIC KEY-----")
            .count()
    }
}

fn rotated(store: Store, sim_cidr: &str) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let stack = match store {
        Store::Sqlite => start_dev(&dir.join("dev"), sim_cidr, &dir.join("api.log"), &[]),
        Store::Postgres => start_postgres_serve(dir, sim_cidr, &[]),
    };
    let mut cluster = Cluster {
        one: boot_one(&stack, dir, &json!({})),
        dir,
    };
    let (ok, _, err) = kubectl(
        &cluster.one.lan,
        0,
        &cluster.one.super_admin,
        &["create", "serviceaccount", "robot"],
    );
    assert!(ok, "{err}");
    let before = cluster.token();
    let old_kid = kid(&before);
    assert_eq!(cluster.whoami(&before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(cluster.published(), vec![old_kid.clone()]);

    let name = cluster.one.founded.cluster.to_string();
    let exk8s = |args: &[&str]| {
        let out = stack.exk8s(dir, args);
        assert!(
            out.status.success(),
            "exk8s {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let phase = || {
        exk8s(&["-o", "json", "sa-key", &name])["rotation"]["phase"]
            .as_str()
            .map(str::to_owned)
    };
    let started = exk8s(&[
        "-o",
        "json",
        "rotate-sa-key",
        &name,
        "--drop-old-after",
        "0",
    ]);
    assert_eq!(started["phase"], "trust-both", "{started}");
    // trust-both: the apiserver restarted with both public keys; the old key still signs.
    cluster.sync(&stack);
    assert_eq!(cluster.key_file_keys(), 2);
    let published = cluster.published();
    assert_eq!(published.len(), 2, "{published:?}");
    assert!(published.contains(&old_kid));
    let new_kid = published.iter().find(|k| **k != old_kid).unwrap().clone();
    assert_eq!(kid(&cluster.token()), old_kid, "the old key still signs");
    assert_eq!(cluster.whoami(&before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(phase().as_deref(), Some("sign-new"));

    // The API dies between phases (SIGKILL) and comes back: the journal says where it was.
    // (On `dev`, whose simulated cloud is kept in its data directory.)
    if matches!(store, Store::Sqlite) {
        stack.kill_and_restart();
    }

    // sign-new: the new key signs; tokens of both keys authenticate.
    cluster.sync(&stack);
    assert_eq!(cluster.key_file_keys(), 2);
    let after = cluster.token();
    assert_eq!(kid(&after), new_kid, "the new key signs");
    assert_eq!(cluster.whoami(&before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(cluster.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    // Every apiserver signs with the new key and no wait was asked for: the old key goes.
    assert_eq!(phase().as_deref(), Some("drop-old"));

    // drop-old: the new key alone; the token of the old one is refused.
    cluster.sync(&stack);
    assert_eq!(cluster.key_file_keys(), 1);
    assert_eq!(cluster.published(), vec![new_kid.clone()]);
    let refused = cluster.whoami(&before).unwrap_err();
    assert!(refused.contains("Unauthorized"), "{refused}");
    assert_eq!(cluster.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    let key = exk8s(&["-o", "json", "sa-key", &name]);
    assert!(key.get("rotation").is_none(), "the rotation ended: {key}");
    assert_eq!(key["age_days"], 0, "{key}");
    cluster.one.node.assert_running();
}
