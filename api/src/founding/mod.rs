//! Founding a cluster (`POST /clusters`): validate → placement (subnet and security groups
//! exist; nothing is created before) → record the cluster row (`provisioning`) and answer;
//! then, on a founding worker ([`queue`]): PKI → security group → one VM per ordinal (each journaled before and after its
//! call, each in its own commit) → wait for addresses → serving certificates → node rows →
//! `founded` → DNS, best effort.
//!
//! Any failure before `founded` compensates: every VM and security group the journal knows of
//! is deleted and the cluster ends `failed` with a reason. When the journal itself is
//! unreachable (the database went down), what this call created is released from memory, so a
//! database outage leaves no machine running. A crash mid-way leaves the cluster
//! `provisioning`; [`reconcile`] finishes the compensation once it is stale.

pub mod delete;
mod dns;
mod job;
mod provision;
pub mod queue;
pub mod reconcile;
pub mod release;
pub mod request;
pub mod supplied;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::compute::{ComputeError, Subnet};
use crate::config::ApiConfig;
use crate::db::{self, Db, DbError, clusters::NewCluster};
use crate::machines::{self, MachineError};
use crate::pki::{ImportTerms, SecretPem, ServiceCidr};
use request::{ClusterSpecRequest, SuppliedCasRequest};

/// What founding needs: the rows, the clock certificates are made at, the settings (network,
/// zone, quotas), the KEKs that seal the cluster's trust, the CPU pool that makes it, the key
/// pool (told of the new cluster), the founding workers, the metrics, and the machines with
/// their DNS name.
#[derive(Debug, Clone)]
pub struct Founder {
    pub db: Db,
    pub clock: Arc<dyn crate::clock::Clock>,
    pub config: Arc<ApiConfig>,
    pub keks: Arc<crate::crypto::Keyring>,
    pub cpu: crate::cpu::CpuPool,
    pub key_pool: crate::keypool::KeyPool,
    pub founders: queue::Founders,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub machines: machines::Machines,
}

/// A founded cluster, as the response reports it.
#[derive(Debug)]
pub struct Founded {
    pub id: i64,
    pub name: String,
    pub dns_name: String,
    pub vm_ids: Vec<i64>,
    pub admin_kubeconfig: SecretPem,
    pub dns_configured: bool,
    pub dns_error: Option<String>,
    pub node_ips: Vec<String>,
}

/// Why founding failed, in the domain's terms; `http/` maps each to its answer.
#[derive(Debug, thiserror::Error)]
pub enum FoundingError {
    /// A request field is malformed (400).
    #[error(transparent)]
    Invalid(#[from] crate::field::FieldError),
    /// The request is well formed but cannot be carried out as asked (422): a subnet or
    /// security group that does not exist, a VM the compute API refused.
    #[error("{message}")]
    Unprocessable {
        field: Option<&'static str>,
        message: String,
    },
    /// The compute API failed or answered something founding cannot use (502).
    #[error("{0}")]
    Upstream(String),
    #[error(transparent)]
    Db(#[from] DbError),
    /// The org already has a cluster of the name asked for (409).
    #[error("a cluster named `{0}` already exists in this org")]
    NameTaken(String),
    /// The org's quota would be passed (409).
    #[error(transparent)]
    Quota(#[from] crate::quotas::Exceeded),
    /// Every founding place is taken (503 with `Retry-After`).
    #[error("too many clusters are being founded; retry in {retry_after_secs} s")]
    Busy { retry_after_secs: u64 },
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl FoundingError {
    pub(crate) fn internal(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(Box::new(e))
    }

    /// The database is out of reach (as opposed to refusing a statement).
    fn is_db_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Db(DbError::Unavailable(_) | DbError::WritesFailing { .. })
        )
    }
}

/// Why founding stopped, with the reason recorded on the cluster.
#[derive(Debug)]
struct Failure {
    reason: &'static str,
    error: FoundingError,
}

impl From<MachineError> for Failure {
    fn from(e: MachineError) -> Self {
        match e {
            MachineError::Compute { step, source } => Self::compute(step, source),
            MachineError::Upstream { step, message } => Self::upstream(step, message),
            e @ MachineError::Unusable { .. } => Self::internal(e.step(), e),
            MachineError::Db(e) => Self::db(e),
        }
    }
}

impl Failure {
    fn compute(step: &'static str, e: ComputeError) -> Self {
        let error = match e {
            ComputeError::Rejected { status, message } if status < 500 => {
                FoundingError::Unprocessable {
                    field: None,
                    message: format!("the compute API refused {step} ({status}): {message}"),
                }
            }
            other => FoundingError::Upstream(format!("{step} failed: {other}")),
        };
        Self {
            reason: step,
            error,
        }
    }

    /// An upstream answer founding cannot use, reported as a failure of `step`.
    fn upstream(step: &'static str, message: String) -> Self {
        Self {
            reason: step,
            error: FoundingError::Upstream(format!("{step} failed: {message}")),
        }
    }

    fn db(e: DbError) -> Self {
        Self {
            reason: "database",
            error: FoundingError::Db(e),
        }
    }

    fn internal(reason: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            reason,
            error: FoundingError::internal(e),
        }
    }
}

/// A founding accepted and running in the background.
#[derive(Debug)]
pub struct Started {
    /// The cluster, recorded `provisioning`.
    pub id: i64,
    /// The cluster's row as it was accepted, read in the transaction that recorded it: an
    /// answer built from it needs no read that could fail once the cluster exists.
    pub accepted: db::clusters::ClusterRow,
    done: oneshot::Receiver<Result<Founded, FoundingError>>,
}

impl Started {
    /// The founding's outcome if it ends within `wait`; `None` while it still runs (it goes on
    /// without a waiter).
    pub async fn outcome_within(self, wait: Duration) -> Option<Result<Founded, FoundingError>> {
        if wait.is_zero() {
            return None;
        }
        match tokio::time::timeout(wait, self.done).await {
            Ok(Ok(outcome)) => Some(outcome),
            Ok(Err(stopped)) => Some(Err(FoundingError::internal(stopped))),
            Err(_) => None,
        }
    }
}

/// Accepts `POST /clusters` for an org: checks the CAs it brought (`supplied`) and the
/// placement, records the cluster `provisioning`, and hands the rest to a founding worker.
/// Every refusal here leaves nothing behind; past it, failures are recorded on the cluster.
pub async fn start(
    ctx: &Founder,
    org_id: i64,
    spec: &ClusterSpecRequest,
    supplied: Option<SuppliedCasRequest>,
    restore_from: Option<(i64, i64)>,
) -> Result<Started, FoundingError> {
    let admission = ctx.founders.admit().ok_or(FoundingError::Busy {
        retry_after_secs: BUSY_RETRY_SECS,
    })?;
    let config = &ctx.config;
    let service_cidr = ServiceCidr::parse(&config.service_cidr).map_err(FoundingError::internal)?;
    let terms = ImportTerms {
        leaf_algorithm: spec.key_algorithm,
        leaf_lifetime: time::Duration::days(spec.leaf_lifetime_days),
        now: ctx.clock.now(),
    };
    let supplied = ctx
        .cpu
        .run(move || supplied::check(supplied.as_ref(), terms))
        .await
        .map_err(FoundingError::internal)??;
    let ask = crate::quotas::Ask {
        clusters: 1,
        vms: spec.control_plane_count,
        pools: 0,
    };
    crate::quotas::admit(&ctx.db, config.quotas, org_id, ask)
        .await
        .map_err(|e| match e {
            crate::quotas::QuotaError::Exceeded(e) => FoundingError::Quota(e),
            crate::quotas::QuotaError::Db(db) => FoundingError::Db(db),
        })?;
    let subnet = check_placement(ctx, spec).await?;

    // The cluster's age (and its service-account key's) is judged by the same clock.
    let now = ctx.clock.unix();
    let spec_json = crate::cluster::Spec::from(spec).to_stored();
    let mut tx = ctx.db.begin().await?;
    let new = NewCluster {
        org_id,
        spec_json: &spec_json,
        key_algorithm: spec.key_algorithm.as_str(),
        kubernetes_version: &spec.kubernetes_version,
        service_cidr: &config.service_cidr,
        pod_cidr: &config.pod_cidr,
        cluster_domain: &config.cluster_domain,
        dns_zone: &config.dns_zone,
        machines: spec.control_plane_count,
        name: spec.name.as_deref(),
    };
    let (id, name, dns_name) = match db::clusters::insert_provisioning(&mut tx, &new, now).await {
        Err(DbError::Duplicate(_)) => {
            return Err(FoundingError::NameTaken(
                spec.name.clone().unwrap_or_default(),
            ));
        }
        inserted => inserted?,
    };
    if let Some(source) = restore_from {
        db::restores::set_source(&mut *tx, id, source).await?;
    }
    let accepted = db::clusters::get(&mut *tx, org_id, id)
        .await?
        .ok_or_else(|| {
            FoundingError::internal(std::io::Error::other(
                "a cluster just recorded is not there",
            ))
        })?;
    tx.commit().await?;
    tracing::info!(cluster_id = id, org_id, %name, "founding accepted");
    let job = job::Job {
        ctx: ctx.clone(),
        id,
        name,
        dns_name,
        service_cidr,
        spec: spec.clone(),
        supplied,
        restore_from: restore_from.map(|(source, _)| source),
        subnet,
    };
    let done = ctx.founders.spawn(admission, job.run());
    Ok(Started { id, accepted, done })
}

/// Seconds a refused `POST /clusters` is told to wait when every founding place is taken.
const BUSY_RETRY_SECS: u64 = 10;

/// Checks, before anything is created, that the subnet and every given security group exist:
/// a request refused here leaves no row and no resource behind.
async fn check_placement(
    ctx: &Founder,
    spec: &ClusterSpecRequest,
) -> Result<Subnet, FoundingError> {
    let compute = &ctx.machines.compute;
    let subnet = compute
        .get_subnet(spec.subnet_id)
        .await
        .map_err(|e| Failure::compute("subnet lookup", e).error)?
        .ok_or_else(|| FoundingError::Unprocessable {
            field: Some("subnet_id"),
            message: format!("subnet {} does not exist", spec.subnet_id),
        })?;
    for &group in &spec.security_group_ids {
        let found = compute
            .get_security_group(group)
            .await
            .map_err(|e| Failure::compute("security group lookup", e).error)?;
        if found.is_none() {
            return Err(FoundingError::Unprocessable {
                field: Some("security_group_ids"),
                message: format!("security group {group} does not exist"),
            });
        }
    }
    Ok(subnet)
}
