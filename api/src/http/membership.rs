//! Removing and replacing one control-plane member (`membership`); changing its size is
//! `PATCH /clusters/{id}` ([`super::patch`]). Each answers 202 with where the change stands;
//! its progress is in `GET /clusters/{id}` (each node's `etcd_membership`, the `ScalingUp` and
//! `ScalingDown` conditions).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use crate::app::AppState;
use crate::membership;
use exk8s_api_types::ScalingView;

/// What removing or replacing a member answers.
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "the answers as the OpenAPI document describes them; the handlers build their own"
)]
enum MemberAnswers {
    #[response(status = 202)]
    Accepted(ScalingView),
    #[response(status = 404)]
    NotFound(ErrorBody),
    #[response(status = 409)]
    Conflict(ErrorBody),
    /// the Idempotency-Key was used with another request
    #[response(status = 422)]
    KeyReused(ErrorBody),
}

/// Removes one control-plane member — the oldest other member's agent drains it and removes
/// it from etcd, then its VM goes. 409 when it is the only member or a majority would not hold.
#[utoipa::path(
    delete, path = "/clusters/{id}/nodes/{vm_id}",
    params(("id" = i64, Path), ("vm_id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the first response; while it is still in progress, 409 `wait` with Retry-After")),
    responses(MemberAnswers),
    security(("operator_token" = [])),
)]
pub async fn remove_member(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, vm_id)): ApiPath<(i64, i64)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = format!("DELETE /clusters/{cluster_id}/nodes/{vm_id}\n");
    member_change(
        &state,
        operator.org_id,
        cluster_id,
        &headers,
        &scope,
        |ctx| async move { membership::remove(&ctx, operator.org_id, cluster_id, vm_id).await },
    )
    .await
}

/// Replaces one control-plane member: a new member joins first and the old one leaves after
/// it — or, when the old one is down, it leaves first and its replacement joins after. Its
/// progress shows in `GET /clusters/{id}` (`replacing`, `etcd_membership`, the conditions).
#[utoipa::path(
    post, path = "/clusters/{id}/nodes/{vm_id}/replace",
    params(("id" = i64, Path), ("vm_id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key return the first response; while it is still in progress, 409 `wait` with Retry-After")),
    responses(MemberAnswers),
    security(("operator_token" = [])),
)]
pub async fn replace_member(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, vm_id)): ApiPath<(i64, i64)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let scope = format!("POST /clusters/{cluster_id}/nodes/{vm_id}/replace\n");
    member_change(
        &state,
        operator.org_id,
        cluster_id,
        &headers,
        &scope,
        |ctx| async move { membership::replace(&ctx, operator.org_id, cluster_id, vm_id).await },
    )
    .await
}

/// Runs `change` once per `Idempotency-Key` of the operator's org (a retry answers what the
/// first did) and answers 202 with where `cluster_id`'s membership stands.
async fn member_change<F, Fut>(
    state: &AppState,
    org_id: i64,
    cluster_id: i64,
    headers: &HeaderMap,
    scope: &str,
    change: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(membership::Membership) -> Fut,
    Fut: Future<Output = Result<membership::Scaling, membership::MembershipError>>,
{
    let key = super::idempotent::key(headers)?;
    let request = super::idempotent::Request {
        scope,
        body: b"",
        locate: None,
    };
    super::idempotent::run(state, org_id, key, request, || async {
        let scaling = change(state.membership()).await?;
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
