//! `PATCH /clusters/{id}` with `{"control_plane_count": N}`: grows a running control plane one
//! member at a time (`membership`). Answers 202 with where the change stands; its progress is
//! in `GET /clusters/{id}` (each node's `etcd_membership`, the `ScalingUp` condition).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::field::Validate as _;
use crate::membership::{self, MembershipError, ScaleRequest};
use exk8s_api_types::ScalingView;

/// Scales the control plane up to 3, 5 or 7 members, one at a time.
#[utoipa::path(
    patch, path = "/clusters/{id}", request_body = ScaleRequest,
    params(("id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key and body return the first response")),
    responses(
        (status = 202, body = ScalingView), (status = 200, body = ScalingView, description = "already that size"),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody),
    ),
    security(("operator_token" = [])),
)]
pub async fn scale(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ScaleRequest>,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let body = serde_json::to_vec(&request).map_err(ApiError::internal)?;
    let count = request.validate().map_err(MembershipError::from)?;
    let scope = format!("PATCH /clusters/{cluster_id}\n");
    let request = super::idempotent::Request {
        scope: &scope,
        body: &body,
        locate: None,
    };
    super::idempotent::run(&state, operator.org_id, key, request, || async {
        let scaling =
            membership::scale(&state.membership(), operator.org_id, cluster_id, count).await?;
        let status = if scaling.desired == scaling.voters {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        let view = ScalingView {
            cluster_id,
            desired: scaling.desired,
            voters: scaling.voters,
        };
        Ok((
            status,
            serde_json::to_vec(&view).map_err(ApiError::internal)?,
        ))
    })
    .await
}

/// Removes one control-plane member — the oldest other member's agent drains it and removes
/// it from etcd, then its VM goes. 409 when it is the only member or a majority would not hold.
#[utoipa::path(
    delete, path = "/clusters/{id}/nodes/{vm_id}",
    params(("id" = i64, Path), ("vm_id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the first response")),
    responses((status = 202, body = ScalingView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody, description = "the Idempotency-Key was used with another request")),
    security(("operator_token" = [])),
)]
pub async fn remove_member(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, vm_id)): ApiPath<(i64, i64)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let scope = format!("DELETE /clusters/{cluster_id}/nodes/{vm_id}\n");
    let request = super::idempotent::Request {
        scope: &scope,
        body: b"",
        locate: None,
    };
    super::idempotent::run(&state, operator.org_id, key, request, || async {
        let scaling =
            membership::remove(&state.membership(), operator.org_id, cluster_id, vm_id).await?;
        let view = ScalingView {
            cluster_id,
            desired: scaling.desired,
            voters: scaling.voters,
        };
        Ok((
            StatusCode::ACCEPTED,
            serde_json::to_vec(&view).map_err(ApiError::internal)?,
        ))
    })
    .await
}

/// Replaces one control-plane member: a new member joins first and the old one leaves after
/// it — or, when the old one is down, it leaves first and its replacement joins after. Its
/// progress shows in `GET /clusters/{id}` (`replacing`, `etcd_membership`, the conditions).
#[utoipa::path(
    post, path = "/clusters/{id}/nodes/{vm_id}/replace",
    params(("id" = i64, Path), ("vm_id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the first response")),
    responses((status = 202, body = ScalingView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody, description = "the Idempotency-Key was used with another request")),
    security(("operator_token" = [])),
)]
pub async fn replace_member(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, vm_id)): ApiPath<(i64, i64)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let scope = format!("POST /clusters/{cluster_id}/nodes/{vm_id}/replace\n");
    let request = super::idempotent::Request {
        scope: &scope,
        body: b"",
        locate: None,
    };
    super::idempotent::run(&state, operator.org_id, key, request, || async {
        let scaling =
            membership::replace(&state.membership(), operator.org_id, cluster_id, vm_id).await?;
        let view = ScalingView {
            cluster_id,
            desired: scaling.desired,
            voters: scaling.voters,
        };
        Ok((
            StatusCode::ACCEPTED,
            serde_json::to_vec(&view).map_err(ApiError::internal)?,
        ))
    })
    .await
}
