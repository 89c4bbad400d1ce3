//! A founding accepted by [`super::start`], run by a founding worker: the cluster's PKI sealed
//! into its row, then its machines ([`super::provision`]); on failure, compensated — every VM
//! and security group the journal knows of deleted, the cluster `failed` with the reason.

use std::sync::Arc;

use super::Founder;
use super::provision::{Target, provision};
use super::request::ClusterSpecRequest;
use super::{Failure, Founded, FoundingError, dns, release};
use crate::compute::Subnet;
use crate::db::{self, phase::ClusterPhase};
use crate::pki::{ClusterNetwork, ClusterPki, ServiceCidr, SuppliedCas};
use crate::render::EncryptionKey;
use crate::trust;

/// An accepted founding, run by a worker.
pub(super) struct Job {
    pub(super) ctx: Founder,
    pub(super) id: i64,
    pub(super) name: String,
    pub(super) dns_name: String,
    pub(super) service_cidr: ServiceCidr,
    pub(super) spec: ClusterSpecRequest,
    pub(super) supplied: SuppliedCas,
    /// The cluster whose CAs, service-account key and secrets-encryption key it keeps (it is
    /// founded from that cluster's snapshot).
    pub(super) restore_from: Option<i64>,
    pub(super) subnet: Subnet,
}

impl Job {
    pub(super) async fn run(mut self) -> Result<Founded, FoundingError> {
        let ctx = self.ctx.clone();
        let ctx = &ctx;
        let id = self.id;
        // The reconciler undoes a founding that waited past the provisioning deadline.
        if !db::clusters::resume_provisioning(&ctx.db.pool, id, db::now()).await? {
            tracing::warn!(
                cluster_id = id,
                "founding waited past its deadline and was released"
            );
            return Err(FoundingError::Unprocessable {
                field: None,
                message: format!(
                    "cluster {id} waited for a founding worker past the provisioning deadline \
                     and was released"
                ),
            });
        }
        let mut created = release::Created::default();
        match self.found(&mut created).await {
            Ok(mut founded) => {
                ctx.metrics.clusters_founded.inc();
                founded.dns_name.clone_from(&self.dns_name);
                dns::configure(ctx, &mut founded).await;
                Ok(founded)
            }
            Err(failure) => Err(compensate(ctx, id, failure, &created).await),
        }
    }

    /// The cluster's PKI, sealed into its row, then its machines.
    async fn found(&mut self, created: &mut release::Created) -> Result<Founded, Failure> {
        let ctx = &self.ctx;
        let algorithm = self.spec.key_algorithm;
        let leaf_lifetime = time::Duration::days(self.spec.leaf_lifetime_days);
        let now = ctx.clock.now();
        // A cluster founded from another's snapshot keeps the source's service-account key,
        // and so its age.
        let mut sa_key_made_at = None;
        let (pki, encryption) = match self.restore_from {
            Some(source) => {
                let (pki, encryption, made_at) = self.source_trust(source, leaf_lifetime).await?;
                sa_key_made_at = Some(made_at);
                (pki, encryption)
            }
            None => {
                let supplied = std::mem::take(&mut self.supplied);
                let pki = ctx
                    .cpu
                    .run(move || {
                        let mut pki = ClusterPki::with_supplied(algorithm, now, supplied)?;
                        pki.set_leaf_lifetime(leaf_lifetime);
                        Ok::<_, crate::pki::PkiError>(pki)
                    })
                    .await
                    .map_err(|e| Failure::internal("certificates", e))?
                    .map_err(|e| Failure::internal("certificates", e))?;
                let encryption =
                    EncryptionKey::generate().map_err(|e| Failure::internal("keys", e))?;
                (pki, encryption)
            }
        };
        let pki = Arc::new(pki);
        let trust = trust::seal(&ctx.keks, self.id, &pki, &encryption)
            .map_err(|e| Failure::internal("sealing", e))?;
        db::clusters::set_trust(&ctx.db.pool, self.id, &trust)
            .await
            .map_err(Failure::db)?;
        // The cluster CA's standby, which operators' clients trust from the start
        // (`crate::standby`): a cluster founded from another's snapshot keeps the source's, as
        // it keeps its CAs.
        let theirs = match self.restore_from {
            Some(source) => db::standby::get(&ctx.db.pool, source)
                .await
                .map_err(Failure::db)?
                .map(|theirs| (source, theirs)),
            None => None,
        };
        let (keks, id) = (Arc::clone(&ctx.keks), self.id);
        let standby = match theirs {
            Some((source, theirs)) => crate::standby::reseal(&keks, source, id, &theirs)
                .map_err(|e| Failure::internal("restore source", e))?,
            None => ctx
                .cpu
                .run(move || crate::standby::make(&keks, id, algorithm, now))
                .await
                .map_err(|e| Failure::internal("certificates", e))?
                .map_err(|e| Failure::internal("certificates", e))?,
        };
        db::standby::put(&ctx.db.pool, self.id, &standby, now.unix_timestamp())
            .await
            .map_err(Failure::db)?;
        if let Some(made_at) = sa_key_made_at {
            db::sa_rotations::set_made_at(&ctx.db.pool, self.id, made_at)
                .await
                .map_err(Failure::db)?;
        }
        let network = ClusterNetwork::new(
            self.service_cidr,
            &ctx.config.cluster_domain,
            &self.dns_name,
        )
        .map_err(|e| Failure::internal("network", e))?;
        let target = Target {
            id: self.id,
            name: &self.name,
            network: &network,
            subnet: &self.subnet,
        };
        provision(ctx, &target, &self.spec, &pki, created).await
    }
}

impl Job {
    /// The CAs, service-account key and secrets-encryption key of cluster `source`, opened
    /// from its row, and when that service-account key was made: a cluster founded from its
    /// snapshot keeps them (its tokens, kubeconfigs and encrypted Secrets stay good).
    async fn source_trust(
        &self,
        source: i64,
        leaf_lifetime: time::Duration,
    ) -> Result<(ClusterPki, EncryptionKey, i64), Failure> {
        let ctx = &self.ctx;
        let row = db::clusters::get_by_id(&ctx.db.pool, source)
            .await
            .map_err(Failure::db)?
            .ok_or_else(|| {
                Failure::internal(
                    "restore source",
                    std::io::Error::other(format!("cluster {source} is gone")),
                )
            })?;
        // Checked when the founding was asked; a rotation started since would leave the old
        // key's tokens behind.
        let rotation = db::sa_rotations::get(&ctx.db.pool, source)
            .await
            .map_err(Failure::db)?;
        if let Some(why) = crate::sa_rotation::not_carried_whole(source, rotation.as_ref()) {
            return Err(Failure::internal(
                "restore source",
                std::io::Error::other(why),
            ));
        }
        let pki =
            trust::open(&ctx.keks, &row).map_err(|e| Failure::internal("restore source", e))?;
        let mut pki = Arc::try_unwrap(pki).map_err(|_| {
            Failure::internal(
                "restore source",
                std::io::Error::other("the source's PKI is shared"),
            )
        })?;
        pki.set_leaf_lifetime(leaf_lifetime);
        let encryption = trust::open_encryption_key(&ctx.keks, &row)
            .map_err(|e| Failure::internal("restore source", e))?;
        Ok((pki, encryption, row.sa_key_made_at()))
    }
}

/// Undoes a founding that failed: every VM and security group the journal knows of is
/// deleted and the cluster ends `failed` with the reason; when the journal is out of reach,
/// what this founding created is released from memory (the reconciler records it later).
async fn compensate(
    ctx: &Founder,
    id: i64,
    failure: Failure,
    created: &release::Created,
) -> FoundingError {
    ctx.metrics.clusters_failed.inc();
    tracing::warn!(cluster_id = id, reason = failure.reason, error = %failure.error, "founding failed; compensating");
    let message = failure.error.to_string();
    if failure.error.is_db_unavailable() {
        // Every journal write would wait out the pool's timeout.
        release::release_created(&ctx.machines, id, created).await;
        return failure.error;
    }
    let record = |phase| {
        db::clusters::set_error(&ctx.db.pool, id, phase, failure.reason, &message, db::now())
    };
    let _ = record(ClusterPhase::Compensating).await;
    match release::release_all(&ctx.machines, id).await {
        Ok(()) => {
            let _ = record(ClusterPhase::Failed).await;
            ctx.metrics.compensations.inc();
        }
        Err(e) => {
            tracing::warn!(cluster_id = id, error = %crate::error_chain(&e), "the journal is out of reach; releasing what this founding created from memory");
            release::release_created(&ctx.machines, id, created).await;
        }
    }
    failure.error
}
