//! `issued_certificates`: every certificate the API made, recorded when it made it (subject,
//! issuer, serial, validity), per node and generation — what the inventory shows and the
//! renewal policy judges. A cluster's own certificates (its CAs, the operator kubeconfig) have
//! no node and keep only their latest row per name.
//!
//! What the rows are is stamped ([`Stamp`]): writing a cluster's own rows moves its
//! `certificates_version` ([`insert`] does, in the writer's transaction), and a node's rows are
//! written only in the transaction that takes the node's bundle serial (issuance).

use std::fmt::Write as _;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt as _};

use sqlx::{Any, Executor, Row};

use super::DbError;

/// What a certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CertKind {
    Ca,
    Serving,
    Client,
}

impl CertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ca => "ca",
            Self::Serving => "serving",
            Self::Client => "client",
        }
    }
}

impl std::str::FromStr for CertKind {
    type Err = exk8s_common::contract::UnknownName;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "ca" => Ok(Self::Ca),
            "serving" => Ok(Self::Serving),
            "client" => Ok(Self::Client),
            other => Err(exk8s_common::contract::UnknownName::new(
                other,
                &["ca", "serving", "client"],
            )),
        }
    }
}

/// One recorded certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertRow {
    pub node_id: Option<i64>,
    pub generation: i64,
    /// Shared: a page of views reads the same few names for thousands of rows.
    pub name: Arc<str>,
    pub not_before: i64,
    pub not_after: i64,
    /// What the inventory shows beside the dates; `None` when the row was read only to judge
    /// what runs and when it expires (a page of views, a renewal pass). Boxed, so that those
    /// rows, judged by the thousand, move as small values.
    pub details: Option<Box<CertDetails>>,
}

/// A recorded certificate's kind and names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertDetails {
    pub kind: CertKind,
    pub subject: String,
    pub issuer: String,
    pub serial: String,
}

/// A certificate to record.
#[derive(Debug, Clone)]
pub struct NewCert<'a> {
    pub cluster_id: i64,
    pub node_id: Option<i64>,
    pub generation: i64,
    pub name: &'a str,
    pub kind: CertKind,
    pub facts: &'a crate::pki::CertFacts,
}

/// Records `certs` in one statement; a cluster-level certificate replaces the previous one of
/// its name and moves its cluster's `certificates_version`. Node rows are recorded only in
/// the transaction that took the node's serial (see [`Stamp`]).
pub async fn insert(
    tx: &mut sqlx::AnyConnection,
    certs: &[NewCert<'_>],
    now: i64,
) -> Result<(), DbError> {
    for cert in certs.iter().filter(|c| c.node_id.is_none()) {
        super::history::cluster_life_ended(tx, cert.cluster_id, cert.name, now).await?;
        sqlx::query(
            "DELETE FROM issued_certificates \
             WHERE cluster_id = $1 AND node_id IS NULL AND name = $2",
        )
        .bind(cert.cluster_id)
        .bind(cert.name)
        .execute(&mut *tx)
        .await?;
    }
    if certs.is_empty() {
        return Ok(());
    }
    let mut own: Vec<i64> = certs
        .iter()
        .filter(|c| c.node_id.is_none())
        .map(|c| c.cluster_id)
        .collect();
    own.sort_unstable();
    own.dedup();
    for cluster_id in own {
        sqlx::query(
            "UPDATE clusters SET certificates_version = certificates_version + 1 WHERE id = $1",
        )
        .bind(cluster_id)
        .execute(&mut *tx)
        .await?;
    }
    const COLUMNS: usize = 11;
    // SQLite binds a `$N` parameter by looking its name up in a list, once per parameter: work
    // quadratic in the parameters, of which a bundle's 14 rows have 154. Anonymous `?`
    // parameters are bound by position (PostgreSQL knows only `$N`).
    let positional = tx.backend_name() == "SQLite";
    let mut sql = String::from(
        "INSERT INTO issued_certificates (cluster_id, node_id, generation, name, kind, subject, \
         issuer, serial, not_before, not_after, created_at) VALUES ",
    );
    for row in 0..certs.len() {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..COLUMNS {
            if column > 0 {
                sql.push_str(", ");
            }
            if positional {
                sql.push('?');
            } else {
                let _ = write!(sql, "${}", row * COLUMNS + column + 1);
            }
        }
        sql.push(')');
    }
    let mut query = sqlx::query(&sql);
    for cert in certs {
        query = query
            .bind(cert.cluster_id)
            .bind(cert.node_id)
            .bind(cert.generation)
            .bind(cert.name)
            .bind(cert.kind.as_str())
            .bind(&cert.facts.subject)
            .bind(&cert.facts.issuer)
            .bind(&cert.facts.serial)
            .bind(cert.facts.not_before)
            .bind(cert.facts.not_after)
            .bind(now);
    }
    query.execute(&mut *tx).await?;
    Ok(())
}

/// Forgets what a node's new bundle of `generation` supersedes: its rows of generations
/// before `keep_from` (no longer on the node: their lives were kept in the history when the
/// node applied a newer one) and those of earlier bundles of `generation` itself (the
/// inventory reads only the latest row per name of a generation, so they were dead weight: a
/// node that fetched 10,000 times kept 10,000 bundles' rows).
pub async fn supersede<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
    node_id: i64,
    keep_from: i64,
    generation: i64,
) -> Result<(), DbError> {
    // `cluster_id` too, so the lookup is a range of the (cluster, node, generation) index.
    sqlx::query(
        "DELETE FROM issued_certificates \
         WHERE cluster_id = $1 AND node_id = $2 AND (generation < $3 OR generation = $4)",
    )
    .bind(cluster_id)
    .bind(node_id)
    .bind(keep_from)
    .bind(generation)
    .execute(db)
    .await?;
    Ok(())
}

/// Which state of a cluster's recorded certificates a read saw: the cluster's
/// `certificates_version` and each of its nodes' bundle serial, by node id. Every write to the
/// rows moves one of them (see the module's doc), none ever goes back, and node ids are never
/// reused, so two reads with the same stamp saw the same rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    version: i64,
    nodes: Box<[(i64, i64)]>,
}

impl Stamp {
    /// From the cluster's version and its nodes' `(id, serial)`, in any order.
    pub fn new(version: i64, nodes: impl IntoIterator<Item = (i64, i64)>) -> Self {
        let mut nodes: Box<[(i64, i64)]> = nodes.into_iter().collect();
        nodes.sort_unstable();
        Self { version, nodes }
    }

    /// From the cluster's version and its nodes' rows.
    pub fn of(version: i64, nodes: &[super::nodes::NodeRow]) -> Self {
        Self::new(version, nodes.iter().map(|n| (n.id, n.serial)))
    }

    /// The stamp of a [`STAMP_NODES`] value (`None`: the cluster has no node).
    pub(super) fn parse(version: i64, nodes: Option<&str>) -> Result<Self, DbError> {
        let node = |pair: &str| {
            let (id, serial) = pair.split_once(' ')?;
            Some((id.parse().ok()?, serial.parse().ok()?))
        };
        let nodes = nodes
            .unwrap_or_default()
            .split(',')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                node(pair).ok_or_else(|| {
                    DbError::Query(sqlx::Error::Decode(
                        format!("a node's stamp does not parse: {pair:?}").into(),
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(version, nodes))
    }
}

/// The `(id, serial)` of every node of the cluster `c`, as one text value for [`Stamp::parse`].
pub(super) const STAMP_NODES: &str = "(SELECT string_agg(concat_ws(' ', n.id, n.serial), ',') \
     FROM cluster_nodes n WHERE n.cluster_id = c.id)";

/// Every recorded certificate of a cluster.
pub async fn list<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<CertRow>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {CERT_COLUMNS} FROM issued_certificates WHERE cluster_id = $1 ORDER BY id"
    ))
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    rows.iter().map(cert_row).collect()
}

/// The columns of [`CertRow`] with its details, as the listing queries select them.
const CERT_COLUMNS: &str =
    "node_id, generation, name, not_before, not_after, kind, subject, issuer, serial";

/// Each row of a group of certificates, without its details, as one text value: what judging
/// many clusters' certificates reads. A page of 500 booted clusters holds 23,000 rows, and
/// sqlx's `Any` driver converts every row and every column's description as it decodes it
/// (most of a page's time in the API); packed, the page is one row per cluster. The records
/// are `id node generation not_before not_after name` (node `-` for the cluster's own
/// certificates: SQLite's `concat_ws` drops an empty argument) joined by `;`, in no
/// particular order: an ordered aggregate sorts each group in the database (a quarter of the
/// read), where [`unpack`] sorts by id for less. `concat_ws` and `string_agg` are the same on
/// PostgreSQL and on SQLite (3.44 and later).
pub(super) const PACKED: &str = "string_agg(concat_ws(' ', \
     id, COALESCE(CAST(node_id AS TEXT), '-'), generation, not_before, not_after, name), ';')";

/// The certificates of one [`PACKED`] value, in recording (id) order, without their details.
/// Each distinct name is allocated once (a booted node's 14 names recur on every node). A
/// record that does not parse (a name holding `;` would split its record) is a decoding
/// error, never a row dropped.
pub(super) fn unpack(packed: &str) -> Result<Vec<CertRow>, DbError> {
    // Parsed and sorted as compact records first: a `CertRow` is several times larger.
    let mut records = Vec::with_capacity(packed.len() / 40 + 1);
    for record in packed.split(';') {
        let bad = || {
            DbError::Query(sqlx::Error::Decode(
                format!("a packed certificate record does not parse: {record:?}").into(),
            ))
        };
        let mut fields = record.splitn(6, ' ');
        let mut field = || fields.next().ok_or_else(bad);
        let number = |text: &str| text.parse::<i64>().map_err(|_| bad());
        let id = number(field()?)?;
        let node_id = match field()? {
            "-" => None,
            node => Some(number(node)?),
        };
        let dates = [number(field()?)?, number(field()?)?, number(field()?)?];
        let name = field()?;
        if name.is_empty() {
            return Err(bad());
        }
        records.push((id, node_id, dates, name));
    }
    records.sort_unstable_by_key(|&(id, ..)| id);
    let mut names: HashMap<&str, Arc<str>> = HashMap::new();
    Ok(records
        .into_iter()
        .map(
            |(_, node_id, [generation, not_before, not_after], name)| CertRow {
                node_id,
                generation,
                name: Arc::clone(names.entry(name).or_insert_with(|| Arc::from(name))),
                not_before,
                not_after,
                details: None,
            },
        )
        .collect())
}

/// A row read with [`CERT_COLUMNS`].
fn cert_row(r: &sqlx::any::AnyRow) -> Result<CertRow, DbError> {
    Ok(CertRow {
        node_id: r.try_get("node_id")?,
        generation: r.try_get("generation")?,
        name: r.try_get::<&str, _>("name")?.into(),
        not_before: r.try_get("not_before")?,
        not_after: r.try_get("not_after")?,
        details: Some(Box::new(CertDetails {
            kind: super::phase::decode(r, "kind")?,
            subject: r.try_get("subject")?,
            issuer: r.try_get("issuer")?,
            serial: r.try_get("serial")?,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(node_id: Option<i64>, generation: i64, name: &str, dates: (i64, i64)) -> CertRow {
        CertRow {
            node_id,
            generation,
            name: name.into(),
            not_before: dates.0,
            not_after: dates.1,
            details: None,
        }
    }

    #[test]
    fn packed_records_unpack_in_id_order() {
        let rows =
            unpack("12 7 3 -5 100 a name;3 7 2 -5 100 etcd/peer.crt;5 - 0 1 2 cluster-ca").unwrap();
        assert_eq!(
            rows,
            [
                row(Some(7), 2, "etcd/peer.crt", (-5, 100)),
                row(None, 0, "cluster-ca", (1, 2)),
                row(Some(7), 3, "a name", (-5, 100)),
            ]
        );
    }

    #[test]
    fn a_record_that_does_not_parse_is_an_error_not_a_dropped_row() {
        for packed in [
            "",
            "1 7 2 -5 100",
            "1 7 2 -5 100 ",
            "1 x 2 -5 100 apiserver",
            "1  2 -5 100 apiserver",
            "1 7 2 -5 soon apiserver",
            "one 7 2 -5 100 apiserver",
            "1 7 2 -5 100 apiserver;",
            "1 7 2 -5 100 api;server",
        ] {
            let err = unpack(packed).expect_err(packed);
            assert!(
                matches!(err, DbError::Query(sqlx::Error::Decode(_))),
                "{packed:?}: {err:?}"
            );
        }
    }
}
