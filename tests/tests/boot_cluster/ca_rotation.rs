//! The cluster CA's rotation on three booted members (`POST …/certificates/rotate-ca`): its
//! three phases — trust-both, sign-new, drop-old — each applied by every member's sync unit,
//! one member at a time, while the first machine sends requests through its node-local
//! balancer and through HAProxy several times a second ([`super::scale::sampled`]): not one
//! fails. Clients as an operator holds them:
//!
//! - the kubeconfig `exk8s kubeconfig --exec` wrote before the rotation (its user runs
//!   `exk8s credential`, client-go's exec credential plugin) works after every phase with no
//!   operator action: the plugin reuses its cached certificate until the CA that signed it is
//!   dropped, then mints one under the new CA;
//! - so does a copy of it whose trust file is the one the plugin wrote before the rotation,
//!   never updated — what a kubectl holds that read the file before: it carries the cluster
//!   CA's standby, which the rotation takes as its new CA;
//! - the operator kubeconfig fetched before the rotation is refused at the end — not for the
//!   apiserver's certificate but for its own, signed by the CA that was dropped — and a new one
//!   works.
//!
//! Before the cluster grows, its one member goes through the front proxy's CA's rotation
//! (`exk8s rotate-ca`, one sync per phase): after each phase the apiserver believes the front
//! proxy's client certificate of the moment about who calls (`X-Remote-User`, what an
//! aggregated API server is told); at the end the one from before, signed by the CA dropped,
//! is not believed.
//!
//! Then the etcd CA rotates on the three members, sampled the same way: after each phase every
//! member's etcd answers a client holding any member's identity of the moment; systemd
//! restarted each member's etcd once a phase; at the end a client certificate signed by the
//! CA dropped is refused by every member.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use exk8s_tests::bins::kubernetes;
use exk8s_tests::cluster::{operator, operator_kubeconfig, view};
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::{binary, wait_until};
use serde_json::json;

use super::control_plane::{hand, kubectl_with};
use super::haproxy::Haproxy;
use super::one_node::OneNode;
use super::sampler::etcd_status_as;
use super::scale::sampled;

/// Where the first machine reaches HAProxy, in front of every member ([`super::haproxy`]).
const HAPROXY: &str = "https://127.0.0.1:8443";

/// kubectl on the first machine's LAN through the kubeconfig `exk8s kubeconfig --exec` wrote,
/// each run calling `exk8s credential` (on PATH, logged in through EXK8S_TOKEN, its cache in
/// the test's directory); the apiservers reached through HAProxy by the control plane's name.
struct Plugin<'a> {
    machine: &'a Machine,
    dns_name: &'a str,
    kubeconfig: PathBuf,
    /// [`Self::frozen`] before the rotation.
    frozen_before: PathBuf,
    cache: PathBuf,
    path: std::ffi::OsString,
    token: String,
}

impl<'a> Plugin<'a> {
    fn new(node: &'a OneNode<'_>) -> Self {
        let dir = node.dir.join("plugin");
        let cache = dir.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        let exk8s = binary("exk8s");
        let mut path = exk8s.parent().unwrap().as_os_str().to_owned();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let written = Command::new(&exk8s)
            .env("EXK8S_API", &node.stack.base)
            .env("EXK8S_TOKEN", &node.stack.token)
            .env("XDG_CACHE_HOME", &cache)
            .args(["kubeconfig", &node.cluster.to_string(), "--exec"])
            .output()
            .unwrap();
        assert!(
            written.status.success(),
            "{}",
            String::from_utf8_lossy(&written.stderr)
        );
        let kubeconfig = dir.join("exec.kubeconfig");
        std::fs::write(&kubeconfig, &written.stdout).unwrap();
        let mut plugin = Self {
            machine: &node.machine,
            dns_name: &node.dns_name,
            kubeconfig,
            frozen_before: PathBuf::new(),
            cache,
            path,
            token: node.stack.token.clone(),
        };
        plugin.works("before the rotation");
        plugin.frozen_before = plugin.frozen(&dir);
        plugin
    }

    /// `kubectl get --raw /api` through the plugin succeeds (at `step`).
    fn works(&self, step: &str) {
        self.works_through(&self.kubeconfig, step);
    }

    /// A copy of the plugin's kubeconfig naming a copy of the trust file its last run wrote,
    /// which nothing updates: what a kubectl holds that read the file before a rotation.
    fn frozen(&self, dir: &Path) -> PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig).unwrap();
        let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
        let trust = doc["clusters"][0]["cluster"]["certificate-authority"]
            .as_str()
            .expect("the exec kubeconfig names a trust file")
            .to_owned();
        let copy = dir.join("frozen-ca.pem");
        std::fs::copy(&trust, &copy).unwrap();
        let kubeconfig = dir.join("frozen.kubeconfig");
        std::fs::write(&kubeconfig, text.replace(&trust, copy.to_str().unwrap())).unwrap();
        kubeconfig
    }

    /// `kubectl get --raw /api` through the plugin with `kubeconfig` succeeds (at `step`):
    /// through HAProxy, the apiserver verified by the control plane's name.
    fn works_through(&self, kubeconfig: &Path, step: &str) {
        let kubectl = kubernetes("kubectl");
        let out = self
            .machine
            .on_lan(kubectl.to_str().unwrap())
            .env("PATH", &self.path)
            .env("EXK8S_TOKEN", &self.token)
            .env("XDG_CACHE_HOME", &self.cache)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--server", HAPROXY, "--tls-server-name", self.dns_name])
            .args(["--request-timeout=10s", "get", "--raw", "/api"])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("APIVersions"),
            "kubectl through exk8s credential, {step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cached credential's certificate (PEM); the cache file is private.
    fn cached_certificate(&self) -> String {
        let dir = self.cache.join("exk8s/credentials");
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "json"))
            .expect("a cached credential");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&file).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600, "{}", file.display());
        let cached: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        cached["client_certificate_pem"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// The rotation's phase now, or `None` once it is over.
fn phase(node: &OneNode<'_>) -> Option<String> {
    view(node.stack, node.cluster)["ca_rotation"]["phase"]
        .as_str()
        .map(str::to_owned)
}

/// `GET /api` on the first machine through `kubeconfig` (a path inside it).
fn api_through(node: &OneNode<'_>, kubeconfig: &str) -> Result<String, String> {
    kubectl_with(&node.machine, kubeconfig, &["get", "--raw", "/api"])
}

/// The operator kubeconfig the API hands out now, written into the first machine as `name`
/// (its path there), once `GET /api` through it works.
fn fresh_operator_kubeconfig(node: &OneNode<'_>, name: &str) -> String {
    let config = hand(
        &node.machine,
        name,
        &operator_kubeconfig(node.stack, node.cluster),
    );
    let api = api_through(node, &config);
    assert!(
        api.as_deref().is_ok_and(|a| a.contains("APIVersions")),
        "{name}: {api:?}"
    );
    config
}

/// The module doc's rotation on `node`'s cluster, which has three members, with `outside` (the
/// DNS-following HAProxy) in front of them.
/// Rotates `ca` (`cluster` or `etcd`) through its three phases, sampled ([`sampled`]): after
/// every member applied each phase, `after_phase` checks what that phase must leave working.
fn rotate_sampled(node: &OneNode<'_>, ca: &str, after_phase: impl Fn(&str)) {
    let id = node.cluster;
    let phases = sampled(node, &format!("the {ca} CA's rotation"), || {
        let started: serde_json::Value = operator(
            node.stack,
            "POST",
            &format!("/clusters/{id}/certificates/rotate-ca"),
        )
        .send_json(json!({ "ca": ca }))
        .unwrap()
        .into_json()
        .unwrap();
        assert_eq!(started["phase"], "trust-both", "{started}");
        let mut phases = Vec::new();
        while let Some(now) = phase(node) {
            assert!(phases.len() < 3, "the rotation does not end: {phases:?}");
            wait_until(
                &format!("every member applied the {ca} CA's {now} phase"),
                Duration::from_secs(900),
                || {
                    node.machine.assert_up();
                    phase(node).as_ref() != Some(&now)
                },
            );
            after_phase(&now);
            phases.push(now);
        }
        phases
    });
    assert_eq!(phases, ["trust-both", "sign-new", "drop-old"]);
}

pub(crate) fn rotate_cluster_ca(node: &OneNode<'_>, outside: &Haproxy) {
    let tls_failures = outside.tls_check_failures();
    let operator_before = fresh_operator_kubeconfig(node, "operator-before.kubeconfig");
    let plugin = Plugin::new(node);
    let first_credential = plugin.cached_certificate();
    plugin.works("again");
    assert_eq!(
        plugin.cached_certificate(),
        first_credential,
        "the cached credential is reused"
    );

    rotate_sampled(node, "cluster", |now| {
        plugin.works(&format!("after the {now} phase"));
        plugin.works_through(
            &plugin.frozen_before,
            &format!("its trust file from before, after the {now} phase"),
        );
    });
    // HAProxy's checks verify the members with the trust written before the rotation: its
    // standby is the new CA, so no check fails at TLS throughout (were it missing, every
    // member's would from sign-new on, and requests would go to the unchecked backend). A
    // check may fail at `/readyz` while a member restarts or etcd is slow on a loaded host.
    assert_eq!(
        outside.tls_check_failures(),
        tls_failures,
        "HAProxy's checks failed to verify a member with the trust from before the rotation"
    );

    let refused = api_through(node, &operator_before);
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("Unauthorized")),
        "the operator kubeconfig from before the rotation: {refused:?}"
    );
    fresh_operator_kubeconfig(node, "operator-after.kubeconfig");
    // The plugin's kubeconfig, written before the rotation, still works: its credential was
    // minted again under the new CA once the old one was dropped.
    plugin.works("after the rotation");
    assert_ne!(plugin.cached_certificate(), first_credential);
    plugin.works_through(
        &plugin.frozen_before,
        "its trust file from before, at the end",
    );
}

/// What the one member's PKI directory holds now: `name`'s path on the host.
fn pki(node: &OneNode<'_>, name: &str) -> PathBuf {
    node.machine.root.join("etc/exk8s/pki").join(name)
}

/// `name` and its key copied out of the member's PKI directory into the test's: a client
/// identity as it is now, kept past a rotation.
fn keep(node: &OneNode<'_>, name: &str) -> (PathBuf, PathBuf) {
    let kept = node.dir.join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    let copy = |file: String| {
        let to = kept.join(&file);
        std::fs::copy(pki(node, &file), &to).unwrap();
        to
    };
    (copy(format!("{name}.pem")), copy(format!("{name}-key.pem")))
}

/// Who the apiserver says the caller is when the front proxy's client certificate `cert`
/// (with `key`) says `X-Remote-User: alice` — what an aggregated API server is told: the
/// username, or what the apiserver answered instead.
fn front_proxied(node: &OneNode<'_>, (cert, key): &(PathBuf, PathBuf)) -> String {
    let review = r#"{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}"#;
    let out = node
        .machine
        .on_lan("curl")
        .args(["-sSk", "--max-time", "10", "-X", "POST"])
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["-H", "X-Remote-User: alice"])
        .args(["-H", "Content-Type: application/json", "-d", review])
        .arg(format!(
            "https://{}:6443/apis/authentication.k8s.io/v1/selfsubjectreviews",
            node.ip
        ))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    serde_json::from_str::<serde_json::Value>(&said)
        .ok()
        .and_then(|v| {
            v["status"]["userInfo"]["username"]
                .as_str()
                .map(str::to_owned)
        })
        .unwrap_or(said)
}

/// `ca`'s rotation on the one member (`exk8s rotate-ca`), its sync unit started once per
/// phase; after each, `/readyz` through the admin kubeconfig and `check` pass.
fn rotate_on_one(node: &OneNode<'_>, ca: &str, check: impl Fn(&str)) {
    let name = node.cluster.to_string();
    let started = node.exk8s(&["rotate-ca", &name, "--ca", ca]);
    assert_eq!(started["phase"], "trust-both", "{started}");
    for want in ["trust-both", "sign-new", "drop-old"] {
        assert_eq!(phase(node).as_deref(), Some(want), "the {ca} CA's rotation");
        node.sync();
        let ready = super::control_plane::admin(&node.machine, &["get", "--raw", "/readyz"]);
        assert_eq!(ready, "ok", "after the {ca} CA's {want} phase");
        check(want);
    }
    assert_eq!(phase(node), None, "the {ca} CA's rotation ended");
}

/// The front proxy's CA's rotation on the cluster's one member: after each phase the
/// apiserver takes the front proxy's word for who calls; at the end the front proxy's client
/// certificate from before — signed by the CA dropped — is not believed.
pub(crate) fn rotate_front_proxy(node: &OneNode<'_>) {
    let proxy_before = keep(node, "front-proxy-client");
    assert_eq!(front_proxied(node, &proxy_before), "alice");
    rotate_on_one(node, "front-proxy", |phase| {
        let now = (
            pki(node, "front-proxy-client.pem"),
            pki(node, "front-proxy-client-key.pem"),
        );
        assert_eq!(
            front_proxied(node, &now),
            "alice",
            "after the {phase} phase"
        );
    });
    let answered = front_proxied(node, &proxy_before);
    assert_ne!(
        answered, "alice",
        "the front proxy's certificate of the dropped CA is still believed"
    );
}

/// How many times systemd has started each member's etcd.
fn etcd_starts(members: &[(Machine, String)]) -> Vec<usize> {
    members
        .iter()
        .map(|(machine, _)| {
            machine
                .journal_grep("etcd.service", "^Started ")
                .lines()
                .count()
        })
        .collect()
}

/// The etcd CA's rotation on `members` (the module doc's last paragraph).
pub(crate) fn rotate_etcd_ca(node: &OneNode<'_>, members: &[(Machine, String)]) {
    let (old_cert, old_key) = keep(node, "etcd-healthcheck-client");
    let starts_before = etcd_starts(members);
    rotate_sampled(node, "etcd", |now| {
        for (holder, _) in members {
            let pki = holder.root.join("etc/exk8s/pki");
            for (_, ip) in members {
                wait_until(
                    &format!(
                        "etcd at {ip} answers {}'s identity after {now}",
                        holder.name
                    ),
                    Duration::from_secs(30),
                    || etcd_status_as(&node.machine, &pki, ip).is_ok(),
                );
            }
        }
    });
    // Each phase changed every member's etcd files: systemd restarted each etcd once a phase.
    let restarts: Vec<usize> = etcd_starts(members)
        .iter()
        .zip(&starts_before)
        .map(|(after, before)| after - before)
        .collect();
    assert_eq!(restarts, [3, 3, 3], "each member's etcd restarts");
    // The identity from before, trusting the etcd CA of now: refused by every member.
    let refused = node.dir.join("etcd-refused");
    std::fs::create_dir_all(&refused).unwrap();
    std::fs::copy(pki(node, "etcd-ca.pem"), refused.join("etcd-ca.pem")).unwrap();
    std::fs::copy(&old_cert, refused.join("etcd-healthcheck-client.pem")).unwrap();
    std::fs::copy(&old_key, refused.join("etcd-healthcheck-client-key.pem")).unwrap();
    for (machine, ip) in members {
        let answered = etcd_status_as(&node.machine, &refused, ip);
        assert!(
            answered.is_err(),
            "{}: a client certificate of the dropped etcd CA was accepted: {answered:?}",
            machine.name
        );
        let current = etcd_status_as(&node.machine, &pki(node, ""), ip);
        assert!(current.is_ok(), "{}: {current:?}", machine.name);
    }
}
