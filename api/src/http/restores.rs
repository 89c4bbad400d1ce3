//! In-place restores of a cluster's etcd: `POST|GET /clusters/{id}/restore` for the operator,
//! and for each member's agent its acknowledgements (`PUT /nodes/{vm_id}/restores/{rid}`) and
//! the snapshot it restores (`GET /nodes/{vm_id}/snapshots/{sid}/content`), both signed with
//! its node key ([`crate::restore`]).

use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use exk8s_api_types::{RestoreMemberView, RestoreRequest, RestoreView};
use exk8s_common::contract::{MAX_REPORT_MESSAGE_CHARS, RestoreAck};

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use super::signed_node::SignedNode;
use crate::app::AppState;
use crate::field::FieldError;
use crate::restore::{self, Restore, RestoreError};

impl From<RestoreError> for ApiError {
    fn from(e: RestoreError) -> Self {
        match e {
            RestoreError::NotFound => Self::NotFound,
            e @ (RestoreError::NotFounded { .. }
            | RestoreError::NotStored { .. }
            | RestoreError::Damaged { .. }
            | RestoreError::Conflict(_)) => Self::Conflict(e.to_string()),
            RestoreError::Compute(e) => Self::BadGateway(e),
            RestoreError::Snapshot(e) => e.into(),
            RestoreError::Db(db) => db.into(),
        }
    }
}

fn view(restore: Restore) -> RestoreView {
    let row = restore.row;
    RestoreView {
        id: row.id,
        cluster_id: row.cluster_id,
        snapshot_id: row.snapshot_id,
        phase: row.phase.as_str().to_owned(),
        started_at: row.started_at,
        updated_at: row.updated_at,
        bump_revision: row.bump_revision,
        error: row.error,
        members: restore
            .members
            .into_iter()
            .map(|m| RestoreMemberView {
                member: m.member_name,
                state: match m.done {
                    0 => "waiting",
                    1 => "stopped",
                    2 => "restored",
                    _ => "started",
                }
                .to_owned(),
            })
            .collect(),
    }
}

/// Restores the cluster's etcd in place from one of its stored snapshots: every member stops,
/// restores the same snapshot as a new logical cluster (its revision bumped, what came before
/// marked compacted) and starts etcd, then the control plane comes back one member at a time.
/// Refused (409) while another change runs, or when the stored snapshot does not read back
/// intact — before anything is stopped.
#[utoipa::path(
    post, path = "/clusters/{id}/restore", params(("id" = i64, Path)),
    request_body = RestoreRequest,
    responses((status = 202, body = RestoreView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn start_restore(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<RestoreRequest>,
) -> Result<(StatusCode, axum::Json<RestoreView>), ApiError> {
    let snapshot_id = body.snapshot_id.ok_or_else(|| {
        FieldError::new(
            "snapshot_id",
            "snapshot_id is required: a stored snapshot's id",
        )
    })?;
    let started = restore::start(&state.snapshots(), operator.org_id, id, snapshot_id).await?;
    tracing::info!(cluster_id = id, snapshot_id, principal = %operator.principal, "etcd restore requested");
    Ok((StatusCode::ACCEPTED, axum::Json(view(started))))
}

/// The cluster's latest restore.
#[utoipa::path(
    get, path = "/clusters/{id}/restore", params(("id" = i64, Path)),
    responses((status = 200, body = RestoreView), (status = 404, body = ErrorBody, description = "no such cluster, or it was never restored")),
    security(("operator_token" = [])),
)]
pub async fn get_restore(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<axum::Json<RestoreView>, ApiError> {
    crate::db::clusters::get(&state.db.pool, operator.org_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let latest = restore::latest(&state.snapshots(), id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(axum::Json(view(latest)))
}

/// A member's word on a step of a restore: done, or why not (which fails the restore).
#[utoipa::path(
    put, path = "/nodes/{vm_id}/restores/{rid}", params(("vm_id" = i64, Path), ("rid" = i64, Path)),
    request_body = RestoreAck,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn acknowledge(
    State(state): State<AppState>,
    ApiPath((_vm_id, id)): ApiPath<(i64, i64)>,
    signed: SignedNode,
) -> Result<StatusCode, ApiError> {
    let SignedNode { vm, body, .. } = signed;
    let ack: RestoreAck = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid("body", format!("not a restore acknowledgement: {e}")))?;
    if ack.failure.chars().count() > MAX_REPORT_MESSAGE_CHARS {
        return Err(ApiError::invalid(
            "failure",
            format!("failure is at most {MAX_REPORT_MESSAGE_CHARS} characters"),
        ));
    }
    let ctx = state.snapshots();
    let phase =
        restore::acknowledge(&ctx, vm.cluster.id, vm.node.id, id, ack.step, &ack.failure).await?;
    if phase == crate::db::restores::RestorePhase::Done {
        // The members it left out are replaced now (or by the reconciler).
        if let Err(e) = restore::rebuild(&ctx, &state.membership(), vm.cluster.id).await {
            tracing::warn!(cluster_id = vm.cluster.id, error = %crate::error_chain(&e), "the members a restore left out cannot be replaced yet (the reconciler retries)");
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

/// The snapshot a member restores, as etcd wrote it: only to a member a running restore of it
/// asks to restore now.
#[utoipa::path(
    get, path = "/nodes/{vm_id}/snapshots/{sid}/content", params(("vm_id" = i64, Path), ("sid" = i64, Path)),
    responses((status = 200, content_type = "application/octet-stream", description = "the etcd snapshot"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody, description = "no restore of this snapshot asks this node to restore it now"), (status = 429, body = ErrorBody)),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn member_content(
    State(state): State<AppState>,
    ApiPath((_vm_id, id)): ApiPath<(i64, i64)>,
    signed: SignedNode,
) -> Result<Response, ApiError> {
    let vm = signed.vm;
    let stream = restore::member_snapshot(&state.snapshots(), &vm.cluster, vm.node.id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    Ok(response)
}
