//! Deleted clusters kept for recovery ([`crate::kept`]): `GET /deleted-clusters`,
//! `GET /deleted-clusters/{id}`, and the purge, `DELETE /deleted-clusters/{id}?confirm=NAME`.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use exk8s_api_types::DeletedClusterView;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use crate::app::AppState;
use crate::db::kept::KeptRow;
use crate::kept::{self, PurgeError};

impl From<PurgeError> for ApiError {
    fn from(e: PurgeError) -> Self {
        match e {
            PurgeError::NotFound => Self::NotFound,
            e @ PurgeError::Unconfirmed { .. } => Self::Unprocessable {
                field: Some("confirm".to_owned()),
                message: e.to_string(),
            },
            e @ PurgeError::InUse { .. } => Self::Conflict(e.to_string()),
            PurgeError::Store(e) => Self::BadGateway(crate::error_chain(&e)),
            PurgeError::Db(db) => db.into(),
        }
    }
}

fn view(row: KeptRow) -> DeletedClusterView {
    let mut kept = vec!["trust".to_owned()];
    if row.snapshots > 0 {
        kept.push("snapshots".to_owned());
    }
    DeletedClusterView {
        cluster_id: row.id,
        name: row.name,
        kubernetes_version: row.kubernetes_version,
        deleted_at: row.deleted_at,
        kept_until: row.kept_until,
        kept,
        snapshots: row.snapshots,
        snapshot_bytes: row.snapshot_bytes,
    }
}

/// The org's deleted clusters still kept, the soonest purged first.
#[utoipa::path(get, path = "/deleted-clusters", responses((status = 200, body = Vec<DeletedClusterView>), (status = 401, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn list_deleted_clusters(
    State(state): State<AppState>,
    operator: Operator,
) -> Result<axum::Json<Vec<DeletedClusterView>>, ApiError> {
    let rows = kept::list(&state.snapshots(), operator.org_id).await?;
    Ok(axum::Json(rows.into_iter().map(view).collect()))
}

/// One deleted cluster still kept; a cluster not deleted (or purged) is 404.
#[utoipa::path(get, path = "/deleted-clusters/{id}", params(("id" = i64, Path)), responses((status = 200, body = DeletedClusterView), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn get_deleted_cluster(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<axum::Json<DeletedClusterView>, ApiError> {
    Ok(axum::Json(view(
        kept::get(&state.snapshots(), operator.org_id, id).await?,
    )))
}

/// Purges a deleted cluster now: its snapshots' objects, then all that was kept. It cannot be
/// undone, so `confirm` must name it; refused while a cluster is being restored from it.
#[utoipa::path(delete, path = "/deleted-clusters/{id}", params(("id" = i64, Path), ("confirm" = String, Query, description = "the deleted cluster's name")), responses((status = 204, description = "purged"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody), (status = 502, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn purge_deleted_cluster(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let params = super::paging::params(query.as_deref())?;
    if let Some(unknown) = params.keys().find(|k| k.as_str() != "confirm") {
        return Err(ApiError::invalid(
            unknown,
            format!("unknown query parameter `{unknown}` (expected confirm)"),
        ));
    }
    kept::purge(
        &state.snapshots(),
        operator.org_id,
        id,
        params.get("confirm").map(String::as_str),
    )
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
