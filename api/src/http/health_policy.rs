//! `GET|PUT /clusters/{id}/health-policy`: how machines are judged unhealthy and whether they
//! are replaced without an operator ([`crate::health`]); `GET|PUT|DELETE
//! /clusters/{id}/node-pools/{pool}/health-policy`: a pool's own, which its workers follow
//! instead.

use axum::Json;
use axum::extract::State;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::health::policy::{self, SetError};
use exk8s_api_types::{HealthPolicy, PoolHealthPolicy};

impl From<SetError> for ApiError {
    fn from(e: SetError) -> Self {
        match e {
            SetError::NotFound => Self::NotFound,
            SetError::Invalid(invalid) => Self::Unprocessable {
                field: Some(invalid.field().to_owned()),
                message: invalid.to_string(),
            },
            SetError::Db(db) => db.into(),
        }
    }
}

/// The cluster's health policy (the defaults until one is set).
#[utoipa::path(
    get, path = "/clusters/{id}/health-policy", params(("id" = i64, Path)),
    responses((status = 200, body = HealthPolicy), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn get_health_policy(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<HealthPolicy>, ApiError> {
    Ok(Json(policy::get(&state.db, operator.org_id, id).await?))
}

/// Replaces the cluster's health policy; a field left out takes its default. Timeouts shorter
/// than a healthy machine's own rhythm are refused (422 naming the field).
#[utoipa::path(
    put, path = "/clusters/{id}/health-policy", params(("id" = i64, Path)),
    request_body = HealthPolicy,
    responses((status = 200, body = HealthPolicy), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn put_health_policy(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<HealthPolicy>,
) -> Result<Json<HealthPolicy>, ApiError> {
    let set = policy::set(&state.db, operator.org_id, id, body).await?;
    tracing::info!(cluster_id = id, remediation = set.remediation, max_unhealthy = %set.max_unhealthy, principal = %operator.principal, "health policy set");
    Ok(Json(set))
}

/// The policy the pool's workers are judged by: its own, or its cluster's.
#[utoipa::path(
    get, path = "/clusters/{id}/node-pools/{pool}/health-policy",
    params(("id" = i64, Path), ("pool" = i64, Path)),
    responses((status = 200, body = PoolHealthPolicy), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn get_pool_health_policy(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((id, pool)): ApiPath<(i64, i64)>,
) -> Result<Json<PoolHealthPolicy>, ApiError> {
    let (policy, own) = policy::get_pool(&state.db, operator.org_id, id, pool).await?;
    Ok(Json(PoolHealthPolicy { own, policy }))
}

/// Gives the pool its own health policy (a field left out takes its default, not the
/// cluster's); refused as the cluster's is (422 naming the field).
#[utoipa::path(
    put, path = "/clusters/{id}/node-pools/{pool}/health-policy",
    params(("id" = i64, Path), ("pool" = i64, Path)),
    request_body = HealthPolicy,
    responses((status = 200, body = PoolHealthPolicy), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn put_pool_health_policy(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((id, pool)): ApiPath<(i64, i64)>,
    ApiJson(body): ApiJson<HealthPolicy>,
) -> Result<Json<PoolHealthPolicy>, ApiError> {
    let set = policy::set_pool(&state.db, operator.org_id, id, pool, Some(body)).await?;
    tracing::info!(cluster_id = id, pool_id = pool, remediation = set.remediation, max_unhealthy = %set.max_unhealthy, principal = %operator.principal, "pool health policy set");
    Ok(Json(PoolHealthPolicy {
        own: true,
        policy: set,
    }))
}

/// The pool follows its cluster's health policy again; that policy.
#[utoipa::path(
    delete, path = "/clusters/{id}/node-pools/{pool}/health-policy",
    params(("id" = i64, Path), ("pool" = i64, Path)),
    responses((status = 200, body = PoolHealthPolicy), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn delete_pool_health_policy(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((id, pool)): ApiPath<(i64, i64)>,
) -> Result<Json<PoolHealthPolicy>, ApiError> {
    let policy = policy::set_pool(&state.db, operator.org_id, id, pool, None).await?;
    tracing::info!(cluster_id = id, pool_id = pool, principal = %operator.principal, "pool health policy dropped: the cluster's applies");
    Ok(Json(PoolHealthPolicy { own: false, policy }))
}
