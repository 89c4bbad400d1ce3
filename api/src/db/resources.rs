//! `cluster_resources`: the journal of every external thing founding creates. A row is written
//! and committed BEFORE the external call (state `creating`, with the client token sent along),
//! and updated after it (`created` + the external id), so a crash never loses track of what may
//! exist: the reconciler finds `creating` rows' resources by their client token.

use sqlx::{Any, Executor, Row};

use super::phase::{ClusterPhase, decode};
use super::{Backend, Db, DbError, SQLITE_SYNC_FULL, SQLITE_SYNC_NORMAL};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Vm,
    SecurityGroup,
    DnsRecord,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Vm => "vm",
            Self::SecurityGroup => "security_group",
            Self::DnsRecord => "dns_record",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "vm" => Some(Self::Vm),
            "security_group" => Some(Self::SecurityGroup),
            "dns_record" => Some(Self::DnsRecord),
            _ => None,
        }
    }
}

/// One journaled resource.
#[derive(Debug, Clone)]
pub struct Resource {
    pub id: i64,
    pub cluster_id: i64,
    pub kind: Kind,
    pub client_token: String,
    pub external_id: Option<String>,
    pub ordinal: Option<i64>,
    /// The pool a worker VM was made for.
    pub pool_id: Option<i64>,
    /// `creating`, `created` or `deleted`.
    pub state: String,
}

/// What is about to be created.
#[derive(Debug, Clone, Copy)]
pub struct Intent<'a> {
    pub cluster_id: i64,
    pub kind: Kind,
    pub client_token: &'a str,
    pub ordinal: Option<i64>,
    pub pool_id: Option<i64>,
}

/// Journals `intent` before the outside world is asked for it. On SQLite the row is committed
/// with `synchronous = FULL` (the store's default is NORMAL): its fsync of the WAL puts it, and
/// every commit before it, on disk, so a power cut after the compute or DNS call cannot lose
/// the record of what was asked for.
pub async fn journal_intent(db: &Db, intent: &Intent<'_>, now: i64) -> Result<i64, DbError> {
    let mut conn = db.pool.acquire().await?;
    let sqlite = db.backend == Backend::Sqlite;
    if sqlite {
        sqlx::query(SQLITE_SYNC_FULL).execute(&mut *conn).await?;
    }
    let journaled = insert_intent(&mut conn, intent, now).await;
    if sqlite
        && sqlx::query(SQLITE_SYNC_NORMAL)
            .execute(&mut *conn)
            .await
            .is_err()
    {
        // Still FULL (only slower), but its state is unknown: never pooled again.
        drop(conn.detach());
    }
    journaled
}

async fn insert_intent(
    conn: &mut sqlx::AnyConnection,
    intent: &Intent<'_>,
    now: i64,
) -> Result<i64, DbError> {
    let row = sqlx::query(
        "INSERT INTO cluster_resources (cluster_id, kind, client_token, ordinal, pool_id, state, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, 'creating', $6, $6) RETURNING id",
    )
    .bind(intent.cluster_id)
    .bind(intent.kind.as_str())
    .bind(intent.client_token)
    .bind(intent.ordinal)
    .bind(intent.pool_id)
    .bind(now)
    .fetch_one(conn)
    .await?;
    Ok(row.try_get("id")?)
}

pub async fn set_state<'c>(
    db: impl Executor<'c, Database = Any>,
    id: i64,
    state: &str,
    external_id: Option<&str>,
    now: i64,
) -> Result<(), DbError> {
    sqlx::query(
        "UPDATE cluster_resources SET state = $1, external_id = COALESCE($2, external_id), updated_at = $3 WHERE id = $4",
    )
    .bind(state)
    .bind(external_id)
    .bind(now)
    .bind(id)
    .execute(db)
    .await?;
    Ok(())
}

const COLUMNS: &str = "id, cluster_id, kind, client_token, external_id, ordinal, pool_id, state";

fn from_row(row: &sqlx::any::AnyRow) -> Result<Resource, sqlx::Error> {
    let kind: String = row.try_get("kind")?;
    Ok(Resource {
        id: row.try_get("id")?,
        cluster_id: row.try_get("cluster_id")?,
        kind: Kind::parse(&kind)
            .ok_or_else(|| sqlx::Error::Decode(format!("kind {kind}").into()))?,
        client_token: row.try_get("client_token")?,
        external_id: row.try_get("external_id")?,
        ordinal: row.try_get("ordinal")?,
        pool_id: row.try_get("pool_id")?,
        state: row.try_get("state")?,
    })
}

pub async fn list_for_cluster<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<Vec<Resource>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_resources WHERE cluster_id = $1 ORDER BY id"
    ))
    .bind(cluster_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

pub async fn find_by_token<'c>(
    db: impl Executor<'c, Database = Any>,
    client_token: &str,
) -> Result<Option<Resource>, DbError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_resources WHERE client_token = $1"
    ))
    .bind(client_token)
    .fetch_optional(db)
    .await?;
    Ok(row.as_ref().map(from_row).transpose()?)
}

/// The pool's VMs that may exist (journaled `creating` or `created`), oldest first.
pub async fn live_for_pool<'c>(
    db: impl Executor<'c, Database = Any>,
    pool_id: i64,
) -> Result<Vec<Resource>, DbError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM cluster_resources \
         WHERE pool_id = $1 AND kind = 'vm' AND state <> 'deleted' ORDER BY id"
    ))
    .bind(pool_id)
    .fetch_all(db)
    .await?;
    Ok(rows.iter().map(from_row).collect::<Result<_, _>>()?)
}

/// A VM the journal holds as made for a cluster (`creating` or `created`, not deleted): the
/// org and phase of that cluster. A VM asks for its bundle as soon as it boots, and its node
/// row follows once its address is known (founding, a pool, a joining member): between the
/// two, this is what says whose it is. `None` when no live journal row names it.
pub async fn cluster_making_vm<'c>(
    db: impl Executor<'c, Database = Any>,
    vm_id: i64,
) -> Result<Option<(i64, ClusterPhase)>, DbError> {
    let row = sqlx::query(
        "SELECT c.org_id, c.phase FROM cluster_resources r JOIN clusters c ON c.id = r.cluster_id \
         WHERE r.kind = 'vm' AND r.state <> 'deleted' AND r.external_id = $1",
    )
    .bind(vm_id.to_string())
    .fetch_optional(db)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    Ok(Some((row.try_get("org_id")?, decode(&row, "phase")?)))
}

pub async fn delete_for_cluster<'c>(
    db: impl Executor<'c, Database = Any>,
    cluster_id: i64,
) -> Result<(), DbError> {
    sqlx::query("DELETE FROM cluster_resources WHERE cluster_id = $1")
        .bind(cluster_id)
        .execute(db)
        .await?;
    Ok(())
}
