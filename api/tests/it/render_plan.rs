//! A bundle's plan: only the initial node runs the addons; an update bundle installs nothing
//! again and restarts one component at a time (etcd, then each control-plane pod once the one
//! before runs its new inputs, then the kubelet), each wait looking for the digest its
//! manifest carries.

use exk8s_api::render::Issuance;
use exk8s_common::payload::PlanStep;

use crate::helpers::issuance;
use crate::render::{golden, golden_as, ips, real};

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
#[test]
fn a_cluster_without_a_pod_network_installs_no_cilium() {
    use exk8s_api::cluster::spec::PodNetwork;
    use exk8s_api::pki::KeyAlgorithm;

    let mut spec = crate::helpers::cluster_spec(crate::helpers::network());
    spec.pod_network = PodNetwork::None;
    let cluster = crate::helpers::render_nodes_of(
        &spec,
        crate::helpers::control_plane(&ips(1)),
        KeyAlgorithm::EcdsaP256,
    );
    let bundle = &cluster.bundles[0];
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
    assert_eq!(
        steps,
        [
            "apply /etc/exk8s/manifests/rbac.yaml",
            "apply /etc/exk8s/manifests/kube-proxy.yaml",
            "wait kube-proxy",
            "apply /etc/exk8s/manifests/coredns.yaml",
            "wait coredns",
        ]
    );
    assert!(!bundle.artifacts.iter().any(|a| a.name.as_str() == "helm"));
    assert!(
        !bundle
            .files
            .iter()
            .any(|f| f.path.as_str().contains("cilium"))
    );
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

    // One component at a time: etcd healthy, then each control-plane pod's manifest lands
    // only after the one before it runs its new inputs, then the kubelet.
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
            "start etcd.service".to_owned(),
            "wait etcd".to_owned(),
            format!("install {m}/kube-apiserver.yaml"),
            format!("wait kube-apiserver-{node}"),
            format!("install {m}/kube-controller-manager.yaml"),
            format!("wait kube-controller-manager-{node}"),
            format!("install {m}/kube-scheduler.yaml"),
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
