//! Kubernetes upgrades: what this API can install ([`versions`]), the skew policy every
//! version change is checked against ([`skew`]), where a control plane's versions stand
//! ([`state`]), and starting a change ([`start`]).
//!
//! An upgrade is a rollout. [`start`] checks the policy and the preflight, then, in one
//! transaction under the cluster's lock, sets the cluster's target version and gives every
//! control-plane member a new generation. Issuance renders a control-plane bundle at the
//! target and hands it through the rollout gate: one member at a time, only while every other
//! member is healthy at what it applied — so etcd keeps quorum and `Available` holds. On each
//! node the agent applies the bundle in its plan's order (etcd, then the static pods:
//! kube-apiserver, then kube-controller-manager and kube-scheduler, then the kubelet), waiting
//! for each to be healthy, and puts back what it ran when one is not. A member that reports
//! its new bundle failed holds every other member; `PATCH` back to the version the others run
//! rolls it back. Nothing here outlives a crash: the target and the generations are rows, and
//! the rollout resumes from them.

pub mod skew;
pub mod snapshot;
pub mod state;
pub mod versions;

use std::sync::Arc;

use exk8s_common::contract::Role;

use crate::config::ApiConfig;
use crate::db::{self, Db, DbError, phase::ClusterPhase, phase::EtcdMembership};
use skew::{Release, SkewError};
use state::{ControlPlane, Step};

/// What changing a cluster's version needs: its rows, the releases offered, and the clock its
/// certificates' days left are judged by.
#[derive(Debug, Clone)]
pub struct Upgrader {
    pub db: Db,
    pub config: Arc<ApiConfig>,
    pub clock: Arc<dyn crate::clock::Clock>,
}

/// Why a version change was refused.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error("cluster not found")]
    NotFound,
    #[error("cluster {id} is {phase}; only a founded cluster can change its version")]
    NotFounded { id: i64, phase: ClusterPhase },
    /// The version asked for is not a release.
    #[error(transparent)]
    NotARelease(#[from] skew::NotARelease),
    /// The skew policy forbids the change.
    #[error(transparent)]
    Skew(#[from] SkewError),
    /// The cluster is not in a state to change now (the preflight).
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// What a version change did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// The control plane already runs the version on all its `members`.
    Current { version: Release, members: usize },
    /// The change is under way (just started, or asked for again while it runs).
    Upgrading {
        from: Release,
        to: Release,
        /// The members that already run it, of all.
        done: usize,
        members: usize,
    },
    /// A mixed control plane goes back to the version its other members run.
    RollingBack { from: Release, to: Release },
}

/// What a version change did, and the etcd snapshot it waits for before any member changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub started: Started,
    /// The preflight snapshot, while it is not stored (`None`: stored, skipped, or no upgrade).
    pub snapshot_id: Option<i64>,
}

/// Asks `org_id`'s cluster `cluster_id` to run Kubernetes `to`: checked against the skew
/// policy and the preflight, then — once a voter stored an etcd snapshot, unless
/// `snapshot_first` is false — rolled out one control-plane member at a time. Asked again while
/// its snapshot failed, it asks for another (or, without `snapshot_first`, goes on without).
pub async fn start(
    ctx: &Upgrader,
    org_id: i64,
    cluster_id: i64,
    to: &str,
    snapshot_first: bool,
) -> Result<Change, UpgradeError> {
    let to: Release = to.parse()?;
    let offered = offered(&ctx.config)?;
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(UpgradeError::NotFound)?;
    if cluster.phase != ClusterPhase::Founded {
        return Err(UpgradeError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    let mut tx = ctx.db.begin().await?;
    // Decided on rows read under the cluster's lock: the rollout gate and every other change
    // of the control plane read them under the same lock.
    db::nodes::lock_cluster(&mut tx, cluster_id).await?;
    let target: Release = current_target(&mut tx, cluster_id).await?;
    let nodes = db::nodes::list(&mut *tx, cluster_id).await?;
    let cp = ControlPlane::read(target, &nodes);
    // The request's own validity is judged before the cluster's state (422 before 409): an
    // operator is never sent to wait for members only to be refused afterwards.
    if to != target && !offered.contains(&to) {
        return Err(skew::SkewError::NotOffered {
            to,
            offered: skew::listed(&offered),
        }
        .into());
    }
    let decided = decide(&cp, &nodes, to, &offered)?;
    let now = ctx.clock.unix();
    if to == target {
        // Nothing to start: it runs already, or is under way — perhaps stopped before its first
        // member by its snapshot, which is asked for again (or given up).
        let mut snapshot_id = None;
        if let Some((id, wait)) = snapshot::pending(&mut tx, cluster_id, now).await? {
            snapshot_id = Some(id);
            if !snapshot_first {
                db::snapshots::set_upgrade_snapshot(&mut *tx, cluster_id, None).await?;
                snapshot_id = None;
                tracing::warn!(
                    cluster_id,
                    snapshot_id = id,
                    "upgrade goes on without its snapshot"
                );
            } else if !matches!(wait, crate::rollout::SnapshotWait::Taking { .. }) {
                snapshot_id = Some(snapshot::ask(&mut tx, cluster_id, &nodes, now).await?);
            }
            tx.commit().await?;
        }
        return Ok(Change {
            started: decided,
            snapshot_id,
        });
    }
    // etcd moves a minor at a time and never back: from what the members run now (on a
    // rollback, the upgraded ones run the target's).
    let from = match decided {
        Started::RollingBack { .. } => target,
        _ => cp.oldest,
    };
    skew::etcd(from, to, etcd_of(from).as_str(), etcd_of(to).as_str())?;
    let mut snapshot_id = None;
    if !matches!(decided, Started::RollingBack { .. }) {
        let pools = db::pools::list(&mut *tx, cluster_id).await?;
        let kubelets = oldest_kubelets(&pools, &nodes, &cluster.kubernetes_version)?;
        let kubelets: Vec<(&str, Release)> =
            kubelets.iter().map(|(n, v)| (n.as_str(), *v)).collect();
        skew::control_plane(cp.oldest, to, &offered, &kubelets)?;
        preflight(&mut tx, &cluster, &nodes, now).await?;
        if snapshot_first {
            snapshot_id = Some(snapshot::ask(&mut tx, cluster_id, &nodes, now).await?);
        }
    }
    if snapshot_id.is_none() {
        // A rollback, or an upgrade asked without one, waits for no snapshot.
        db::snapshots::set_upgrade_snapshot(&mut *tx, cluster_id, None).await?;
    }
    db::clusters::set_kubernetes_version(&mut *tx, cluster_id, &to.to_string()).await?;
    db::nodes::bump_role_generations(&mut tx, cluster_id, Role::ControlPlane).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        from = %cp.oldest,
        to = %to,
        snapshot_id,
        "control plane version change started"
    );
    Ok(Change {
        started: decided,
        snapshot_id,
    })
}

/// The etcd release Kubernetes `release` runs.
fn etcd_of(release: Release) -> exk8s_common::names::Version {
    let version = exk8s_common::names::Version::new(release.to_string())
        .unwrap_or_else(|_| unreachable!("a release is a valid version"));
    crate::render::etcd_for(&version)
}

/// Each release this API offers besides the one `org_id`'s cluster `cluster_id` runs, and why
/// the skew policy refuses it — the checks [`start`] makes of the release itself (a change
/// under way, the skew between minors, etcd's, the pools' kubelets), not those of the moment
/// (every member healthy, no rotation): what an upgrade form offers. Read without the lock.
pub async fn choices(
    ctx: &Upgrader,
    org_id: i64,
    cluster_id: i64,
) -> Result<Vec<(Release, Option<String>)>, UpgradeError> {
    let offered = offered(&ctx.config)?;
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(UpgradeError::NotFound)?;
    let target: Release = cluster.kubernetes_version.parse()?;
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    let pools = db::pools::list(&ctx.db.pool, cluster_id).await?;
    let kubelets = oldest_kubelets(&pools, &nodes, &cluster.kubernetes_version)?;
    let kubelets: Vec<(&str, Release)> = kubelets.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    let cp = ControlPlane::read(target, &nodes);
    let mut choices: Vec<(Release, Option<String>)> = offered
        .iter()
        .filter(|to| **to != target)
        .map(|&to| {
            let refused = decide(&cp, &nodes, to, &offered)
                .map_err(|e| e.to_string())
                .and_then(|decided| match decided {
                    Started::RollingBack { .. } => Ok(()),
                    _ => skew::etcd(
                        cp.oldest,
                        to,
                        etcd_of(cp.oldest).as_str(),
                        etcd_of(to).as_str(),
                    )
                    .and_then(|()| skew::control_plane(cp.oldest, to, &offered, &kubelets))
                    .map_err(|e| e.to_string()),
                })
                .err();
            (to, refused)
        })
        .collect();
    choices.sort_by_key(|c| std::cmp::Reverse(c.0));
    Ok(choices)
}

/// The cluster's target, read again under its lock.
async fn current_target(
    tx: &mut sqlx::AnyConnection,
    cluster_id: i64,
) -> Result<Release, UpgradeError> {
    let version = db::clusters::kubernetes_version(tx, cluster_id)
        .await?
        .ok_or(UpgradeError::NotFound)?;
    Ok(version.parse()?)
}

/// Each pool's oldest kubelet: its own release, or an older one a worker still runs while the
/// pool is being replaced.
fn oldest_kubelets(
    pools: &[db::pools::PoolRow],
    nodes: &[db::nodes::NodeRow],
    cluster_version: &str,
) -> Result<Vec<(String, Release)>, UpgradeError> {
    pools
        .iter()
        .map(|p| {
            let release: Release = p
                .kubernetes_version
                .as_deref()
                .unwrap_or(cluster_version)
                .parse()?;
            let oldest = nodes
                .iter()
                .filter(|n| n.pool_id == Some(p.id))
                .filter_map(state::running)
                .fold(release, Release::min);
            Ok((p.name.clone(), oldest))
        })
        .collect()
}

/// The releases this API installs.
fn offered(config: &ApiConfig) -> Result<Vec<Release>, UpgradeError> {
    Ok(config
        .kubernetes_versions
        .iter()
        .map(|v| v.parse())
        .collect::<Result<_, _>>()?)
}

/// What asking for `to` means for a control plane at `cp`: nothing, a change to start or
/// already running, or a rollback. Refuses a third version while a change runs.
fn decide(
    cp: &ControlPlane,
    nodes: &[db::nodes::NodeRow],
    to: Release,
    offered: &[Release],
) -> Result<Started, UpgradeError> {
    let upgrading = Started::Upgrading {
        from: cp.oldest,
        to,
        done: if to == cp.target { cp.done } else { 0 },
        members: cp.members,
    };
    if to == cp.target {
        return Ok(if cp.mixed() || cp.step != Step::Steady {
            upgrading
        } else {
            Started::Current {
                version: to,
                members: cp.members,
            }
        });
    }
    if cp.changing(nodes) {
        // Mid-change: back to the version the other members run, or nothing.
        if to == cp.oldest && offered.contains(&to) {
            return Ok(Started::RollingBack {
                from: cp.target,
                to,
            });
        }
        return Err(UpgradeError::Conflict(format!(
            "the control plane is changing from {} to {} ({} of {} members run it); wait for \
             it to finish, or PATCH back to {} to roll it back",
            cp.oldest, cp.target, cp.done, cp.members, cp.oldest
        )));
    }
    Ok(upgrading)
}

/// Days a certificate the cluster runs must have left for an upgrade to start (as
/// `CertificatesAvailable` warns below it): renew or rotate first.
pub const CERTIFICATE_DAYS: i64 = 30;

/// Refuses unless every member is healthy and up to date, etcd's membership is settled, no CA
/// rotation runs and no certificate the cluster runs is near its end.
async fn preflight(
    tx: &mut sqlx::AnyConnection,
    cluster: &db::clusters::ClusterRow,
    nodes: &[db::nodes::NodeRow],
    now: i64,
) -> Result<(), UpgradeError> {
    let cluster_id = cluster.id;
    let conflict = |what: String| Err(UpgradeError::Conflict(what));
    if let Some(why) = db::restores::refusal(&mut *tx, cluster_id, "upgrade after it").await? {
        return conflict(why);
    }
    if let Some(why) = db::rotations::refusal(&mut *tx, cluster_id, "upgrade after it").await? {
        return conflict(why);
    }
    let control_plane: Vec<_> = nodes
        .iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    if let Some(changing) = control_plane
        .iter()
        .find(|n| n.etcd_membership != Some(EtcdMembership::Voter) || n.replace_since.is_some())
    {
        return conflict(format!(
            "a membership change is in progress ({} is {}); upgrade after it",
            changing.node_name,
            if changing.replace_since.is_some() {
                "being replaced"
            } else {
                changing
                    .etcd_membership
                    .map_or("without membership", EtcdMembership::as_str)
            }
        ));
    }
    if let Some(asked) = db::membership::desired(&mut *tx, cluster_id).await? {
        let members = i64::try_from(control_plane.len()).unwrap_or(i64::MAX);
        if asked != members {
            return conflict(format!(
                "the control plane is changing to {asked} members ({members} now); upgrade after it"
            ));
        }
    }
    if let Some(unready) = control_plane
        .iter()
        .find(|n| !n.phase.healthy() || !n.up_to_date())
    {
        return conflict(format!(
            "every control-plane member must be healthy and up to date before an upgrade: {} is \
             {} at generation {} of {}",
            unready.node_name,
            unready.phase,
            unready.applied_generation,
            unready.desired_generation
        ));
    }
    let rows = db::certificates::list(&mut *tx, cluster_id).await?;
    let inventory =
        crate::certificates::inventory_of(cluster_id, cluster.sa_key_made_at(), nodes, rows, now);
    // Soonest expiry first; an operator's kubeconfig is theirs to renew.
    if let Some(due) = inventory
        .certificates
        .iter()
        .filter(|e| !crate::certificates::is_operator_credential(&e.row))
        .find(|e| e.days_left < CERTIFICATE_DAYS)
    {
        let whose = due
            .vm_id
            .map_or_else(String::new, |vm| format!(" of vm {vm}"));
        return conflict(format!(
            "{}{whose} has {} day(s) left; renew the certificates (or rotate its CA) before \
             an upgrade",
            due.row.name, due.days_left
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
