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
use std::time::Duration;

use base64::Engine as _;
use exk8s_tests::cluster::{agent_inside, agent_ok, found, install_recorded_artifacts};
use exk8s_tests::control_plane::{Node, kubectl, kubectl_until};
use exk8s_tests::dev::{start_dev, start_postgres_serve};
use exk8s_tests::netns::Lan;
use exk8s_tests::procs::binary;
use serde_json::{Value, json};

const READY: Duration = Duration::from_secs(120);
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

/// A running node and how to reach it.
struct Cluster<'a> {
    lan: &'a Lan,
    dir: &'a Path,
    root: &'a Path,
    dns_name: &'a str,
    admin: &'a Path,
}

impl Cluster<'_> {
    /// A fresh token of the service account, signed by whichever key the apiserver signs with.
    fn token(&self) -> String {
        let (ok, token, err) = kubectl(
            self.lan,
            0,
            self.admin,
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
                self.dns_name,
                self.root.join("etc/exk8s/pki/ca.pem").display()
            ),
        )
        .unwrap();
        let (ok, out, err) = kubectl(
            self.lan,
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
            self.lan,
            0,
            self.admin,
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
        std::fs::read_to_string(self.root.join("etc/exk8s/pki/service-account.pem"))
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
    let founded = found(
        &stack,
        dir,
        &json!({"control_plane_count": 1, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let vm = founded.vms[0];
    let root = dir.join(format!("vm-{vm}"));
    agent_ok(&stack, &founded, &root, vm, "run");
    install_recorded_artifacts(&root);
    let ip = founded.ip_of[&vm].clone();
    let dns_name = founded.created["control_plane_dns_name"]
        .as_str()
        .unwrap()
        .to_owned();
    let lan = Lan::new(&[&ip], 24, &format!("{ip} {dns_name}\n"));
    let mut node = Node::new(&root, 0);
    node.start_etcd(&lan);
    node.sync_static_pods(&lan);
    let admin = root.join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
    let ready = |node: &mut Node| {
        let ready = kubectl_until(
            &lan,
            &mut [node],
            0,
            &admin,
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok");
    };
    ready(&mut node);
    let cluster = Cluster {
        lan: &lan,
        dir,
        root: &root,
        dns_name: &dns_name,
        admin: &admin,
    };
    let (ok, _, err) = kubectl(&lan, 0, &admin, &["create", "serviceaccount", "robot"]);
    assert!(ok, "{err}");
    let before = cluster.token();
    let old_kid = kid(&before);
    assert_eq!(cluster.whoami(&before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(cluster.published(), vec![old_kid.clone()]);

    let name = founded.cluster.to_string();
    let exk8s = |args: &[&str]| {
        let out = std::process::Command::new(binary("exk8s"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir)
            .env("EXK8S_API", &stack.base)
            .env("EXK8S_TOKEN", &stack.token)
            .args(args)
            .output()
            .unwrap();
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
    let sync = |node: &mut Node| {
        let (mut agent, _api) = agent_inside(&lan, 0, &stack, &founded, &root, vm, "sync", READY);
        let out = node.run_agent(&lan, &mut agent);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // trust-both: the apiserver restarted with both public keys; the old key still signs.
    sync(&mut node);
    ready(&mut node);
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
    sync(&mut node);
    ready(&mut node);
    assert_eq!(cluster.key_file_keys(), 2);
    let after = cluster.token();
    assert_eq!(kid(&after), new_kid, "the new key signs");
    assert_eq!(cluster.whoami(&before).as_deref(), Ok(SERVICE_ACCOUNT));
    assert_eq!(cluster.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    // Every apiserver signs with the new key and no wait was asked for: the old key goes.
    assert_eq!(phase().as_deref(), Some("drop-old"));

    // drop-old: the new key alone; the token of the old one is refused.
    sync(&mut node);
    ready(&mut node);
    assert_eq!(cluster.key_file_keys(), 1);
    assert_eq!(cluster.published(), vec![new_kid.clone()]);
    let refused = cluster.whoami(&before).unwrap_err();
    assert!(refused.contains("Unauthorized"), "{refused}");
    assert_eq!(cluster.whoami(&after).as_deref(), Ok(SERVICE_ACCOUNT));
    let key = exk8s(&["-o", "json", "sa-key", &name]);
    assert!(key.get("rotation").is_none(), "the rotation ended: {key}");
    assert_eq!(key["age_days"], 0, "{key}");
    node.assert_running();
}
