//! What a founded control plane is, checked on booted machines from its bundle's own files:
//! `/livez`; the operator kubeconfig the API hands out reaches the control-plane name and is
//! `exk8s-admin` in `exk8s:cluster-admins`; the controller-manager and scheduler hold their
//! leader leases and answer `/healthz` on each member; each kubelet is `system:node:<name>` and
//! the Node authorizer lets it write its own Node but not another's; a service-account token
//! is minted and authenticates; a Secret is stored encrypted (`k8s:enc:` read back from etcd);
//! the audit log gets the policy's entries; the aggregation layer's `apiservices` list. With
//! three members: etcd has three voters, and what one apiserver writes another reads. etcd
//! refuses an identity of the cluster CA.

use std::process::Output;

use exk8s_tests::cluster::operator_kubeconfig;
use exk8s_tests::dev::Stack;
use exk8s_tests::machine::Machine;
use serde_json::{Value, json};

use super::day2::kubectl;

/// Where files the checks hand a machine's kubectl go, inside its root.
const SCRATCH: &str = "var/tmp/exk8s-checks";

/// `kubectl` on `machine` with `kubeconfig` (a path inside the machine): its output when it
/// succeeded, or its error.
pub(crate) fn kubectl_with(
    machine: &Machine,
    kubeconfig: &str,
    args: &[&str],
) -> Result<String, String> {
    let mut all = vec!["--kubeconfig", kubeconfig];
    all.extend_from_slice(args);
    let out = machine.run(
        &format!(
            "/opt/exk8s/kubernetes/{}/kubectl",
            exk8s_tests::bins::KUBERNETES_VERSION
        ),
        &all,
    );
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// The admin kubeconfig's `kubectl` on `machine`, which must succeed.
pub(crate) fn admin(machine: &Machine, args: &[&str]) -> String {
    let out = kubectl(machine, args);
    assert!(out.status.success(), "kubectl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Writes `text` into `machine`'s scratch directory as `name`; its path inside the machine.
pub(crate) fn hand(machine: &Machine, name: &str, text: &str) -> String {
    let dir = machine.root.join(SCRATCH);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), text).unwrap();
    format!("/{SCRATCH}/{name}")
}

/// The host's etcdctl on `machine`'s LAN against its own etcd, as the apiserver's etcd
/// client.
pub(crate) fn etcdctl(machine: &Machine, ip: &str, args: &[&str]) -> Output {
    let pki = |name: &str| {
        machine
            .root
            .join("etc/exk8s/pki")
            .join(name)
            .display()
            .to_string()
    };
    machine
        .on_lan(&exk8s_tests::bins::etcd("etcdctl").display().to_string())
        .arg(format!("--endpoints=https://{ip}:2379"))
        .arg(format!("--cacert={}", pki("etcd-ca.pem")))
        .arg(format!("--cert={}", pki("apiserver-etcd-client.pem")))
        .arg(format!("--key={}", pki("apiserver-etcd-client-key.pem")))
        .args(args)
        .output()
        .unwrap()
}

/// Every check of the module doc on the control plane of `members` (machine and address each,
/// the first one first), named `dns_name`, whose node names are `names` in the same order.
pub(crate) fn check_control_plane(
    stack: &Stack,
    cluster: i64,
    dns_name: &str,
    members: &[(&Machine, &str)],
    names: &[&str],
) {
    let (first, first_ip) = members[0];
    assert_eq!(admin(first, &["get", "--raw", "/livez"]), "ok");

    // The operator's kubeconfig, as the API hands it out, reaches the control-plane name.
    let text = operator_kubeconfig(stack, cluster);
    assert!(text.contains(&format!("https://{dns_name}:6443")), "{text}");
    let operator = hand(first, "operator.kubeconfig", &text);
    let whoami: Value = serde_json::from_str(
        &kubectl_with(first, &operator, &["auth", "whoami", "-o", "json"]).unwrap(),
    )
    .unwrap();
    assert_eq!(whoami["status"]["userInfo"]["username"], "exk8s-admin");
    assert!(
        whoami["status"]["userInfo"]["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("exk8s:cluster-admins")),
        "{whoami}"
    );
    let namespaces = kubectl_with(first, &operator, &["get", "namespaces", "-o", "name"]).unwrap();
    assert!(namespaces.contains("namespace/kube-system"), "{namespaces}");

    // The controller-manager and scheduler hold their leader leases; each member's answer
    // `/healthz` on its loopback.
    for (lease, port) in [
        ("kube-controller-manager", 10257),
        ("kube-scheduler", 10259),
    ] {
        let holder = admin(
            first,
            &[
                "-n",
                "kube-system",
                "get",
                "lease",
                lease,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        );
        // `<hostname>_<id>`: one of the members' processes.
        assert!(
            members
                .iter()
                .any(|(m, _)| holder.starts_with(&format!("{}_", m.name))),
            "{lease} held by {holder:?}"
        );
        for (machine, _) in members {
            let health = machine
                .on_lan("curl")
                .args(["-sk", &format!("https://127.0.0.1:{port}/healthz")])
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&health.stdout),
                "ok",
                "{}: {lease} /healthz",
                machine.name
            );
        }
    }

    // The kubelet's identity: system:node:<name>, allowed to write its own Node (which exists:
    // asked with a server-side dry run, authorized and then found to exist), refused another's.
    let kubelet = "/etc/exk8s/kubeconfig/kubelet.kubeconfig";
    let me = kubectl_with(
        first,
        kubelet,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .unwrap();
    assert_eq!(me, format!("system:node:{}", names[0]));
    let node_object = |name: &str| {
        let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        hand(first, &format!("node-{name}.json"), &body.to_string())
    };
    let own = node_object(names[0]);
    let err =
        kubectl_with(first, kubelet, &["create", "--dry-run=server", "-f", &own]).unwrap_err();
    assert!(err.contains("AlreadyExists"), "its own Node: {err}");
    let other = node_object("someone-else");
    let err = kubectl_with(
        first,
        kubelet,
        &["create", "--dry-run=server", "-f", &other],
    )
    .unwrap_err();
    assert!(err.contains("Forbidden"), "another's Node: {err}");

    // A service-account token, signed with the rendered key, authenticates (a token-only
    // kubeconfig: a client certificate beside the token would win).
    let token = admin(first, &["-n", "default", "create", "token", "default"]);
    let bearer = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{dns_name}:6443\n    certificate-authority: /etc/exk8s/pki/ca.pem\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: sa}}\ncurrent-context: c\n"
    );
    let bearer = hand(first, "token.kubeconfig", &bearer);
    let user = kubectl_with(
        first,
        &bearer,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
    )
    .unwrap();
    assert_eq!(user, "system:serviceaccount:default:default");
    std::fs::remove_dir_all(first.root.join(SCRATCH)).unwrap();

    // Secrets are encrypted at rest with the rendered key.
    admin(
        first,
        &[
            "-n",
            "default",
            "create",
            "secret",
            "generic",
            "proof",
            "--from-literal=k=plaintext-value",
        ],
    );
    let stored = etcdctl(
        first,
        first_ip,
        &[
            "get",
            "/registry/secrets/default/proof",
            "--print-value-only",
        ],
    );
    let stored = String::from_utf8_lossy(&stored.stdout);
    assert!(
        stored.starts_with("k8s:enc:"),
        "not encrypted: {stored:.80}"
    );
    assert!(!stored.contains("plaintext-value"));

    // The audit policy's entries reach the rendered log.
    let audit =
        std::fs::read_to_string(first.root.join("var/log/kubernetes/audit/audit.log")).unwrap();
    assert!(
        audit.contains("\"apiVersion\":\"audit.k8s.io/v1\""),
        "{audit:.200}"
    );
    assert!(
        audit.contains("secrets"),
        "the Secret's creation is audited"
    );

    // The aggregation layer (front-proxy identity) serves its API.
    let services = admin(first, &["get", "apiservices", "-o", "name"]);
    assert!(services.contains("v1.apps"), "{services}");

    // One etcd cluster of voters, seen from the last member.
    let (last, last_ip) = members[members.len() - 1];
    let listed = etcdctl(last, last_ip, &["member", "list", "-w", "json"]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let voters = listed["members"].as_array().unwrap();
    assert_eq!(voters.len(), members.len(), "{listed}");
    assert!(voters.iter().all(|m| m["isLearner"] != true), "{listed}");
    // etcd trusts its own CA only: the apiserver's kubelet client identity (the cluster CA's)
    // is refused.
    let pki = |name: &str| last.root.join("etc/exk8s/pki").join(name);
    let refused = last
        .on_lan("curl")
        .args(["-sS", "--max-time", "5", "-X", "POST", "-d", "{}"])
        .arg("--cacert")
        .arg(pki("etcd-ca.pem"))
        .arg("--cert")
        .arg(pki("apiserver-kubelet-client.pem"))
        .arg("--key")
        .arg(pki("apiserver-kubelet-client-key.pem"))
        .arg(format!("https://{last_ip}:2379/v3/maintenance/status"))
        .output()
        .unwrap();
    assert!(
        !refused.status.success() && !String::from_utf8_lossy(&refused.stdout).contains("raftTerm"),
        "a cluster-CA identity was answered: {refused:?}"
    );
    if members.len() > 1 {
        // Written through the first apiserver, read through the last one.
        let at = |ip: &str| format!("--server=https://{ip}:6443");
        admin(
            first,
            &[
                &at(first_ip),
                "-n",
                "default",
                "create",
                "configmap",
                "shared",
                "--from-literal=k=v",
            ],
        );
        let read = admin(
            first,
            &[
                &at(last_ip),
                "-n",
                "default",
                "get",
                "configmap",
                "shared",
                "-o",
                "jsonpath={.data.k}",
            ],
        );
        assert_eq!(read, "v");
        admin(first, &["-n", "default", "delete", "configmap", "shared"]);
    }
    admin(first, &["-n", "default", "delete", "secret", "proof"]);
}
