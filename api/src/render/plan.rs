//! What the node installs and does: artifacts (binaries with digests), OS packages, and the
//! ordered plan. The API decides all of it — including that only the initial node's bootstrap
//! bundle runs the cluster-wide addon steps (an update restarts what changed, nothing more) —
//! so the agent never branches on cluster facts.

use exk8s_common::contract::BundleKind;
use exk8s_common::names::{ArchiveMember, ArtifactDest, ArtifactName, HttpUrl, PackageName};
use exk8s_common::names::{BundlePath, FileMode, K8sName, UnitName, Version};
use exk8s_common::payload::{Artifact, Package, PlanStep, RolloutKind};

use crate::cluster::spec::PodNetwork;

use super::files::StaticPod;
use super::paths::PATHS;
use super::{RenderError, RenderInput};

/// How long each wait may take before the agent reports the step failed.
const WAIT_ETCD_SECS: u32 = 600;
const WAIT_APISERVER_SECS: u32 = 600;
const WAIT_COMPONENT_SECS: u32 = 300;
/// An update's default wait for each component it restarted (`--update-wait-secs`).
pub const DEFAULT_UPDATE_WAIT_SECS: u32 = 600;
const ADDON_SECS: u32 = 600;
/// How long a joining member may take to catch up before its learner is withdrawn.
const PROMOTE_SECS: u32 = 600;
/// How long one worker's drain may take (the API's drain deadline bounds the retries).
const DRAIN_SECS: u32 = 300;

/// OS packages every control-plane node needs (Debian names).
const PACKAGES: &[&str] = &[
    "ca-certificates",
    "conntrack",
    "containerd",
    "containernetworking-plugins",
    "ebtables",
    "ethtool",
    "iproute2",
    "iptables",
    "socat",
];

fn invalid(e: impl std::fmt::Display) -> RenderError {
    RenderError::InvalidValue(e.to_string())
}

fn path(p: &str) -> Result<BundlePath, RenderError> {
    BundlePath::new(p).map_err(invalid)
}

fn paths(list: &[&str]) -> Result<Vec<BundlePath>, RenderError> {
    list.iter().map(|p| path(p)).collect()
}

fn name(s: &str) -> Result<K8sName, RenderError> {
    K8sName::new(s).map_err(invalid)
}

fn unit(s: &str) -> Result<UnitName, RenderError> {
    UnitName::new(s).map_err(invalid)
}

struct Source<'a> {
    name: &'a str,
    version: &'a Version,
    url: String,
    archive_member: Option<String>,
    dest: String,
}

/// Where a control-plane node's `etcdutl` lives (a restore runs it).
pub const ETCDUTL: &str = "/usr/local/bin/etcdutl";

/// Only the initial node's first bundle installs the cluster's addons.
fn installs_addons(input: &RenderInput<'_>) -> bool {
    input.node.is_initial && input.issuance.kind == BundleKind::Bootstrap
}

pub(super) fn artifacts(input: &RenderInput<'_>) -> Result<Vec<Artifact>, RenderError> {
    let mut names = vec!["etcd", "etcdctl", "etcdutl", "kubelet", "kubectl"];
    // helm installs the pod network's chart, and nothing else.
    if installs_addons(input) && input.cluster.pod_network == PodNetwork::Cilium {
        names.push("helm");
    }
    pinned(&input.cluster.versions, input.artifacts, &names)
}

/// A worker installs the kubelet only.
pub(super) fn worker_artifacts(
    cluster: &super::ClusterSpec,
    catalog: &super::ArtifactCatalog,
) -> Result<Vec<Artifact>, RenderError> {
    pinned(&cluster.versions, catalog, &["kubelet"])
}

/// Every download a node of `versions` may install, pinned by `catalog` where it has an entry.
pub fn downloads(
    versions: &super::Versions,
    catalog: &super::ArtifactCatalog,
) -> Result<Vec<Artifact>, RenderError> {
    pinned(versions, catalog, super::catalog::ARTIFACT_NAMES)
}

/// Where each artifact of `names` comes from: the catalog's pinned download, or upstream.
fn pinned(
    versions: &super::Versions,
    catalog: &super::ArtifactCatalog,
    names: &[&str],
) -> Result<Vec<Artifact>, RenderError> {
    let (k8s, etcd, helm) = (&versions.kubernetes, &versions.etcd, &versions.helm);
    let etcd_tarball = format!(
        "https://github.com/etcd-io/etcd/releases/download/{etcd}/etcd-{etcd}-linux-amd64.tar.gz"
    );
    let all = [
        Source {
            name: "etcd",
            version: etcd,
            url: etcd_tarball.clone(),
            archive_member: Some(format!("etcd-{etcd}-linux-amd64/etcd")),
            dest: super::paths::etcd_binary(etcd),
        },
        Source {
            name: "etcdctl",
            version: etcd,
            url: etcd_tarball.clone(),
            archive_member: Some(format!("etcd-{etcd}-linux-amd64/etcdctl")),
            dest: "/usr/local/bin/etcdctl".into(),
        },
        Source {
            name: "etcdutl",
            version: etcd,
            url: etcd_tarball,
            archive_member: Some(format!("etcd-{etcd}-linux-amd64/etcdutl")),
            dest: ETCDUTL.into(),
        },
        Source {
            name: "kubelet",
            version: k8s,
            url: format!("https://dl.k8s.io/release/{k8s}/bin/linux/amd64/kubelet"),
            archive_member: None,
            dest: super::paths::kubernetes_binary(k8s, "kubelet"),
        },
        Source {
            name: "kubectl",
            version: k8s,
            url: format!("https://dl.k8s.io/release/{k8s}/bin/linux/amd64/kubectl"),
            archive_member: None,
            dest: super::paths::kubernetes_binary(k8s, "kubectl"),
        },
        Source {
            name: "helm",
            version: helm,
            url: format!("https://get.helm.sh/helm-{helm}-linux-amd64.tar.gz"),
            archive_member: Some("linux-amd64/helm".into()),
            dest: PATHS.helm_binary.into(),
        },
    ];
    let sources: Vec<Source<'_>> = all
        .into_iter()
        .filter(|s| names.contains(&s.name))
        .collect();
    sources
        .into_iter()
        .map(|s| {
            let name = ArtifactName::new(s.name).map_err(invalid)?;
            // etcdctl and etcdutl come out of etcd's tarball: a catalog that pins only etcd's
            // (written before a node installed etcdutl, say) pins theirs too.
            let own = catalog.get(&name, s.version);
            let pinned = match (own, s.name) {
                (None, "etcdctl" | "etcdutl") => {
                    catalog.get(&ArtifactName::new("etcd").map_err(invalid)?, s.version)
                }
                _ => own,
            };
            let (url, sha256) = match pinned {
                Some(pinned) => (pinned.url.clone(), Some(pinned.sha256)),
                None => (HttpUrl::new(s.url).map_err(invalid)?, None),
            };
            Ok(Artifact {
                sha256,
                name,
                version: s.version.clone(),
                url,
                archive_member: s
                    .archive_member
                    .map(|m| ArchiveMember::new(m).map_err(invalid))
                    .transpose()?,
                dest: ArtifactDest::new(&s.dest).map_err(invalid)?,
                mode: FileMode::EXECUTABLE,
            })
        })
        .collect()
}

pub(super) fn packages() -> Vec<Package> {
    PACKAGES
        .iter()
        .map(|p| Package {
            name: PackageName::new(*p).unwrap_or_else(|_| unreachable!("literal names are valid")),
        })
        .collect()
}

/// The kernel modules and parameters every node needs, loaded and applied by systemd's own
/// units before containerd starts (again when the bundle changes them). Both are static units
/// `systemctl enable` leaves as they are; in a container whose kernel is the host's they skip
/// themselves (their conditions), and the host must provide both.
fn kernel_steps() -> Result<[PlanStep; 2], RenderError> {
    Ok([
        PlanStep::EnableStart {
            unit: unit("systemd-modules-load.service")?,
            watch: paths(&[PATHS.modules_conf])?,
        },
        PlanStep::EnableStart {
            unit: unit("systemd-sysctl.service")?,
            watch: paths(&[PATHS.sysctl_conf])?,
        },
    ])
}

/// containerd, which every node runs: restarted when its configuration changed.
fn containerd_step() -> Result<PlanStep, RenderError> {
    Ok(PlanStep::EnableStart {
        unit: unit("containerd.service")?,
        watch: paths(&[PATHS.containerd_config, PATHS.cni_template])?,
    })
}

/// The node-local apiserver balancer, which every node runs before its kubelet: its socket
/// first (systemd holds it while the service restarts), then the service, each restarted only
/// when its own unit changed (the balancer reads the cluster CA again every round).
fn balancer_steps() -> Result<[PlanStep; 2], RenderError> {
    Ok([
        PlanStep::EnableStart {
            unit: unit("exk8s-apiserver-balancer.socket")?,
            watch: paths(&[PATHS.balancer_socket])?,
        },
        PlanStep::EnableStart {
            unit: unit("exk8s-apiserver-balancer.service")?,
            watch: paths(&[PATHS.balancer_unit])?,
        },
    ])
}

/// The kubelet, which every node runs: restarted when a file it reads changed.
fn kubelet_step() -> Result<PlanStep, RenderError> {
    let p = &PATHS;
    Ok(PlanStep::EnableStart {
        unit: unit("kubelet.service")?,
        watch: paths(&[
            p.kubelet_unit,
            p.kubelet_config,
            p.kubelet_kubeconfig,
            p.kubelet_cert,
            p.kubelet_key,
            p.ca_cert,
        ])?,
    })
}

/// A worker's plan: containerd, the balancer, then the kubelet, restarted when what they read
/// changed.
pub(super) fn worker_steps() -> Result<Vec<PlanStep>, RenderError> {
    let mut steps = vec![PlanStep::DaemonReload {}];
    steps.extend(kernel_steps()?);
    steps.push(containerd_step()?);
    steps.extend(balancer_steps()?);
    steps.push(kubelet_step()?);
    Ok(steps)
}

/// Where each component other than the apiserver answers `/healthz` on loopback (the ports
/// templates/kube-controller-manager.yaml and kube-scheduler.yaml bind and probe).
fn healthz_port(pod: &str) -> Option<u16> {
    match pod {
        "kube-controller-manager" => Some(10257),
        "kube-scheduler" => Some(10259),
        _ => None,
    }
}

/// A first boot starts the kubelet (which runs the static pods) and installs every static pod,
/// then waits for the apiserver's `/readyz`, the controller-manager's and the scheduler's
/// `/healthz`, and this node's registration.
fn bring_up(
    input: &RenderInput<'_>,
    static_pods: &[StaticPod],
    admin: &BundlePath,
) -> Result<Vec<PlanStep>, RenderError> {
    let install = |pod: &StaticPod| {
        Ok::<_, RenderError>(PlanStep::InstallStaticPod {
            manifest: path(pod.manifest)?,
        })
    };
    // Every manifest at once, as kubeadm writes them: the kubelet pulls and starts the three
    // side by side, and the controller-manager and the scheduler wait for the apiserver on
    // their own (leader election retries until it answers).
    let mut steps = vec![kubelet_step()?];
    for pod in static_pods {
        steps.push(install(pod)?);
    }
    steps.push(PlanStep::WaitApiserverReady {
        kubeconfig: admin.clone(),
        timeout_secs: WAIT_APISERVER_SECS,
    });
    for pod in static_pods {
        if let Some(port) = healthz_port(pod.name) {
            steps.push(PlanStep::WaitComponentHealthy {
                component: name(pod.name)?,
                port,
                timeout_secs: WAIT_COMPONENT_SECS,
            });
        }
    }
    // Read with the kubelet's own identity, which the Node authorizer lets read its own Node
    // (the admin group is bound to cluster-admin only by the first node's addon step).
    steps.push(PlanStep::WaitNodeRegistered {
        kubeconfig: path(PATHS.kubelet_kubeconfig)?,
        node: input.node.addresses.name.clone(),
        timeout_secs: WAIT_APISERVER_SECS,
    });
    Ok(steps)
}

/// An update restarts the apiserver first and waits for it to run its new inputs; then the
/// controller-manager and the scheduler together (each is leader-elected, with a replica on
/// every other member, so this member restarting both leaves the cluster both), waited for
/// side by side; the kubelet itself restarts last. Each wait lasts at most the update wait
/// (`--update-wait-secs`): past it the agent puts the previous files back.
fn roll_components(
    input: &RenderInput<'_>,
    static_pods: &[StaticPod],
    admin: &BundlePath,
) -> Result<Vec<PlanStep>, RenderError> {
    let (apiservers, others): (Vec<&StaticPod>, Vec<&StaticPod>) = static_pods
        .iter()
        .partition(|pod| pod.name == "kube-apiserver");
    let wait = |pod: &StaticPod| {
        Ok::<_, RenderError>(PlanStep::WaitStaticPod {
            kubeconfig: admin.clone(),
            manifest: path(pod.manifest)?,
            mirror_pod: name(&format!("{}-{}", pod.name, input.node.addresses.name))?,
            inputs_sha256: pod.inputs_sha256,
            timeout_secs: input.update_wait_secs,
        })
    };
    let mut steps = Vec::new();
    for group in [apiservers, others] {
        for pod in &group {
            steps.push(PlanStep::InstallStaticPod {
                manifest: path(pod.manifest)?,
            });
        }
        for pod in &group {
            steps.push(wait(pod)?);
        }
    }
    steps.extend([
        kubelet_step()?,
        PlanStep::WaitApiserverReady {
            kubeconfig: admin.clone(),
            timeout_secs: input.update_wait_secs,
        },
    ]);
    Ok(steps)
}

/// The voter the API chose removes leaving members (an update's work): each is drained, then
/// leaves etcd through the members that stay.
fn removals(
    input: &RenderInput<'_>,
    voters: &[HttpUrl],
    admin: &BundlePath,
) -> Result<Vec<PlanStep>, RenderError> {
    let p = &PATHS;
    if input.issuance.kind != BundleKind::Update {
        return Ok(Vec::new());
    }
    let mut steps = Vec::new();
    for leaving in input.peers.iter().filter(|peer| {
        peer.membership
            == super::Membership::Leaving {
                by: input.node.vm_id,
            }
    }) {
        let ip = leaving.addresses.private_ipv4;
        steps.push(PlanStep::DrainNode {
            kubeconfig: admin.clone(),
            node: leaving.addresses.name.clone(),
            timeout_secs: DRAIN_SECS,
        });
        steps.push(PlanStep::EtcdRemove {
            voters: voters.to_vec(),
            member_client_url: HttpUrl::new(format!("https://{ip}:2379")).map_err(invalid)?,
            member_peer_url: HttpUrl::new(format!("https://{ip}:2380")).map_err(invalid)?,
            ca_file: path(p.etcd_ca_cert)?,
            cert_file: path(p.etcd_healthcheck_client_cert)?,
            key_file: path(p.etcd_healthcheck_client_key)?,
            timeout_secs: PROMOTE_SECS,
        });
    }
    Ok(steps)
}

/// A control-plane node's plan. Both kinds bring etcd up (or restart it when its files
/// changed) and wait for it first. A bootstrap bundle then brings the other components up
/// together ([`bring_up`]); an update rolls them, the apiserver first ([`roll_components`]).
pub(super) fn steps(
    input: &RenderInput<'_>,
    static_pods: &[StaticPod],
) -> Result<Vec<PlanStep>, RenderError> {
    let p = &PATHS;
    let admin = path(p.admin_kubeconfig)?;
    let kube_system = name("kube-system")?;
    let joining = input.node.membership == super::Membership::Joining;
    let voters = input
        .peers
        .iter()
        .filter(|peer| peer.membership == super::Membership::Voter)
        .map(|peer| HttpUrl::new(format!("https://{}:2379", peer.addresses.private_ipv4)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    let peer_url = HttpUrl::new(format!(
        "https://{}:2380",
        input.node.addresses.private_ipv4
    ))
    .map_err(invalid)?;
    let mut steps = vec![PlanStep::DaemonReload {}];
    steps.extend(kernel_steps()?);
    steps.push(containerd_step()?);
    steps.extend(balancer_steps()?);
    if joining {
        steps.push(PlanStep::EtcdJoin {
            voters: voters.clone(),
            peer_url: peer_url.clone(),
            ca_file: path(p.etcd_ca_cert)?,
            cert_file: path(p.etcd_healthcheck_client_cert)?,
            key_file: path(p.etcd_healthcheck_client_key)?,
        });
    }
    steps.extend([
        PlanStep::EnableStart {
            unit: unit("etcd.service")?,
            watch: paths(&[
                p.etcd_unit,
                p.etcd_ca_cert,
                p.etcd_server_cert,
                p.etcd_server_key,
                p.etcd_peer_cert,
                p.etcd_peer_key,
            ])?,
        },
        PlanStep::WaitEtcdHealthy {
            endpoint: HttpUrl::new("https://127.0.0.1:2379").map_err(invalid)?,
            ca_file: path(p.etcd_ca_cert)?,
            cert_file: path(p.etcd_healthcheck_client_cert)?,
            key_file: path(p.etcd_healthcheck_client_key)?,
            timeout_secs: if input.issuance.kind == BundleKind::Update {
                input.update_wait_secs
            } else {
                WAIT_ETCD_SECS
            },
        },
    ]);
    // A learner answers /health; it votes (and the rest may start) once promoted.
    if joining {
        steps.push(PlanStep::EtcdPromote {
            voters: voters.clone(),
            peer_url,
            ca_file: path(p.etcd_ca_cert)?,
            cert_file: path(p.etcd_healthcheck_client_cert)?,
            key_file: path(p.etcd_healthcheck_client_key)?,
            timeout_secs: PROMOTE_SECS,
        });
    }
    if input.issuance.kind == BundleKind::Update {
        steps.extend(roll_components(input, static_pods, &admin)?);
    } else {
        steps.extend(bring_up(input, static_pods, &admin)?);
    }
    // Workers being removed, drained once this node's own components are up.
    for node in &input.issuance.drains {
        steps.push(PlanStep::DrainNode {
            kubeconfig: admin.clone(),
            node: node.clone(),
            timeout_secs: DRAIN_SECS,
        });
    }
    steps.extend(removals(input, &voters, &admin)?);
    if installs_addons(input) {
        steps.extend(addons(input, &admin, &kube_system)?);
    }
    Ok(steps)
}

/// The initial node's addon steps: every manifest applied first, then each rollout waited for,
/// so the images of the pod network, kube-proxy and CoreDNS are pulled side by side (the pod
/// network first: every Node's readiness waits on it). The binding that makes the admin group
/// cluster-admin comes before all of them and needs system:masters.
fn addons(
    input: &RenderInput<'_>,
    admin: &BundlePath,
    kube_system: &K8sName,
) -> Result<Vec<PlanStep>, RenderError> {
    let p = &PATHS;
    let apply = |file: &str| {
        Ok::<_, RenderError>(PlanStep::KubectlApply {
            kubeconfig: admin.clone(),
            file: path(file)?,
        })
    };
    let rollout = |kind: RolloutKind, workload: &str| {
        Ok::<_, RenderError>(PlanStep::WaitRollout {
            kubeconfig: admin.clone(),
            kind,
            name: name(workload)?,
            namespace: kube_system.clone(),
            timeout_secs: ADDON_SECS,
        })
    };
    let mut steps = vec![PlanStep::KubectlApply {
        kubeconfig: path(p.super_admin_kubeconfig)?,
        file: path(p.rbac_manifest)?,
    }];
    if input.cluster.pod_network == PodNetwork::Flannel {
        steps.push(apply(p.flannel_manifest)?);
    }
    steps.extend([apply(p.kube_proxy_manifest)?, apply(p.coredns_manifest)?]);
    match input.cluster.pod_network {
        // helm's own --wait is the rollout.
        PodNetwork::Cilium => steps.push(PlanStep::HelmInstall {
            kubeconfig: admin.clone(),
            release: name("cilium")?,
            chart: "oci://quay.io/cilium/charts/cilium"
                .parse()
                .map_err(invalid)?,
            version: input.cluster.versions.cilium_chart.clone(),
            namespace: kube_system.clone(),
            values_file: path(p.cilium_values)?,
            timeout_secs: ADDON_SECS,
        }),
        PodNetwork::Flannel => steps.push(rollout(RolloutKind::DaemonSet, "kube-flannel")?),
        // The operator's own network, installed after founding.
        PodNetwork::None => {}
    }
    steps.extend([
        rollout(RolloutKind::DaemonSet, "kube-proxy")?,
        rollout(RolloutKind::Deployment, "coredns")?,
    ]);
    Ok(steps)
}
