//! What only a control-plane node's bundle carries: the etcd and front-proxy CA certificates,
//! the service-account key pair, the stored serving certificates, the control plane's client
//! certificates and kubeconfigs, etcd's unit, the cluster environment, encryption and audit
//! configuration, the addon assets, and the static pods — last, so each pod's
//! `exk8s.io/inputs-sha256` digests exactly the files it mounts.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use zeroize::Zeroizing;

use crate::cluster::spec::PodNetwork;

use super::super::contexts::{self, Mount};
use super::super::engine::{InputsSlot, PodUidSlot};
use super::super::paths::{NodePaths, PATHS};
use super::super::{Membership, RenderError, RenderInput, render, render_static_pod};
use super::{FileSet, LOCAL_API, StaticPod, Trust};
use crate::pki::{ClientIdentity, ControlPlaneCerts, IssuedCert};
use exk8s_common::names::Sha256Digest;

/// A read-only hostPath file mount named after the file.
fn file_mount(path: &'static str) -> Mount {
    let name = path
        .rsplit('/')
        .next()
        .unwrap_or(path)
        .replace(['.', '_'], "-");
    Mount {
        name,
        path,
        kind: "File",
        read_only: true,
    }
}

fn apiserver_mounts(p: &NodePaths) -> Vec<Mount> {
    let mut mounts: Vec<Mount> = [
        p.ca_cert,
        p.apiserver_cert,
        p.apiserver_key,
        p.apiserver_kubelet_client_cert,
        p.apiserver_kubelet_client_key,
        p.etcd_ca_cert,
        p.apiserver_etcd_client_cert,
        p.apiserver_etcd_client_key,
        p.front_proxy_ca_cert,
        p.front_proxy_client_cert,
        p.front_proxy_client_key,
        p.service_account_public,
        p.service_account_key,
        p.encryption_config,
        p.audit_policy,
    ]
    .into_iter()
    .map(file_mount)
    .collect();
    mounts.push(Mount {
        name: "audit-log".into(),
        path: p.audit_log_dir,
        kind: "DirectoryOrCreate",
        read_only: false,
    });
    mounts
}

fn controller_manager_mounts(p: &NodePaths) -> Vec<Mount> {
    [
        p.controller_manager_kubeconfig,
        p.ca_cert,
        p.front_proxy_ca_cert,
        p.service_account_key,
    ]
    .into_iter()
    .map(file_mount)
    .collect()
}

fn scheduler_mounts(p: &NodePaths) -> Vec<Mount> {
    vec![file_mount(p.scheduler_kubeconfig)]
}

pub(super) fn files(
    input: &RenderInput<'_>,
    minted: &ControlPlaneCerts,
    files: &mut FileSet,
) -> Result<Vec<StaticPod>, RenderError> {
    let p = &PATHS;
    let cluster = input.cluster;
    let network = &cluster.network;
    let node = &input.node.addresses;
    let creds = &input.credentials;
    let versions = &cluster.versions;
    let node_ip = node.private_ipv4.to_string();
    let cluster_name = cluster.name.as_str();
    let image = |component: &str| format!("registry.k8s.io/{component}:{}", versions.kubernetes);

    let initial_cluster = input
        .peers
        .iter()
        .map(|peer| {
            format!(
                "{}=https://{}:2380",
                peer.addresses.name, peer.addresses.private_ipv4
            )
        })
        .collect::<Vec<_>>()
        .join(",");
    // A learner refuses client requests: the apiserver uses voters only.
    let etcd_servers = input
        .peers
        .iter()
        .filter(|peer| peer.membership == Membership::Voter)
        .map(|peer| format!("https://{}:2379", peer.addresses.private_ipv4))
        .collect::<Vec<_>>()
        .join(",");
    let initial_node = input
        .peers
        .iter()
        .find(|peer| peer.is_initial)
        .ok_or(RenderError::InitialNodes(0))?;

    // Trust: CA certificates only (never their keys), the service-account pair, node certs.
    files.public(p.etcd_ca_cert, creds.etcd_ca_pem.as_bytes());
    files.public(p.front_proxy_ca_cert, creds.front_proxy_ca_pem.as_bytes());
    files.public(
        p.service_account_public,
        creds.service_account_public_pem.as_bytes(),
    );
    files.private(
        p.service_account_key,
        creds.service_account.private_pem.expose().as_bytes(),
    );
    files.cert(p.apiserver_cert, p.apiserver_key, &creds.serving.apiserver);
    files.cert(
        p.etcd_server_cert,
        p.etcd_server_key,
        &creds.serving.etcd_server,
    );
    files.cert(p.etcd_peer_cert, p.etcd_peer_key, &creds.serving.etcd_peer);
    files.cert(
        p.apiserver_kubelet_client_cert,
        p.apiserver_kubelet_client_key,
        &minted.apiserver_kubelet_client,
    );
    files.cert(
        p.apiserver_etcd_client_cert,
        p.apiserver_etcd_client_key,
        &minted.apiserver_etcd_client,
    );
    files.cert(
        p.front_proxy_client_cert,
        p.front_proxy_client_key,
        &minted.front_proxy_client,
    );
    files.cert(
        p.etcd_healthcheck_client_cert,
        p.etcd_healthcheck_client_key,
        &minted.etcd_healthcheck_client,
    );

    // Kubeconfigs: every node-local identity talks to its own apiserver.
    let kubeconfigs: [(&'static str, ClientIdentity, &IssuedCert); 4] = [
        (p.admin_kubeconfig, ClientIdentity::Admin, &minted.admin),
        (
            p.super_admin_kubeconfig,
            ClientIdentity::SuperAdmin,
            &minted.super_admin,
        ),
        (
            p.controller_manager_kubeconfig,
            ClientIdentity::ControllerManager,
            &minted.controller_manager,
        ),
        (
            p.scheduler_kubeconfig,
            ClientIdentity::Scheduler,
            &minted.scheduler,
        ),
    ];
    let trust = Trust {
        cluster_name,
        server: LOCAL_API,
        ca_pem: creds.cluster_ca_pem,
    };
    for (path, identity, credentials) in kubeconfigs {
        files.kubeconfig(path, &trust, &identity, credentials);
    }

    // Host configuration and units.
    files.public(
        p.cluster_env,
        render(&contexts::ClusterEnv {
            cluster_name,
            cluster_id: cluster.cluster_id,
            kubernetes_version: versions.kubernetes.as_str(),
            cluster_domain: &network.cluster_domain,
            service_cidr: network.service_cidr.to_string(),
            api_service_ip: network.service_cidr.api_service_ip().to_string(),
            dns_service_ip: network.service_cidr.dns_service_ip().to_string(),
            pod_cidr: cluster.pod_cidr.to_string(),
            control_plane_dns_name: &network.control_plane_dns_name,
            node_name: node.name.as_str(),
            node_ipv4: node_ip.clone(),
            node_ipv6: node
                .private_ipv6
                .map(|ip| ip.to_string())
                .unwrap_or_default(),
            etcd_initial_cluster: &initial_cluster,
            is_initial: input.node.is_initial,
        })?,
    );
    files.public(
        p.etcd_unit,
        render(&contexts::EtcdUnit {
            paths: p,
            etcd_binary: crate::render::paths::etcd_binary(&cluster.versions.etcd),
            name: node.name.as_str(),
            node_ip: node_ip.clone(),
        })?,
    );
    files.public(
        p.etcd_bootstrap_env,
        render(&contexts::EtcdBootstrap {
            initial_cluster: &initial_cluster,
            initial_cluster_state: match input.node.membership {
                Membership::Voter | Membership::Leaving { .. } => "new",
                Membership::Joining => "existing",
            },
            cluster_token: format!("exk8s-{}", cluster.cluster_id),
        })?,
    );
    let key_base64 = Zeroizing::new(BASE64.encode(cluster.encryption_key.expose()));
    files.private(
        p.encryption_config,
        render(&contexts::Encryption {
            key_name: "exk8s-1",
            key_base64: &key_base64,
        })?,
    );
    files.public(p.audit_policy, render(&contexts::AuditPolicy {})?);

    // Addon assets (applied by the initial node only, as the plan says).
    match cluster.pod_network {
        PodNetwork::Cilium => files.public(
            p.cilium_values,
            render(&contexts::CiliumValues {
                api_host: initial_node.addresses.private_ipv4.to_string(),
            })?,
        ),
        PodNetwork::Flannel => files.public(
            p.flannel_manifest,
            render(&contexts::Flannel {
                image: format!("ghcr.io/flannel-io/flannel:{}", versions.flannel),
                net_conf: flannel_net_conf(&cluster.pod_cidr.to_string()),
                api_host: super::BALANCER_HOST.to_owned(),
                api_port: super::BALANCER_PORT.to_string(),
            })?,
        ),
        PodNetwork::None => {}
    }
    files.public(
        p.kube_proxy_manifest,
        render(&contexts::KubeProxy {
            image: image("kube-proxy"),
            pod_cidr: cluster.pod_cidr.to_string(),
            kubeconfig: p.kube_proxy_kubeconfig,
        })?,
    );
    files.public(
        p.coredns_manifest,
        render(&contexts::CoreDns {
            image: format!("registry.k8s.io/coredns/coredns:{}", versions.coredns),
            cluster_domain: &network.cluster_domain,
            dns_service_ip: network.service_cidr.dns_service_ip().to_string(),
        })?,
    );
    let (admin_group, kubelet_client_user) = (
        ClientIdentity::Admin.subject().1.unwrap_or_default(),
        ClientIdentity::ApiserverKubeletClient.subject().0,
    );
    files.public(
        p.rbac_manifest,
        render(&contexts::Rbac {
            admin_group,
            apiserver_kubelet_client_user: &kubelet_client_user,
        })?,
    );

    // Static pods last: their annotations digest the files they mount.
    let mut static_pods = Vec::with_capacity(3);
    let mut static_pod = |name, manifest, inputs_sha256: &Sha256Digest| {
        static_pods.push(StaticPod {
            name,
            manifest,
            inputs_sha256: *inputs_sha256,
        });
    };
    let mounts = apiserver_mounts(p);
    let inputs = files.digest_of(&mounts);
    static_pod("kube-apiserver", p.apiserver_manifest, &inputs);
    let manifest = render_static_pod(
        &contexts::Apiserver {
            paths: p,
            image: image("kube-apiserver"),
            inputs_sha256: InputsSlot,
            pod_uid: PodUidSlot,
            node_ip: node_ip.clone(),
            etcd_servers: &etcd_servers,
            service_cidr: network.service_cidr.to_string(),
            service_account_issuer: format!(
                "https://kubernetes.default.svc.{}",
                network.cluster_domain
            ),
            mounts: &mounts,
        },
        &inputs,
    )?;
    files.private(p.apiserver_manifest, manifest);
    let mounts = controller_manager_mounts(p);
    let inputs = files.digest_of(&mounts);
    static_pod(
        "kube-controller-manager",
        p.controller_manager_manifest,
        &inputs,
    );
    let manifest = render_static_pod(
        &contexts::ControllerManager {
            paths: p,
            image: image("kube-controller-manager"),
            inputs_sha256: InputsSlot,
            pod_uid: PodUidSlot,
            cluster_name,
            pod_cidr: cluster.pod_cidr.to_string(),
            node_cidr_mask: cluster.pod_cidr.node_prefix(),
            service_cidr: network.service_cidr.to_string(),
            mounts: &mounts,
        },
        &inputs,
    )?;
    files.private(p.controller_manager_manifest, manifest);
    let mounts = scheduler_mounts(p);
    let inputs = files.digest_of(&mounts);
    static_pod("kube-scheduler", p.scheduler_manifest, &inputs);
    let manifest = render_static_pod(
        &contexts::Scheduler {
            paths: p,
            image: image("kube-scheduler"),
            inputs_sha256: InputsSlot,
            pod_uid: PodUidSlot,
            mounts: &mounts,
        },
        &inputs,
    )?;
    files.private(p.scheduler_manifest, manifest);

    Ok(static_pods)
}

/// flanneld's `net-conf.json`: the cluster's pod CIDR (each node's range is its
/// `Node.spec.podCIDR`, taken by `--kube-subnet-mgr`), VXLAN between nodes.
fn flannel_net_conf(pod_cidr: &str) -> String {
    serde_json::json!({
        "Network": pod_cidr,
        "Backend": { "Type": "vxlan" },
    })
    .to_string()
}
