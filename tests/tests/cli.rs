//! `exk8s`, the operator CLI, end to end against the dev stack (real binaries): `login` saves
//! a private config; `clusters create --wait` founds a cluster and follows it while the test
//! boots its node with the real agent, showing each phase, until it is ready; `-o json` and
//! `-o yaml` parse; `kubeconfig --merge` adds the cluster to a kubeconfig holding another
//! context and kubectl lists both; `doctor` finds the login, the API, the token, the clock and
//! the merged identity fine, and a refused token a problem; a pool named positionally, and the
//! old `--name` with a deprecation warning; API refusals show their field and message.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use exk8s_tests::cluster::{Founded, agent_ok, trusted_keys, view};
use exk8s_tests::dev::start_dev;
use exk8s_tests::procs::{binary, wait_until};
use exk8s_tests::workers::{pool_view, pool_workers};
use serde_json::Value;

/// `exk8s` with its config (and kubeconfig) inside `dir` and no ambient credentials.
fn exk8s(dir: &Path) -> Command {
    let mut command = Command::new(binary("exk8s"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("EXK8S_CONFIG", dir.join("exk8s.toml"))
        .env("KUBECONFIG", dir.join("kubeconfig"));
    command
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exk8s failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

const OTHER_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: other\n  cluster:\n    server: https://other.example:6443\nusers:\n- name: someone\n  user:\n    token: not-exk8s\ncontexts:\n- name: other\n  context:\n    cluster: other\n    user: someone\ncurrent-context: other\n";

#[test]
fn an_operator_founds_watches_and_reaches_a_cluster_with_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let stack = start_dev(
        &dir.join("dev"),
        "127.0.25.0/24",
        &dir.join("api.log"),
        &["--kubernetes-versions", "v1.35.3,v1.36.3"],
    );

    // Not logged in: a clear error, no stack trace.
    let out = exk8s(dir).args(["clusters", "list"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not logged in"));

    // login: the token from stdin, checked against the API, saved 0600.
    let mut login = exk8s(dir)
        .args(["login", "--api", &stack.base])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    login
        .stdin
        .take()
        .unwrap()
        .write_all(stack.token.as_bytes())
        .unwrap();
    ok(&login.wait_with_output().unwrap());
    let mode = std::fs::metadata(dir.join("exk8s.toml"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let mut wrong = exk8s(dir)
        .args(["login", "--api", &stack.base])
        .env("EXK8S_CONFIG", dir.join("wrong.toml"))
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wrong
        .stdin
        .take()
        .unwrap()
        .write_all(b"exk8s_wrong")
        .unwrap();
    let refused = wrong.wait_with_output().unwrap();
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    assert!(
        !dir.join("wrong.toml").exists(),
        "a refused token is not saved"
    );

    // A refusal names the field.
    let out = exk8s(dir)
        .args(["clusters", "create", "--control-plane", "2", "--image", "1"])
        .args(["--instance-type", "dev.small", "--subnet", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("control_plane_count"), "{said}");
    assert!(said.starts_with("error: "), "{said}");

    // A brought CA that is not one: refused naming its field; half a CA is a usage error.
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-nodes", "-newkey", "rsa:2048", "-days", "30",
        ])
        .args([
            "-subj",
            "/CN=not-a-ca",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .arg("-keyout")
        .arg(dir.join("leaf-key.pem"))
        .arg("-out")
        .arg(dir.join("leaf.pem"))
        .output()
        .expect("openssl must be installed (scripts/test.sh installs it)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let out = exk8s(dir)
        .args([
            "clusters",
            "create",
            "--image",
            "1",
            "--instance-type",
            "dev.small",
        ])
        .args(["--subnet", "1", "--cluster-ca-cert"])
        .arg(dir.join("leaf.pem"))
        .arg("--cluster-ca-key")
        .arg(dir.join("leaf-key.pem"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("certificate_authorities.cluster.cert_pem") && said.contains("not a CA"),
        "{said}"
    );
    let out = exk8s(dir)
        .args([
            "clusters",
            "create",
            "--image",
            "1",
            "--instance-type",
            "dev.small",
        ])
        .args(["--subnet", "1", "--cluster-ca-cert"])
        .arg(dir.join("leaf.pem"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "clap refuses half a CA");

    // create --wait follows the cluster while its node boots.
    let create = exk8s(dir)
        .args([
            "clusters",
            "create",
            "shop",
            "--image",
            "1",
            "--instance-type",
            "dev.small",
        ])
        .args(["--subnet", "1", "--wait", "--timeout", "300", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let cluster = loop {
        assert!(Instant::now() < deadline, "the CLI founded nothing");
        let list: Value = serde_json::from_str(&ok(&exk8s(dir)
            .args(["clusters", "list", "-o", "json"])
            .output()
            .unwrap()))
        .unwrap();
        // Its nodes are recorded once its VMs have addresses.
        let founded = list
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["nodes"].as_array().is_some_and(|n| !n.is_empty()));
        if let Some(id) = founded.and_then(|c| c["id"].as_i64()) {
            break id;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let nodes = view(&stack, cluster)["nodes"].as_array().unwrap().clone();
    let vm = nodes[0]["vm_id"].as_i64().unwrap();
    let founded = Founded {
        cluster,
        vms: vec![vm],
        ip_of: std::collections::BTreeMap::new(),
        keys: trusted_keys(&stack, dir),
        created: Value::Null,
    };
    agent_ok(&stack, &founded, &dir.join(format!("vm-{vm}")), vm, "run");
    let created = create.wait_with_output().unwrap();
    let shown: Value = serde_json::from_str(&ok(&created)).unwrap();
    assert_eq!(shown["ready"], true, "{shown}");
    let progress = String::from_utf8_lossy(&created.stderr);
    let name = shown["nodes"][0]["name"].as_str().unwrap();
    assert!(
        progress.contains(&format!("node {name}: complete")),
        "{progress}"
    );
    assert!(progress.contains("founded"), "{progress}");
    assert!(
        progress.contains("1/1 control-plane nodes ready"),
        "the status events of the cluster's stream: {progress}"
    );

    // Tables and YAML.
    let table = ok(&exk8s(dir).args(["clusters", "list"]).output().unwrap());
    let cluster_name = shown["name"].as_str().unwrap();
    assert_eq!(cluster_name, "shop", "the name asked for");
    // A name is unique in the org, and checked.
    for (name, said) in [("shop", "already exists"), ("Shop", "may hold only a-z")] {
        let out = exk8s(dir)
            .args(["clusters", "create", name, "--image", "1"])
            .args(["--instance-type", "dev.small", "--subnet", "1"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{name}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(said), "{name}: {stderr}");
    }
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains(cluster_name), "{table}");
    assert!(
        table.contains(" 1/1 "),
        "one ready control-plane machine of one: {table}"
    );
    let yaml = ok(&exk8s(dir)
        .args(["nodes", cluster_name, "-o", "yaml"])
        .output()
        .unwrap());
    let nodes: yaml_serde::Value = yaml_serde::from_str(&yaml).unwrap();
    assert_eq!(nodes[0]["vm_id"].as_i64(), Some(vm));
    let certs = ok(&exk8s(dir).args(["certs", cluster_name]).output().unwrap());
    assert!(certs.contains("cluster-ca"), "{certs}");

    // kubeconfig --merge keeps the other context and makes this one current.
    std::fs::write(dir.join("kubeconfig"), OTHER_KUBECONFIG).unwrap();
    ok(&exk8s(dir)
        .args(["kubeconfig", cluster_name, "--merge"])
        .output()
        .unwrap());
    let kubectl = |args: &[&str]| {
        let out = Command::new("kubectl")
            .args(args)
            .arg("--kubeconfig")
            .arg(dir.join("kubeconfig"))
            .output()
            .expect("kubectl (client-go) must be installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let contexts = kubectl(&["config", "get-contexts", "-o", "name"]);
    let mut listed: Vec<String> = contexts.lines().map(str::to_owned).collect();
    listed.sort_unstable();
    assert_eq!(
        listed,
        [format!("exk8s-admin@{cluster_name}"), "other".to_owned()]
    );
    assert_eq!(
        kubectl(&["config", "current-context"]).trim(),
        format!("exk8s-admin@{cluster_name}")
    );
    let mode = std::fs::metadata(dir.join("kubeconfig"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    // A fresh entry is kept by --refresh.
    let kept = exk8s(dir)
        .args(["kubeconfig", "--refresh"])
        .output()
        .unwrap();
    ok(&kept);
    let said = String::from_utf8_lossy(&kept.stderr);
    assert!(
        said.contains(&format!("kept exk8s-admin@{cluster_name}: valid until")),
        "{said}"
    );

    // doctor: the login, the API, the token, the clock and the merged identity are all fine;
    // with a token the API refuses, it says so and exits 1.
    let checked = exk8s(dir).arg("doctor").output().unwrap();
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{said}");
    for line in [
        "ok       the API accepts the token",
        "ok       this machine's clock agrees with the API's",
        &format!("ok       user exk8s-admin@{cluster_name}'s certificate is valid until"),
    ] {
        assert!(said.contains(line), "{line}: {said}");
    }
    let refused = exk8s(dir)
        .arg("doctor")
        .env("EXK8S_TOKEN", "not-a-token")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(
        said.contains("problem  the API refused the token"),
        "{said}"
    );

    // Day 2: a worker pool, a rollout, and a refusal for removing the last member.
    let pool: Value = serde_json::from_str(&ok(&exk8s(dir)
        .args(["node-pools", "create", cluster_name, "blue", "--count", "1"])
        .args([
            "--instance-type",
            "dev.small",
            "--image",
            "1",
            "--subnet",
            "1",
        ])
        .args(["--label", "node.kubernetes.io/pool=blue"])
        .args(["--taint", "dedicated=blue:NoSchedule", "-o", "json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(pool["name"], "blue", "{pool}");
    assert_eq!(pool["taints"][0]["effect"], "NoSchedule", "{pool}");
    let pools = ok(&exk8s(dir)
        .args(["node-pools", "list", cluster_name])
        .output()
        .unwrap());
    assert!(pools.contains("blue"), "{pools}");
    ok(&exk8s(dir)
        .args(["node-pools", "delete", cluster_name, "blue", "--yes"])
        .output()
        .unwrap());
    // `nodes --watch` and `certs --watch` show their lists, then again as the rollout and the
    // sync change them.
    let watching = Watch::start(exk8s(dir).args(["nodes", cluster_name, "--watch", "-o", "json"]));
    let certs = Watch::start(exk8s(dir).args(["certs", cluster_name, "--watch", "-o", "json"]));
    let documents = || watching.documents();
    wait_until("the first list", Duration::from_secs(30), || {
        !documents().is_empty()
    });
    let rollout: Value = serde_json::from_str(&ok(&exk8s(dir)
        .args(["rollout", cluster_name, "-o", "json"])
        .output()
        .unwrap()))
    .unwrap();
    assert_eq!(rollout["nodes"][0]["vm_id"].as_i64(), Some(vm), "{rollout}");

    // An upgrade waits for the rollout: the member is not up to date yet.
    let out = exk8s(dir)
        .args(["upgrade", cluster_name, "--to", "v1.36.3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("healthy and up to date before an upgrade"),
        "{said}"
    );
    let root = dir.join(format!("vm-{vm}"));
    agent_ok(&stack, &founded, &root, vm, "sync");
    let start = Instant::now();
    // (The rollout's generation, and the one that drained the blue pool's worker.)
    while !documents().last().is_some_and(|nodes| {
        nodes[0]["up_to_date"] == true && nodes[0]["applied_generation"].as_i64() > Some(1)
    }) {
        assert!(
            start.elapsed() < Duration::from_secs(40),
            "the list after the sync: {:?}",
            documents()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = documents();
    assert!(seen.len() >= 2, "{seen:?}");
    assert_eq!(seen[0][0]["applied_generation"], 1, "{seen:?}");
    watching.stop();
    // The node's leaves of its new generation replaced those of its first.
    let newest = |inventory: &Value| {
        inventory["certificates"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["generation"].as_i64())
            .max()
    };
    wait_until(
        "the certificates after the sync",
        Duration::from_secs(40),
        || {
            certs
                .documents()
                .last()
                .is_some_and(|inv| newest(inv) > Some(1))
        },
    );
    assert_eq!(newest(&certs.documents()[0]), Some(1), "the first list");
    certs.stop();
    // A pool that follows the control plane, its worker booted (named the old way: `--name`
    // still works, with a deprecation warning).
    let made = exk8s(dir)
        .args(["node-pools", "create", cluster_name, "--name", "green"])
        .args([
            "--count",
            "1",
            "--max-surge",
            "1",
            "--instance-type",
            "dev.small",
        ])
        .args(["--image", "1", "--subnet", "1", "-o", "json"])
        .output()
        .unwrap();
    let warned = String::from_utf8_lossy(&made.stderr);
    assert!(
        warned.contains("--name is deprecated; the name is positional"),
        "{warned}"
    );
    let green: Value = serde_json::from_str(&ok(&made)).unwrap();
    assert_eq!(green["max_surge"], 1, "{green}");
    let green_id = green["id"].as_i64().unwrap();
    let green_vms = || pool_workers(&pool_view(&stack, cluster, green_id));
    let mut old_worker = None;
    wait_until("the green worker", Duration::from_secs(30), || {
        old_worker = green_vms().first().map(|(vm, _)| *vm);
        old_worker.is_some()
    });
    let old_worker = old_worker.unwrap();
    let worker_root = |vm: i64| dir.join(format!("worker-{vm}"));
    agent_ok(
        &stack,
        &founded,
        &worker_root(old_worker),
        old_worker,
        "run",
    );
    // Then it goes, and --wait follows it on the event stream until the member runs it; with
    // --pools, then until the pool's workers run it too. (Without the etcd snapshot first:
    // these agents record host steps and take none — it::upgrade_snapshot and the real
    // control_plane_upgrade prove the wait.)
    let upgrade = exk8s(dir)
        .args([
            "upgrade",
            cluster_name,
            "--to",
            "v1.36.3",
            "--wait",
            "--pools",
            "--no-snapshot",
            "-o",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    while view(&stack, cluster)["kubernetes_version"] != "v1.36.3" {
        std::thread::sleep(Duration::from_millis(100));
    }
    agent_ok(&stack, &founded, &root, vm, "sync");
    // The pool follows: a new worker first, then the old one drained by the member's agent.
    let mut new_worker = None;
    wait_until(
        "the green pool's new worker",
        Duration::from_secs(30),
        || {
            new_worker = green_vms()
                .iter()
                .map(|(vm, _)| *vm)
                .find(|vm| *vm != old_worker);
            new_worker.is_some()
        },
    );
    let new_worker = new_worker.unwrap();
    agent_ok(
        &stack,
        &founded,
        &worker_root(new_worker),
        new_worker,
        "run",
    );
    wait_until("the old worker draining", Duration::from_secs(30), || {
        green_vms()
            .iter()
            .any(|(vm, removal)| *vm == old_worker && removal == "draining")
    });
    agent_ok(&stack, &founded, &root, vm, "sync");
    let upgraded = upgrade.wait_with_output().unwrap();
    let shown: Value = serde_json::from_str(&ok(&upgraded)).unwrap();
    assert_eq!(shown["version"], "v1.36.3", "{shown}");
    assert_eq!(
        shown["nodes"][0]["kubernetes_version"], "v1.36.3",
        "{shown}"
    );
    let progress = String::from_utf8_lossy(&upgraded.stderr);
    assert!(
        progress.contains("upgrading cluster shop's control plane from v1.35.3 to v1.36.3"),
        "{progress}"
    );
    assert!(
        progress.contains("pool green: 1/1 workers run v1.36.3, 1 in all"),
        "{progress}"
    );
    assert_eq!(green_vms(), vec![(new_worker, Value::Null)]);
    let nodes = ok(&exk8s(dir).args(["nodes", cluster_name]).output().unwrap());
    assert!(nodes.contains("v1.36.3"), "{nodes}");
    let out = exk8s(dir)
        .args(["members", "remove", cluster_name, &vm.to_string(), "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("409"), "{said}");

    // A rotation of the cluster CA begins: --refresh fetches the entry again (it trusts both
    // CAs now), and leaves the current context where the operator put it.
    ok(&exk8s(dir)
        .args(["rotate-ca", cluster_name, "--ca", "cluster"])
        .output()
        .unwrap());
    kubectl(&["config", "use-context", "other"]);
    let refreshed = exk8s(dir)
        .args(["kubeconfig", cluster_name, "--refresh"])
        .output()
        .unwrap();
    ok(&refreshed);
    let said = String::from_utf8_lossy(&refreshed.stderr);
    assert!(
        said.contains(&format!(
            "refreshed exk8s-admin@{cluster_name}: the cluster's apiservers are trusted with another CA now"
        )),
        "{said}"
    );
    assert_eq!(kubectl(&["config", "current-context"]).trim(), "other");
    let ca = kubectl(&[
        "config",
        "view",
        "--raw",
        "-o",
        &format!(
            "jsonpath={{.clusters[?(@.name==\"{cluster_name}\")].cluster.certificate-authority-data}}"
        ),
    ]);
    let ca = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, ca.trim()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&ca)
            .matches("BEGIN CERTIFICATE")
            .count(),
        2,
        "the old CA and the new one"
    );

    // kubectl runs the credential plugin once per invocation and scripts run many at once: 32
    // concurrent runs on an empty cache each print a whole ExecCredential, and leave one valid
    // cache file and its trust file, nothing half-written and no temporary.
    let cache = dir.join(".cache/exk8s/credentials");
    let _ = std::fs::remove_dir_all(&cache);
    let runs: Vec<_> = (0..32)
        .map(|_| {
            exk8s(dir)
                .args(["credential", cluster_name])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for run in runs {
        let printed: Value = serde_json::from_str(&ok(&run.wait_with_output().unwrap())).unwrap();
        assert_eq!(printed["kind"], "ExecCredential", "{printed}");
        let status = &printed["status"];
        assert!(
            status["clientCertificateData"]
                .as_str()
                .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")),
            "{status}"
        );
        assert!(
            status["clientKeyData"]
                .as_str()
                .is_some_and(|k| k.contains("PRIVATE KEY"))
        );
    }
    let mut left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left.len(),
        2,
        "the credential and its trust file, no temporary: {left:?}"
    );
    let cached: Value =
        serde_json::from_slice(&std::fs::read(cache.join(&left[1])).unwrap()).unwrap();
    assert!(
        cached["client_certificate_pem"].as_str().is_some(),
        "{left:?}"
    );
    let trust = std::fs::read_to_string(cache.join(&left[0])).unwrap();
    assert!(trust.starts_with("-----BEGIN CERTIFICATE-----"), "{left:?}");

    // delete asks for --yes, then deletes.
    let out = exk8s(dir)
        .args(["clusters", "delete", cluster_name])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    ok(&exk8s(dir)
        .args(["clusters", "delete", cluster_name, "--yes"])
        .output()
        .unwrap());

    // Completions for the shells operators use.
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&exk8s(dir).args(["completions", shell]).output().unwrap());
        assert!(script.contains("clusters"), "{shell}");
    }
}

/// A `--watch` command running, its output collected.
struct Watch {
    child: std::process::Child,
    shown: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Watch {
    fn start(command: &mut std::process::Command) -> Self {
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let shown = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let reader = {
            let shown = std::sync::Arc::clone(&shown);
            let mut out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(n) = std::io::Read::read(&mut out, &mut buffer) {
                    if n == 0 {
                        break;
                    }
                    shown
                        .lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buffer[..n]));
                }
            })
        };
        Self {
            child,
            shown,
            reader,
        }
    }

    /// The JSON documents shown so far.
    fn documents(&self) -> Vec<Value> {
        serde_json::Deserializer::from_str(&self.shown.lock().unwrap())
            .into_iter::<Value>()
            .map_while(Result::ok)
            .collect()
    }

    fn stop(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.reader.join().unwrap();
    }
}
