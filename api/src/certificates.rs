//! The certificate inventory: every certificate of a cluster, as recorded when the API made it
//! (its CAs and operator kubeconfig at founding or on request, each node's leaves with the
//! bundle generation that carried them). The API never reads a node's disk; what a node runs
//! is what its applied generation's bundle held.

use std::collections::BTreeMap;

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};

use std::sync::Arc;

use crate::crypto::Keyring;
use crate::db::{self, Db, DbError, certificates::CertKind, certificates::CertRow};
use crate::metrics::SoonestExpiry;
use crate::pki::{BundleCerts, ClusterPki, IssuedCert, NodeServingCerts, PkiError};

/// Why the inventory could not be read or a certificate not recorded.
#[derive(Debug, thiserror::Error)]
pub enum CertificatesError {
    #[error("cluster not found")]
    NotFound,
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Trust(#[from] crate::trust::TrustError),
    #[error(transparent)]
    Cpu(#[from] crate::cpu::CpuError),
}

/// A certificate to record: its name in the inventory, its kind, its PEM and, when this
/// process minted it, its facts (else they are read from the PEM).
#[derive(Debug, Clone, Copy)]
pub struct Issued<'a> {
    pub name: &'static str,
    pub kind: CertKind,
    pub pem: &'a str,
    pub minted: Option<&'a crate::pki::CertFacts>,
}

/// The cluster's CAs.
pub fn cas(pki: &ClusterPki) -> [Issued<'_>; 3] {
    let ca = |name, pem| Issued {
        name,
        kind: CertKind::Ca,
        pem,
        minted: None,
    };
    [
        ca("cluster-ca", pki.cluster_ca.cert_pem()),
        ca("etcd-ca", pki.etcd_ca.cert_pem()),
        ca("front-proxy-ca", pki.front_proxy_ca.cert_pem()),
    ]
}

/// The operator's admin kubeconfig (cluster-level; the latest one minted).
pub fn operator_kubeconfig_cert(cert: &IssuedCert) -> Issued<'_> {
    Issued {
        name: OPERATOR_KUBECONFIG,
        kind: CertKind::Client,
        pem: &cert.cert_pem,
        minted: cert.minted.as_ref(),
    }
}

/// Every certificate a node's bundle carries, by the file it lands in (serving certificates
/// only on a control-plane node).
pub fn bundle<'a>(
    serving: Option<&'a NodeServingCerts>,
    minted: &'a BundleCerts,
) -> Vec<Issued<'a>> {
    let item = |name, kind, cert: &'a IssuedCert| Issued {
        name,
        kind,
        pem: &cert.cert_pem,
        minted: cert.minted.as_ref(),
    };
    let node = minted.node();
    let mut all = Vec::new();
    if let Some(serving) = serving {
        all.extend([
            item("apiserver", CertKind::Serving, &serving.apiserver),
            item("etcd-server", CertKind::Serving, &serving.etcd_server),
            item("etcd-peer", CertKind::Serving, &serving.etcd_peer),
        ]);
    }
    all.extend([
        item("kubelet", CertKind::Serving, &node.kubelet_serving),
        item("kubelet.kubeconfig", CertKind::Client, &node.kubelet_client),
        item("kube-proxy.kubeconfig", CertKind::Client, &node.kube_proxy),
    ]);
    if let Some(cp) = minted.control_plane() {
        all.extend([
            item(
                "apiserver-kubelet-client",
                CertKind::Client,
                &cp.apiserver_kubelet_client,
            ),
            item(
                "apiserver-etcd-client",
                CertKind::Client,
                &cp.apiserver_etcd_client,
            ),
            item(
                "front-proxy-client",
                CertKind::Client,
                &cp.front_proxy_client,
            ),
            item(
                "etcd-healthcheck-client",
                CertKind::Client,
                &cp.etcd_healthcheck_client,
            ),
            item(
                "controller-manager.kubeconfig",
                CertKind::Client,
                &cp.controller_manager,
            ),
            item("scheduler.kubeconfig", CertKind::Client, &cp.scheduler),
            item("admin.kubeconfig", CertKind::Client, &cp.admin),
            item("super-admin.kubeconfig", CertKind::Client, &cp.super_admin),
        ]);
    }
    all
}

/// Records `certs` for `cluster_id` (and `node_id` at `generation`), inside `tx`.
pub async fn record(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    node: Option<(i64, i64)>,
    certs: &[Issued<'_>],
    now: i64,
) -> Result<(), CertificatesError> {
    let facts = facts_of(certs)?;
    record_read(tx, cluster_id, node, certs, &facts, now).await
}

/// What each of `certs` says of itself: as minted, else parsed (CPU work).
pub fn facts_of(certs: &[Issued<'_>]) -> Result<Vec<crate::pki::CertFacts>, CertificatesError> {
    Ok(certs
        .iter()
        .map(|cert| match cert.minted {
            Some(facts) => Ok(facts.clone()),
            None => crate::pki::facts(cert.pem),
        })
        .collect::<Result<Vec<_>, _>>()?)
}

/// [`record`] with `facts` (one per certificate, as [`facts_of`] gives) already read.
pub async fn record_read(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    node: Option<(i64, i64)>,
    certs: &[Issued<'_>],
    facts: &[crate::pki::CertFacts],
    now: i64,
) -> Result<(), CertificatesError> {
    let rows: Vec<db::certificates::NewCert<'_>> = certs
        .iter()
        .zip(facts)
        .map(|(cert, facts)| db::certificates::NewCert {
            cluster_id,
            node_id: node.map(|(id, _)| id),
            generation: node.map_or(0, |(_, generation)| generation),
            name: cert.name,
            kind: cert.kind,
            facts,
        })
        .collect();
    db::certificates::insert(&mut *tx, &rows, now).await?;
    Ok(())
}

/// One certificate of the inventory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The node's VM, or `None` for the cluster's own certificates.
    pub vm_id: Option<i64>,
    /// The generation whose bundle carried it (0 for the cluster's own).
    pub generation: i64,
    pub row: CertRow,
    /// Whole days until `not_after` (negative once expired).
    pub days_left: i64,
}

/// A cluster's certificates, soonest expiry first.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub cluster_id: i64,
    /// Days since the service-account key in use was made (at founding, or by its last rotation).
    pub service_account_key_age_days: i64,
    pub certificates: Vec<Entry>,
}

impl Inventory {
    /// The soonest expiries, nodes' and operator credentials' apart.
    pub fn soonest_expiry(&self) -> SoonestExpiry {
        soonest_expiry(self.certificates.iter().map(|e| &e.row))
    }
}

/// The soonest expiries among `rows` (what runs, as [`current`] gives): the operator
/// kubeconfig's for the operator credentials, every other (the CAs, each node's) for the nodes.
pub fn soonest_expiry<'a>(rows: impl IntoIterator<Item = &'a CertRow>) -> SoonestExpiry {
    let mut soonest = SoonestExpiry::default();
    for row in rows {
        let slot = if is_operator_credential(row) {
            &mut soonest.operator
        } else {
            &mut soonest.nodes
        };
        *slot = Some(slot.map_or(row.not_after, |s| s.min(row.not_after)));
    }
    soonest
}

/// What each node runs: the rows of its applied generation (or, before its first apply, of
/// the latest generation issued), the latest row per name; and the cluster's own rows. They
/// keep the rows' (recording) order; the rows are never moved but once, into the result (a
/// page of views judges 23,000).
pub fn current(rows: Vec<CertRow>, applied: &BTreeMap<i64, i64>) -> Vec<CertRow> {
    let mut latest_generation: HashMap<i64, i64> = HashMap::new();
    let mut has_applied: HashSet<i64> = HashSet::new();
    for row in &rows {
        if let Some(node) = row.node_id {
            let top = latest_generation.entry(node).or_insert(row.generation);
            *top = (*top).max(row.generation);
            if applied.get(&node) == Some(&row.generation) {
                has_applied.insert(node);
            }
        }
    }
    let wanted = |row: &CertRow| match row.node_id {
        None => true,
        Some(node) => {
            let generation = if has_applied.contains(&node) {
                applied.get(&node)
            } else {
                latest_generation.get(&node)
            };
            generation == Some(&row.generation)
        }
    };
    // Rows come in id order: a later one of the same name replaces an earlier one.
    let mut latest: HashMap<(Option<i64>, &str), usize> = HashMap::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate().filter(|(_, row)| wanted(row)) {
        latest.insert((row.node_id, &*row.name), i);
    }
    let mut keep = vec![false; rows.len()];
    for &i in latest.values() {
        keep[i] = true;
    }
    rows.into_iter()
        .zip(keep)
        .filter_map(|(row, kept)| kept.then_some(row))
        .collect()
}

/// What the inventory and the operator's kubeconfig need: the rows, the clock, opened trust,
/// the CPU pool that mints the operator's key and the metrics that show the soonest expiry.
#[derive(Debug, Clone)]
pub struct Certifier {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub keks: Arc<Keyring>,
    pub issuers: Arc<crate::records::issuers::IssuerCache>,
    pub cpu: crate::cpu::CpuPool,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// The inventory of `org_id`'s cluster `cluster_id`, with days left judged at the API's clock.
pub async fn inventory(
    ctx: &Certifier,
    org_id: i64,
    cluster_id: i64,
) -> Result<Inventory, CertificatesError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(CertificatesError::NotFound)?;
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let rows = db::certificates::list(&ctx.db.pool, cluster_id).await?;
    let inventory = inventory_of(
        cluster_id,
        cluster.sa_key_made_at(),
        &nodes,
        rows,
        ctx.clock.unix(),
    );
    if !inventory.certificates.is_empty() {
        ctx.metrics
            .set_soonest_expiry(cluster_id, inventory.soonest_expiry());
    }
    Ok(inventory)
}

/// A cluster's inventory from its rows: what its nodes may run (see [`current`]) and its own
/// certificates, soonest expiry first, judged at `now`.
pub fn inventory_of(
    cluster_id: i64,
    sa_key_made_at: i64,
    nodes: &[db::nodes::NodeRow],
    rows: Vec<CertRow>,
    now: i64,
) -> Inventory {
    let applied: BTreeMap<i64, i64> = nodes.iter().map(|n| (n.id, n.applied_generation)).collect();
    let vm_of: BTreeMap<i64, i64> = nodes.iter().map(|n| (n.id, n.vm_id)).collect();
    let mut certificates: Vec<Entry> = current(rows, &applied)
        .into_iter()
        .map(|row| Entry {
            vm_id: row.node_id.and_then(|n| vm_of.get(&n).copied()),
            generation: row.generation,
            days_left: (row.not_after - now).div_euclid(86_400),
            row,
        })
        .collect();
    certificates.sort_by(|a, b| {
        (a.row.not_after, a.vm_id, &a.row.name).cmp(&(b.row.not_after, b.vm_id, &b.row.name))
    });
    Inventory {
        cluster_id,
        service_account_key_age_days: (now - sa_key_made_at).div_euclid(86_400),
        certificates,
    }
}

/// Mints the operator's admin kubeconfig for founded cluster `row` (server: the shared DNS
/// name; the cluster's leaf lifetime; trusting what an operator's client trusts, the standby
/// CA included), recording its certificate. A new client certificate each call.
pub async fn operator_kubeconfig(
    ctx: &Certifier,
    row: db::clusters::ClusterRow,
) -> Result<crate::pki::SecretPem, CertificatesError> {
    use crate::pki::ClientIdentity;
    use crate::pki::kubeconfig::{self, KubeconfigSpec};

    let keks = Arc::clone(&ctx.keks);
    let issuers = Arc::clone(&ctx.issuers);
    let now = ctx.clock.now();
    let cluster_id = row.id;
    let rotation = db::rotations::get(&ctx.db.pool, cluster_id).await?;
    let standby = db::standby::get(&ctx.db.pool, cluster_id).await?;
    // Opening the CA and minting the client key is CPU work (seconds for RSA-4096): the pool.
    let (text, admin) = ctx
        .cpu
        .run(move || {
            let pki = issuers.open(&keks, &row)?;
            let admin = ClientIdentity::Admin.issue(&pki, now)?;
            let (user, _) = ClientIdentity::Admin.subject();
            let server = format!("https://{}:6443", row.control_plane_dns_name);
            let text = kubeconfig::render(&KubeconfigSpec {
                cluster_name: &row.name,
                server: &server,
                ca_pem: &crate::trust::operator_bundle(
                    pki.cluster_ca.cert_pem(),
                    rotation.as_ref(),
                    standby.as_ref().map(|s| s.cert.as_str()),
                ),
                user: &user,
                credentials: &admin,
            });
            Ok::<_, CertificatesError>((text, admin))
        })
        .await??;
    let mut tx = ctx.db.begin().await?;
    record(
        &mut tx,
        cluster_id,
        None,
        &[operator_kubeconfig_cert(&admin)],
        now.unix_timestamp(),
    )
    .await?;
    tx.commit().await?;
    Ok(text)
}

/// The recorded name of an operator kubeconfig's client certificate.
const OPERATOR_KUBECONFIG: &str = "operator.kubeconfig";

/// The recorded name of an operator's short-lived credential (`exk8s credential`).
pub const OPERATOR_CREDENTIAL: &str = "operator.credential";

/// Whether `row` is an operator's credential (no node runs it), not something the cluster runs.
pub fn is_operator_credential(row: &CertRow) -> bool {
    row.node_id.is_none() && matches!(&*row.name, OPERATOR_KUBECONFIG | OPERATOR_CREDENTIAL)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn entry(
        name: &str,
        vm: Option<i64>,
        not_before: i64,
        not_after: i64,
        now: i64,
    ) -> Entry {
        Entry {
            vm_id: vm,
            generation: 1,
            days_left: (not_after - now).div_euclid(86_400),
            row: CertRow {
                node_id: vm,
                generation: 1,
                name: name.into(),
                not_before,
                not_after,
                details: None,
            },
        }
    }

    pub(crate) fn inventory(mut certificates: Vec<Entry>) -> Inventory {
        certificates.sort_by_key(|e| e.row.not_after);
        Inventory {
            cluster_id: 1,
            service_account_key_age_days: 0,
            certificates,
        }
    }

    #[test]
    fn current_rows_are_each_node_applied_or_latest_generation_the_last_per_name() {
        let row = |node: Option<i64>, generation: i64, name: &str, not_after: i64| CertRow {
            node_id: node,
            generation,
            name: name.into(),
            not_before: 0,
            not_after,
            details: None,
        };
        // In recording order. Node 1 applied generation 2 and was handed 3; node 2 applied
        // 1, of which nothing is left (its rows are of 4 and 5); node 3 has no row.
        let rows = vec![
            row(None, 0, "cluster-ca", 1),
            row(Some(1), 2, "kubelet.pem", 2),
            row(Some(2), 4, "kubelet.pem", 3),
            row(Some(1), 2, "admin.kubeconfig", 4),
            row(Some(1), 3, "kubelet.pem", 5),
            row(Some(2), 5, "kubelet.pem", 6),
            row(Some(1), 2, "kubelet.pem", 7),
            row(None, 0, "operator.kubeconfig", 8),
            row(Some(2), 5, "kubelet.pem", 9),
        ];
        let applied = BTreeMap::from([(1, 2), (2, 1), (3, 1)]);
        let kept: Vec<i64> = current(rows, &applied)
            .iter()
            .map(|r| r.not_after)
            .collect();
        assert_eq!(kept, [1, 4, 7, 8, 9]);
    }

    #[test]
    fn the_nodes_soonest_expiry_ignores_the_operator_kubeconfig() {
        let day = 86_400;
        let now = 100 * day;
        let soonest = inventory(vec![
            // Expired long ago: an operator's old kubeconfig, which no node runs.
            entry(
                "operator.kubeconfig",
                None,
                now - 9 * day,
                now - 8 * day,
                now,
            ),
            entry("cluster-ca", None, now - 9 * day, now + 3000 * day, now),
            entry("kubelet.pem", Some(7), now - day, now + 200 * day, now),
            entry("apiserver.pem", Some(8), now - day, now + 100 * day, now),
        ])
        .soonest_expiry();
        assert_eq!(
            soonest,
            SoonestExpiry {
                nodes: Some(now + 100 * day),
                operator: Some(now - 8 * day),
            }
        );
        let none = inventory(vec![entry("kubelet.pem", Some(7), 0, now, now)]).soonest_expiry();
        assert_eq!((none.nodes, none.operator), (Some(now), None));
    }
}
