//! What growing and shrinking a set of a cluster's machines shares, whatever their role: where
//! a new machine goes and what it is asked for ([`Placement`]), making one so that a failure
//! leaves nothing behind ([`make`]), releasing what a crash left half-made
//! ([`release_orphans`]) and a removed machine's VM ([`release_vm`]). Each set's policy is its
//! own: a control plane ([`crate::membership`]) changes one member at a time behind its quorum
//! gate and etcd's membership steps; a worker pool ([`crate::pools`]) makes several machines
//! at once and drains before it deletes. Both run under one lease each
//! ([`crate::lease::run`]).

use std::future::Future;

use crate::cluster::Spec;
use crate::compute::{CreateVm, Vm};
use crate::db::{
    self, DbError, clusters::ClusterRow, nodes::NodeRow, phase::EtcdMembership, resources::Resource,
};
use crate::machines::{self, MachineError, Machines, NewMachine};
use crate::pki::NodeAddresses;
use exk8s_common::contract::Role;

/// Where a cluster's new machines go and what they boot with, from its stored spec.
#[derive(Debug, Clone)]
pub struct Placement {
    pub spec: Spec,
    /// The groups asked for, then the cluster's own.
    pub security_groups: Vec<i64>,
    pub userdata: String,
}

/// What differs between two machines of one placement.
#[derive(Debug, Clone)]
pub struct Shape<'a> {
    pub name: String,
    pub image_id: i64,
    pub instance_type: &'a str,
    pub subnet_id: i64,
    /// `exk8s.io/...` tags.
    pub tags: &'a [(&'a str, String)],
}

impl Placement {
    /// `cluster`'s placement.
    pub fn of(machines: &Machines, cluster: &ClusterRow) -> Result<Self, MachineError> {
        let spec = Spec::from_stored(&cluster.spec_json).map_err(|e| MachineError::Unusable {
            what: "the cluster's stored spec",
            message: e.to_string(),
        })?;
        let security_groups = spec.security_groups(cluster.security_group_id);
        let userdata = machines.userdata().map_err(|e| MachineError::Unusable {
            what: "the userdata",
            message: e.to_string(),
        })?;
        Ok(Self {
            spec,
            security_groups,
            userdata,
        })
    }

    /// The compute request for a machine of `shape` placed here.
    pub fn vm(&self, shape: Shape<'_>) -> CreateVm {
        CreateVm {
            name: shape.name,
            image_id: shape.image_id,
            instance_type: shape.instance_type.to_owned(),
            zone_id: self.spec.placement.zone_id,
            subnet_id: shape.subnet_id,
            security_group_ids: self.security_groups.clone(),
            allocate_public_ipv4: self.spec.placement.allocate_public_ipv4,
            ssh_pubkey: self.spec.placement.ssh_pubkey.clone(),
            root_volume_size_gib: self.spec.placement.root_volume_size_gib,
            userdata: self.userdata.clone(),
            tags: shape
                .tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
            client_token: String::new(),
        }
    }
}

/// Makes `machine` — journaled, created, given an address — and hands it to `record`. A
/// failure after the journal entry releases the VM at once (and, if that fails too, the set's
/// next pass does: it is an orphan then).
pub async fn make<E, Fut>(
    machines: &Machines,
    machine: NewMachine,
    record: impl FnOnce(Vm) -> Fut,
) -> Result<(), E>
where
    E: From<MachineError>,
    Fut: Future<Output = Result<(), E>>,
{
    let (cluster_id, ordinal) = (machine.cluster_id, machine.ordinal);
    let made = async {
        let vm = machines::create(machines, machine).await?;
        let vm = machines::wait_for_address(machines, vm.id).await?;
        record(vm).await
    }
    .await;
    if made.is_err() {
        let token = machines::client_token(cluster_id, ordinal);
        if let Ok(Some(resource)) = db::resources::find_by_token(&machines.db.pool, &token).await {
            if let Err(e) = machines::release(machines, &resource).await {
                tracing::warn!(cluster_id, ordinal, error = %crate::error_chain(&e), "could not release a new machine's VM (the next pass does)");
            }
        }
    }
    made
}

/// Releases journaled VMs that have no node: creations that failed or crashed, never adopted
/// half-made. True when there were any.
pub async fn release_orphans<'a>(
    machines: &Machines,
    orphans: impl IntoIterator<Item = &'a Resource>,
) -> Result<bool, MachineError> {
    let mut any = false;
    for resource in orphans {
        tracing::info!(cluster_id = resource.cluster_id, token = %resource.client_token, "releasing a VM whose creation did not finish");
        machines::release(machines, resource).await?;
        any = true;
    }
    Ok(any)
}

/// Deletes removed `node`'s VM: through its journal entry when there is one, else by its id
/// (released before a crash: deleting again is a no-op).
pub async fn release_vm(
    machines: &Machines,
    node: &NodeRow,
    journaled: Option<&Resource>,
) -> Result<(), MachineError> {
    match journaled {
        Some(resource) => machines::release(machines, resource).await,
        None => machines
            .compute
            .delete_vm(node.vm_id)
            .await
            .map_err(|source| MachineError::Compute {
                step: "VM deletion",
                source,
            }),
    }
}

/// Which set a new machine's node belongs to.
#[derive(Debug, Clone, Copy)]
pub enum Member {
    /// A control-plane member, at its first step in etcd.
    ControlPlane(EtcdMembership),
    Worker {
        pool_id: i64,
    },
}

/// Records `vm` (made as the cluster's machine `ordinal`, at `addresses`) as a node of the
/// set `member` names; returns the node's id.
pub async fn insert_node(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
    (ordinal, vm): (i64, &Vm),
    addresses: &NodeAddresses,
    member: Member,
    now: i64,
) -> Result<i64, DbError> {
    let (role, pool_id, etcd_membership) = match member {
        Member::ControlPlane(m) => (Role::ControlPlane, None, Some(m)),
        Member::Worker { pool_id } => (Role::Worker, Some(pool_id), None),
    };
    let (v4, v6, public) = (
        addresses.private_ipv4.to_string(),
        addresses.private_ipv6.map(|a| a.to_string()),
        addresses.public_ipv4.map(|a| a.to_string()),
    );
    db::nodes::insert(
        tx,
        &db::nodes::NewNode {
            cluster_id,
            ordinal,
            vm_id: vm.id,
            node_name: addresses.name.as_str(),
            private_ipv4: &v4,
            private_ipv6: v6.as_deref(),
            public_ipv4: public.as_deref(),
            is_initial: false,
            role,
            pool_id,
            etcd_membership,
        },
        now,
    )
    .await
}

/// Why a pass over a machine set stopped short; recorded with its lease, retried by the
/// reconciler.
#[derive(Debug, thiserror::Error)]
pub enum ConvergeError {
    #[error(transparent)]
    Machine(#[from] MachineError),
    #[error(transparent)]
    Db(#[from] DbError),
    /// The change cannot go on, and why: a join abandoned, a stored fact that cannot be used,
    /// no block of the pod CIDR left for another node.
    #[error("{0}")]
    Stopped(String),
    #[error("a machine's task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Lease(#[from] crate::lease::LeaseLost),
}

/// How a pass over a machine set ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The set's machines match what it asks for.
    Converged,
    /// A step is under way elsewhere (a member joining, a rollout, a drain): a report, or the
    /// step's deadline, moves the set on.
    Waiting,
    /// Another process holds the set's lease, or a pass of this one waits for its turn at it
    /// (and reads everything afresh then).
    Busy,
    /// The set (or its cluster) is gone or going.
    Gone,
}

/// Runs `pass` in the background; a failure is logged (and recorded with the lease), and the
/// reconciler retries it.
pub fn spawn<E>(
    what: &'static str,
    id: i64,
    pass: impl Future<Output = Result<Outcome, E>> + Send + 'static,
) where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = pass.await {
            tracing::warn!(id, error = %crate::error_chain(&e), "{what} did not converge (the reconciler retries)");
        }
    });
}

/// Why a request to change a machine set (its size, its placement, its removal) was refused,
/// in the domain's terms; `http/` maps each to its answer.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// A field is malformed or impossible (422, naming the field).
    #[error(transparent)]
    Invalid(#[from] crate::field::FieldError),
    #[error("not found")]
    NotFound,
    /// The request collides with the cluster's or the set's state (409).
    #[error("{0}")]
    Conflict(String),
    /// The compute API failed (502).
    #[error("{0}")]
    Upstream(String),
    #[error(transparent)]
    Db(#[from] DbError),
    /// The org's quota would be passed (409).
    #[error(transparent)]
    Quota(#[from] crate::quotas::Exceeded),
}

/// `org_id`'s cluster `cluster_id`, founded: a set of its machines may change only then.
pub async fn founded_cluster(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
) -> Result<ClusterRow, ChangeError> {
    let cluster = db::clusters::get(&db.pool, org_id, cluster_id)
        .await?
        .ok_or(ChangeError::NotFound)?;
    if cluster.phase != db::phase::ClusterPhase::Founded {
        return Err(ChangeError::Conflict(format!(
            "cluster {cluster_id} is {}, not founded",
            cluster.phase
        )));
    }
    Ok(cluster)
}

impl From<crate::quotas::QuotaError> for ChangeError {
    fn from(e: crate::quotas::QuotaError) -> Self {
        match e {
            crate::quotas::QuotaError::Exceeded(e) => Self::Quota(e),
            crate::quotas::QuotaError::Db(db) => Self::Db(db),
        }
    }
}
