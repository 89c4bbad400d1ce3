//! A page of clusters' related rows, one query per table for the whole page: what
//! `GET /clusters` needs to build 500 views without 500 × 10 round trips. Each function takes
//! the page as [`Clusters`]: a few ids bound as a list, a page as the span of ids it covers.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::{Any, Executor, Row as _};

use super::DbError;
use super::certificates::{CertRow, PACKED, STAMP_NODES, Stamp, unpack};
use super::components::{ComponentRow, component_row};
use super::nodes::NodeRow;
use super::pools::PoolRow;
use super::rotations::{ROTATION_COLUMNS, Rotation, rotation_row};

/// `rows` grouped by `key`, each group in the rows' order.
pub fn group<T>(rows: Vec<T>, key: impl Fn(&T) -> i64) -> HashMap<i64, Vec<T>> {
    let mut groups: HashMap<i64, Vec<T>> = HashMap::new();
    for row in rows {
        groups.entry(key(&row)).or_default().push(row);
    }
    groups
}

/// The clusters a page's reads are for. A page is bound as its span of ids, not as a list of
/// them: a handful of values plan in microseconds where 500 took a millisecond per query, and
/// a span reads an index range. A span may hold clusters the page does not (another org's, or
/// one committed into it since the page was listed): their rows come back and are never asked
/// for.
#[derive(Debug, Clone)]
pub enum Clusters {
    /// Exactly these (a page of one).
    Ids(Arc<[i64]>),
    /// The clusters with an id from `first` to `last`, of one org (a `GET /clusters` page) or
    /// of every org (`None`: a fleet-wide pass's page).
    Span {
        org_id: Option<i64>,
        first: i64,
        last: i64,
    },
}

impl Clusters {
    /// A `WHERE` predicate on `column` (a cluster id) that keeps these clusters' rows, and the
    /// values it binds from `$1`. An org's span names its bounds twice: once on the column
    /// itself, so the planner reads an index range of the table, and once in the sub-select.
    fn predicate(&self, column: &str) -> (String, Vec<i64>) {
        match *self {
            Self::Ids(ref ids) => {
                let marks = (1..=ids.len())
                    .map(|i| format!("${i}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                (format!("{column} IN ({marks})"), ids.to_vec())
            }
            Self::Span {
                org_id: None,
                first,
                last,
            } => (format!("{column} BETWEEN $1 AND $2"), vec![first, last]),
            Self::Span {
                org_id: Some(org_id),
                first,
                last,
            } => (
                format!(
                    "{column} BETWEEN $1 AND $2 AND {column} IN \
                     (SELECT id FROM clusters WHERE org_id = $3 AND id BETWEEN $4 AND $5)"
                ),
                vec![first, last, org_id, first, last],
            ),
        }
    }

    /// These clusters in two parts, split by id, each cluster wholly in one: a large read made
    /// as two, whose rows are decoded on two threads.
    pub fn halves(&self) -> [Self; 2] {
        match *self {
            Self::Ids(ref ids) => {
                let (early, late) = ids.split_at(ids.len() / 2);
                [Self::Ids(early.into()), Self::Ids(late.into())]
            }
            Self::Span {
                org_id,
                first,
                last,
            } => {
                let middle = first + (last - first) / 2;
                [
                    Self::Span {
                        org_id,
                        first,
                        last: middle,
                    },
                    Self::Span {
                        org_id,
                        first: middle + 1,
                        last,
                    },
                ]
            }
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Self::Ids(ids) => ids.is_empty(),
            Self::Span { first, last, .. } => first > last,
        }
    }
}

/// Runs `sql`, whose `{clusters}` stands for a predicate on the cluster-id `column`, for
/// `clusters`.
async fn fetch<'c>(
    db: impl Executor<'c, Database = Any>,
    sql: &str,
    column: &str,
    clusters: &Clusters,
) -> Result<Vec<sqlx::any::AnyRow>, DbError> {
    if clusters.is_empty() {
        return Ok(Vec::new());
    }
    let (predicate, values) = clusters.predicate(column);
    let sql = sql.replace("{clusters}", &predicate);
    let mut query = sqlx::query(&sql);
    for value in values {
        query = query.bind(value);
    }
    Ok(query.fetch_all(db).await?)
}

/// The clusters' nodes, by cluster and ordinal.
pub async fn nodes<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<NodeRow>, DbError> {
    let sql = format!(
        "SELECT {} FROM cluster_nodes WHERE {{clusters}} ORDER BY cluster_id, ordinal",
        super::nodes::COLUMNS
    );
    let rows = fetch(db, &sql, "cluster_id", clusters).await?;
    Ok(rows
        .iter()
        .map(super::nodes::from_row)
        .collect::<Result<_, _>>()?)
}

/// A cluster's recorded certificates and the [`Stamp`] of what was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamped {
    pub stamp: Stamp,
    /// In recording order, without their details.
    pub rows: Vec<CertRow>,
}

/// The clusters' recorded certificates, by cluster (every cluster read, those with none too),
/// each cluster's in recording order, without their details, with the stamp they were read
/// with: one statement reads both, so they are of one moment. The rows are read packed, one
/// value per cluster (see [`super::certificates::PACKED`]).
pub async fn certificates<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<HashMap<i64, Stamped>, DbError> {
    let sql = format!(
        "SELECT c.id AS cluster_id, c.certificates_version AS version, {STAMP_NODES} AS nodes, \
         (SELECT {PACKED} FROM issued_certificates WHERE cluster_id = c.id) AS packed \
         FROM clusters c WHERE {{clusters}}"
    );
    let rows = fetch(db, &sql, "c.id", clusters).await?;
    rows.iter()
        .map(|r| {
            let nodes: Option<String> = r.try_get("nodes")?;
            let packed: Option<String> = r.try_get("packed")?;
            let stamped = Stamped {
                stamp: Stamp::parse(r.try_get("version")?, nodes.as_deref())?,
                rows: packed
                    .as_deref()
                    .map(unpack)
                    .transpose()?
                    .unwrap_or_default(),
            };
            Ok((r.try_get("cluster_id")?, stamped))
        })
        .collect()
}

/// The clusters' CA rotations in progress.
pub async fn rotations<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<Rotation>, DbError> {
    let sql = format!("SELECT {ROTATION_COLUMNS} FROM ca_rotations WHERE {{clusters}}");
    let rows = fetch(db, &sql, "cluster_id", clusters).await?;
    rows.iter().map(rotation_row).collect()
}

/// The clusters' service-account key rotations in progress.
pub async fn sa_rotations<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<super::sa_rotations::SaRotation>, DbError> {
    let sql = format!(
        "SELECT {} FROM sa_key_rotations WHERE {{clusters}}",
        super::sa_rotations::COLUMNS
    );
    let rows = fetch(db, &sql, "cluster_id", clusters).await?;
    rows.iter().map(super::sa_rotations::from_row).collect()
}

/// When each cluster's nodes last reported (clusters none of whose nodes reported are absent).
pub async fn last_reports<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<HashMap<i64, i64>, DbError> {
    let sql = "SELECT n.cluster_id, MAX(r.created_at) AS at FROM node_reports r \
         JOIN cluster_nodes n ON n.id = r.node_id WHERE {clusters} \
         GROUP BY n.cluster_id";
    let rows = fetch(db, sql, "n.cluster_id", clusters).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("cluster_id")?, r.try_get("at")?)))
        .collect()
}

/// Each cluster's asked-for control-plane size and its membership error.
pub async fn memberships<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<HashMap<i64, (Option<i64>, Option<String>)>, DbError> {
    let sql = "SELECT id, desired_control_plane_count AS n, membership_error AS e \
         FROM clusters WHERE {clusters}";
    let rows = fetch(db, sql, "id", clusters).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("id")?, (r.try_get("n")?, r.try_get("e")?))))
        .collect()
}

/// The clusters' node pools, by cluster and id.
pub async fn pools<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<PoolRow>, DbError> {
    let sql = format!(
        "SELECT {} FROM node_pools WHERE {{clusters}} ORDER BY cluster_id, id",
        super::pools::COLUMNS
    );
    let rows = fetch(db, &sql, "cluster_id", clusters).await?;
    Ok(rows
        .iter()
        .map(super::pools::from_row)
        .collect::<Result<_, _>>()?)
}

/// The clusters' nodes' component health, each with its cluster.
pub async fn components<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<(i64, ComponentRow)>, DbError> {
    let sql = "SELECT n.cluster_id, c.node_id, c.component, c.healthy, c.message, c.changed_at \
         FROM node_components c JOIN cluster_nodes n ON n.id = c.node_id \
         WHERE {clusters} ORDER BY c.node_id, c.component";
    let rows = fetch(db, sql, "n.cluster_id", clusters).await?;
    rows.iter()
        .map(|r| Ok((r.try_get("cluster_id")?, component_row(r)?)))
        .collect()
}

/// Each cluster's latest snapshot in each state: the one being taken, the last stored and the
/// last failed.
pub async fn snapshots<'c>(
    db: impl Executor<'c, Database = Any>,
    clusters: &Clusters,
) -> Result<Vec<super::snapshots::SnapshotRow>, DbError> {
    let rows = fetch(db, super::snapshots::LATEST_SQL, "cluster_id", clusters).await?;
    rows.iter().map(super::snapshots::snapshot_row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids a part covers, with the org it is limited to.
    fn covered(part: &Clusters) -> (Option<i64>, Vec<i64>) {
        match part {
            Clusters::Ids(ids) => (None, ids.to_vec()),
            Clusters::Span {
                org_id,
                first,
                last,
            } => (*org_id, (*first..=*last).collect()),
        }
    }

    #[test]
    fn halves_hold_every_cluster_of_the_page_once() {
        let ids: Arc<[i64]> = vec![3, 9, 10, 42, 43].into();
        let pages = [
            Clusters::Ids(ids),
            Clusters::Ids(Vec::new().into()),
            Clusters::Span {
                org_id: None,
                first: 5,
                last: 5,
            },
            Clusters::Span {
                org_id: None,
                first: 5,
                last: 6,
            },
            Clusters::Span {
                org_id: Some(7),
                first: 101,
                last: 600,
            },
        ];
        for page in pages {
            let (org, whole) = covered(&page);
            let [early, late] = page.halves();
            let (early_org, mut both) = covered(&early);
            let (late_org, late_ids) = covered(&late);
            assert_eq!((early_org, late_org), (org, org), "{page:?}");
            assert!(
                both.last().zip(late_ids.first()).is_none_or(|(a, b)| a < b),
                "{page:?}: the halves overlap or are out of order"
            );
            both.extend(late_ids);
            assert_eq!(both, whole, "{page:?}");
            let sizes = [covered(&early).1.len(), covered(&late).1.len()];
            assert!(sizes[0].abs_diff(sizes[1]) <= 1, "{page:?}: {sizes:?}");
        }
    }
}
