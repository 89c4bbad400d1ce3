//! `GET /clusters/{id}/trust` (what a client of the cluster's apiservers trusts now) and
//! `POST /clusters/{id}/credentials` (a short-lived client certificate of the admin identity,
//! for `exk8s credential`, client-go's exec credential plugin).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;

use super::certificates::certificates_error;
use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use crate::app::AppState;
use crate::db::{self, clusters::ClusterRow, phase::ClusterPhase};
use exk8s_api_types::{ClusterTrust, OperatorCredential};

/// `org_id`'s founded cluster `id`.
async fn founded(state: &AppState, org_id: i64, id: i64) -> Result<ClusterRow, ApiError> {
    let row = db::clusters::get(&state.db.pool, org_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    if row.phase != ClusterPhase::Founded {
        return Err(ApiError::Conflict(format!(
            "cluster {id} is {}, not founded",
            row.phase
        )));
    }
    Ok(row)
}

/// What a client of the cluster's apiservers trusts now: the cluster CA, and the other one
/// while that CA is rotated. Fetched before each use, it keeps a client's trust current
/// through a rotation.
#[utoipa::path(
    get, path = "/clusters/{id}/trust", params(("id" = i64, Path)),
    responses((status = 200, body = ClusterTrust), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn trust(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<ClusterTrust>, ApiError> {
    let row = founded(&state, operator.org_id, id).await?;
    let trust = crate::credentials::trust(&state.certifier(), &row)
        .await
        .map_err(certificates_error)?;
    Ok(Json(ClusterTrust {
        server: trust.server,
        certificate_authority_pem: trust.certificate_authority_pem,
    }))
}

/// A new client certificate of the cluster's admin identity that lives eight hours (at most
/// the cluster's leaf lifetime), recorded in the certificate inventory.
#[utoipa::path(
    post, path = "/clusters/{id}/credentials", params(("id" = i64, Path)),
    responses((status = 201, body = OperatorCredential), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn mint(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<(StatusCode, Json<OperatorCredential>), ApiError> {
    let row = founded(&state, operator.org_id, id).await?;
    let minted = crate::credentials::mint(&state.certifier(), row)
        .await
        .map_err(certificates_error)?;
    let expires_at = minted
        .not_after
        .format(&time::format_description::well_known::Rfc3339)
        .map_err(ApiError::internal)?;
    tracing::info!(cluster_id = id, principal = %operator.principal, %expires_at, "operator credential minted");
    Ok((
        StatusCode::CREATED,
        Json(OperatorCredential {
            server: minted.trust.server,
            certificate_authority_pem: minted.trust.certificate_authority_pem,
            client_certificate_pem: minted.certificate_pem,
            client_key_pem: minted.key_pem,
            issuer_pem: minted.issuer_pem,
            expires_at,
        }),
    ))
}
