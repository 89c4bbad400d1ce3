//! exk8s as a Cluster API provider, driven by the real Cluster API: a management cluster (real
//! etcd, kube-apiserver and kube-controller-manager), Cluster API's CRDs and core controller
//! built from its Go module, `exk8s-capi`, and the dev stack as exk8s (its simulated cloud, each
//! VM booted by the real agent with host actions recorded) — all in a network namespace of the
//! test's own. `kubectl apply` of a Cluster, an `ExK8sCluster` and an `ExK8sControlPlane`
//! founds the exk8s cluster; Cluster API's own status says its infrastructure is provisioned,
//! its control plane initialized and its endpoint set; the kubeconfig Secret is in Cluster
//! API's format; `clusterctl describe cluster` shows it; bad specs are refused naming the
//! field; a refused upgrade is a condition with the API's reason; a paused Cluster is left
//! alone; `spec.replicas` scales; a MachinePool's workers are an exk8s pool ([`workers`]);
//! deleting the Cluster deletes the exk8s cluster and its VMs, and every object goes.
//!
//! Not here: the `Available` condition, which needs Cluster API to reach the workload
//! apiserver (its remote-connection probe); that takes a booted cluster.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::time::Duration;

use exk8s_tests::bins::{self, KUBERNETES_VERSION, NEXT_KUBERNETES_VERSION};
use exk8s_tests::cluster::{operator, view as cluster_view};
use exk8s_tests::dev::{MANY_AGENTS, http, start_dev};
use exk8s_tests::management::{Management, example_manifest};
use exk8s_tests::netns::Netns;
use exk8s_tests::procs::wait_until;
use exk8s_tests::timeline::{begin, mark};
use serde_json::Value;

mod agents;
mod workers;

use agents::agents_pass;

/// Condition `type_` of `object`'s status.
fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The minor of `v1.MINOR.PATCH`.
fn minor(version: &str) -> u32 {
    version.split('.').nth(1).unwrap().parse().unwrap()
}

#[test]
fn cluster_api_founds_scales_pauses_and_deletes_an_exk8s_cluster() {
    let _timeline = begin("capi");
    let netns = Netns::new("capi");
    netns.enter();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let versions = format!("{KUBERNETES_VERSION},{NEXT_KUBERNETES_VERSION}");
    let mut args = MANY_AGENTS.to_vec();
    args.extend(["--kubernetes-versions", &versions]);
    let stack = start_dev(
        &dir.join("dev"),
        "127.0.31.0/24",
        &dir.join("api.log"),
        &args,
    );
    let mut management = Management::start(&dir.join("management"));
    mark("the management cluster answers");

    management.install_crds();
    management.start_cluster_api(&[]);
    management.start_exk8s_capi();
    let kubeconfig = management.kubeconfig.display().to_string();
    let logs = |m: &Management| m.controller_logs();

    let version: Value = operator(&stack, "GET", "/kubernetes-versions")
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let default = version
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["default"] == true)
        .unwrap()["version"]
        .as_str()
        .unwrap()
        .to_owned();
    mark("kubectl apply: Cluster, ExK8sCluster, ExK8sControlPlane");
    // First without the credentials Secret: nothing is founded, and both say why.
    let example = example_manifest(&stack.base, &stack.token, &default, 1);
    let (secret, rest) = example.split_once("---\n").unwrap();
    assert!(secret.contains("kind: Secret"), "{secret}");
    management.apply(rest).unwrap();
    let missing = "the Secret default/exk8s-credentials (credentialsRef) does not exist";
    wait_until(
        "both objects name the missing Secret",
        Duration::from_secs(180),
        || {
            let infra = management.get("exk8scluster", "shop").unwrap();
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            condition(&infra, "Ready").is_some_and(|c| c["message"] == missing)
                && condition(&cp, "Founded").is_some_and(|c| {
                    // The control plane waits for the infrastructure first.
                    c["reason"] == "WaitingForInfrastructure"
                })
        },
    );
    let infra = management.get("exk8scluster", "shop").unwrap();
    assert_eq!(
        condition(&infra, "Ready").unwrap()["reason"],
        "CredentialsUnusable"
    );
    assert!(
        infra["status"]["initialization"]["provisioned"].is_null(),
        "{infra}"
    );
    management.apply(&example).unwrap();

    let mut id = 0;
    wait_until(
        "the ExK8sControlPlane founds its exk8s cluster",
        Duration::from_secs(120),
        || {
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            id = cp["status"]["clusterID"].as_i64().unwrap_or_default();
            id > 0
        },
    );
    let infra = management.get("exk8scluster", "shop").unwrap();
    assert_eq!(
        infra["status"]["initialization"]["provisioned"], true,
        "{infra}"
    );
    assert_eq!(condition(&infra, "Ready").unwrap()["status"], "True");
    wait_until("the exk8s cluster's VMs", Duration::from_secs(120), || {
        let view: Value = cluster_view(&stack, id);
        view["nodes"].as_array().is_some_and(|n| !n.is_empty())
    });
    mark("booting its VM with the real agent");
    agents_pass(&stack, dir, id);

    wait_until(
        "Cluster API: the Cluster provisioned, its control plane initialized",
        Duration::from_secs(180),
        || {
            let cluster = management.get("cluster.cluster.x-k8s.io", "shop").unwrap();
            cluster["status"]["phase"] == "Provisioned"
                && cluster["status"]["initialization"]["controlPlaneInitialized"] == true
                && cluster["status"]["initialization"]["infrastructureProvisioned"] == true
        },
    );
    let view: Value = cluster_view(&stack, id);
    let cluster = management.get("cluster.cluster.x-k8s.io", "shop").unwrap();
    assert_eq!(
        cluster["spec"]["controlPlaneEndpoint"]["host"], view["control_plane_dns_name"],
        "{cluster}"
    );
    assert_eq!(cluster["spec"]["controlPlaneEndpoint"]["port"], 6443);
    let cp = management.get("exk8scontrolplane", "shop").unwrap();
    assert_eq!(cp["status"]["replicas"], 1, "{cp}");
    assert_eq!(cp["status"]["readyReplicas"], 1, "{cp}");
    assert_eq!(cp["status"]["version"], default.as_str(), "{cp}");
    assert_eq!(
        cp["status"]["selector"],
        "cluster.x-k8s.io/cluster-name=shop,cluster.x-k8s.io/control-plane"
    );
    assert_eq!(
        cp["metadata"]["finalizers"][0],
        "controlplane.cluster.x-k8s.io/exk8s"
    );
    // Cluster API set its owner reference and label on both.
    for object in [&cp, &infra] {
        assert_eq!(
            object["metadata"]["ownerReferences"][0]["kind"], "Cluster",
            "{object}"
        );
        assert_eq!(
            object["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
            "shop"
        );
    }

    // The kubeconfig Secret, in Cluster API's format, for the server and CA exk8s names.
    let secret = management
        .get("secret", "shop-kubeconfig")
        .unwrap_or_else(|| panic!("{}", logs(&management)));
    assert_eq!(secret["type"], "cluster.x-k8s.io/secret");
    assert_eq!(
        secret["metadata"]["labels"]["cluster.x-k8s.io/cluster-name"],
        "shop"
    );
    assert_eq!(
        secret["metadata"]["ownerReferences"][0]["kind"],
        "ExK8sControlPlane"
    );
    assert_eq!(secret["metadata"]["ownerReferences"][0]["controller"], true);
    use base64::Engine as _;
    let kubeconfig_text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["value"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let trust: Value = operator(&stack, "GET", &format!("/clusters/{id}/trust"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let kubeconfig_yaml: Value = yaml_serde::from_str(&kubeconfig_text).unwrap();
    let old_ca = base64::engine::general_purpose::STANDARD
        .decode(
            kubeconfig_yaml["clusters"][0]["cluster"]["certificate-authority-data"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(
        kubeconfig_yaml["clusters"][0]["cluster"]["server"], trust["server"],
        "{kubeconfig_text}"
    );
    // Renewed only when stale: another pass leaves the same certificate.
    std::thread::sleep(Duration::from_secs(6));
    let again = management.get("secret", "shop-kubeconfig").unwrap();
    assert_eq!(
        again["data"], secret["data"],
        "the kubeconfig was minted again"
    );

    workers::made(&management, &stack, dir, id, &default);

    let describe = std::process::Command::new(bins::cluster_api("clusterctl"))
        .args(["describe", "cluster", "shop", "--kubeconfig", &kubeconfig])
        .output()
        .unwrap();
    let described = String::from_utf8_lossy(&describe.stdout);
    assert!(
        describe.status.success(),
        "{described}{}",
        String::from_utf8_lossy(&describe.stderr)
    );
    for line in [
        "Cluster default/shop",
        "ExK8sCluster default/shop",
        "ExK8sControlPlane default/shop",
        "MachinePool default/shop-workers",
    ] {
        assert!(described.contains(line), "{described}");
    }
    eprintln!("clusterctl describe cluster shop:\n{described}");

    mark("bad specs are refused naming the field");
    let refused = |yaml: String, field: &str| {
        let said = management.apply(&yaml).unwrap_err();
        assert!(said.contains(field), "{said}");
        said
    };
    let even = example_manifest(&stack.base, &stack.token, &default, 2);
    refused(even, "spec.replicas");
    let bad_version = example_manifest(&stack.base, &stack.token, "1.35", 1);
    refused(bad_version, "spec.version");
    let moved = example_manifest(&stack.base, &stack.token, &default, 1)
        .replace("subnetID: 1", "subnetID: 2");
    let said = refused(moved, "spec.subnetID");
    assert!(
        said.contains("subnetID cannot change after founding"),
        "{said}"
    );

    mark("a refused upgrade is a condition with the API's reason");
    management
        .apply(&example_manifest(&stack.base, &stack.token, "v1.99.0", 1))
        .unwrap();
    wait_until(
        "SpecApplied False: UpgradeRefused",
        Duration::from_secs(180),
        || {
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            condition(&cp, "SpecApplied").is_some_and(|c| c["reason"] == "UpgradeRefused")
        },
    );
    let cp = management.get("exk8scontrolplane", "shop").unwrap();
    let applied = condition(&cp, "SpecApplied").unwrap();
    assert_eq!(applied["status"], "False");
    assert!(
        applied["message"].as_str().unwrap().contains("v1.99.0"),
        "{applied}"
    );
    management
        .apply(&example_manifest(&stack.base, &stack.token, &default, 1))
        .unwrap();

    mark("a paused Cluster is left alone");
    management.kubectl_ok(&[
        "patch",
        "cluster.cluster.x-k8s.io",
        "shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":true}}"#,
    ]);
    wait_until("both objects Paused", Duration::from_secs(180), || {
        ["exk8scontrolplane", "exk8scluster"].iter().all(|kind| {
            let object = management.get(kind, "shop").unwrap();
            condition(&object, "Paused")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "Paused")
        })
    });
    management
        .apply(&example_manifest(&stack.base, &stack.token, &default, 3))
        .unwrap();
    // It waits long enough for both.
    workers::paused(&management, &stack, id, &default);
    let view: Value = cluster_view(&stack, id);
    assert_eq!(
        view["control_plane_members"]["desired"], 1,
        "a paused control plane was scaled: {view}"
    );

    mark("unpaused: spec.replicas 3 scales the exk8s cluster");
    management.kubectl_ok(&[
        "patch",
        "cluster.cluster.x-k8s.io",
        "shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"paused":false}}"#,
    ]);
    wait_until(
        "exk8s asked for 3 members",
        Duration::from_secs(180),
        || {
            let view: Value = cluster_view(&stack, id);
            view["control_plane_members"]["desired"] == 3
        },
    );
    let cp = management.get("exk8scontrolplane", "shop").unwrap();
    assert_eq!(condition(&cp, "Paused").unwrap()["status"], "False", "{cp}");
    wait_until(
        "the ExK8sControlPlane reports ScalingUp",
        Duration::from_secs(180),
        || {
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            condition(&cp, "ScalingUp").is_some_and(|c| c["status"] == "True")
        },
    );
    mark("the new members boot: 3 ready, up to date, SpecApplied");
    wait_until(
        "3 of 3 members ready and up to date",
        Duration::from_secs(300),
        || {
            agents_pass(&stack, dir, id);
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            cp["status"]["readyReplicas"] == 3
                && cp["status"]["upToDateReplicas"] == 3
                && cp["status"]["replicas"] == 3
                && condition(&cp, "SpecApplied").is_some_and(|c| c["status"] == "True")
        },
    );
    workers::scaled(&management, &stack, dir, id);

    let next = version
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap().to_owned())
        .find(|v| minor(v) == minor(&default) + 1)
        .expect("the dev stack installs the next minor");
    mark("spec.version one minor up: exk8s stops at its snapshot, which these agents cannot take");
    management
        .apply(&example_manifest(&stack.base, &stack.token, &next, 3))
        .unwrap();
    wait_until(
        "SpecApplied says why the upgrade stopped",
        Duration::from_secs(120),
        || {
            agents_pass(&stack, dir, id);
            let cp = management.get("exk8scontrolplane", "shop").unwrap();
            condition(&cp, "SpecApplied").is_some_and(|c| {
                c["reason"] == "InProgress"
                    && c["message"]
                        .as_str()
                        .unwrap()
                        .contains("the upgrade is stopped: its etcd snapshot")
            })
        },
    );
    // With host actions recorded, an agent takes no etcd snapshot: the upgrade goes on without
    // one (the booted clusters' upgrades take theirs). The new spec is asked of exk8s again.
    mark("snapshotBeforeUpgrade: false: every member upgraded");
    let without_snapshot =
        example_manifest(&stack.base, &stack.token, &next, 3) + "  snapshotBeforeUpgrade: false\n";
    management.apply(&without_snapshot).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    loop {
        agents_pass(&stack, dir, id);
        let cp = management.get("exk8scontrolplane", "shop").unwrap();
        if cp["status"]["version"] == next.as_str()
            && cp["status"]["upToDateReplicas"] == 3
            && condition(&cp, "SpecApplied").is_some_and(|c| c["status"] == "True")
        {
            break;
        }
        if std::time::Instant::now() > deadline {
            let view: Value = cluster_view(&stack, id);
            panic!(
                "3 of 3 members not at {next} after 180 s:\n{:#}\nexk8s: {:#}\n{}",
                cp["status"],
                view["conditions"],
                logs(&management)
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }

    let view: Value = cluster_view(&stack, id);
    let versions: Vec<&str> = view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["kubernetes_version"].as_str().unwrap_or("none"))
        .collect();
    let versions: Vec<&str> = versions
        .iter()
        .zip(view["nodes"].as_array().unwrap())
        .filter(|(_, n)| n["role"] == "control-plane")
        .map(|(v, _)| *v)
        .collect();
    assert_eq!(versions, [next.as_str(); 3], "{view:#}");
    workers::held(&stack, id, &default);
    workers::upgraded(&management, &stack, dir, id, &next);
    let cluster = management.get("cluster.cluster.x-k8s.io", "shop").unwrap();
    eprintln!(
        "Cluster API's Cluster after the upgrade: {:#}",
        cluster["status"]
    );

    mark("the cluster CA's rotation: the kubeconfig Secret follows each step");
    let started = operator(
        &stack,
        "POST",
        &format!("/clusters/{id}/certificates/rotate-ca"),
    )
    .send_json(serde_json::json!({"ca": "cluster"}));
    assert!(started.is_ok(), "{started:?}");
    // Step by step: the agents move the rotation on only once exk8s-capi minted the Secret
    // for the step it is at.
    let step_now = || {
        let view: Value = cluster_view(&stack, id);
        match view["ca_rotation"]["phase"].as_str() {
            Some(phase) => format!("cluster/{phase}"),
            None => "none".to_owned(),
        }
    };
    let minted_at = || {
        management.get("secret", "shop-kubeconfig").unwrap()["metadata"]["annotations"]
            ["exk8s.dev/ca-rotation"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let mut steps = Vec::new();
    loop {
        let step = step_now();
        wait_until(
            &format!("the kubeconfig Secret minted at {step}"),
            Duration::from_secs(180),
            || minted_at() == step,
        );
        steps.push(step.clone());
        if step == "none" {
            break;
        }
        wait_until(
            &format!("the rotation past {step}"),
            Duration::from_secs(120),
            || {
                agents_pass(&stack, dir, id);
                step_now() != step
            },
        );
    }
    assert_eq!(
        steps,
        [
            "cluster/trust-both",
            "cluster/sign-new",
            "cluster/drop-old",
            "none"
        ]
    );
    // What the Secret holds now: the CAs clients trust, and a client certificate one of them
    // signed (openssl verifies it).
    let secret = management.get("secret", "shop-kubeconfig").unwrap();
    let text = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(secret["data"]["value"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let kubeconfig: Value = yaml_serde::from_str(&text).unwrap();
    let decode = |field: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(field.as_str().unwrap())
            .unwrap()
    };
    let trust: Value = operator(&stack, "GET", &format!("/clusters/{id}/trust"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let ca = decode(&kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"]);
    assert_eq!(
        String::from_utf8(ca.clone()).unwrap().trim(),
        trust["certificate_authority_pem"].as_str().unwrap().trim()
    );
    assert_ne!(
        ca, old_ca,
        "the Secret still trusts only the CAs of before the rotation"
    );
    std::fs::write(dir.join("ca.pem"), &ca).unwrap();
    std::fs::write(
        dir.join("client.pem"),
        decode(&kubeconfig["users"][0]["user"]["client-certificate-data"]),
    )
    .unwrap();
    let verified = std::process::Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(dir.join("ca.pem"))
        .arg(dir.join("client.pem"))
        .output()
        .unwrap();
    assert!(verified.status.success(), "{verified:?}");

    workers::deleted(&management, &stack, dir, id);

    mark("deleting the Cluster deletes the exk8s cluster");
    management.kubectl_ok(&["delete", "cluster.cluster.x-k8s.io", "shop", "--wait=false"]);
    wait_until(
        "the Cluster and its objects gone",
        Duration::from_secs(180),
        || {
            management.get("cluster.cluster.x-k8s.io", "shop").is_none()
                && management.get("exk8scontrolplane", "shop").is_none()
                && management.get("exk8scluster", "shop").is_none()
        },
    );
    let gone = operator(&stack, "GET", &format!("/clusters/{id}")).call();
    assert!(
        matches!(gone, Err(ureq::Error::Status(404, _))),
        "the exk8s cluster is still there: {gone:?}"
    );
    let vms: Value = http()
        .get(&format!("{}/sim/compute/v1/vms", stack.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(vms.as_array().unwrap().len(), 0, "VMs left: {vms}");
    wait_until(
        "the kubeconfig Secret collected",
        Duration::from_secs(180),
        || management.get("secret", "shop-kubeconfig").is_none(),
    );
    mark("done");
}
