//! etcd snapshots: `POST|GET /clusters/{id}/snapshots`, `GET|DELETE …/snapshots/{sid}`,
//! `GET …/snapshots/{sid}/content` (the snapshot as etcd wrote it, opened), and the member's
//! upload `PUT /nodes/{vm_id}/snapshots/{sid}` ([`crate::snapshots`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use exk8s_api_types::{SnapshotSchedule, SnapshotView};
use exk8s_common::contract::{ETCD_REVISION_HEADER, ETCD_VERSION_HEADER, SNAPSHOT_FAILURE_HEADER};

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use super::signed_node::SignedUpload;
use crate::app::AppState;
use crate::db::snapshots::{SnapshotRow, Trigger};
use crate::snapshots::{self, SnapshotError, Upload, UploadError};

impl From<SnapshotError> for ApiError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::NotFound => Self::NotFound,
            SnapshotError::BadSchedule(message) => Self::Unprocessable {
                field: None,
                message,
            },
            e @ (SnapshotError::NotFounded { .. }
            | SnapshotError::InProgress { .. }
            | SnapshotError::NoVoter(_)
            | SnapshotError::Restoring(_)
            | SnapshotError::NotStored { .. }) => Self::Conflict(e.to_string()),
            SnapshotError::Store(e) => Self::BadGateway(crate::error_chain(&e)),
            SnapshotError::Db(db) => db.into(),
            e @ (SnapshotError::Cipher(_) | SnapshotError::Seal(_)) => Self::internal(e),
        }
    }
}

impl From<UploadError> for ApiError {
    fn from(e: UploadError) -> Self {
        match e {
            UploadError::NotAsked(_) => Self::NotFound,
            e @ UploadError::Refused(_) => Self::Unprocessable {
                field: None,
                message: e.to_string(),
            },
            e @ UploadError::BrokenOff(_) => Self::Invalid {
                field: None,
                message: e.to_string(),
            },
            UploadError::Snapshot(e) => e.into(),
        }
    }
}

fn view(row: SnapshotRow) -> SnapshotView {
    SnapshotView {
        id: row.id,
        cluster_id: row.cluster_id,
        state: row.state.as_str().to_owned(),
        trigger: row.trigger.as_str().to_owned(),
        member: row.member_name,
        requested_at: row.requested_at,
        not_after: row.not_after,
        taken_at: row.taken_at,
        revision: row.revision,
        etcd_version: row.etcd_version,
        size_bytes: row.size_bytes,
        sha256: row.sha256,
        ca_sha256: row.ca_sha256,
        error: row.error,
    }
}

/// Asks a healthy voter for a snapshot now; its agent takes it at its next sync.
#[utoipa::path(
    post, path = "/clusters/{id}/snapshots", params(("id" = i64, Path)),
    responses((status = 202, body = SnapshotView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody, description = "not founded, one being taken, or no healthy voter")),
    security(("operator_token" = [])),
)]
pub async fn create_snapshot(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
) -> Result<Response, ApiError> {
    let row = snapshots::request(
        &state.snapshots(),
        operator.org_id,
        cluster_id,
        Trigger::Operator,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, axum::Json(view(row))).into_response())
}

/// The cluster's snapshots, newest first.
#[utoipa::path(
    get, path = "/clusters/{id}/snapshots", params(("id" = i64, Path)),
    responses((status = 200, body = Vec<SnapshotView>), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn list_snapshots(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
) -> Result<axum::Json<Vec<SnapshotView>>, ApiError> {
    let rows = snapshots::list(&state.snapshots(), operator.org_id, cluster_id).await?;
    Ok(axum::Json(rows.into_iter().map(view).collect()))
}

/// One snapshot.
#[utoipa::path(
    get, path = "/clusters/{id}/snapshots/{sid}", params(("id" = i64, Path), ("sid" = i64, Path)),
    responses((status = 200, body = SnapshotView), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn get_snapshot(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> Result<axum::Json<SnapshotView>, ApiError> {
    let row = snapshots::get(&state.snapshots(), operator.org_id, cluster_id, id).await?;
    Ok(axum::Json(view(row)))
}

fn schedule_view(s: snapshots::schedule::Schedule) -> SnapshotSchedule {
    SnapshotSchedule {
        every_hours: s.every_secs / 3600,
        retain: s.retain,
    }
}

/// The cluster's snapshot schedule.
#[utoipa::path(
    get, path = "/clusters/{id}/snapshots/schedule", params(("id" = i64, Path)),
    responses((status = 200, body = SnapshotSchedule), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn get_schedule(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
) -> Result<axum::Json<SnapshotSchedule>, ApiError> {
    let s = snapshots::schedule::get(&state.snapshots(), operator.org_id, cluster_id).await?;
    Ok(axum::Json(schedule_view(s)))
}

/// Sets the cluster's snapshot schedule: the reconciler asks for one every `every_hours`
/// (0: only when an operator asks) and keeps the newest `retain` stored.
#[utoipa::path(
    put, path = "/clusters/{id}/snapshots/schedule", params(("id" = i64, Path)), request_body = SnapshotSchedule,
    responses((status = 200, body = SnapshotSchedule), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn put_schedule(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
    ApiJson(asked): ApiJson<SnapshotSchedule>,
) -> Result<axum::Json<SnapshotSchedule>, ApiError> {
    let s = snapshots::schedule::set(
        &state.snapshots(),
        operator.org_id,
        cluster_id,
        asked.every_hours,
        asked.retain,
    )
    .await?;
    Ok(axum::Json(schedule_view(s)))
}

/// Deletes a snapshot and its object.
#[utoipa::path(
    delete, path = "/clusters/{id}/snapshots/{sid}", params(("id" = i64, Path), ("sid" = i64, Path)),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn delete_snapshot(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> Result<StatusCode, ApiError> {
    snapshots::delete(&state.snapshots(), operator.org_id, cluster_id, id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The snapshot as etcd wrote it (every object of the cluster, Secrets as etcd holds them):
/// for `etcdutl snapshot restore` outside exk8s. A stored object that no longer opens ends
/// the body early.
#[utoipa::path(
    get, path = "/clusters/{id}/snapshots/{sid}/content", params(("id" = i64, Path), ("sid" = i64, Path)),
    responses((status = 200, content_type = "application/octet-stream", description = "the etcd snapshot"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn snapshot_content(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, id)): ApiPath<(i64, i64)>,
) -> Result<Response, ApiError> {
    let ctx = state.snapshots();
    let row = snapshots::get(&ctx, operator.org_id, cluster_id, id).await?;
    let stream = snapshots::content(&ctx, operator.org_id, cluster_id, id).await?;
    tracing::info!(
        cluster_id,
        snapshot_id = id,
        org_id = operator.org_id,
        "etcd snapshot content read"
    );
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(size) = row.size_bytes {
        headers.insert(header::CONTENT_LENGTH, header::HeaderValue::from(size));
    }
    Ok(response)
}

fn header_text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The member's upload of the snapshot asked of it: the snapshot as its etcd streamed it,
/// signed over the body's SHA-256 declared in `X-Exk8s-Content-Sha256`; or, with
/// `X-Exk8s-Snapshot-Failure` and an empty body, why it could not take it.
#[utoipa::path(
    put, path = "/nodes/{vm_id}/snapshots/{sid}", params(("vm_id" = i64, Path), ("sid" = i64, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "no such snapshot asked of this node now"),
        (status = 422, body = ErrorBody, description = "the body is not what was signed, or not an etcd snapshot"),
        (status = 429, body = ErrorBody),
    ),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn upload_snapshot(
    State(state): State<AppState>,
    ApiPath((_vm_id, id)): ApiPath<(i64, i64)>,
    upload: SignedUpload,
) -> Result<StatusCode, ApiError> {
    let SignedUpload {
        vm,
        headers,
        declared,
        body,
    } = upload;
    let failure = header_text(&headers, SNAPSHOT_FAILURE_HEADER).map(str::to_owned);
    let revision = match (
        failure.is_some(),
        header_text(&headers, ETCD_REVISION_HEADER),
    ) {
        (true, _) => 0,
        (false, text) => text
            .and_then(|r| r.parse::<i64>().ok())
            .filter(|r| *r >= 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    ETCD_REVISION_HEADER,
                    format!("{ETCD_REVISION_HEADER} must be the member's revision (a number)"),
                )
            })?,
    };
    let etcd_version = header_text(&headers, ETCD_VERSION_HEADER)
        .filter(|v| {
            v.len() <= 32
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
        .unwrap_or_default()
        .to_owned();
    if failure.is_none() && etcd_version.is_empty() {
        return Err(ApiError::invalid(
            ETCD_VERSION_HEADER,
            format!("{ETCD_VERSION_HEADER} must name the member's etcd release (3.6.14)"),
        ));
    }
    let up = Upload {
        node: &vm.node,
        cluster: &vm.cluster,
        snapshot_id: id,
        declared,
        revision,
        etcd_version,
        failure,
    };
    snapshots::upload(&state.snapshots(), up, body.into_data_stream()).await?;
    Ok(StatusCode::NO_CONTENT)
}
