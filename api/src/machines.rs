//! One machine as the journal sees it, shared by founding and by node pools: a VM is journaled
//! `creating` (committed) before the compute call, with a client token derived from its
//! cluster and ordinal, and `created` with its id after; it is released the same way, by id or
//! — when the create's answer was lost — by its token. A crash between any two steps leaves a
//! journal row that says what may exist.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::compute::{Compute, ComputeError, CreateVm, Vm};
use crate::config::ApiConfig;
use crate::db::{self, Db, DbError, resources::Kind};
use crate::dns::Dns;
use crate::pki::NodeAddresses;
use exk8s_common::names::NodeName;

/// What making, naming and releasing machines needs: the journal, the compute API, the DNS
/// service (when exk8s manages names) and the settings written into every VM's userdata.
#[derive(Debug, Clone)]
pub struct Machines {
    pub db: Db,
    pub compute: Arc<dyn Compute>,
    pub dns: Option<Arc<dyn Dns>>,
    pub config: Arc<ApiConfig>,
}

impl Machines {
    /// The userdata every new VM boots with: where its agent reaches this API.
    pub fn userdata(&self) -> Result<String, crate::render::RenderError> {
        crate::render::render_userdata(
            &self.config.public_url,
            &self.config.imds_url,
            self.config.agent_insecure_http,
        )
    }
}

/// Why a machine could not be made or released.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("{step} failed: {source}")]
    Compute {
        step: &'static str,
        #[source]
        source: ComputeError,
    },
    /// The compute API answered something exk8s cannot use.
    #[error("{step} failed: {message}")]
    Upstream { step: &'static str, message: String },
    /// A stored fact a new machine is made from cannot be used (a defect, not the caller's).
    #[error("{what} cannot be used: {message}")]
    Unusable { what: &'static str, message: String },
    #[error(transparent)]
    Db(#[from] DbError),
}

impl MachineError {
    /// The step that failed, recorded as a failure's reason.
    pub fn step(&self) -> &'static str {
        match self {
            Self::Compute { step, .. } | Self::Upstream { step, .. } => step,
            Self::Unusable { what, .. } => what,
            Self::Db(_) => "database",
        }
    }
}

/// The client token of the cluster's machine `ordinal`: the same on every retry, so a create
/// is idempotent and a lost answer can be found.
pub fn client_token(cluster_id: i64, ordinal: i64) -> String {
    format!("cluster-{cluster_id}-vm-{ordinal}")
}

/// A machine to make: where it is journaled and what the compute API is asked for (its
/// `client_token` is set from the cluster and ordinal).
#[derive(Debug, Clone)]
pub struct NewMachine {
    pub cluster_id: i64,
    pub ordinal: i64,
    pub pool_id: Option<i64>,
    pub vm: CreateVm,
}

/// Journals the machine (committed), creates it, journals its id.
pub async fn create(machines: &Machines, machine: NewMachine) -> Result<Vm, MachineError> {
    let NewMachine {
        cluster_id,
        ordinal,
        pool_id,
        mut vm,
    } = machine;
    vm.client_token = client_token(cluster_id, ordinal);
    let journal_id = db::resources::journal_intent(
        &machines.db,
        &db::resources::Intent {
            cluster_id,
            kind: Kind::Vm,
            client_token: &vm.client_token,
            ordinal: Some(ordinal),
            pool_id,
        },
        db::now(),
    )
    .await?;
    let created =
        machines
            .compute
            .create_vm(&vm)
            .await
            .map_err(|source| MachineError::Compute {
                step: "VM creation",
                source,
            })?;
    db::resources::set_state(
        &machines.db.pool,
        journal_id,
        "created",
        Some(&created.id.to_string()),
        db::now(),
    )
    .await?;
    Ok(created)
}

/// Deletes the journaled VM `resource` (by its id, or its token when the id was never
/// recorded) and marks it deleted. Deleting what is gone is not an error.
pub async fn release(
    machines: &Machines,
    resource: &db::resources::Resource,
) -> Result<(), MachineError> {
    let failed = |source| MachineError::Compute {
        step: "VM deletion",
        source,
    };
    let id = match resource
        .external_id
        .as_deref()
        .and_then(|id| id.parse::<i64>().ok())
    {
        Some(id) => Some(id),
        None => machines
            .compute
            .find_vm(&resource.client_token)
            .await
            .map_err(failed)?
            .map(|vm| vm.id),
    };
    if let Some(id) = id {
        machines.compute.delete_vm(id).await.map_err(failed)?;
        tracing::info!(cluster_id = resource.cluster_id, vm_id = id, "deleted VM");
    }
    db::resources::set_state(&machines.db.pool, resource.id, "deleted", None, db::now()).await?;
    Ok(())
}

/// Polls a VM until it reports a private IPv4 address, up to the configured deadline.
pub async fn wait_for_address(machines: &Machines, vm_id: i64) -> Result<Vm, MachineError> {
    let deadline = Instant::now() + machines.config.address_timeout;
    loop {
        let vm = machines
            .compute
            .get_vm(vm_id)
            .await
            .map_err(|source| MachineError::Compute {
                step: "address lookup",
                source,
            })?
            .ok_or_else(|| lookup_failed(format!("VM {vm_id} disappeared")))?;
        if vm.private_ipv4.is_some() {
            return Ok(vm);
        }
        if Instant::now() >= deadline {
            let waited = machines.config.address_timeout.as_secs();
            return Err(lookup_failed(format!(
                "VM {vm_id} got no address within {waited}s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn lookup_failed(message: String) -> MachineError {
    MachineError::Upstream {
        step: "address lookup",
        message,
    }
}

/// The addresses `vm` reported, checked, under the node name `name`.
pub fn addresses(vm: &Vm, name: NodeName) -> Result<NodeAddresses, MachineError> {
    fn parse<T: std::str::FromStr>(
        vm: i64,
        what: &str,
        text: Option<&str>,
    ) -> Result<Option<T>, MachineError> {
        let Some(text) = text else { return Ok(None) };
        // Any address family parses as an address; the family must be the one named.
        let invalid = || lookup_failed(format!("the compute API gave VM {vm} an invalid {what}"));
        text.parse::<IpAddr>().map_err(|_| invalid())?;
        text.parse::<T>().map(Some).map_err(|_| invalid())
    }
    Ok(NodeAddresses {
        name,
        private_ipv4: parse::<Ipv4Addr>(vm.id, "IPv4 address", vm.private_ipv4.as_deref())?
            .ok_or_else(|| lookup_failed(format!("VM {} has no IPv4 address", vm.id)))?,
        private_ipv6: parse::<Ipv6Addr>(vm.id, "IPv6 address", vm.private_ipv6.as_deref())?,
        public_ipv4: parse::<Ipv4Addr>(vm.id, "public IPv4 address", vm.public_ipv4.as_deref())?,
    })
}
