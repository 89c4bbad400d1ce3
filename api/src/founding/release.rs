//! Releasing a cluster's external resources, newest first (VMs before the security group they
//! use): by the journal's external id, or — for a resource journaled `creating` whose call's
//! answer was lost — by its client token. Idempotent: anything already gone is skipped.
//! Used by failed founding, by the reconciler, and by `DELETE /clusters/{id}`.
//!
//! [`release_created`] is the fallback for founding when the journal cannot be read: it deletes
//! what one founding call knows it created, without touching the database.

use crate::compute::ComputeError;
use crate::db::{self, DbError, resources::Kind};
use crate::machines::Machines;

#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("releasing {what}: {source}")]
    Compute {
        what: String,
        #[source]
        source: ComputeError,
    },
}

pub async fn release_all(machines: &Machines, cluster_id: i64) -> Result<(), ReleaseError> {
    let resources = db::resources::list_for_cluster(&machines.db.pool, cluster_id).await?;
    let dns_name = db::clusters::get_by_id(&machines.db.pool, cluster_id)
        .await?
        .map(|c| c.control_plane_dns_name);
    for resource in resources.iter().rev().filter(|r| r.state != "deleted") {
        let failed = |what: String| move |source| ReleaseError::Compute { what, source };
        let known_id = resource
            .external_id
            .as_deref()
            .and_then(|id| id.parse::<i64>().ok());
        match resource.kind {
            Kind::Vm => {
                let id = match known_id {
                    Some(id) => Some(id),
                    None => machines
                        .compute
                        .find_vm(&resource.client_token)
                        .await
                        .map_err(failed(format!("VM {}", resource.client_token)))?
                        .map(|vm| vm.id),
                };
                if let Some(id) = id {
                    machines
                        .compute
                        .delete_vm(id)
                        .await
                        .map_err(failed(format!("VM {id}")))?;
                    tracing::info!(cluster_id, vm_id = id, "deleted VM");
                }
            }
            Kind::SecurityGroup => {
                let id = match known_id {
                    Some(id) => Some(id),
                    None => machines
                        .compute
                        .find_security_group(&resource.client_token)
                        .await
                        .map_err(failed(format!("security group {}", resource.client_token)))?
                        .map(|g| g.id),
                };
                if let Some(id) = id {
                    machines
                        .compute
                        .delete_security_group(id)
                        .await
                        .map_err(failed(format!("security group {id}")))?;
                    tracing::info!(cluster_id, group_id = id, "deleted security group");
                }
            }
            Kind::DnsRecord => {
                if let (Some(dns), Some(name)) = (&machines.dns, &dns_name) {
                    dns.delete_a(name)
                        .await
                        .map_err(failed(format!("DNS record {name}")))?;
                }
            }
        }
        db::resources::set_state(&machines.db.pool, resource.id, "deleted", None, db::now())
            .await?;
    }
    Ok(())
}

/// What one founding call created, as its compute calls answered (not read from the journal).
#[derive(Debug, Default)]
pub struct Created {
    pub vms: Vec<i64>,
    pub security_group: Option<i64>,
}

/// Best effort, database-free: deletes `created` (VMs first, then their group). The journal
/// still lists them; the reconciler marks them deleted once the database answers (deleting what
/// is gone is a no-op).
pub async fn release_created(machines: &Machines, cluster_id: i64, created: &Created) {
    for &vm_id in created.vms.iter().rev() {
        match machines.compute.delete_vm(vm_id).await {
            Ok(()) => tracing::info!(cluster_id, vm_id, "deleted VM (from memory)"),
            Err(e) => {
                tracing::warn!(cluster_id, vm_id, error = %crate::error_chain(&e), "could not delete VM; the reconciler will");
            }
        }
    }
    if let Some(group_id) = created.security_group {
        match machines.compute.delete_security_group(group_id).await {
            Ok(()) => tracing::info!(cluster_id, group_id, "deleted security group (from memory)"),
            Err(e) => {
                tracing::warn!(cluster_id, group_id, error = %crate::error_chain(&e), "could not delete security group; the reconciler will");
            }
        }
    }
}
