//! A bundle's plan: only the initial node runs the addons; an update bundle installs nothing
//! again and restarts one component at a time (etcd, then each control-plane pod once the one
//! before runs its new inputs, then the kubelet), each wait looking for the digest its
//! manifest carries.

use exk8s_api::render::Issuance;
use exk8s_common::payload::PlanStep;

use crate::helpers::issuance;
use crate::render::{golden, golden_as, golden_waiting, ips, real};

#[test]
fn only_the_initial_node_runs_addon_steps() {
    let cluster = real();
    for (bundle, node) in cluster.bundles.iter().zip(&cluster.nodes) {
        let addons = bundle
            .plan
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    PlanStep::KubectlApply { .. }
                        | PlanStep::HelmInstall { .. }
                        | PlanStep::WaitRollout { .. }
                )
            })
            .count();
        let has_helm = bundle.artifacts.iter().any(|a| a.name.as_str() == "helm");
        if node.is_initial {
            assert_eq!(
                addons, 6,
                "initial node: rbac, cilium, kube-proxy + wait, coredns + wait"
            );
            assert!(has_helm);
        } else {
            assert_eq!(addons, 0, "node {} must not run addons", node.vm_id);
            assert!(!has_helm);
        }
        assert!(matches!(bundle.plan[0], PlanStep::DaemonReload {}));
    }
}

/// A cluster whose operator brings the pod network: the initial node applies the RBAC,
/// kube-proxy and CoreDNS, and neither downloads helm nor installs Cilium or its values.
/// The initial node's bundle for a one-node cluster with `network`, and its addon steps.
pub(crate) fn addon_steps(
    network: exk8s_api::cluster::spec::PodNetwork,
) -> (exk8s_common::payload::BundlePayload, Vec<String>) {
    use exk8s_api::pki::KeyAlgorithm;

    let mut spec = crate::helpers::cluster_spec(crate::helpers::network());
    spec.pod_network = network;
    let mut cluster = crate::helpers::render_nodes_of(
        &spec,
        crate::helpers::control_plane(&ips(1)),
        KeyAlgorithm::EcdsaP256,
    );
    let bundle = cluster.bundles.remove(0);
    let steps: Vec<String> = bundle
        .plan
        .iter()
        .filter_map(|s| match s {
            PlanStep::KubectlApply { file, .. } => Some(format!("apply {}", file.as_str())),
            PlanStep::HelmInstall { release, .. } => Some(format!("helm {}", release.as_str())),
            PlanStep::WaitRollout { name, .. } => Some(format!("wait {}", name.as_str())),
            _ => None,
        })
        .collect();
    (bundle, steps)
}

/// The bridge configuration's `ipMasq` and `mtu`, once containerd's own template marks are
/// taken out (what is left is JSON).
fn bridge(bundle: &exk8s_common::payload::BundlePayload) -> (bool, Option<u64>) {
    let text = crate::helpers::text(bundle, "/etc/containerd/bridge-cni.conflist.tmpl");
    let json: String = text
        .split_once("*/ -}}")
        .unwrap()
        .1
        .replace(
            r#"[{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{ "subnet": "{{$range}}" }]{{end}}]"#,
            "[]",
        );
    let conf: serde_json::Value = serde_json::from_str(&json).unwrap();
    let plugin = &conf["plugins"][0];
    assert_eq!(plugin["type"], "bridge");
    (plugin["ipMasq"].as_bool().unwrap(), plugin["mtu"].as_u64())
}

#[test]
fn a_cluster_without_a_pod_network_installs_no_cilium() {
    let (bundle, steps) = addon_steps(exk8s_api::cluster::spec::PodNetwork::None);
    assert_eq!(
        steps,
        [
            "apply /etc/exk8s/manifests/rbac.yaml",
            "apply /etc/exk8s/manifests/kube-proxy.yaml",
            "apply /etc/exk8s/manifests/coredns.yaml",
            "wait kube-proxy",
            "wait coredns",
        ]
    );
    assert!(!bundle.artifacts.iter().any(|a| a.name.as_str() == "helm"));
    assert!(!bundle.files.iter().any(|f| {
        let path = f.path.as_str();
        path.contains("cilium") || path.contains("flannel")
    }));
    // Pods leaving the node are masqueraded by the bridge, at the link's MTU.
    assert_eq!(bridge(&bundle), (true, None));
}

#[test]
fn a_flannel_cluster_applies_every_addon_flannel_first_then_waits_and_its_bridge_leaves_room_for_vxlan()
 {
    let (bundle, steps) = addon_steps(exk8s_api::cluster::spec::PodNetwork::Flannel);
    assert_eq!(
        steps,
        [
            "apply /etc/exk8s/manifests/rbac.yaml",
            "apply /etc/exk8s/manifests/flannel.yaml",
            "apply /etc/exk8s/manifests/kube-proxy.yaml",
            "apply /etc/exk8s/manifests/coredns.yaml",
            "wait kube-flannel",
            "wait kube-proxy",
            "wait coredns",
        ]
    );
    assert!(!bundle.artifacts.iter().any(|a| a.name.as_str() == "helm"));
    let docs: Vec<yaml_serde::Value> = yaml_serde::Deserializer::from_str(crate::helpers::text(
        &bundle,
        "/etc/exk8s/manifests/flannel.yaml",
    ))
    .map(|d| serde::Deserialize::deserialize(d).unwrap())
    .collect();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet"
        ]
    );
    let net_conf: serde_json::Value =
        serde_json::from_str(docs[3]["data"]["net-conf.json"].as_str().unwrap()).unwrap();
    let spec = crate::helpers::cluster_spec(crate::helpers::network());
    assert_eq!(net_conf["Network"], spec.pod_cidr.to_string());
    assert_eq!(net_conf["Backend"]["Type"], "vxlan");
    let pod = &docs[4]["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(container["image"], "ghcr.io/flannel-io/flannel:v0.28.4");
    let env = container["env"].as_sequence().unwrap();
    // Through the node's balancer: flanneld never meets a stopping apiserver.
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap()["value"].clone();
    assert_eq!(var("KUBERNETES_SERVICE_HOST"), "127.0.0.1");
    assert_eq!(var("KUBERNETES_SERVICE_PORT"), "7445");
    // Least privilege: the capabilities flanneld needs, not a privileged container.
    assert_eq!(container["securityContext"]["privileged"], false);
    // flanneld masquerades; the bridge does not, and its pods leave VXLAN's 50 bytes.
    assert_eq!(bridge(&bundle), (false, Some(1450)));
}

#[test]
fn an_update_bundle_restarts_what_changed_and_never_reinstalls_addons() {
    let ips = ips(3);
    let initial = golden(&ips, 0);
    let update = golden_as(
        &ips,
        0,
        &Issuance {
            kind: exk8s_common::contract::BundleKind::Update,
            generation: 2,
            serial: 8,
            ..issuance(7)
        },
    );
    assert!(initial.identity.is_initial_control_plane);
    assert_eq!(
        update.identity.kind,
        exk8s_common::contract::BundleKind::Update
    );
    assert_eq!(update.identity.generation, 2);
    assert!(
        !update.plan.iter().any(|s| matches!(
            s,
            PlanStep::KubectlApply { .. }
                | PlanStep::HelmInstall { .. }
                | PlanStep::WaitRollout { .. }
        )),
        "{:?}",
        update.plan
    );
    assert!(!update.artifacts.iter().any(|a| a.name.as_str() == "helm"));
    // Same credentials, same files: an update with nothing new changes no file.
    assert_eq!(initial.files, update.files);

    // etcd healthy, then the apiserver's manifest, waited for until it runs its new inputs,
    // then the controller-manager's and the scheduler's together (each leader-elected, with a
    // replica on every other member), then the kubelet.
    let order: Vec<String> = update
        .plan
        .iter()
        .map(|step| match step {
            PlanStep::DaemonReload {} => "daemon-reload".to_owned(),
            PlanStep::EnableStart { unit, .. } => format!("start {unit}"),
            PlanStep::WaitEtcdHealthy { .. } => "wait etcd".to_owned(),
            PlanStep::InstallStaticPod { manifest } => format!("install {manifest}"),
            PlanStep::WaitStaticPod { mirror_pod, .. } => format!("wait {mirror_pod}"),
            PlanStep::WaitApiserverReady { .. } => "wait readyz".to_owned(),
            other => panic!("an update runs no {other:?}"),
        })
        .collect();
    let node = &update.identity.node_name;
    let m = "/etc/kubernetes/manifests";
    assert_eq!(
        order,
        [
            "daemon-reload".to_owned(),
            "start systemd-modules-load.service".to_owned(),
            "start systemd-sysctl.service".to_owned(),
            "start containerd.service".to_owned(),
            "start exk8s-apiserver-balancer.socket".to_owned(),
            "start exk8s-apiserver-balancer.service".to_owned(),
            "start etcd.service".to_owned(),
            "wait etcd".to_owned(),
            format!("install {m}/kube-apiserver.yaml"),
            format!("wait kube-apiserver-{node}"),
            format!("install {m}/kube-controller-manager.yaml"),
            format!("install {m}/kube-scheduler.yaml"),
            format!("wait kube-controller-manager-{node}"),
            format!("wait kube-scheduler-{node}"),
            "start kubelet.service".to_owned(),
            "wait readyz".to_owned(),
        ]
    );
    // Each wait looks for exactly the digest its manifest's annotation carries.
    for step in &update.plan {
        if let PlanStep::WaitStaticPod {
            manifest,
            inputs_sha256,
            ..
        } = step
        {
            let text = String::from_utf8(
                update
                    .file(manifest.as_str())
                    .unwrap()
                    .content
                    .as_bytes()
                    .to_vec(),
            )
            .unwrap();
            let pod: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
            assert_eq!(
                pod["metadata"]["annotations"]["exk8s.io/inputs-sha256"].as_str(),
                Some(inputs_sha256.to_hex().as_str()),
                "{manifest}"
            );
        }
    }
}

/// Every wait's limit in `bundle`'s plan, by what it waits for.
fn waits(bundle: &exk8s_common::payload::BundlePayload) -> Vec<(String, u32)> {
    bundle
        .plan
        .iter()
        .filter_map(|step| match step {
            PlanStep::WaitEtcdHealthy { timeout_secs, .. } => Some(("etcd".into(), *timeout_secs)),
            PlanStep::WaitStaticPod {
                mirror_pod,
                timeout_secs,
                ..
            } => Some((mirror_pod.to_string(), *timeout_secs)),
            PlanStep::WaitApiserverReady { timeout_secs, .. } => {
                Some(("readyz".into(), *timeout_secs))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn an_update_waits_for_each_restarted_component_as_long_as_the_api_is_told() {
    let ips = ips(3);
    let update = Issuance {
        kind: exk8s_common::contract::BundleKind::Update,
        generation: 2,
        ..issuance(7)
    };
    let short = waits(&golden_waiting(&ips, 1, &update, 90));
    assert_eq!(short.len(), 5, "{short:?}");
    assert!(short.iter().all(|(_, secs)| *secs == 90), "{short:?}");
    let default = waits(&golden_as(&ips, 1, &update));
    assert!(default.iter().all(|(_, secs)| *secs == 600), "{default:?}");
    // A first boot's waits are its own: the setting is an update's.
    let first = waits(&golden_waiting(&ips, 1, &issuance(7), 90));
    assert!(
        !first.is_empty() && first.iter().all(|(_, secs)| *secs == 600),
        "{first:?}"
    );
}
