//! Workloads on a booted cluster with a pod network: a Deployment of agnhost's HTTP server on
//! one worker, behind a ClusterIP and a NodePort Service, and a client pod on the other worker.
//! The client resolves the Service's names and `kubernetes.default` through CoreDNS and reaches
//! the server's pods through the Service and directly, across nodes; the NodePort answers on
//! both workers' addresses; `kubectl logs`, `exec` and `port-forward` work; the Deployment rolls.

use std::process::Stdio;
use std::time::Duration;

use exk8s_tests::bins::kubernetes;
use exk8s_tests::machine::Machine;
use serde_json::Value;

use super::day2::kubectl;

/// The test image the registry serves (Kubernetes' e2e `agnhost`).
const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";

/// `kubectl` on `machine`, which must succeed: its output.
fn ok(machine: &Machine, args: &[&str]) -> String {
    let out = kubectl(machine, args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn manifest(server_node: &str, client_node: &str) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: default}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      nodeSelector: {{kubernetes.io/hostname: {server_node}}}
      containers:
        - name: echo
          image: {AGNHOST}
          args: [netexec, --http-port=8080]
          ports: [{{containerPort: 8080}}]
          readinessProbe: {{httpGet: {{path: /healthz, port: 8080}}, periodSeconds: 1}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  selector: {{app: echo}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: echo-nodeport, namespace: default}}
spec:
  type: NodePort
  selector: {{app: echo}}
  ports: [{{port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: client, namespace: default, labels: {{app: client}}}}
spec:
  nodeName: {client_node}
  containers:
    - name: client
      image: {AGNHOST}
      args: [netexec, --http-port=8080]
      readinessProbe: {{httpGet: {{path: /healthz, port: 8080}}, periodSeconds: 1}}
"#
    )
}

/// What the client pod's agnhost answers for one HTTP `hostname` request to `host:port` made
/// from inside the client pod (its `/dial`, reached through the apiserver's pod proxy).
fn dial(first: &Machine, host: &str, port: u16) -> Result<String, String> {
    let path = format!(
        "/api/v1/namespaces/default/pods/client:8080/proxy/dial?request=hostname&protocol=http&host={host}&port={port}&tries=1"
    );
    let out = kubectl(first, &["get", "--raw", &path]);
    let text = String::from_utf8_lossy(&out.stdout);
    let answer: Value = serde_json::from_str(&text).map_err(|_| {
        format!(
            "{text}{}",
            String::from_utf8_lossy(&out.stderr).trim().to_owned()
        )
    })?;
    match answer["responses"].as_array().and_then(|r| r.first()) {
        Some(name) => Ok(name.as_str().unwrap_or_default().to_owned()),
        None => Err(answer.to_string()),
    }
}

/// What a failed check needs to be understood: the client node's NAT rules and routes, and
/// kube-proxy's and flannel's last words.
fn diagnose(first: &Machine, client: &Machine) -> String {
    let host = |program: &str, args: &[&str]| {
        let out = client.on_lan(program).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let logs = |app: &str| {
        let selector = format!("k8s-app={app}");
        let out = kubectl(
            first,
            &[
                "logs",
                "-n",
                "kube-system",
                "-l",
                &selector,
                "--prefix",
                "--tail=40",
            ],
        );
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    format!(
        "routes:\n{}\nnat:\n{}\nfilter:\n{}\nkube-proxy:\n{}\nflannel:\n{}",
        host("ip", &["route"]),
        host("iptables-nft-save", &["-t", "nat"]),
        host("iptables-nft-save", &["-t", "filter"]),
        logs("kube-proxy"),
        logs("flannel")
    )
}

/// Runs the workload checks on a cluster whose workers are `workers` (node name, address).
pub(crate) fn run_workloads(first: &Machine, workers: &[(String, String, &Machine)]) {
    let [
        (server_node, server_ip, _),
        (client_node, client_ip, client_machine),
    ] = workers
    else {
        panic!("two workers expected");
    };
    let file = "/root/workloads.yaml";
    std::fs::write(
        first.root.join(file.trim_start_matches('/')),
        manifest(server_node, client_node),
    )
    .unwrap();
    ok(first, &["apply", "-f", file]);
    ok(
        first,
        &["rollout", "status", "deployment/echo", "--timeout=180s"],
    );
    ok(
        first,
        &[
            "wait",
            "--for=condition=Ready",
            "pod/client",
            "--timeout=180s",
        ],
    );
    let pods = |selector: &str| -> Vec<(String, String)> {
        let listed = ok(
            first,
            &[
                "get",
                "pods",
                "--selector",
                selector,
                "--field-selector",
                "status.phase=Running",
                "-o",
                r#"jsonpath={range .items[*]}{.metadata.name} {.status.podIP} {.spec.nodeName} {.metadata.deletionTimestamp}{"\n"}{end}"#,
            ],
        );
        listed
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|f| f.len() == 3)
            .map(|f| {
                assert_eq!(f[2], server_node, "pods on their node: {listed}");
                (f[0].to_owned(), f[1].to_owned())
            })
            .collect()
    };
    let echo = pods("app=echo");
    assert_eq!(echo.len(), 2, "{echo:?}");
    let echo_names: Vec<&str> = echo.iter().map(|(n, _)| n.as_str()).collect();

    // Pod to pod across nodes, by address; then by the Service's names, which CoreDNS
    // resolves, through its ClusterIP (kube-proxy's rules on the client's node).
    let mut answers = Vec::new();
    exk8s_tests::procs::wait_until(
        "the client reaching the server's pods",
        Duration::from_secs(60),
        || {
            answers = echo
                .iter()
                .map(|(_, ip)| dial(first, ip, 8080))
                .collect::<Vec<_>>();
            answers.iter().all(Result::is_ok)
        },
    );
    let direct: Vec<String> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(direct, echo_names, "each pod answers as itself");
    // kube-proxy programs a new Service within its sync period: the first answer waited for.
    let start = std::time::Instant::now();
    while let Err(e) = dial(first, "echo", 80) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the Service never answered: {e}\n{}",
            diagnose(first, client_machine)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for host in ["echo", "echo.default.svc.cluster.local"] {
        for _ in 0..4 {
            let name = dial(first, host, 80)
                .unwrap_or_else(|e| panic!("{host}: {e}\n{}", diagnose(first, client_machine)));
            assert!(echo_names.contains(&name.as_str()), "{host}: {name}");
        }
    }
    // The cluster's own Service, by its full name: resolved and connected from the pod.
    ok(
        first,
        &[
            "exec",
            "client",
            "--",
            "/usr/local/bin/agnhost",
            "connect",
            "kubernetes.default.svc.cluster.local:443",
            "--timeout=5s",
        ],
    );

    // The NodePort answers on both workers' addresses, from another node's LAN: on the
    // client's worker kube-proxy forwards to the server's worker.
    let node_port = ok(
        first,
        &[
            "get",
            "service",
            "echo-nodeport",
            "-o",
            "jsonpath={.spec.ports[0].nodePort}",
        ],
    );
    for ip in [server_ip, client_ip] {
        let out = first
            .on_lan("curl")
            .args(["-sS", "--max-time", "5"])
            .arg(format!("http://{ip}:{node_port}/hostname"))
            .output()
            .unwrap();
        let name = String::from_utf8_lossy(&out.stdout);
        assert!(
            echo_names.contains(&name.trim()),
            "NodePort on {ip}: {name}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // logs, and port-forward (the host's kubectl in the first machine's network namespace).
    let logs = ok(first, &["logs", "deployment/echo"]);
    assert!(logs.contains("Started HTTP server on port 8080"), "{logs}");
    let kubeconfig = first.root.join("etc/exk8s/kubeconfig/admin.kubeconfig");
    let mut forward = first
        .on_lan(kubernetes("kubectl").to_str().unwrap())
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["port-forward", "pod/client", "18080:8080"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    let forwarded = loop {
        let out = first
            .on_lan("curl")
            .args(["-sS", "--max-time", "5", "http://127.0.0.1:18080/hostname"])
            .output()
            .unwrap();
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).into_owned();
        }
        if start.elapsed() > Duration::from_secs(30) {
            forward.kill().unwrap();
            let said = forward.wait_with_output().unwrap();
            panic!(
                "port-forward: curl said {}; kubectl said {}{} ({:?}); containerd: {}; kubelet: {}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&said.stdout),
                String::from_utf8_lossy(&said.stderr),
                said.status,
                client_machine.journal("containerd.service", 30),
                client_machine.journal("kubelet.service", 30),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    forward.kill().unwrap();
    forward.wait().unwrap();
    assert_eq!(forwarded, "client");

    // The Deployment rolls: two new pods replace the two old ones, and the Service follows.
    ok(first, &["rollout", "restart", "deployment/echo"]);
    ok(
        first,
        &["rollout", "status", "deployment/echo", "--timeout=180s"],
    );
    let mut rolled = Vec::new();
    exk8s_tests::procs::wait_until("the old pods gone", Duration::from_secs(60), || {
        rolled = pods("app=echo");
        rolled.len() == 2
            && rolled
                .iter()
                .all(|(n, _)| !echo_names.contains(&n.as_str()))
    });
    // kube-proxy follows the new endpoints within its sync period.
    let mut answer = Err(String::new());
    exk8s_tests::procs::wait_until(
        "the Service answering from the new pods",
        Duration::from_secs(30),
        || {
            answer = dial(first, "echo", 80);
            answer
                .as_ref()
                .is_ok_and(|name| rolled.iter().any(|(n, _)| n == name))
        },
    );
    ok(first, &["delete", "-f", file, "--wait=false"]);
}
