//! A restore's steps as its members see them: the step each is to do now ([`task_for`]), their
//! acknowledgements moving the restore on ([`acknowledge`]), and the snapshot a member fetches
//! while it is asked to restore it ([`member_snapshot`]).

use exk8s_common::contract::{RestoreStep, RestoreTask};

use super::RestoreError;
use crate::db::restores::RestorePhase;
use crate::db::{self, DbError};
use crate::snapshots::{SnapshotError, Snapshots};

/// The snapshot member `node_id` of `cluster_id` is asked to restore now, as etcd wrote it:
/// `None` unless a running restore of `snapshot_id` asks it to.
pub async fn member_snapshot(
    ctx: &Snapshots,
    cluster: &db::clusters::ClusterRow,
    node_id: i64,
    snapshot_id: i64,
) -> Result<
    Option<futures_util::stream::BoxStream<'static, Result<bytes::Bytes, SnapshotError>>>,
    RestoreError,
> {
    let asked = task_for(ctx, cluster.id, node_id)
        .await?
        .filter(|t| t.step == RestoreStep::Restore && t.snapshot_id == snapshot_id);
    let Some(task) = asked else {
        return Ok(None);
    };
    let Some(row) = db::restores::running(&ctx.db.pool, cluster.id).await? else {
        return Ok(None);
    };
    tracing::info!(
        cluster_id = cluster.id,
        restore_id = task.id,
        snapshot_id,
        "etcd snapshot sent to a member to restore"
    );
    Ok(Some(
        crate::snapshots::content(ctx, cluster.org_id, row.source_cluster_id, snapshot_id).await?,
    ))
}

/// The step of a running restore that node `node_id` of `cluster_id` is to do now, if any.
pub async fn task_for(
    ctx: &Snapshots,
    cluster_id: i64,
    node_id: i64,
) -> Result<Option<RestoreTask>, DbError> {
    let Some(row) = db::restores::running(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let members = db::restores::members(&ctx.db.pool, row.id).await?;
    let Some(member) = members.iter().find(|m| m.node_id == node_id) else {
        return Ok(None);
    };
    let step = match row.phase {
        RestorePhase::Stop if member.done < 1 => RestoreStep::Stop,
        RestorePhase::Restore if member.done < 2 => RestoreStep::Restore,
        // One member at a time: the first (by ordinal) not started yet.
        RestorePhase::Start
            if members.iter().find(|m| m.done < 3).map(|m| m.node_id) == Some(node_id) =>
        {
            RestoreStep::Start
        }
        _ => return Ok(None),
    };
    let paths = &crate::render::paths::PATHS;
    Ok(Some(RestoreTask {
        id: row.id,
        step,
        snapshot_id: row.snapshot_id,
        sha256: row.sha256.clone(),
        member_name: member.member_name.clone(),
        peer_url: member.peer_url.clone(),
        initial_cluster: members
            .iter()
            .map(|m| format!("{}={}", m.member_name, m.peer_url))
            .collect::<Vec<_>>()
            .join(","),
        initial_cluster_token: row.token.clone(),
        bump_revision: u64::try_from(row.bump_revision).unwrap_or(u64::MAX),
        data_dir: paths.etcd_data_dir.to_owned(),
        etcdutl: crate::render::plan::ETCDUTL.to_owned(),
        manifests: paths.control_plane_manifests().map(str::to_owned).to_vec(),
    }))
}

/// Node `node_id` of `cluster_id` did (or could not do: `failure`) step `step` of restore
/// `id`. A step already acknowledged is acknowledged again without effect; a step the restore
/// is not at is a conflict. The last member to finish a phase moves the restore on.
pub async fn acknowledge(
    ctx: &Snapshots,
    cluster_id: i64,
    node_id: i64,
    id: i64,
    step: RestoreStep,
    failure: &str,
) -> Result<RestorePhase, RestoreError> {
    let Some(row) = db::restores::latest(&ctx.db.pool, cluster_id)
        .await?
        .filter(|r| r.id == id)
    else {
        return Err(RestoreError::NotFound);
    };
    let members = db::restores::members(&ctx.db.pool, id).await?;
    let member = members
        .iter()
        .find(|m| m.node_id == node_id)
        .ok_or(RestoreError::NotFound)?;
    let phase = phase_of(step);
    if member.done >= phase.level() {
        return Ok(row.phase);
    }
    if row.phase != phase {
        return Err(RestoreError::Conflict(format!(
            "restore {id} is {}, not at its {} step",
            row.phase,
            step.as_str()
        )));
    }
    let now = ctx.clock.unix();
    if !failure.is_empty() {
        let error = format!(
            "{} could not {}: {failure}",
            member.member_name,
            step.as_str()
        );
        db::restores::fail(&ctx.db.pool, id, &error, now).await?;
        tracing::warn!(cluster_id, restore_id = id, %error, "etcd restore failed");
        return Ok(RestorePhase::Failed);
    }
    db::restores::member_done(&ctx.db.pool, id, node_id, phase.level()).await?;
    let members = db::restores::members(&ctx.db.pool, id).await?;
    if members.iter().all(|m| m.done >= phase.level())
        && db::restores::advance(&ctx.db.pool, id, phase, phase.next(), now).await?
    {
        tracing::info!(
            cluster_id,
            restore_id = id,
            phase = %phase.next(),
            "etcd restore moved on"
        );
        return Ok(phase.next());
    }
    tracing::info!(cluster_id, restore_id = id, member = %member.member_name, step = step.as_str(), "etcd restore step done");
    Ok(phase)
}

fn phase_of(step: RestoreStep) -> RestorePhase {
    match step {
        RestoreStep::Stop => RestorePhase::Stop,
        RestoreStep::Restore => RestorePhase::Restore,
        RestoreStep::Start => RestorePhase::Start,
    }
}
