//! The cluster CA's rotation on booted machines (`POST …/certificates/rotate-ca`, trust-both,
//! sign-new, drop-old), every node's sync unit started again and again as its timer would,
//! while the first machine samples every apiserver's `/readyz` and sends requests through every
//! node's balancer and through HAProxy: at least two apiservers ready in every round and no
//! request through a balancer failed, the sampler's own balancer restarted mid-way included. The balancers re-read the CA file each round (two CAs
//! while the rotation runs); HAProxy, as `docs/apiserver-endpoint.md` tells its operator, is
//! given both CAs (a fresh kubeconfig's CA data) and reloaded as the rotation starts, and the
//! new one alone once it ends. At the
//! end every apiserver and kubelet serves a new certificate, the one its bundle carries; the
//! operator kubeconfig fetched before is refused and a new one works; and the kubeconfig `exk8s
//! kubeconfig --exec` wrote before everything (its user runs `exk8s credential`, client-go's
//! exec plugin) worked at every phase with no operator action — its cached certificate reused
//! until the CA that signed it was dropped, then minted again under the new CA.

use exk8s_tests::cluster::{operator, operator_kubeconfig, view};
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use exk8s_tests::procs::binary;
use exk8s_tests::site::nodes as cluster_nodes;
use serde_json::json;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use super::day2::{apiserver_starts, assert_two_ready, sampling, serving, syncing};
use super::haproxy::Haproxy;
use super::nodes;

/// kubectl on the host, in `from`'s network namespace, through a kubeconfig whose user runs
/// `exk8s credential` (on PATH, logged in through the environment, its cache in `cache`).
struct Plugin<'a> {
    stack: &'a Stack,
    kubeconfig: PathBuf,
    cache: PathBuf,
    /// The member asked (the kubeconfig names the control plane's DNS name, which the host
    /// does not resolve; the apiservers' certificates name their addresses too).
    server: String,
}

impl Plugin<'_> {
    /// `kubectl get --raw /api` through the plugin, from `from`; panics naming `step` when
    /// it fails.
    fn works(&self, from: &Machine, step: &str) {
        let exk8s = binary("exk8s");
        let mut path = exk8s.parent().unwrap().as_os_str().to_owned();
        path.push(":");
        path.push(std::env::var_os("PATH").unwrap_or_default());
        let out = from
            .on_lan(
                &exk8s_tests::bins::kubernetes("kubectl")
                    .display()
                    .to_string(),
            )
            .env("PATH", path)
            .env("EXK8S_API", &self.stack.base)
            .env("EXK8S_TOKEN", &self.stack.token)
            .env("XDG_CACHE_HOME", &self.cache)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--server={}", self.server))
            .args(["--request-timeout=10s", "get", "--raw", "/api"])
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("APIVersions"),
            "kubectl through exk8s credential, {step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The cached credential's certificate (PEM); the cache file is 0600.
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

/// `kubectl get --raw /api` from `from` with the kubeconfig `config` (a host path) against
/// `server`: its stderr when it failed.
fn with_kubeconfig(from: &Machine, config: &Path, server: &str) -> Result<(), String> {
    let out = from
        .on_lan(
            &exk8s_tests::bins::kubernetes("kubectl")
                .display()
                .to_string(),
        )
        .arg(format!("--kubeconfig={}", config.display()))
        .arg(format!("--server={server}"))
        .args(["--request-timeout=10s", "get", "--raw", "/api"])
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The CA data of a freshly fetched operator kubeconfig (PEM): during a rotation, both CAs.
fn kubeconfig_ca(stack: &Stack, cluster: i64) -> String {
    let config: yaml_serde::Value =
        yaml_serde::from_str(&operator_kubeconfig(stack, cluster)).unwrap();
    let data = config["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .unwrap();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    String::from_utf8(pem).unwrap()
}

/// The rotation of the module doc on the cluster `cluster` of `machines` (the members first,
/// at `cp`: address and node name each; `addresses` every machine's own), HAProxy `outside`
/// in front of it; `dir` for the test's files.
pub(crate) fn rotate_cluster_ca(
    stack: &Stack,
    cluster: i64,
    machines: &[Machine],
    addresses: &[String],
    cp: &[(String, String)],
    outside: &mut Haproxy,
    dir: &Path,
) {
    let sampler = &machines[0];
    let ips: Vec<String> = cp.iter().map(|(ip, _)| ip.clone()).collect();
    let server = format!("https://{}:6443", ips[0]);
    let names: Vec<&String> = cp.iter().map(|(_, name)| name).collect();
    let before = apiserver_starts(sampler, &names);
    let certs_before = serving(sampler, addresses, cp);
    let old_config = dir.join("operator-before.kubeconfig");
    std::fs::write(&old_config, operator_kubeconfig(stack, cluster)).unwrap();
    with_kubeconfig(sampler, &old_config, &server).unwrap();
    let written = stack.exk8s(dir, &["kubeconfig", &cluster.to_string(), "--exec"]);
    assert!(written.status.success(), "{written:?}");
    let plugin = Plugin {
        stack,
        kubeconfig: dir.join("exec.kubeconfig"),
        cache: dir.join("cache"),
        server: server.clone(),
    };
    std::fs::write(&plugin.kubeconfig, &written.stdout).unwrap();
    plugin.works(sampler, "before the rotation");
    let first_credential = plugin.cached_certificate();
    plugin.works(sampler, "again");
    assert_eq!(plugin.cached_certificate(), first_credential, "reused");

    let started = operator(
        stack,
        "POST",
        &format!("/clusters/{cluster}/certificates/rotate-ca"),
    )
    .send_json(json!({"ca": "cluster"}));
    let started: serde_json::Value = started.unwrap().into_json().unwrap();
    assert_eq!(started["phase"], "trust-both", "{started}");
    // As docs/apiserver-endpoint.md tells its operator: the outside load balancer trusts both
    // CAs before any member serves a certificate of the new one.
    let both = kubeconfig_ca(stack, cluster);
    assert_eq!(both.matches("BEGIN CERTIFICATE").count(), 2, "{both}");
    outside.trust(&both);
    let phase = || {
        view(stack, cluster)["ca_rotation"]["phase"]
            .as_str()
            .map(str::to_owned)
    };
    let ((), rounds) = sampling(sampler, &ips, machines, || {
        // The sampler's balancer restarted first: its socket stays, so nothing is refused.
        std::thread::sleep(std::time::Duration::from_secs(2));
        sampler.ok(
            "systemctl",
            &["restart", "exk8s-apiserver-balancer.service"],
        );
        syncing(machines, || phase().as_deref() != Some("trust-both"));
        plugin.works(sampler, "after trust-both");
        syncing(machines, || phase().as_deref() != Some("sign-new"));
        plugin.works(sampler, "after sign-new");
        syncing(machines, || {
            phase().is_none()
                && cluster_nodes(stack, cluster)
                    .iter()
                    .all(|n| n["up_to_date"] == true)
        });
        plugin.works(sampler, "after drop-old");
        // The rotation over, the load balancer trusts the new CA alone.
        outside.trust(&kubeconfig_ca(stack, cluster));
        std::thread::sleep(std::time::Duration::from_secs(3));
    });
    assert_two_ready("the cluster CA's rotation", &rounds);
    let balancer = sampler.journal("exk8s-apiserver-balancer.service", 400);
    assert!(
        balancer
            .matches("listening on 127.0.0.1:7445 (systemd's socket)")
            .count()
            >= 2,
        "restarted on systemd's socket: {balancer}"
    );
    for machine in machines {
        let sync = machine.show("exk8s-agent-sync.service", &["Result"]);
        assert_eq!(sync, "Result=success", "{}", machine.name);
    }
    let after = apiserver_starts(sampler, &names);
    for (name, started) in &before {
        assert_ne!(after[name], *started, "{name}'s apiserver restarted");
    }
    let certs_after = serving(sampler, addresses, cp);
    for (i, machine) in machines.iter().enumerate() {
        assert_ne!(certs_before[cp.len() + i], certs_after[cp.len() + i]);
        let pem = |file: &str| {
            nodes::first_pem(&std::fs::read_to_string(machine.root.join(file)).unwrap())
        };
        assert_eq!(certs_after[cp.len() + i], pem("etc/exk8s/pki/kubelet.pem"));
        if i < cp.len() {
            assert_ne!(certs_before[i], certs_after[i]);
            assert_eq!(certs_after[i], pem("etc/exk8s/pki/apiserver.pem"));
        }
    }

    // The operator kubeconfig from before is refused; a new one works.
    let refused = with_kubeconfig(sampler, &old_config, &server).unwrap_err();
    assert!(
        refused.contains("certificate") || refused.contains("x509"),
        "{refused}"
    );
    let fresh = dir.join("operator-after.kubeconfig");
    std::fs::write(&fresh, operator_kubeconfig(stack, cluster)).unwrap();
    with_kubeconfig(sampler, &fresh, &server).unwrap();
    // The plugin's kubeconfig, written before everything, still works: its credential was
    // minted again under the new CA once the old one was dropped.
    plugin.works(sampler, "after everything");
    assert_ne!(plugin.cached_certificate(), first_credential);
}
