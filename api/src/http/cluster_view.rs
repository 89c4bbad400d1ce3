//! Clusters as operators see them ([`ClusterView`]), built a page at a time: every related
//! table is read once for the whole page ([`db::pages`]), so a page of 500 clusters costs a
//! handful of queries, not 500 × 10. One cluster's view is a page of one.

use std::collections::HashMap;

use exk8s_common::contract::Role;

use super::conditions::Condition;
use super::error::ApiError;
use crate::app::AppState;
use crate::db::phase::EtcdMembership;
use crate::db::{
    self,
    clusters::ClusterRow,
    pages::{Clusters, group},
    phase::ClusterPhase,
};
use crate::status;
use crate::upgrade::skew::Release;
use exk8s_api_types::{
    CaRotationView, ClusterView, MembersView, NodeView, PoolSummary, SaKeyRotationView,
    ServiceAccountKeyView,
};

/// One cluster's related rows.
#[derive(Default)]
struct Parts {
    nodes: Vec<db::nodes::NodeRow>,
    certificates: Vec<db::certificates::CertRow>,
    rotation: Option<db::rotations::Rotation>,
    sa_rotation: Option<db::sa_rotations::SaRotation>,
    last_report: Option<i64>,
    /// The asked-for control-plane size and the membership error.
    membership: (Option<i64>, Option<String>),
    pools: Vec<db::pools::PoolRow>,
    components: Vec<db::components::ComponentRow>,
    /// The latest snapshot in each state.
    snapshots: Vec<db::snapshots::SnapshotRow>,
}

/// Each of `rows` with its related rows, in their order. The reads run at once, each as
/// its own task on its own connection: the page waits for the slowest, and their rows are
/// decoded on every async worker, not one. A read whose page was abandoned finishes (a few
/// milliseconds) rather than have its connection closed mid-query. The clusters'
/// certificates come from memory while they are unchanged ([`crate::cert_cache`]): only those
/// never held are read with the rest, and those that changed after the nodes are read.
async fn gather(
    state: &AppState,
    rows: Vec<ClusterRow>,
) -> Result<Vec<(ClusterRow, Parts)>, ApiError> {
    let clusters = covering(&rows);
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    let page = || (state.db.pool.clone(), clusters.clone());
    // Certificates are the page's largest read (14 rows per node that booted): one never
    // held is read ahead, as two reads, one per half of the page.
    let [early, late] = state.recorded.ahead(&clusters, &ids).halves();
    let (
        nodes,
        early,
        late,
        rotations,
        sa_rotations,
        reports,
        mut memberships,
        pools,
        components,
        snapshots,
    ) = tokio::try_join!(
        spawned(
            page(),
            |(p, c)| async move { db::pages::nodes(&p, &c).await }
        ),
        spawned((state.db.pool.clone(), early), |(p, c)| async move {
            db::pages::certificates(&p, &c).await
        }),
        spawned((state.db.pool.clone(), late), |(p, c)| async move {
            db::pages::certificates(&p, &c).await
        }),
        spawned(page(), |(p, c)| async move {
            db::pages::rotations(&p, &c).await
        }),
        spawned(page(), |(p, c)| async move {
            db::pages::sa_rotations(&p, &c).await
        }),
        spawned(page(), |(p, c)| async move {
            db::pages::last_reports(&p, &c).await
        }),
        spawned(page(), |(p, c)| async move {
            db::pages::memberships(&p, &c).await
        }),
        spawned(
            page(),
            |(p, c)| async move { db::pages::pools(&p, &c).await }
        ),
        spawned(page(), |(p, c)| async move {
            db::pages::components(&p, &c).await
        }),
        spawned(page(), |(p, c)| async move {
            db::pages::snapshots(&p, &c).await
        }),
    )?;
    let mut nodes = group(nodes, |n| n.cluster_id);
    // Each cluster's rows lie in one half.
    let mut read = early;
    read.extend(late);
    let versions = rows.iter().map(|r| (r.id, r.certificates_version));
    let mut certificates = (state.recorded)
        .resolve(&state.db.pool, versions, &nodes, read)
        .await?;
    let mut rotations: HashMap<i64, db::rotations::Rotation> =
        rotations.into_iter().map(|r| (r.cluster_id, r)).collect();
    let mut sa_rotations: HashMap<i64, db::sa_rotations::SaRotation> = sa_rotations
        .into_iter()
        .map(|r| (r.cluster_id, r))
        .collect();
    let mut pools = group(pools, |p| p.cluster_id);
    let mut components = group(components, |(c, _)| *c);
    let mut snapshots = group(snapshots, |s| s.cluster_id);
    Ok(rows
        .into_iter()
        .map(|row| {
            let id = row.id;
            let parts = Parts {
                nodes: nodes.remove(&id).unwrap_or_default(),
                certificates: certificates
                    .remove(&id)
                    .map(|rows| rows.to_vec())
                    .unwrap_or_default(),
                rotation: rotations.remove(&id),
                sa_rotation: sa_rotations.remove(&id),
                last_report: reports.get(&id).copied(),
                membership: memberships.remove(&id).unwrap_or_default(),
                pools: pools.remove(&id).unwrap_or_default(),
                components: without_cluster(components.remove(&id).unwrap_or_default()),
                snapshots: snapshots.remove(&id).unwrap_or_default(),
            };
            (row, parts)
        })
        .collect())
}

/// What to read for `rows`: the span of ids they cover within their org when they are a page
/// of one org's clusters, else exactly their ids.
fn covering(rows: &[ClusterRow]) -> Clusters {
    let ids = || rows.iter().map(|r| r.id);
    match (rows.first(), ids().min(), ids().max()) {
        (Some(row), Some(first), Some(last))
            if rows.len() > 1 && rows.iter().all(|r| r.org_id == row.org_id) =>
        {
            Clusters::Span {
                org_id: Some(row.org_id),
                first,
                last,
            }
        }
        _ => Clusters::Ids(ids().collect()),
    }
}

/// Rows without the cluster id they were grouped by.
fn without_cluster<T>(rows: Vec<(i64, T)>) -> Vec<T> {
    rows.into_iter().map(|(_, row)| row).collect()
}

/// Runs `read(input)` as a task of its own.
async fn spawned<I, T, F>(input: I, read: impl FnOnce(I) -> F) -> Result<T, ApiError>
where
    F: Future<Output = Result<T, db::DbError>> + Send + 'static,
    T: Send + 'static,
{
    tokio::spawn(read(input))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::from)
}

/// One cluster's view.
pub(crate) async fn view(state: &AppState, row: ClusterRow) -> Result<ClusterView, ApiError> {
    let now = state.clock.unix();
    gather(state, vec![row])
        .await?
        .pop()
        .map(|(row, parts)| assemble(state, row, parts, now))
        .ok_or_else(|| ApiError::internal(std::io::Error::other("a page of one built no view")))
}

/// Below this many clusters a page is written in one piece.
const SLICED_FROM: usize = 64;

/// The views of `rows`, in their order, as one JSON array. A page's views are built and
/// written on the blocking threads, a slice per core, and the slices joined: on the async
/// threads, 500 views would hold one worker for tens of milliseconds.
pub(super) async fn page_json(
    state: &AppState,
    rows: Vec<ClusterRow>,
) -> Result<Vec<u8>, ApiError> {
    let mut gathered = gather(state, rows).await?;
    let now = state.clock.unix();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let slices = if gathered.len() < SLICED_FROM {
        1
    } else {
        cores.clamp(1, 4)
    };
    let per_slice = gathered.len().div_ceil(slices).max(1);
    let mut tasks = Vec::with_capacity(slices);
    while !gathered.is_empty() {
        let rest = gathered.split_off(per_slice.min(gathered.len()));
        let slice = std::mem::replace(&mut gathered, rest);
        let state = state.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            let views: Vec<ClusterView> = slice
                .into_iter()
                .map(|(row, parts)| assemble(&state, row, parts, now))
                .collect();
            // Sized for the views up front: a page is megabytes, and a growing buffer copies
            // itself a dozen times on the way.
            let mut written = Vec::with_capacity(views.len() * VIEW_BYTES);
            serde_json::to_writer(&mut written, &views).map(|()| written)
        }));
    }
    let mut written = Vec::with_capacity(tasks.len());
    for task in tasks {
        written.push(
            task.await
                .map_err(ApiError::internal)?
                .map_err(ApiError::internal)?,
        );
    }
    Ok(join_arrays(written))
}

/// A booted three-node cluster's view is about 5.6 KB of JSON.
const VIEW_BYTES: usize = 6 * 1024;

/// JSON arrays joined into one, in their order: the first one's buffer is the result, each
/// other's elements are copied in once.
fn join_arrays(arrays: Vec<Vec<u8>>) -> Vec<u8> {
    let mut arrays = arrays.into_iter().filter(|a| a.len() > 2);
    let Some(mut page) = arrays.next() else {
        return b"[]".to_vec();
    };
    let rest: Vec<Vec<u8>> = arrays.collect();
    page.reserve(rest.iter().map(Vec::len).sum());
    for array in rest {
        // Each array's brackets go, a comma joins its elements to the ones before.
        page.pop();
        page.push(b',');
        page.extend_from_slice(array.get(1..).unwrap_or_default());
    }
    page
}

fn assemble(state: &AppState, row: ClusterRow, parts: Parts, now: i64) -> ClusterView {
    let nodes = parts.nodes;
    let inventory = crate::certificates::inventory_of(
        row.id,
        row.sa_key_made_at(),
        &nodes,
        parts.certificates,
        now,
    );
    if !inventory.certificates.is_empty() {
        state
            .metrics
            .set_soonest_expiry(row.id, inventory.soonest_expiry());
    }
    let certificates = status::availability(&inventory, row.created_at, now);
    let ca_rotation = parts.rotation.map(|r| CaRotationView {
        ca: db::rotations::ca_name(r.ca).to_owned(),
        phase: r.phase.to_string(),
        started_at: r.started_at,
        updated_at: r.updated_at,
        waiting_for: crate::rotation::waiting_for(&nodes).map(|n| {
            format!(
                "{} (vm {}) to apply generation {} (it applied {}, it is {})",
                n.node_name, n.vm_id, n.desired_generation, n.applied_generation, n.phase
            )
        }),
    });
    let service_account_key = sa_key_view(&row, parts.sa_rotation.as_ref(), &nodes, now);
    let founded = row.phase == ClusterPhase::Founded;
    let control_plane = || nodes.iter().filter(|n| n.role == Role::ControlPlane);
    let ready =
        founded && control_plane().next().is_some() && control_plane().all(|n| n.phase.completed());
    let last_report = parts.last_report;
    let machines = status::machines(&nodes, last_report.unwrap_or(row.created_at));
    let (desired_control_plane_count, membership_error) = parts.membership;
    let [scaling_up, scaling_down] = status::scaling(
        &nodes,
        desired_control_plane_count,
        membership_error.as_deref(),
        last_report.unwrap_or(row.created_at),
    );
    let node_pools = parts
        .pools
        .iter()
        .map(|p| {
            let [replicas, ready_replicas, up_to_date_replicas] =
                status::pool_replicas(nodes.iter().filter(|n| n.pool_id == Some(p.id)));
            PoolSummary {
                id: p.id,
                name: p.name.clone(),
                desired: p.desired_count,
                replicas,
                ready_replicas,
                up_to_date_replicas,
            }
        })
        .collect();
    let api_endpoints = if !founded {
        Vec::new()
    } else if row.dns_configured {
        vec![format!("https://{}:6443", row.control_plane_dns_name)]
    } else {
        nodes
            .iter()
            .map(|n| {
                format!(
                    "https://{}:6443",
                    n.public_ipv4.as_deref().unwrap_or(&n.private_ipv4)
                )
            })
            .collect()
    };
    let replicas = status::replicas(&nodes);
    let deleting = status::deleting(row.phase, row.updated_at);
    let rotating = status::ca_rotation(
        ca_rotation
            .as_ref()
            .map(|r| status::Rotating {
                ca: &r.ca,
                phase: &r.phase,
                updated_at: r.updated_at,
                waiting_for: r.waiting_for.as_deref(),
            })
            .as_ref(),
        row.created_at,
    );
    // A stored version that is not a release cannot come from this API: shown as it is, and
    // judged as the oldest there is.
    let target: Option<Release> = row.kubernetes_version.parse().ok();
    let version = target.map_or_else(
        || row.kubernetes_version.clone(),
        |t| crate::upgrade::state::oldest(t, &nodes).to_string(),
    );
    // The upgrade's snapshot, while it is not stored (each state's latest is at hand).
    let snapshot_hold = row.upgrade_snapshot_id.and_then(|id| {
        let named = parts.snapshots.iter().find(|s| s.id == id)?;
        let wait = crate::upgrade::snapshot::wait_of(Some(named), now)?;
        Some(crate::lifecycle::Hold::UpgradeSnapshot { id, wait })
    });
    let rolling_out = status::rolling_out(
        target.unwrap_or(Release { minor: 0, patch: 0 }),
        &nodes,
        last_report.unwrap_or(row.created_at),
        snapshot_hold,
    );
    let snapshots = status::snapshots(
        status::Snapshots {
            founded,
            every_secs: row.snapshot_every_secs,
            created_at: row.created_at,
            latest: &parts.snapshots,
        },
        now,
        crate::snapshots::UPLOAD_WINDOW_SECS,
    );
    let sa_key = status::SaKey {
        made_at: service_account_key.created_at,
        max_age_days: service_account_key.max_age_days,
        auto_rotate: service_account_key.auto_rotate,
        rotation: service_account_key
            .rotation
            .as_ref()
            .map(|r| status::SaKeyRotating {
                phase: &r.phase,
                updated_at: r.updated_at,
                waiting_for: r.waiting_for.as_deref(),
                drop_old_at: r.drop_old_at,
            }),
    };
    let sa_key_rotating = status::sa_key_rotating(sa_key.rotation.as_ref(), row.created_at);
    let sa_key_fresh = status::sa_key_fresh(&sa_key, &row.name, now);
    let reported = parts.components;
    let health = status::Health::new(&nodes, &reported);
    let [available, etcd_healthy, components_healthy] = health.cluster(founded, row.created_at);
    let policy = crate::health::policy::of(&row);
    let remediation = status::remediation_allowed(
        &policy,
        row.remediation_blocked.as_deref(),
        &parts.pools,
        row.created_at,
    );
    let node_conditions: Vec<Vec<Condition>> = nodes
        .iter()
        .map(|n| {
            let facts = crate::health::Facts {
                node: n,
                components: &reported,
            };
            let own = crate::health::policy::for_node(&row, &parts.pools, n);
            let verdict = crate::health::judge(&own, facts, now);
            let checked = status::health_check(n, &verdict, now);
            health
                .node(n)
                .into_iter()
                .chain(std::iter::once(checked))
                .map(Condition::from)
                .collect()
        })
        .collect();
    ClusterView {
        replicas: replicas.replicas,
        ready_replicas: replicas.ready,
        up_to_date_replicas: replicas.up_to_date,
        version,
        initialized: founded && replicas.initialized,
        id: row.id,
        name: row.name,
        phase: row.phase,
        ready,
        api_endpoints,
        error_reason: row.error_reason,
        error_message: row.error_message,
        control_plane_dns_name: row.control_plane_dns_name,
        dns_configured: row.dns_configured,
        key_algorithm: row.key_algorithm,
        kubernetes_version: row.kubernetes_version,
        service_cidr: row.service_cidr,
        pod_cidr: row.pod_cidr,
        conditions: [
            available,
            etcd_healthy,
            components_healthy,
            status::certificates(&certificates),
            machines,
            rolling_out,
            scaling_up,
            scaling_down,
            rotating,
            sa_key_rotating,
            sa_key_fresh,
            snapshots,
            remediation,
            deleting,
        ]
        .into_iter()
        .map(Condition::from)
        .collect(),
        node_pools,
        control_plane_members: members_view(&nodes, desired_control_plane_count),
        desired_control_plane_count,
        membership_error,
        ca_rotation,
        service_account_key,
        health_policy: policy,
        nodes: nodes
            .into_iter()
            .zip(node_conditions)
            .map(|(n, conditions)| NodeView {
                conditions,
                last_seen_at: n.last_seen_at,
                up_to_date: n.up_to_date(),
                kubernetes_version: n.kubernetes_version,
                vm_id: n.vm_id,
                ordinal: n.ordinal,
                name: n.node_name,
                private_ipv4: n.private_ipv4,
                public_ipv4: n.public_ipv4,
                is_initial: n.is_initial,
                role: n.role,
                phase: n.phase.to_string(),
                serial: n.serial,
                desired_generation: n.desired_generation,
                applied_generation: n.applied_generation,
                etcd_membership: n.etcd_membership,
                replacing: n.replace_since.is_some(),
            })
            .collect(),
        created_at: row.created_at,
    }
}

/// The cluster's service-account key: its age and policy, and its rotation in progress.
pub(super) fn sa_key_view(
    row: &ClusterRow,
    rotation: Option<&db::sa_rotations::SaRotation>,
    nodes: &[db::nodes::NodeRow],
    now: i64,
) -> ServiceAccountKeyView {
    let made_at = row.sa_key_made_at();
    ServiceAccountKeyView {
        created_at: made_at,
        age_days: status::age_days(made_at, now),
        max_age_days: row.sa_key_max_age_days,
        auto_rotate: row.sa_key_auto_rotate,
        rotation: rotation.map(|r| {
            let control_plane: Vec<_> = nodes
                .iter()
                .filter(|n| n.role == Role::ControlPlane)
                .cloned()
                .collect();
            SaKeyRotationView {
                phase: r.phase.to_string(),
                started_at: r.started_at,
                updated_at: r.updated_at,
                drop_old_after_seconds: r.drop_old_after,
                signing_since: r.signing_since,
                drop_old_at: r.drop_old_at(),
                waiting_for: crate::rotation::waiting_for(&control_plane).map(|n| {
                    format!(
                        "{} (vm {}) to apply generation {} (it applied {}, it is {})",
                        n.node_name, n.vm_id, n.desired_generation, n.applied_generation, n.phase
                    )
                }),
            }
        }),
    }
}

/// A control plane's members counted from its nodes; `asked` is the size asked for.
fn members_view(nodes: &[db::nodes::NodeRow], asked: Option<i64>) -> MembersView {
    let count = |m: EtcdMembership| {
        let n = nodes
            .iter()
            .filter(|n| n.role == Role::ControlPlane && n.etcd_membership == Some(m))
            .count();
        i64::try_from(n).unwrap_or(i64::MAX)
    };
    let (voters, joining, leaving) = (
        count(EtcdMembership::Voter),
        count(EtcdMembership::Joining),
        count(EtcdMembership::Leaving),
    );
    MembersView {
        desired: asked.unwrap_or(voters + joining),
        voters,
        joining,
        leaving,
    }
}

#[cfg(test)]
mod tests {
    use super::join_arrays;

    #[test]
    fn arrays_join_into_one_in_their_order_empty_ones_skipped() {
        let join = |arrays: &[&str]| {
            let joined = join_arrays(arrays.iter().map(|a| a.as_bytes().to_vec()).collect());
            String::from_utf8(joined).unwrap()
        };
        assert_eq!(join(&[]), "[]");
        assert_eq!(join(&["[]", "[]"]), "[]");
        assert_eq!(join(&[r#"[{"a":1}]"#]), r#"[{"a":1}]"#);
        assert_eq!(
            join(&["[]", r#"[{"a":1},{"b":[2]}]"#, "[]", "[3]", r#"["]"]"#]),
            r#"[{"a":1},{"b":[2]},3,"]"]"#
        );
    }
}
