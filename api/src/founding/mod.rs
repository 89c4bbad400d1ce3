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
pub mod queue;
pub mod reconcile;
pub mod release;
pub mod request;
pub mod supplied;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::compute::{ComputeError, CreateSecurityGroup, CreateVm, Rule, Subnet, Vm};
use crate::config::ApiConfig;
use crate::db::{
    self, Db, DbError, clusters::NewCluster, nodes::NewNode, phase::ClusterPhase, resources::Kind,
};
use crate::machines::{self, MachineError, NewMachine};
use crate::pki::kubeconfig::{self, KubeconfigSpec};
use crate::pki::{
    ClientIdentity, ClusterNetwork, ClusterPki, ImportTerms, NodeAddresses, NodeServingCerts,
    SecretPem, ServiceCidr,
};
use crate::trust;
use exk8s_common::contract::Role;
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
    Ok(Started { id, done })
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

/// Journals `kind` with `client_token` (committed), returning the journal row id.
async fn journal(ctx: &Founder, cluster_id: i64, kind: Kind, token: &str) -> Result<i64, Failure> {
    let intent = db::resources::Intent {
        cluster_id,
        kind,
        client_token: token,
        ordinal: None,
        pool_id: None,
    };
    db::resources::journal_intent(&ctx.db, &intent, db::now())
        .await
        .map_err(Failure::db)
}

/// The cluster being founded and where its machines go.
struct Target<'a> {
    id: i64,
    name: &'a str,
    network: &'a ClusterNetwork,
    subnet: &'a Subnet,
}

async fn provision(
    ctx: &Founder,
    target: &Target<'_>,
    spec: &ClusterSpecRequest,
    pki: &Arc<ClusterPki>,
    created: &mut release::Created,
) -> Result<Founded, Failure> {
    let Target {
        id: cluster_id,
        name,
        network,
        subnet,
    } = *target;
    let compute = &ctx.machines.compute;
    let mut groups = spec.security_group_ids.clone();
    if groups.is_empty() {
        let token = format!("cluster-{cluster_id}-sg");
        let journal_id = journal(ctx, cluster_id, Kind::SecurityGroup, &token).await?;
        let group = compute
            .create_security_group(&CreateSecurityGroup {
                name: format!("{name}-control-plane"),
                subnet_id: subnet.id,
                rules: vec![
                    Rule {
                        protocol: "all".into(),
                        port: None,
                        source_cidr: subnet.cidr.clone(),
                    },
                    Rule {
                        protocol: "tcp".into(),
                        port: Some(6443),
                        source_cidr: "0.0.0.0/0".into(),
                    },
                ],
                client_token: token,
            })
            .await
            .map_err(|e| Failure::compute("security group creation", e))?;
        created.security_group = Some(group.id);
        db::resources::set_state(
            &ctx.db.pool,
            journal_id,
            "created",
            Some(&group.id.to_string()),
            db::now(),
        )
        .await
        .map_err(Failure::db)?;
        db::clusters::set_security_group(&ctx.db.pool, cluster_id, group.id, db::now())
            .await
            .map_err(Failure::db)?;
        groups.push(group.id);
    }

    let userdata = ctx
        .machines
        .userdata()
        .map_err(|e| Failure::internal("userdata", e))?;
    let mut vms: Vec<Vm> = Vec::new();
    for ordinal in 1..=spec.control_plane_count {
        let tags = BTreeMap::from([
            ("exk8s.io/role".to_owned(), "control-plane".to_owned()),
            ("exk8s.io/cluster".to_owned(), cluster_id.to_string()),
            ("exk8s.io/ordinal".to_owned(), ordinal.to_string()),
        ]);
        let machine = NewMachine {
            cluster_id,
            ordinal,
            pool_id: None,
            vm: CreateVm {
                name: format!("{name}-cp-{ordinal}"),
                image_id: spec.control_plane_image_id,
                instance_type: spec.control_plane_instance_type.clone(),
                zone_id: spec.zone_id,
                subnet_id: spec.subnet_id,
                security_group_ids: groups.clone(),
                allocate_public_ipv4: spec.allocate_public_ipv4,
                ssh_pubkey: spec.ssh_pubkey.clone(),
                root_volume_size_gib: spec.root_volume_size_gib,
                userdata: userdata.clone(),
                tags,
                client_token: String::new(),
            },
        };
        let vm = machines::create(&ctx.machines, machine).await?;
        created.vms.push(vm.id);
        db::clusters::set_phase(
            &ctx.db.pool,
            cluster_id,
            ClusterPhase::Provisioning,
            db::now(),
        )
        .await
        .map_err(Failure::db)?;
        vms.push(vm);
    }

    let mut nodes = Vec::with_capacity(vms.len());
    for (index, vm) in vms.iter().enumerate() {
        let vm = machines::wait_for_address(&ctx.machines, vm.id).await?;
        let name = trust::node_name(cluster_id, trust::CONTROL_PLANE_GROUP, vm.id)
            .map_err(|e| Failure::internal("node name", e))?;
        let addresses = machines::addresses(&vm, name)?;
        nodes.push((vm, index as i64 + 1, addresses));
    }

    // Serving certificates per node, made now and stored, so bundles are pure rendering.
    let pki_for_certs = Arc::clone(pki);
    let network_for_certs = network.clone();
    let addresses: Vec<NodeAddresses> = nodes.iter().map(|(_, _, a)| a.clone()).collect();
    let now = ctx.clock.now();
    let (serving, admin) = ctx
        .cpu
        .run(move || {
            let serving = addresses
                .iter()
                .map(|a| NodeServingCerts::generate(&pki_for_certs, a, &network_for_certs, now))
                .collect::<Result<Vec<_>, _>>()?;
            let admin = ClientIdentity::Admin.issue(&pki_for_certs, now)?;
            Ok::<_, crate::pki::PkiError>((serving, admin))
        })
        .await
        .map_err(|e| Failure::internal("certificates", e))?
        .map_err(|e| Failure::internal("certificates", e))?;
    let server = format!("https://{}:6443", network.control_plane_dns_name);
    let (user, _) = ClientIdentity::Admin.subject();
    let admin_kubeconfig = kubeconfig::render(&KubeconfigSpec {
        cluster_name: name,
        server: &server,
        ca_pem: pki.cluster_ca.cert_pem(),
        user: &user,
        credentials: &admin,
    });

    let now = db::now();
    for (vm, ..) in &nodes {
        // A compute service that reuses an id (or a simulator restarted without its state)
        // would make two nodes one: an upstream fault, reported as such.
        let taken = db::nodes::find_by_vm(&ctx.db.pool, vm.id)
            .await
            .map_err(Failure::db)?;
        if let Some(existing) = taken {
            return Err(Failure::upstream(
                "node records",
                format!(
                    "the compute API returned VM id {} for a new machine, but that id already \
                     belongs to a node of cluster {}",
                    vm.id, existing.cluster_id
                ),
            ));
        }
    }
    let mut tx = ctx.db.begin().await.map_err(Failure::db)?;
    for ((vm, ordinal, addresses), certs) in nodes.iter().zip(&serving) {
        let node_id = db::nodes::insert(
            &mut tx,
            &NewNode {
                cluster_id,
                ordinal: *ordinal,
                vm_id: vm.id,
                node_name: addresses.name.as_str(),
                private_ipv4: &addresses.private_ipv4.to_string(),
                private_ipv6: addresses.private_ipv6.map(|a| a.to_string()).as_deref(),
                public_ipv4: addresses.public_ipv4.map(|a| a.to_string()).as_deref(),
                is_initial: *ordinal == 1,
                role: Role::ControlPlane,
                pool_id: None,
                etcd_membership: Some(db::phase::EtcdMembership::Voter),
            },
            now,
        )
        .await
        .map_err(Failure::db)?;
        let seal = |column: trust::NodeKeyColumn, cert| {
            trust::seal_node_key(&ctx.keks, cluster_id, vm.id, column, cert)
                .map_err(|e| Failure::internal("sealing", e))
        };
        db::nodes::insert_etcd_member(
            &mut tx,
            node_id,
            (
                &certs.etcd_server.cert_pem,
                &seal(trust::NodeKeyColumn::EtcdServer, &certs.etcd_server)?,
            ),
            (
                &certs.etcd_peer.cert_pem,
                &seal(trust::NodeKeyColumn::EtcdPeer, &certs.etcd_peer)?,
            ),
        )
        .await
        .map_err(Failure::db)?;
        db::nodes::insert_apiserver_node(
            &mut tx,
            node_id,
            &certs.apiserver.cert_pem,
            &seal(trust::NodeKeyColumn::Apiserver, &certs.apiserver)?,
        )
        .await
        .map_err(Failure::db)?;
    }
    let mut issued = crate::certificates::cas(pki).to_vec();
    issued.push(crate::certificates::operator_kubeconfig_cert(&admin));
    crate::certificates::record(&mut tx, cluster_id, None, &issued, now)
        .await
        .map_err(|e| match e {
            // A full disk or a lost database is the database's answer (503), not a defect.
            crate::certificates::CertificatesError::Db(db) => Failure::db(db),
            other => Failure::internal("recording certificates", other),
        })?;
    db::clusters::set_phase(&mut *tx, cluster_id, ClusterPhase::Founded, now)
        .await
        .map_err(Failure::db)?;
    tx.commit().await.map_err(Failure::db)?;
    tracing::info!(cluster_id, nodes = nodes.len(), "cluster founded");
    // The new nodes will all ask for their bundles at once: make an RSA cluster's keys now.
    ctx.key_pool.refresh_cluster(&ctx.db.pool, cluster_id).await;

    let node_ips = nodes
        .iter()
        .map(|(_, _, a)| a.public_ipv4.unwrap_or(a.private_ipv4).to_string())
        .collect();
    Ok(Founded {
        id: cluster_id,
        name: name.to_owned(),
        dns_name: String::new(),
        vm_ids: nodes.iter().map(|(vm, ..)| vm.id).collect(),
        admin_kubeconfig,
        dns_configured: false,
        dns_error: None,
        node_ips,
    })
}
