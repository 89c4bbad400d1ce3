//! CA rotation in phases, each delivered to every node as its own generation, so no client is
//! ever cut off (`POST /clusters/{id}/certificates/rotate-ca`):
//!
//! 1. **trust-both** — a new CA is made (its key sealed, waiting) — for the cluster CA, the
//!    standby operators' clients already trust ([`crate::standby`]); every trust file carries
//!    the old and the new CA; the old one still signs.
//! 2. **sign-new** — once every node applied that: the new CA becomes the cluster's, serving
//!    certificates are re-minted under it, and every bundle's leaves are minted by it; the old
//!    CA is still trusted, so nodes not yet updated keep talking to updated ones.
//! 3. **drop-old** — once every node applied that: trust files carry only the new CA.
//!
//! Then the rotation ends; one of the cluster CA leaves a new standby for the next. [`advance`]
//! moves a rotation on when every node of the cluster runs its desired generation; a node's
//! successful report and the reconciler both call it.

use std::sync::Arc;

use exk8s_common::contract::Role;

use crate::clock::Clock;
use crate::cpu::CpuPool;
use crate::crypto::Keyring;
use crate::db::phase::ClusterPhase;
use crate::db::rotations::{Rotation, RotationPhase};
use crate::db::{self, Db, DbError};
use crate::pki::{CaRole, CertAuthority, ClusterPki, PkiError, SecretPem};
use crate::records::issuers::IssuerCache;
use crate::renewal::{RenewalError, mint_serving, store_serving};
use crate::standby::{self, StandbyError};
use crate::trust::{self, cluster_aad};

/// What a CA rotation needs: the rows, the clock its phases are judged by, the KEKs that seal
/// the new CA's key, opened trust, and the CPU pool that mints serving certificates.
#[derive(Debug, Clone)]
pub struct Rotator {
    pub db: Db,
    pub clock: Arc<dyn Clock>,
    pub keks: Arc<Keyring>,
    pub issuers: Arc<IssuerCache>,
    pub cpu: CpuPool,
}

/// Why a rotation could not start or move on.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// Another change runs (a restore, a service-account key rotation): it says which.
    #[error("{0}")]
    Blocked(String),
    #[error("cluster not found")]
    NotFound,
    #[error("cluster {id} is {phase}; only a founded cluster's CAs can be rotated")]
    NotFounded { id: i64, phase: ClusterPhase },
    #[error("the {ca} CA of this cluster is being rotated (phase {phase}); one rotation at a time")]
    InProgress {
        ca: &'static str,
        phase: RotationPhase,
    },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Trust(#[from] trust::TrustError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Cpu(#[from] crate::cpu::CpuError),
    #[error("sealing the new CA key")]
    Seal(#[from] crate::crypto::SealError),
    #[error(transparent)]
    Renewal(#[from] RenewalError),
    #[error(transparent)]
    Certificates(#[from] crate::certificates::CertificatesError),
    #[error(transparent)]
    Standby(#[from] StandbyError),
}

/// The column a waiting new CA key is sealed under.
const NEW_KEY: &str = "rotation_key";

/// A rotation started: its CA and phase, and each node's new desired generation.
#[derive(Debug, Clone)]
pub struct Started {
    pub ca: CaRole,
    pub phase: RotationPhase,
    pub rollout: crate::rollout::Started,
}

/// Starts rotating `ca` of `org_id`'s cluster `cluster_id`.
pub async fn start(
    ctx: &Rotator,
    org_id: i64,
    cluster_id: i64,
    ca: CaRole,
) -> Result<Started, RotationError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(RotationError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(RotationError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    if let Some(current) = db::rotations::get(&ctx.db.pool, cluster_id).await? {
        return Err(in_progress(&current));
    }
    if let Some(why) =
        db::restores::refusal(&ctx.db.pool, cluster_id, "rotate a CA after it").await?
    {
        return Err(RotationError::Blocked(why));
    }
    if let Some(why) =
        db::rotations::refusal(&ctx.db.pool, cluster_id, "rotate a CA after it").await?
    {
        return Err(RotationError::Blocked(why));
    }
    let algorithm = ctx.issuers.open(&ctx.keks, &cluster)?.algorithm;
    let now = ctx.clock.now();
    // The cluster CA's standby, which operators' clients already trust, becomes the new CA;
    // without one (a cluster founded before standbys), a new CA is made.
    let waiting = match ca {
        CaRole::Cluster => db::standby::get(&ctx.db.pool, cluster_id).await?,
        CaRole::Etcd | CaRole::FrontProxy => None,
    };
    let new = match &waiting {
        Some(waiting) => standby::open(&ctx.keks, cluster_id, waiting, algorithm)?,
        None => {
            ctx.cpu
                .run(move || CertAuthority::generate(ca, algorithm, now))
                .await??
        }
    };
    let sealed = ctx.keks.seal(
        &cluster_aad(cluster_id, NEW_KEY),
        new.key_pem().expose().as_bytes(),
    )?;
    let mut tx = ctx.db.begin().await?;
    if !db::rotations::insert(
        &mut tx,
        cluster_id,
        ca,
        new.cert_pem(),
        &sealed,
        now.unix_timestamp(),
    )
    .await?
    {
        drop(tx);
        let current = db::rotations::get(&ctx.db.pool, cluster_id).await?;
        return Err(current.map_or(RotationError::NotFound, |c| in_progress(&c)));
    }
    if waiting.is_some() {
        db::standby::take(&mut *tx, cluster_id).await?;
    }
    let nodes = db::nodes::bump_generations(&mut tx, cluster_id).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        ca = db::rotations::ca_name(ca),
        standby = waiting.is_some(),
        "CA rotation started: trust-both"
    );
    Ok(Started {
        ca,
        phase: RotationPhase::TrustBoth,
        rollout: crate::rollout::Started { cluster_id, nodes },
    })
}

fn in_progress(rotation: &Rotation) -> RotationError {
    RotationError::InProgress {
        ca: db::rotations::ca_name(rotation.ca),
        phase: rotation.phase,
    }
}

/// Where a rotation went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advanced {
    To(RotationPhase),
    Finished,
}

/// Moves `cluster_id`'s rotation to its next phase when every node runs its desired
/// generation (the phase was delivered everywhere). `None`: nothing to do yet.
pub async fn advance(ctx: &Rotator, cluster_id: i64) -> Result<Option<Advanced>, RotationError> {
    let Some(rotation) = db::rotations::get(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    if nodes.is_empty() || waiting_for(&nodes).is_some() {
        return Ok(None);
    }
    let now = ctx.clock.unix();
    let advanced = match rotation.phase {
        RotationPhase::TrustBoth => sign_with_new(ctx, &rotation, &nodes).await?,
        RotationPhase::SignNew => {
            let mut tx = ctx.db.begin().await?;
            if !db::rotations::advance(
                &mut tx,
                cluster_id,
                rotation.phase,
                RotationPhase::DropOld,
                None,
                now,
            )
            .await?
            {
                return Ok(None);
            }
            db::nodes::bump_generations(&mut tx, cluster_id).await?;
            tx.commit().await?;
            Some(Advanced::To(RotationPhase::DropOld))
        }
        RotationPhase::DropOld => finish(ctx, &rotation).await?,
    };
    if let Some(step) = advanced {
        tracing::info!(cluster_id, ca = db::rotations::ca_name(rotation.ca), step = ?step, "CA rotation moved on");
    }
    Ok(advanced)
}

/// drop-old → finished; a rotation of the cluster CA leaves a new standby for the next one.
async fn finish(ctx: &Rotator, rotation: &Rotation) -> Result<Option<Advanced>, RotationError> {
    let cluster_id = rotation.cluster_id;
    let next = match rotation.ca {
        CaRole::Cluster => {
            let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
                return Ok(None);
            };
            let algorithm: crate::pki::KeyAlgorithm = cluster.key_algorithm.parse()?;
            let (keks, now) = (Arc::clone(&ctx.keks), ctx.clock.now());
            Some(
                ctx.cpu
                    .run(move || standby::make(&keks, cluster_id, algorithm, now))
                    .await??,
            )
        }
        CaRole::Etcd | CaRole::FrontProxy => None,
    };
    let mut tx = ctx.db.begin().await?;
    if !db::rotations::finish(&mut tx, cluster_id, ctx.clock.unix()).await? {
        return Ok(None);
    }
    if let Some(next) = &next {
        db::standby::put(&mut *tx, cluster_id, next, ctx.clock.unix()).await?;
    }
    tx.commit().await?;
    Ok(Some(Advanced::Finished))
}

/// The node a rotation's phase waits for: the first that took a bundle and has not applied its
/// desired generation. A node that never took one (a VM that never booted) is not waited for:
/// its first bundle, whenever it comes, is rendered for the phase current then.
pub fn waiting_for(nodes: &[db::nodes::NodeRow]) -> Option<&db::nodes::NodeRow> {
    nodes
        .iter()
        .find(|n| n.handed_generation > 0 && !n.up_to_date())
}

/// trust-both → sign-new: the waiting CA becomes the cluster's, serving certificates are
/// re-minted under the new CAs, every node gets its next generation.
async fn sign_with_new(
    ctx: &Rotator,
    rotation: &Rotation,
    nodes: &[db::nodes::NodeRow],
) -> Result<Option<Advanced>, RotationError> {
    let cluster_id = rotation.cluster_id;
    let Some(mut cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let (Some(new_cert), Some(sealed)) = (&rotation.other_cert, &rotation.new_key_sealed) else {
        return Err(RotationError::Trust(trust::TrustError::Missing(cluster_id)));
    };
    let key = ctx
        .keks
        .open_text(&cluster_aad(cluster_id, NEW_KEY), sealed)?;
    // Checks the pair before anything is written.
    let algorithm: crate::pki::KeyAlgorithm = cluster.key_algorithm.parse()?;
    CertAuthority::from_pem(
        rotation.ca,
        new_cert,
        SecretPem::new(key.to_string()),
        algorithm,
    )?;
    let (cert_column, key_column) = match rotation.ca {
        CaRole::Cluster => (&mut cluster.ca_cert, &mut cluster.ca_key_sealed),
        CaRole::Etcd => (&mut cluster.etcd_ca_cert, &mut cluster.etcd_ca_key_sealed),
        CaRole::FrontProxy => (
            &mut cluster.front_proxy_ca_cert,
            &mut cluster.front_proxy_ca_key_sealed,
        ),
    };
    let column = match rotation.ca {
        CaRole::Cluster => "ca_key",
        CaRole::Etcd => "etcd_ca_key",
        CaRole::FrontProxy => "front_proxy_ca_key",
    };
    let resealed = ctx
        .keks
        .seal(&cluster_aad(cluster_id, column), key.as_bytes())?;
    let old_cert = cert_column.replace(new_cert.clone()).unwrap_or_default();
    *key_column = Some(resealed.clone());
    let pki: Arc<ClusterPki> = ctx.issuers.open(&ctx.keks, &cluster)?;
    let now = ctx.clock.now();
    let mut serving = Vec::new();
    for node in nodes.iter().filter(|n| n.role == Role::ControlPlane) {
        serving.push((
            node,
            mint_serving(&ctx.cpu, &cluster, node, &pki, now).await?,
        ));
    }
    let mut tx = ctx.db.begin().await?;
    if !db::rotations::advance(
        &mut tx,
        cluster_id,
        RotationPhase::TrustBoth,
        RotationPhase::SignNew,
        Some(&old_cert),
        now.unix_timestamp(),
    )
    .await?
    {
        return Ok(None);
    }
    db::rotations::set_ca(&mut tx, cluster_id, rotation.ca, new_cert, &resealed).await?;
    for (node, certs) in &serving {
        store_serving(&ctx.keks, &mut tx, &cluster, node, certs).await?;
    }
    crate::certificates::record(
        &mut tx,
        cluster_id,
        None,
        &crate::certificates::cas(&pki),
        now.unix_timestamp(),
    )
    .await?;
    db::nodes::bump_generations(&mut tx, cluster_id).await?;
    tx.commit().await?;
    Ok(Some(Advanced::To(RotationPhase::SignNew)))
}
