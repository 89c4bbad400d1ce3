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

mod day_two;

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use exk8s_tests::cluster::{Founded, agent_ok, trusted_keys, view};
use exk8s_tests::dev::start_dev;
use exk8s_tests::procs::binary;
use serde_json::Value;

/// `exk8s` with its config (and kubeconfig) inside `dir` and no ambient credentials.
pub(crate) fn exk8s(dir: &Path) -> Command {
    let mut command = Command::new(binary("exk8s"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("EXK8S_CONFIG", dir.join("exk8s.toml"))
        .env("KUBECONFIG", dir.join("kubeconfig"));
    command
}

pub(crate) fn ok(out: &Output) -> String {
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
    let kubectl = |args: &[&str]| kubectl(dir, args);
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

    day_two::run(dir, &stack, &founded, cluster_name);

    // Completions for the shells operators use.
    for shell in ["bash", "zsh", "fish"] {
        let script = ok(&exk8s(dir).args(["completions", shell]).output().unwrap());
        assert!(script.contains("clusters"), "{shell}");
    }
}

/// `kubectl args` with the kubeconfig the CLI merges into (`dir/kubeconfig`); its stdout.
pub(crate) fn kubectl(dir: &Path, args: &[&str]) -> String {
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
}

/// A `--watch` command running, its output collected.
pub(crate) struct Watch {
    child: std::process::Child,
    shown: std::sync::Arc<std::sync::Mutex<String>>,
    reader: std::thread::JoinHandle<()>,
}

impl Watch {
    pub(crate) fn start(command: &mut std::process::Command) -> Self {
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
    pub(crate) fn documents(&self) -> Vec<Value> {
        serde_json::Deserializer::from_str(&self.shown.lock().unwrap())
            .into_iter::<Value>()
            .map_while(Result::ok)
            .collect()
    }

    pub(crate) fn stop(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.reader.join().unwrap();
    }
}
