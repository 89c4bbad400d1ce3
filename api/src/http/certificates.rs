//! `GET /clusters/{id}/certificates` (the cluster's certificate inventory, soonest expiry
//! first), `POST /clusters/{id}/certificates/renew` (every leaf now) and
//! `POST /clusters/{id}/certificates/rotate-ca` (a CA, in phases).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::certificates::{self, CertificatesError};
use crate::field::FieldError;
use crate::renewal::RenewalError;
use crate::rotation::RotationError;
use exk8s_api_types::{
    CertificateInventory, CertificateView, RolloutStarted, RotateCaRequest, RotationStarted,
};

pub(super) fn certificates_error(e: CertificatesError) -> ApiError {
    match e {
        CertificatesError::NotFound => ApiError::NotFound,
        CertificatesError::Db(db) => db.into(),
        e => ApiError::internal(e),
    }
}

/// Every certificate of the cluster — its CAs, and each node's leaves and kubeconfig client
/// certificates at the generation it runs — read from what was issued, soonest expiry first.
#[utoipa::path(
    get, path = "/clusters/{id}/certificates", params(("id" = i64, Path)),
    responses((status = 200, body = CertificateInventory), (status = 404, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn inventory(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<CertificateInventory>, ApiError> {
    inventory_of(&state, operator.org_id, id).await.map(Json)
}

/// `org_id`'s cluster `id`'s certificate inventory as the API answers it (the console's
/// certificates page shows the same).
pub(super) async fn inventory_of(
    state: &AppState,
    org_id: i64,
    id: i64,
) -> Result<CertificateInventory, ApiError> {
    let inventory = certificates::inventory(&state.certifier(), org_id, id)
        .await
        .map_err(certificates_error)?;
    Ok(CertificateInventory {
        cluster_id: inventory.cluster_id,
        service_account_key_age_days: inventory.service_account_key_age_days,
        certificates: inventory
            .certificates
            .into_iter()
            .map(|e| {
                // The inventory reads every row with its details.
                let details = *e.row.details.ok_or_else(|| {
                    ApiError::internal(std::io::Error::other(
                        "an inventory row was read without its details",
                    ))
                })?;
                Ok(CertificateView {
                    vm_id: e.vm_id,
                    generation: e.generation,
                    name: e.row.name.to_string(),
                    kind: details.kind.as_str().to_owned(),
                    subject: details.subject,
                    issuer: details.issuer,
                    serial: details.serial,
                    not_before: e.row.not_before,
                    not_after: e.row.not_after,
                    days_left: e.days_left,
                })
            })
            .collect::<Result<_, ApiError>>()?,
    })
}

/// Renews every leaf now (e.g. after a suspected key leak): serving certificates are re-minted
/// with their SANs, every node gets a new generation whose bundle carries fresh leaves, and the
/// rollout delivers them one control-plane node at a time. Answers with that rollout.
#[utoipa::path(
    post, path = "/clusters/{id}/certificates/renew", params(("id" = i64, Path)),
    responses((status = 202, body = RolloutStarted), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn renew(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<(StatusCode, Json<RolloutStarted>), ApiError> {
    let started = crate::renewal::force(&state.renewer(), operator.org_id, id)
        .await
        .map_err(|e| match e {
            RenewalError::NotFound => ApiError::NotFound,
            e @ (RenewalError::NotFounded { .. } | RenewalError::Restoring(_)) => {
                ApiError::Conflict(e.to_string())
            }
            RenewalError::Db(db) => db.into(),
            e => ApiError::internal(e),
        })?;
    tracing::info!(cluster_id = id, principal = %operator.principal, "certificate renewal requested");
    Ok((StatusCode::ACCEPTED, Json(RolloutStarted::from(started))))
}

/// Rotates one of the cluster's CAs in phases, each delivered to every node before the next:
/// trust files carry old and new CA; the new CA signs and every leaf is re-minted under it; the
/// old CA is dropped. No client is cut off on the way.
#[utoipa::path(
    post, path = "/clusters/{id}/certificates/rotate-ca", params(("id" = i64, Path)),
    request_body = RotateCaRequest,
    responses((status = 202, body = RotationStarted), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn rotate_ca(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<RotateCaRequest>,
) -> Result<(StatusCode, Json<RotationStarted>), ApiError> {
    let ca = body
        .ca
        .as_deref()
        .ok_or_else(|| FieldError::new("ca", "ca is required: cluster, etcd or front_proxy"))?;
    let ca = crate::db::rotations::ca_named(ca).ok_or_else(|| {
        FieldError::new(
            "ca",
            format!(
                "ca must be cluster, etcd or front_proxy, got `{}`",
                ca.chars().take(40).collect::<String>()
            ),
        )
    })?;
    let started = crate::rotation::start(&state.rotator(), operator.org_id, id, ca)
        .await
        .map_err(|e| match e {
            RotationError::NotFound => ApiError::NotFound,
            e @ (RotationError::NotFounded { .. }
            | RotationError::InProgress { .. }
            | RotationError::Blocked(_)) => ApiError::Conflict(e.to_string()),
            RotationError::Db(db) => db.into(),
            e => ApiError::internal(e),
        })?;
    tracing::info!(cluster_id = id, ca = crate::db::rotations::ca_name(ca), principal = %operator.principal, "CA rotation requested");
    let rollout = RolloutStarted::from(started.rollout);
    Ok((
        StatusCode::ACCEPTED,
        Json(RotationStarted {
            cluster_id: rollout.cluster_id,
            ca: crate::db::rotations::ca_name(started.ca).to_owned(),
            phase: started.phase.to_string(),
            nodes: rollout.nodes,
        }),
    ))
}
