//! Certificates renew themselves. A pass (the reconciler runs one every interval) looks at what
//! every node of every founded cluster runs — the certificates its applied generation's bundle
//! carried, as recorded at issuance — and when any of them has less than the server's share of
//! its validity left ([`RenewAt`], a third by default), gives that node its next generation. The
//! rollout then hands the node a bundle with freshly minted leaves, one control-plane node at a
//! time. Serving certificates made at founding (apiserver, etcd server and peer) are re-minted
//! here when they are due, keeping their SANs, and stored for the bundle to carry.

use std::collections::BTreeMap;
use std::sync::Arc;

use exk8s_common::contract::Role;
use time::OffsetDateTime;

use crate::certificates;
use crate::crypto::Keyring;
use crate::db::phase::ClusterPhase;
use crate::db::{self, Db, DbError, certificates::CertRow, clusters::ClusterRow, nodes::NodeRow};
use crate::pki::{ClusterNetwork, ClusterPki, NodeServingCerts, PkiError, ServiceCidr};
use crate::trust::{self, NodeKeyColumn};

pub use crate::pki::RenewAt;

/// What renewal needs: the rows and their kept copy, the clock and rule leaves are judged by,
/// opened trust, the KEKs that seal re-minted serving keys, the CPU pool that mints them and
/// the metrics that show the soonest expiry.
#[derive(Debug, Clone)]
pub struct Renewer {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub renew_at: RenewAt,
    pub keks: Arc<Keyring>,
    pub issuers: Arc<crate::records::issuers::IssuerCache>,
    pub recorded: Arc<crate::cert_cache::CertificateCache>,
    pub cpu: crate::cpu::CpuPool,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Why a renewal pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum RenewalError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Trust(#[from] trust::TrustError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Cpu(#[from] crate::cpu::CpuError),
    #[error("sealing a re-minted key")]
    Seal(#[from] crate::crypto::SealError),
    #[error("node {vm_id} has an unusable stored {what}")]
    Corrupt { vm_id: i64, what: &'static str },
    #[error("{0}")]
    Restoring(String),
    #[error("cluster not found")]
    NotFound,
    #[error("cluster {id} is {phase}; only a founded cluster's certificates can be renewed")]
    NotFounded { id: i64, phase: ClusterPhase },
}

/// A node given its next generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    pub cluster_id: i64,
    pub vm_id: i64,
    pub desired_generation: i64,
    /// Its serving certificates were re-minted too.
    pub serving: bool,
}

/// Founded clusters a pass reads at once: their nodes and certificates come in one query each,
/// so a pass over 10,000 clusters is 60 queries, not 30,000.
const PAGE: i64 = 500;

/// One pass over every founded cluster, [`PAGE`] at a time.
pub async fn pass(ctx: &Renewer) -> Result<Vec<Renewed>, RenewalError> {
    pass_in_pages(ctx, PAGE).await
}

/// One pass over every founded cluster, `page` at a time.
pub async fn pass_in_pages(ctx: &Renewer, page: i64) -> Result<Vec<Renewed>, RenewalError> {
    let pool = &ctx.db.pool;
    let page = page.max(1);
    let mut renewed = Vec::new();
    let mut after = 0;
    // The clusters with gauges now: those the pass does not find founded are gone (one
    // founded during the pass gets its gauge after this and stays).
    let gauged = ctx.metrics.clusters_with_gauges();
    let mut seen = std::collections::BTreeSet::new();
    loop {
        let founded = db::renewal::founded_page(pool, after, page).await?;
        seen.extend(founded.iter().map(|&(id, _)| id));
        let (Some(&(first, _)), Some(&(last, _))) = (founded.first(), founded.last()) else {
            ctx.metrics.forget_clusters(gauged.difference(&seen));
            return Ok(renewed);
        };
        after = last;
        let span = db::pages::Clusters::Span {
            org_id: None,
            first,
            last,
        };
        // The certificates come from memory while unchanged (see `crate::cert_cache`).
        let ids: Vec<i64> = founded.iter().map(|&(id, _)| id).collect();
        let ahead = ctx.recorded.ahead(&span, &ids);
        let (nodes, read) = tokio::try_join!(
            db::pages::nodes(pool, &span),
            db::pages::certificates(pool, &ahead)
        )?;
        let mut nodes = db::pages::group(nodes, |n| n.cluster_id);
        let versions = founded.iter().copied();
        let mut certificates = (ctx.recorded).resolve(pool, versions, &nodes, read).await?;
        for id in &ids {
            let nodes = nodes.remove(id).unwrap_or_default();
            let certificates = certificates
                .remove(id)
                .map(|rows| rows.to_vec())
                .unwrap_or_default();
            renewed.extend(renew_due(ctx, *id, nodes, certificates).await?);
        }
        if i64::try_from(founded.len()).unwrap_or(i64::MAX) < page {
            ctx.metrics.forget_clusters(gauged.difference(&seen));
            return Ok(renewed);
        }
    }
}

/// Names of the serving certificates stored per node (re-minted here, not per bundle).
const SERVING: [&str; 3] = ["apiserver", "etcd-server", "etcd-peer"];

/// Gives every idle node of cluster `cluster_id` (its `nodes` and recorded `certificates`, as
/// read for the pass) whose running certificates are due its next generation. The cluster's
/// full row, and its opened trust, are read only when a node is due.
async fn renew_due(
    ctx: &Renewer,
    cluster_id: i64,
    nodes: Vec<NodeRow>,
    recorded: Vec<CertRow>,
) -> Result<Vec<Renewed>, RenewalError> {
    let applied: BTreeMap<i64, i64> = nodes.iter().map(|n| (n.id, n.applied_generation)).collect();
    let current = certificates::current(recorded, &applied);
    if !current.is_empty() {
        let soonest = certificates::soonest_expiry(&current);
        ctx.metrics.set_soonest_expiry(cluster_id, soonest);
    }
    let now = ctx.clock.now();
    let rule = ctx.renew_at;
    let due = |c: &CertRow| rule.due(c.not_before, c.not_after, now.unix_timestamp());
    // Every role's leaves renew; only control-plane nodes have serving certificates stored.
    let due_nodes: Vec<(&NodeRow, bool)> = nodes
        .iter()
        .filter(|n| n.up_to_date())
        .filter_map(|node| {
            let running: Vec<&CertRow> = current
                .iter()
                .filter(|c| c.node_id == Some(node.id))
                .collect();
            running.iter().any(|c| due(c)).then(|| {
                let serving = running
                    .iter()
                    .any(|c| SERVING.contains(&&*c.name) && due(c));
                (node, serving)
            })
        })
        .collect();
    if due_nodes.is_empty() {
        return Ok(Vec::new());
    }
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(Vec::new());
    };
    if cluster.phase != ClusterPhase::Founded {
        return Ok(Vec::new()); // It is being deleted since the page was read.
    }
    let pki = ctx.issuers.open(&ctx.keks, &cluster)?;
    let mut renewed = Vec::new();
    for (node, serving) in due_nodes {
        if let Some(done) = renew_node(ctx, &cluster, node, &pki, serving, now).await? {
            tracing::info!(
                cluster_id = cluster.id,
                vm_id = node.vm_id,
                generation = done.desired_generation,
                serving = done.serving,
                "certificates due: node renews"
            );
            renewed.push(done);
        }
    }
    Ok(renewed)
}

/// Bumps `node`'s generation (when it is idle) and, with `serving`, stores re-minted serving
/// certificates, in one transaction.
async fn renew_node(
    ctx: &Renewer,
    cluster: &ClusterRow,
    node: &NodeRow,
    pki: &Arc<ClusterPki>,
    serving: bool,
    now: OffsetDateTime,
) -> Result<Option<Renewed>, RenewalError> {
    let minted = if serving {
        Some(mint_serving(&ctx.cpu, cluster, node, pki, now).await?)
    } else {
        None
    };
    let mut tx = ctx.db.begin().await?;
    let Some(desired_generation) = db::renewal::bump_idle_node(&mut tx, node.id).await? else {
        // It started moving since we looked: its next bundle is fresh anyway.
        return Ok(None);
    };
    if let Some(certs) = &minted {
        store_serving(&ctx.keks, &mut tx, cluster, node, certs).await?;
    }
    tx.commit().await?;
    Ok(Some(Renewed {
        cluster_id: cluster.id,
        vm_id: node.vm_id,
        desired_generation,
        serving,
    }))
}

/// New serving certificates for `node`, with the SANs its addresses and the cluster's network
/// give (the same as at founding).
pub(crate) async fn mint_serving(
    cpu: &crate::cpu::CpuPool,
    cluster: &ClusterRow,
    node: &NodeRow,
    pki: &Arc<ClusterPki>,
    now: OffsetDateTime,
) -> Result<NodeServingCerts, RenewalError> {
    let network = ClusterNetwork::new(
        ServiceCidr::parse(&cluster.service_cidr)?,
        &cluster.cluster_domain,
        &cluster.control_plane_dns_name,
    )?;
    let addresses = crate::records::load::addresses(node).map_err(|_| RenewalError::Corrupt {
        vm_id: node.vm_id,
        what: "addresses",
    })?;
    let pki = Arc::clone(pki);
    Ok(cpu
        .run(move || NodeServingCerts::generate(&pki, &addresses, &network, now))
        .await??)
}

/// Seals and stores `certs` as `node`'s serving certificates.
pub(crate) async fn store_serving(
    keks: &Keyring,
    tx: &mut sqlx::AnyConnection,
    cluster: &ClusterRow,
    node: &NodeRow,
    certs: &NodeServingCerts,
) -> Result<(), RenewalError> {
    let seal = |column, cert| trust::seal_node_key(keks, cluster.id, node.vm_id, column, cert);
    let (apiserver, etcd_server, etcd_peer) = (
        seal(NodeKeyColumn::Apiserver, &certs.apiserver)?,
        seal(NodeKeyColumn::EtcdServer, &certs.etcd_server)?,
        seal(NodeKeyColumn::EtcdPeer, &certs.etcd_peer)?,
    );
    db::renewal::replace_serving(
        tx,
        node.id,
        &db::renewal::ServingRows {
            apiserver: (&certs.apiserver.cert_pem, &apiserver),
            etcd_server: (&certs.etcd_server.cert_pem, &etcd_server),
            etcd_peer: (&certs.etcd_peer.cert_pem, &etcd_peer),
        },
    )
    .await?;
    Ok(())
}

/// `POST /clusters/{id}/certificates/renew`: every leaf now (after a suspected key leak).
/// Each control-plane node's serving certificates are re-minted and stored, and every node
/// gets its next generation, whose bundle carries freshly minted leaves; the rollout delivers
/// them one control-plane node at a time.
pub async fn force(
    ctx: &Renewer,
    org_id: i64,
    cluster_id: i64,
) -> Result<crate::rollout::Started, RenewalError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(RenewalError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(RenewalError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    if let Some(why) = db::restores::refusal(&ctx.db.pool, cluster_id, "renew after it").await? {
        return Err(RenewalError::Restoring(why));
    }
    let pki = ctx.issuers.open(&ctx.keks, &cluster)?;
    let now = ctx.clock.now();
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let mut minted = Vec::new();
    for node in nodes.iter().filter(|n| n.role == Role::ControlPlane) {
        minted.push((
            node,
            mint_serving(&ctx.cpu, &cluster, node, &pki, now).await?,
        ));
    }
    let mut tx = ctx.db.begin().await?;
    for (node, certs) in &minted {
        store_serving(&ctx.keks, &mut tx, &cluster, node, certs).await?;
    }
    let nodes = db::nodes::bump_generations(&mut tx, cluster_id).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        nodes = nodes.len(),
        "forced renewal of every leaf started"
    );
    Ok(crate::rollout::Started { cluster_id, nodes })
}

#[cfg(test)]
mod tests {
    use super::RenewAt;

    #[test]
    fn due_when_less_than_the_share_remains() {
        let day = 86_400;
        let third = RenewAt::THIRD;
        // A 3-day leaf (backdated five minutes) is due after two days, not before.
        let (from, to) = (-300, 3 * day);
        assert!(!third.due(from, to, day));
        assert!(third.due(from, to, 2 * day));
        assert!(third.due(from, to, 4 * day), "expired is due");
        assert_eq!(RenewAt::parse("1/3"), Ok(third));
        assert_eq!(
            RenewAt::parse(" 1 / 4 ").map(|r| r.to_string()),
            Ok("1/4".into())
        );
        for bad in ["0/3", "3/3", "4/3", "a/b", "1", "1/0"] {
            assert!(RenewAt::parse(bad).is_err(), "{bad}");
        }
    }
}
