//! The service-account signing key: `POST /clusters/{id}/certificates/rotate-sa-key` (a
//! rotation in phases, [`crate::sa_rotation`]) and `GET|PUT /clusters/{id}/service-account-key`
//! (its age, its policy, its rotation).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::cluster_view::sa_key_view;
use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::sa_rotation::{self, KeyState, SaRotationError};
use exk8s_api_types::{
    RotateSaKeyRequest, SaKeyRotationStarted, ServiceAccountKeyPolicy, ServiceAccountKeyView,
};

impl From<SaRotationError> for ApiError {
    fn from(e: SaRotationError) -> Self {
        match e {
            SaRotationError::NotFound => Self::NotFound,
            e @ (SaRotationError::NotFounded { .. }
            | SaRotationError::InProgress(_)
            | SaRotationError::Blocked(_)) => Self::Conflict(e.to_string()),
            e @ SaRotationError::DropOldAfter(_) => Self::Unprocessable {
                field: Some("drop_old_after_seconds".into()),
                message: e.to_string(),
            },
            e @ SaRotationError::MaxAge(_) => Self::Unprocessable {
                field: Some("max_age_days".into()),
                message: e.to_string(),
            },
            SaRotationError::Db(db) => db.into(),
            e => Self::internal(e),
        }
    }
}

/// Rotates the cluster's service-account signing key in phases, each delivered to every
/// control-plane node before the next: every apiserver verifies with the old and the new
/// public key; the new key signs; `drop_old_after_seconds` after every apiserver signs with it
/// (default 25 h, within which kubelets refresh their pods' tokens) the old public key is
/// dropped. Tokens signed before keep authenticating until then.
#[utoipa::path(
    post, path = "/clusters/{id}/certificates/rotate-sa-key", params(("id" = i64, Path)),
    request_body = RotateSaKeyRequest,
    responses((status = 202, body = SaKeyRotationStarted), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn rotate_sa_key(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<RotateSaKeyRequest>,
) -> Result<(StatusCode, Json<SaKeyRotationStarted>), ApiError> {
    let started = sa_rotation::start(
        &state.rotator(),
        operator.org_id,
        id,
        body.drop_old_after_seconds,
    )
    .await?;
    tracing::info!(cluster_id = id, drop_old_after = started.drop_old_after, principal = %operator.principal, "service-account key rotation requested");
    Ok((
        StatusCode::ACCEPTED,
        Json(SaKeyRotationStarted {
            cluster_id: started.cluster_id,
            phase: started.phase.to_string(),
            drop_old_after_seconds: started.drop_old_after,
            nodes: super::nodes::rollout_nodes(started.nodes),
        }),
    ))
}

fn view(state: &AppState, key: &KeyState) -> ServiceAccountKeyView {
    sa_key_view(
        &key.cluster,
        key.rotation.as_ref(),
        &key.nodes,
        state.clock.unix(),
    )
}

/// The cluster's service-account signing key: when it was made, its policy, its rotation.
#[utoipa::path(
    get, path = "/clusters/{id}/service-account-key", params(("id" = i64, Path)),
    responses((status = 200, body = ServiceAccountKeyView), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn get_sa_key(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<ServiceAccountKeyView>, ApiError> {
    let key = sa_rotation::state(&state.rotator(), operator.org_id, id).await?;
    Ok(Json(view(&state, &key)))
}

/// Sets the key's policy: past `max_age_days` the `ServiceAccountKeyFresh` condition turns
/// False, and with `auto_rotate` the API rotates the key by itself (once no other change of
/// the cluster runs).
#[utoipa::path(
    put, path = "/clusters/{id}/service-account-key", params(("id" = i64, Path)),
    request_body = ServiceAccountKeyPolicy,
    responses((status = 200, body = ServiceAccountKeyView), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn put_sa_key(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    ApiJson(policy): ApiJson<ServiceAccountKeyPolicy>,
) -> Result<Json<ServiceAccountKeyView>, ApiError> {
    let key = sa_rotation::set_policy(
        &state.rotator(),
        operator.org_id,
        id,
        policy.max_age_days,
        policy.auto_rotate,
    )
    .await?;
    tracing::info!(cluster_id = id, max_age_days = policy.max_age_days, auto_rotate = policy.auto_rotate, principal = %operator.principal, "service-account key policy set");
    Ok(Json(view(&state, &key)))
}
