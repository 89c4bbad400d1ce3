//! `GET /clusters/{id}/certificates` (the cluster's certificate inventory, soonest expiry first)
//! and `POST /clusters/{id}/certificates/renew` (every leaf now).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use super::nodes::RolloutStarted;
use crate::app::AppState;
use crate::certificates::{self, CertificatesError};
use crate::renewal::RenewalError;

/// One certificate, as the API issued it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CertificateView {
    /// The node's VM; absent for the cluster's own certificates (CAs, operator kubeconfig).
    pub vm_id: Option<i64>,
    /// The node generation whose bundle carried it (0 for the cluster's own).
    pub generation: i64,
    /// What it is: `cluster-ca`, `apiserver`, `etcd-peer`, `admin.kubeconfig`, …
    pub name: String,
    /// `ca`, `serving` or `client`.
    pub kind: String,
    pub subject: String,
    pub issuer: String,
    /// Hex, colon-separated.
    pub serial: String,
    /// Unix seconds.
    pub not_before: i64,
    /// Unix seconds.
    pub not_after: i64,
    /// Whole days until `not_after` (negative once expired).
    pub days_left: i64,
}

/// A cluster's certificates.
#[derive(Debug, Serialize, ToSchema)]
pub struct CertificateInventory {
    pub cluster_id: i64,
    /// Days since the service-account signing key was made (at founding). It is not rotated
    /// automatically: rotating it invalidates every issued service-account token.
    pub service_account_key_age_days: i64,
    /// Soonest `not_after` first.
    pub certificates: Vec<CertificateView>,
}

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
    let inventory = certificates::inventory(&state, operator.org_id, id)
        .await
        .map_err(certificates_error)?;
    Ok(Json(CertificateInventory {
        cluster_id: inventory.cluster_id,
        service_account_key_age_days: inventory.service_account_key_age_days,
        certificates: inventory
            .certificates
            .into_iter()
            .map(|e| CertificateView {
                vm_id: e.vm_id,
                generation: e.generation,
                name: e.row.name,
                kind: e.row.kind.as_str().to_owned(),
                subject: e.row.subject,
                issuer: e.row.issuer,
                serial: e.row.serial,
                not_before: e.row.not_before,
                not_after: e.row.not_after,
                days_left: e.days_left,
            })
            .collect(),
    }))
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
    let started = crate::renewal::force(&state, operator.org_id, id)
        .await
        .map_err(|e| match e {
            RenewalError::NotFound => ApiError::NotFound,
            e @ RenewalError::NotFounded { .. } => ApiError::Conflict(e.to_string()),
            RenewalError::Db(db) => db.into(),
            e => ApiError::internal(e),
        })?;
    tracing::info!(cluster_id = id, principal = %operator.principal, "certificate renewal requested");
    Ok((StatusCode::ACCEPTED, Json(RolloutStarted::from(started))))
}
