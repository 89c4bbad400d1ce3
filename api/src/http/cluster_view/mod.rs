//! Clusters as operators see them ([`ClusterView`]), built a page at a time: every related
//! table is read once for the whole page ([`db::pages`]), so a page of 500 clusters costs a
//! handful of queries, not 500 × 10. One cluster's view is a page of one.

mod assemble;

use std::collections::HashMap;

use super::error::ApiError;
use crate::app::AppState;
use crate::db::{
    self,
    clusters::ClusterRow,
    pages::{Clusters, group},
};
use exk8s_api_types::ClusterView;

use assemble::assemble;
pub(super) use assemble::sa_key_view;

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

/// The view of a cluster as it was accepted (`row`, read when it was recorded): nothing but
/// its row exists yet, so nothing else is read.
pub(crate) fn as_accepted(state: &AppState, row: ClusterRow) -> ClusterView {
    assemble(state, row, Parts::default(), state.clock.unix())
}

/// The views of `rows`, in their order.
pub(crate) async fn views(
    state: &AppState,
    rows: Vec<ClusterRow>,
) -> Result<Vec<ClusterView>, ApiError> {
    let now = state.clock.unix();
    Ok(gather(state, rows)
        .await?
        .into_iter()
        .map(|(row, parts)| assemble(state, row, parts, now))
        .collect())
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
