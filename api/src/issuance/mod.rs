//! Issuance owns "node row → signed bundle": who is asking ([`auth`]), the typed loading of
//! the node and its cluster ([`load`]), certificates minted fresh per bundle, rendering, the
//! signature, and the serial and audit row taken in one transaction. Its failures are
//! [`IssuanceError`]; `http/` decides how each is answered.
//!
//! The CPU work runs off the async threads and never inside the transaction: minting,
//! rendering and serialising everything but the payload's head before it, on the bounded pool
//! (nothing rendered depends on the serial or the generation); signing after it, as the pool's
//! last step of admitted work, which never queues behind new work ([`crate::cpu::CpuPool::finish`]). The
//! transaction holds the node's row only to take the serial, put the head in front of the
//! serialised body, digest it and write the audit row and the inventory.
//!
//! Refusals fall into classes with one answer each ([`auth::Refused`]); the caller never learns
//! which check failed, the audit row and the log say.

pub mod auth;
pub mod report;
pub mod signed;
mod subject;

use std::sync::Arc;

use exk8s_common::contract::{BundleKind, Role};
use exk8s_common::names::Nonce;
use exk8s_common::node_auth::{NODE_KEY_HEADER, NodePublicKey};
use exk8s_common::payload::{Freshness, Identity, PayloadBody};

use crate::config::ApiConfig;
use crate::crypto::Keyring;
use crate::db::{self, Db, DbError, issuances::Audit};
use crate::pki::{BundleCerts, CertFacts, KeySource, LeafKey};
use crate::render::Issuance;
use crate::rollout;
use exk8s_common::BundleSigner;

pub use auth::{Refusal, Refused, Vm, authenticate, refuse};
pub use exk8s_common::contract::{IMDS_TOKEN_HEADER as IMDS_HEADER, NONCE_HEADER};

/// What issuing a bundle needs: the rows, the clock leaves are minted at, opened trust and the
/// KEKs under it, the keys made ahead, the CPU pool, the bundle signer, the metrics, and the
/// settings that shape a bundle (its lifetime, its artifacts, the request deadline).
#[derive(Debug, Clone)]
pub struct Issuer {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub config: Arc<ApiConfig>,
    pub keks: Arc<Keyring>,
    pub issuers: Arc<crate::records::IssuerCache>,
    pub key_pool: crate::keypool::KeyPool,
    pub cpu: crate::cpu::CpuPool,
    pub signer: Arc<BundleSigner>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Why a bundle was not issued.
#[derive(Debug, thiserror::Error)]
pub enum IssuanceError {
    /// The caller failed authentication; the class decides the answer.
    #[error("refused: {0:?}")]
    Refused(Refused),
    /// A request field is malformed.
    #[error(transparent)]
    Invalid(#[from] crate::field::FieldError),
    /// A request header is malformed.
    #[error("{header}: {message}")]
    InvalidHeader {
        header: &'static str,
        message: String,
    },
    /// The node finished bootstrapping and was not re-armed.
    #[error("this node finished bootstrapping; an operator must re-arm it for another bundle")]
    Sealed,
    /// A stored record cannot be used (a defect, never the caller's fault).
    #[error("node {vm_id} has an unusable stored {what}")]
    Corrupt { vm_id: i64, what: &'static str },
    /// The CPU pool cannot start the work before the request's deadline (503, `Retry-After`).
    #[error("too many bundles are being made; retry in {retry_after_secs} s")]
    Busy { retry_after_secs: u64 },
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Seconds a bundle request refused for a saturated CPU pool is told to wait.
const BUSY_RETRY_SECS: u64 = 2;

impl From<crate::records::LoadError> for IssuanceError {
    fn from(e: crate::records::LoadError) -> Self {
        match e {
            crate::records::LoadError::Corrupt { vm_id, what } => Self::Corrupt { vm_id, what },
            cluster @ crate::records::LoadError::Cluster { .. } => Self::internal(cluster),
        }
    }
}

impl IssuanceError {
    pub(crate) fn internal(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(Box::new(e))
    }
}

/// The request nonce: present and well formed.
fn parse_nonce(nonce: Option<&str>) -> Result<Nonce, IssuanceError> {
    let nonce = nonce.ok_or_else(|| IssuanceError::InvalidHeader {
        header: NONCE_HEADER,
        message: format!("the {NONCE_HEADER} header is required"),
    })?;
    Nonce::new(nonce).map_err(|e| IssuanceError::InvalidHeader {
        header: NONCE_HEADER,
        message: e.to_string(),
    })
}

/// The node key sent with a bootstrap fetch, when there is one.
fn parse_node_key(key: Option<&str>) -> Result<Option<NodePublicKey>, IssuanceError> {
    key.map(|text| {
        NodePublicKey::parse(text).map_err(|e| IssuanceError::InvalidHeader {
            header: NODE_KEY_HEADER,
            message: e.to_string(),
        })
    })
    .transpose()
}

/// The bootstrap bundle (the node's first, fetched with the bootstrap token). A node key sent
/// with it is registered for the node's day-2 requests (the latest bootstrap fetch wins).
pub async fn issue(
    ctx: &Issuer,
    vm: &Vm,
    nonce: Option<&str>,
    node_key: Option<&str>,
    source: &str,
) -> Result<Vec<u8>, IssuanceError> {
    let nonce = parse_nonce(nonce)?;
    let node_key = parse_node_key(node_key)?;
    let (cluster, node) = (&vm.cluster, &vm.node);
    if !node.issuance_allowed {
        let audit = Audit {
            vm_id: node.vm_id,
            cluster_id: Some(cluster.id),
            outcome: "refused",
            reason: Some("node is complete"),
            source_address: Some(source),
            ..Audit::default()
        };
        db::issuances::insert(&ctx.db.pool, &audit, db::now()).await?;
        return Err(IssuanceError::Sealed);
    }
    let request = Request {
        vm,
        nonce,
        source,
        kind: BundleKind::Bootstrap,
        node_key,
    };
    sign_bundle(ctx, &request)
        .await?
        .ok_or(IssuanceError::Sealed)
}

/// What a node that asks for its update gets.
#[derive(Debug)]
pub enum Update {
    /// The node already runs its desired generation.
    Current,
    /// A newer generation exists, but the rollout must not hand it to this node yet.
    Wait(rollout::Hold),
    /// The signed update bundle.
    Bundle(Vec<u8>),
}

/// The update bundle for a node that is behind its desired generation, when the rollout lets
/// it have one now (one control-plane node at a time, the others healthy).
pub async fn issue_update(
    ctx: &Issuer,
    vm: &Vm,
    nonce: Option<&str>,
    source: &str,
) -> Result<Update, IssuanceError> {
    let nonce = parse_nonce(nonce)?;
    if vm.node.up_to_date() {
        return Ok(Update::Current);
    }
    let nodes = db::nodes::list(&ctx.db.pool, vm.cluster.id).await?;
    if let Err(hold) = rollout::gate(&vm.node, &nodes) {
        return Ok(Update::Wait(hold));
    }
    let snapshot_hold =
        crate::upgrade::snapshot::hold(&ctx.db.pool, &vm.cluster, &vm.node, ctx.clock.unix());
    if let Some(hold) = snapshot_hold.await? {
        return Ok(Update::Wait(hold));
    }
    let request = Request {
        vm,
        nonce,
        source,
        kind: BundleKind::Update,
        node_key: None,
    };
    match sign_bundle(ctx, &request).await? {
        Some(envelope) => Ok(Update::Bundle(envelope)),
        // Another node took the rollout's one slot between the check and the commit.
        None => Ok(Update::Wait(rollout::Hold::AnotherNodeUpdating)),
    }
}

/// One issuance being made.
struct Request<'a> {
    vm: &'a Vm,
    nonce: Nonce,
    source: &'a str,
    kind: BundleKind,
    node_key: Option<NodePublicKey>,
}

/// What the CPU job makes before the transaction: the payload but for the serial and
/// generation the transaction takes, and what the inventory records.
struct Prepared {
    identity: Identity,
    freshness: Freshness,
    body: PayloadBody,
    facts: Vec<CertFacts>,
    minted: BundleCerts,
    /// Keys made in the job because none was ready in the pool.
    fresh: usize,
}

/// Mints, renders and serialises the bundle on the CPU pool; takes its serial (and
/// generation) and writes its audit row and inventory in one short transaction; signs it as
/// a last step. `None` when the node may not take one now.
async fn sign_bundle(
    ctx: &Issuer,
    request: &Request<'_>,
) -> Result<Option<Vec<u8>>, IssuanceError> {
    let (cluster, node) = (&request.vm.cluster, &request.vm.node);
    let loaded = subject::load(ctx, cluster, node, request.kind).await?;
    let role = loaded.role();
    let now = db::now();
    let ttl = i64::try_from(ctx.config.bundle_ttl.as_secs()).unwrap_or(900);
    let issuance = Issuance {
        bundle_id: uuid::Uuid::new_v4(),
        issued_at: now,
        expires_at: now + ttl,
        // Placeholders: the transaction takes both and they replace these in the payload's
        // head. Nothing rendered depends on them.
        serial: 0,
        generation: u64::try_from(node.desired_generation).map_err(IssuanceError::internal)?,
        nonce: request.nonce.clone(),
        kind: request.kind,
        drains: loaded.drains().to_vec(),
    };
    let minting_at = ctx.clock.now();
    let (key_pool, cluster_id, config) =
        (ctx.key_pool.clone(), cluster.id, Arc::clone(&ctx.config));
    // Refused at once when the pool cannot start it in time; stopped before its next key when
    // the request is dropped (client gone, deadline passed). Keys made ahead for the cluster
    // are taken only once the job runs, so a refused request wastes none.
    let (loaded, prepared) = ctx
        .cpu
        .admit(ctx.config.bootstrap_deadline, move |stop| {
            let wanted = BundleCerts::keys(loaded.role());
            let ready = key_pool.take(cluster_id, loaded.pki.algorithm, wanted);
            let stopped = || stop.requested();
            let prepared = prepare(&loaded, &issuance, &config, minting_at, ready, &stopped);
            (loaded, prepared)
        })
        .await
        .map_err(|e| match e {
            crate::cpu::CpuError::Saturated => IssuanceError::Busy {
                retry_after_secs: BUSY_RETRY_SECS,
            },
            other => IssuanceError::internal(other),
        })?;
    let Prepared {
        mut identity,
        mut freshness,
        body,
        facts,
        minted,
        fresh,
    } = prepared?;
    ctx.metrics
        .count_bundle_keys(BundleCerts::keys(role), fresh);

    let version = loaded.version().as_str();
    let mut tx = ctx.db.begin().await?;
    let taken = match request.kind {
        BundleKind::Bootstrap => {
            let key = request.node_key.as_ref().map(NodePublicKey::to_text);
            db::nodes::take_serial(&mut tx, node.id, version, key.as_deref()).await?
        }
        BundleKind::Update => {
            // The rollout's decision again, on rows read under the cluster's lock: another
            // node may have taken the one slot since the check before minting.
            // Workers are not gated: no need to read the cluster's nodes for them.
            db::nodes::lock_cluster(&mut tx, node.cluster_id).await?;
            let allowed = node.role != Role::ControlPlane || {
                let nodes = db::nodes::list(&mut *tx, node.cluster_id).await?;
                let fresh = nodes.iter().find(|n| n.id == node.id);
                fresh.is_some_and(|fresh| rollout::gate(fresh, &nodes).is_ok())
            };
            if allowed {
                db::nodes::hand_update(&mut tx, node.id, version).await?
            } else {
                None
            }
        }
    };
    let Some(handed) = taken else {
        return Ok(None);
    };
    let serial = handed.serial;
    freshness.serial = u64::try_from(serial).map_err(IssuanceError::internal)?;
    identity.generation = u64::try_from(handed.generation).map_err(IssuanceError::internal)?;
    let payload = body
        .finish(&identity, &freshness)
        .map_err(IssuanceError::internal)?;
    let bundle_id = identity.bundle_id.to_string();
    let digest = exk8s_common::names::Sha256Digest::of(&payload).to_hex();
    let key_id = ctx.signer.key_id().to_string();
    let audit = Audit {
        vm_id: node.vm_id,
        cluster_id: Some(cluster.id),
        serial: Some(serial),
        bundle_id: Some(&bundle_id),
        bundle_sha256: Some(&digest),
        key_id: Some(&key_id),
        outcome: "issued",
        reason: None,
        source_address: Some(request.source),
    };
    db::issuances::insert(&mut *tx, &audit, freshness.issued_at).await?;
    // What this bundle carries becomes the node's inventory at this generation: it replaces
    // the rows of the node's earlier bundles of this generation, and generations before the
    // one the node runs are gone from it. Node rows are of generation 1 or later, and rows of
    // this generation exist only once one was handed, so a first fetch deletes nothing and
    // skips the statement (a fetch racing it may leave a superseded row, which the inventory
    // never reads and the node's next bundle removes).
    if node.applied_generation > 1 || node.handed_generation >= handed.generation {
        db::certificates::supersede(
            &mut *tx,
            cluster.id,
            node.id,
            node.applied_generation,
            handed.generation,
        )
        .await?;
    }
    crate::certificates::record_read(
        &mut tx,
        cluster.id,
        Some((node.id, handed.generation)),
        &loaded.certificates(&minted),
        &facts,
        freshness.issued_at,
    )
    .await
    .map_err(|e| match e {
        // The database gone mid-write is the database's answer (503), not a defect.
        crate::certificates::CertificatesError::Db(db) => IssuanceError::Db(db),
        other => IssuanceError::internal(other),
    })?;
    tx.commit().await?;
    let signer = Arc::clone(&ctx.signer);
    let envelope = ctx
        .cpu
        .finish(move || signer.sign_to_json(exk8s_common::BUNDLE_PAYLOAD_TYPE, &payload))
        .await
        .map_err(IssuanceError::internal)?;
    ctx.metrics.bundles_issued.inc();
    tracing::info!(vm_id = node.vm_id, cluster_id = cluster.id, serial, generation = handed.generation, kind = %request.kind, bundle_id = %bundle_id, "bundle issued");
    Ok(Some(envelope))
}

/// The CPU part of an issuance: mint (with the `ready` keys, then fresh ones until `stopped`
/// says so), render, serialise the body, read the certificates' facts.
fn prepare(
    loaded: &subject::Loaded,
    issuance: &Issuance,
    config: &ApiConfig,
    minting_at: time::OffsetDateTime,
    ready: Vec<LeafKey>,
    stopped: &dyn Fn() -> bool,
) -> Result<Prepared, IssuanceError> {
    let role = loaded.role();
    let mut source = KeySource::new(loaded.pki.algorithm, ready, &config.key_maker, stopped);
    let minted = BundleCerts::mint_from(
        &loaded.pki,
        loaded.addresses(),
        role,
        minting_at,
        &mut source,
    )
    .map_err(IssuanceError::internal)?;
    let fresh = source.generated();
    let payload = loaded
        .render(&minted, issuance, config)
        .map_err(IssuanceError::internal)?;
    let body = PayloadBody::of(&payload).map_err(IssuanceError::internal)?;
    let facts = crate::certificates::facts_of(&loaded.certificates(&minted))
        .map_err(IssuanceError::internal)?;
    Ok(Prepared {
        identity: payload.identity.clone(),
        freshness: payload.freshness.clone(),
        body,
        facts,
        minted,
        fresh,
    })
}
