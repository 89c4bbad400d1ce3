//! `GET|PUT /clusters/{id}/health-policy`: how machines are judged unhealthy and whether they
//! are replaced without an operator ([`crate::health`]).

use axum::Json;
use axum::extract::State;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::health::policy::{self, SetError};
use exk8s_api_types::HealthPolicy;

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
