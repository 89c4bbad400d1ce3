//! A node's phase reports, from its first boot (bootstrap token) and from its syncs (node key):
//! each is kept in `node_reports` and becomes the node's current phase; a succeeded `complete`
//! or `sync` marks the reported generation applied. The components a report checked are kept
//! per node (`node_components`).

use exk8s_common::contract::{BootPhase, ComponentHealth, MAX_REPORT_MESSAGE_CHARS, ReportState};

use crate::db::Db;
use crate::db::{self, phase::NodePhase};
use crate::field::FieldError;

use super::{IssuanceError, Vm};

/// What recording a report needs: the rows, and what a report moves on — the cluster's CA
/// rotation, its pools (a drain applied) and its control plane (a join or a rollout ended).
#[derive(Debug, Clone)]
pub struct Reporter {
    pub db: Db,
    pub rotator: crate::rotation::Rotator,
    pub pools: crate::pools::Pools,
    pub membership: crate::membership::Membership,
    pub snapshots: crate::snapshots::Snapshots,
}

/// One report, as parsed from the request.
#[derive(Debug, Clone)]
pub struct Report<'a> {
    pub phase: BootPhase,
    pub state: ReportState,
    pub message: &'a str,
    pub generation: Option<u64>,
    /// What the node's probes saw, one entry per component at most.
    pub components: Vec<ComponentHealth>,
}

/// At most one entry per component, each message within the report's limit.
fn check_components(components: &[ComponentHealth]) -> Result<(), FieldError> {
    let mut seen = std::collections::BTreeSet::new();
    for c in components {
        if !seen.insert(c.component) {
            return Err(FieldError::new(
                "components",
                format!("components names {} twice", c.component),
            ));
        }
        if c.message.chars().count() > MAX_REPORT_MESSAGE_CHARS {
            return Err(FieldError::new(
                "components",
                format!(
                    "the message of {} must be at most {MAX_REPORT_MESSAGE_CHARS} characters",
                    c.component
                ),
            ));
        }
    }
    Ok(())
}

/// Checks and records `report` for `vm`.
pub async fn record(ctx: &Reporter, vm: &Vm, report: &Report<'_>) -> Result<(), IssuanceError> {
    if report.message.chars().count() > MAX_REPORT_MESSAGE_CHARS {
        return Err(FieldError::new(
            "message",
            format!("message must be at most {MAX_REPORT_MESSAGE_CHARS} characters"),
        )
        .into());
    }
    check_components(&report.components)?;
    let generation = report
        .generation
        .map(|g| {
            i64::try_from(g)
                .ok()
                .filter(|g| *g >= 1)
                .ok_or_else(|| FieldError::new("generation", "generation must be at least 1"))
        })
        .transpose()?;
    let now = db::now();
    let mut tx = ctx.db.begin().await?;
    db::issuances::insert_report(
        &mut *tx,
        vm.node.id,
        report.phase.as_str(),
        report.state.as_str(),
        report.message,
        now,
    )
    .await?;
    let phase = NodePhase::Reported {
        phase: report.phase,
        state: report.state,
    };
    db::nodes::record_report(&mut tx, vm.node.id, phase, generation, now).await?;
    db::components::record(&mut tx, vm.node.id, &report.components, now).await?;
    tx.commit().await?;
    if phase.healthy() {
        // The last node to apply a rotation phase moves the rotation on.
        if let Err(e) = crate::rotation::advance(&ctx.rotator, vm.cluster.id).await {
            tracing::warn!(cluster_id = vm.cluster.id, error = %crate::error_chain(&e), "CA rotation could not move on (the reconciler retries)");
        }
        // Only control-plane nodes carry the service-account key.
        if vm.node.pool_id.is_none() {
            if let Err(e) = crate::sa_rotation::advance(&ctx.rotator, vm.cluster.id).await {
                tracing::warn!(cluster_id = vm.cluster.id, error = %crate::error_chain(&e), "service-account key rotation could not move on (the reconciler retries)");
            }
        }
        // A drainer that applied its drain lets the drained workers go.
        crate::pools::converge::after_report(&ctx.pools, vm.node.id).await;
        match vm.node.pool_id {
            // A new worker that came up lets its pool's replacement move on.
            Some(pool_id) => crate::pools::converge::after_worker_report(&ctx.pools, pool_id).await,
            // The last member to run the control plane's new release moves the pools on.
            None => crate::pools::converge::follow_control_plane(&ctx.pools, vm.cluster.id).await,
        }
    }
    // A joined member's report — or a failed join's, or the end of a rollout — moves a
    // control-plane change on.
    let finished = phase.healthy() || report.state == exk8s_common::contract::ReportState::Failed;
    if finished && vm.node.role == exk8s_common::contract::Role::ControlPlane {
        crate::membership::converge::after_report(&ctx.membership, vm.cluster.id).await;
    }
    // A cluster founded from another's snapshot restores it once its control plane is up.
    if phase.healthy() && vm.node.role == exk8s_common::contract::Role::ControlPlane {
        if let Err(e) = crate::restore::start_pending(&ctx.snapshots, vm.cluster.id).await {
            tracing::warn!(cluster_id = vm.cluster.id, error = %crate::error_chain(&e), "the restore a cluster was founded for cannot start (the reconciler retries)");
        }
    }
    tracing::info!(vm_id = vm.node.vm_id, phase = %report.phase, state = %report.state, generation, "node reported");
    Ok(())
}
