//! Who a bundle is for, loaded by the role in the node's record (never from the request): a
//! control-plane node — its peers, its stored serving certificates, every trust file — or a
//! worker — its pool's labels and taints, the cluster CA only. Minting, rendering and the
//! certificates recorded follow the role.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use exk8s_common::contract::{BundleKind, Role};
use exk8s_common::names::NodeName;
use exk8s_common::payload::BundlePayload;
use serde::Deserialize;

use super::Issuer;
use crate::certificates::{self, Issued};
use crate::db::{self, clusters::ClusterRow, nodes::NodeRow};
use crate::labels::{NodeLabel, Taint};
use crate::pki::{BundleCerts, ClusterPki, NodeAddresses, NodeServingCerts};
use crate::render::{
    self, ClusterSpec, ControlPlaneNode, Issuance, NodeCredentials, RenderError, RenderInput,
    WorkerInput, WorkerNode,
};
use crate::trust::Trusted;

use super::IssuanceError;
use crate::records::load;

enum Subject {
    ControlPlane {
        this: ControlPlaneNode,
        peers: Vec<ControlPlaneNode>,
        serving: Box<NodeServingCerts>,
        /// Workers this node's agent is asked to drain.
        drains: Vec<NodeName>,
        /// The public keys its apiserver verifies tokens with (two during a rotation).
        service_account_public: String,
    },
    Worker {
        node: WorkerNode,
        /// The control-plane members' private addresses (its balancer's seeds).
        apiservers: Vec<Ipv4Addr>,
    },
}

/// A node and its cluster, ready to mint for and render.
pub(super) struct Loaded {
    pub(super) pki: Arc<ClusterPki>,
    spec: ClusterSpec,
    trusted: Trusted,
    subject: Subject,
}

#[derive(Deserialize)]
struct StoredTaint {
    key: String,
    #[serde(default)]
    value: String,
    effect: String,
}

fn unusable(node: &NodeRow, what: &'static str) -> IssuanceError {
    IssuanceError::Corrupt {
        vm_id: node.vm_id,
        what,
    }
}

/// A worker's record and its pool's registration, and the pool's Kubernetes version (None:
/// the cluster's).
async fn worker(
    ctx: &Issuer,
    node: &NodeRow,
) -> Result<(WorkerNode, Option<String>), IssuanceError> {
    let pool_id = node.pool_id.ok_or_else(|| unusable(node, "pool"))?;
    let pool = db::pools::get(&ctx.db.pool, pool_id)
        .await?
        .ok_or_else(|| unusable(node, "pool"))?;
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&pool.labels_json).map_err(|_| unusable(node, "pool labels"))?;
    let taints: Vec<StoredTaint> =
        serde_json::from_str(&pool.taints_json).map_err(|_| unusable(node, "pool taints"))?;
    let worker = WorkerNode {
        vm_id: u64::try_from(node.vm_id).map_err(|_| unusable(node, "VM id"))?,
        addresses: load::addresses(node)?,
        labels: labels
            .iter()
            .map(|(k, v)| NodeLabel::new(k, v))
            .collect::<Result<_, _>>()
            .map_err(|_| unusable(node, "pool labels"))?,
        taints: taints
            .iter()
            .map(|t| Taint::new(&t.key, &t.value, &t.effect))
            .collect::<Result<_, _>>()
            .map_err(|_| unusable(node, "pool taints"))?,
    };
    Ok((worker, pool.kubernetes_version))
}

/// Loads what `node`'s bundle of `kind` is made from (the workers to drain only for an
/// update: a bootstrap bundle carries none).
pub(super) async fn load(
    ctx: &Issuer,
    cluster: &ClusterRow,
    node: &NodeRow,
    kind: BundleKind,
) -> Result<Loaded, IssuanceError> {
    let load::Cluster { pki, mut spec } = load::cluster(&ctx.keks, &ctx.issuers, cluster)?;
    // During a CA rotation trust files carry the CA trusted beside the signing one. A
    // control-plane node reads the rotation with its peers and serving certificates, in one
    // statement.
    let (rotation, subject) = match node.role {
        Role::ControlPlane => {
            let db::nodes::ControlPlaneView {
                nodes: rows,
                serving,
                rotation,
                sa_rotation,
            } = db::nodes::control_plane_view(&ctx.db.pool, cluster.id, node.id).await?;
            let subject = Subject::ControlPlane {
                service_account_public: crate::sa_rotation::public_keys(
                    &pki.service_account.public_pem,
                    sa_rotation.as_ref(),
                ),
                this: load::control_plane_node(node, &rows)?,
                peers: rows
                    .iter()
                    .filter(|p| p.role == Role::ControlPlane)
                    .map(|p| load::control_plane_node(p, &rows))
                    .collect::<Result<Vec<_>, _>>()?,
                serving: Box::new(load::serving_certs(&ctx.keks, cluster.id, node, serving)?),
                drains: match kind {
                    BundleKind::Update => db::removals::drained_by(&ctx.db.pool, node.id)
                        .await?
                        .iter()
                        .map(|name| NodeName::new(name.as_str()))
                        .collect::<Result<_, _>>()
                        .map_err(|_| unusable(node, "drained node name"))?,
                    BundleKind::Bootstrap => Vec::new(),
                },
            };
            (rotation, subject)
        }
        Role::Worker => {
            let (worker, version) = worker(ctx, node).await?;
            let apiservers = db::nodes::list(&ctx.db.pool, cluster.id)
                .await?
                .iter()
                .filter(|n| n.role == Role::ControlPlane)
                .map(|n| load::addresses(n).map(|a| a.private_ipv4))
                .collect::<Result<Vec<_>, _>>()?;
            // A worker's kubelet follows its pool's version, which moves only after the
            // control plane's.
            if let Some(version) = version {
                spec.versions = crate::render::Versions::of(
                    version
                        .parse()
                        .map_err(|_| unusable(node, "pool Kubernetes version"))?,
                );
            }
            (
                db::rotations::get(&ctx.db.pool, cluster.id).await?,
                Subject::Worker {
                    node: worker,
                    apiservers,
                },
            )
        }
    };
    let trusted = Trusted::of(&pki, rotation.as_ref());
    Ok(Loaded {
        pki,
        spec,
        trusted,
        subject,
    })
}

impl Loaded {
    pub(super) fn role(&self) -> Role {
        match self.subject {
            Subject::ControlPlane { .. } => Role::ControlPlane,
            Subject::Worker { .. } => Role::Worker,
        }
    }

    /// The Kubernetes version the bundle renders: the cluster's for a control-plane node, its
    /// pool's for a worker.
    pub(super) fn version(&self) -> &exk8s_common::names::Version {
        &self.spec.versions.kubernetes
    }

    /// The workers an update bundle asks this node to drain.
    pub(super) fn drains(&self) -> &[NodeName] {
        match &self.subject {
            Subject::ControlPlane { drains, .. } => drains,
            Subject::Worker { .. } => &[],
        }
    }

    pub(super) fn addresses(&self) -> &NodeAddresses {
        match &self.subject {
            Subject::ControlPlane { this, .. } => &this.addresses,
            Subject::Worker { node, .. } => &node.addresses,
        }
    }

    /// The payload for `issuance`, carrying `minted`.
    pub(super) fn render(
        &self,
        minted: &BundleCerts,
        issuance: &Issuance,
        config: &crate::config::ApiConfig,
    ) -> Result<BundlePayload, RenderError> {
        let artifacts = &config.artifacts;
        match &self.subject {
            Subject::ControlPlane {
                this,
                peers,
                serving,
                service_account_public,
                ..
            } => render::render_bundle(&RenderInput {
                cluster: &self.spec,
                node: this,
                peers,
                credentials: NodeCredentials {
                    cluster_ca_pem: &self.trusted.cluster,
                    etcd_ca_pem: &self.trusted.etcd,
                    front_proxy_ca_pem: &self.trusted.front_proxy,
                    service_account: &self.pki.service_account,
                    service_account_public_pem: service_account_public,
                    serving,
                    minted,
                },
                issuance,
                artifacts,
                update_wait_secs: u32::try_from(config.update_wait.as_secs()).unwrap_or(u32::MAX),
            }),
            Subject::Worker { node, apiservers } => render::render_worker_bundle(&WorkerInput {
                cluster: &self.spec,
                node,
                cluster_ca_pem: &self.trusted.cluster,
                minted: minted.node(),
                apiservers,
                issuance,
                artifacts,
            }),
        }
    }

    /// The certificates the bundle carries, for the inventory.
    pub(super) fn certificates<'a>(&'a self, minted: &'a BundleCerts) -> Vec<Issued<'a>> {
        let serving = match &self.subject {
            Subject::ControlPlane { serving, .. } => Some(&**serving),
            Subject::Worker { .. } => None,
        };
        certificates::bundle(serving, minted)
    }
}
