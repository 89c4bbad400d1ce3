//! Worker node pools: `POST /clusters/{id}/node-pools` (Idempotency-Key), `GET` (all, or one),
//! `PATCH` and `DELETE /clusters/{id}/node-pools/{pool}`. Changes answer 202 at once: the
//! pool's machines are made or removed in the background (`pools::converge`), visible in
//! `GET` as they go.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::field::Validate as _;
use crate::machineset::ChangeError;
use crate::pools::request::{CreatePoolRequest, UpdatePoolRequest};
use crate::pools::{self, Pool, PoolError};
use exk8s_api_types::{PoolNodeView, PoolView};

/// A refused change of a machine set (a pool or a control plane).
impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::Invalid(field) => Self::Unprocessable {
                field: Some(field.field),
                message: field.message,
            },
            ChangeError::NotFound => Self::NotFound,
            ChangeError::Conflict(message) => Self::Conflict(message),
            ChangeError::Upstream(message) => Self::BadGateway(message),
            ChangeError::Db(db) => db.into(),
            e @ ChangeError::Quota(_) => Self::QuotaExceeded(e.to_string()),
        }
    }
}

fn view(pool: Pool) -> Result<PoolView, ApiError> {
    let Pool {
        row,
        nodes,
        release,
    } = pool;
    let [replicas, ready_replicas, up_to_date_replicas] =
        crate::status::pool_replicas(nodes.iter(), &release);
    Ok(PoolView {
        replicas,
        ready_replicas,
        up_to_date_replicas,
        labels: serde_json::from_str(&row.labels_json).map_err(ApiError::internal)?,
        taints: serde_json::from_str(&row.taints_json).map_err(ApiError::internal)?,
        id: row.id,
        cluster_id: row.cluster_id,
        name: row.name,
        instance_type: row.instance_type,
        image_id: row.image_id,
        subnet_id: row.subnet_id,
        desired: row.desired_count,
        kubernetes_version: row.kubernetes_version.clone().unwrap_or_default(),
        follow_control_plane: row.follow_control_plane,
        max_surge: row.max_surge,
        deleting: row.deleting,
        error_message: row.last_error,
        nodes: nodes
            .into_iter()
            .map(|n| PoolNodeView {
                up_to_date: crate::status::pool_node_up_to_date(&n, &release),
                provider_id: exk8s_api_types::provider_id(row.cluster_id, n.vm_id),
                vm_id: n.vm_id,
                ordinal: n.ordinal,
                name: n.node_name,
                private_ipv4: n.private_ipv4,
                ready: n.phase.healthy(),
                phase: n.phase.to_string(),
                desired_generation: n.desired_generation,
                applied_generation: n.applied_generation,
                kubernetes_version: n.kubernetes_version,
                removal: n.removal,
            })
            .collect(),
    })
}

fn accepted(pool: Pool) -> Result<(StatusCode, Vec<u8>), ApiError> {
    let body = serde_json::to_vec(&view(pool)?).map_err(ApiError::internal)?;
    Ok((StatusCode::ACCEPTED, body))
}

/// Adds a pool of workers; they are made in the background.
#[utoipa::path(
    post, path = "/clusters/{id}/node-pools", request_body = CreatePoolRequest,
    params(("id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key and body return the first response; while it is still in progress, 409 `wait` with Retry-After")),
    responses(
        (status = 202, body = PoolView),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 502, body = ErrorBody),
    ),
    security(("operator_token" = [])),
)]
pub async fn create_pool(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CreatePoolRequest>,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let body = serde_json::to_vec(&request).map_err(ApiError::internal)?;
    let spec = request.validate().map_err(PoolError::from)?;
    let scope = format!("POST /clusters/{cluster_id}/node-pools\n");
    let request = super::idempotent::Request {
        scope: &scope,
        body: &body,
        locate: None,
    };
    super::idempotent::run(&state, operator.org_id, key, request, || async {
        accepted(pools::create(&state.pools(), operator.org_id, cluster_id, &spec).await?)
    })
    .await
}

/// The cluster's pools.
#[utoipa::path(get, path = "/clusters/{id}/node-pools", params(("id" = i64, Path)), responses((status = 200, body = Vec<PoolView>), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn list_pools(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
) -> Result<Json<Vec<PoolView>>, ApiError> {
    let pools = pools::list(&state.pools(), operator.org_id, cluster_id).await?;
    Ok(Json(pools.into_iter().map(view).collect::<Result<_, _>>()?))
}

/// One pool with each worker's phase and generation.
#[utoipa::path(get, path = "/clusters/{id}/node-pools/{pool}", params(("id" = i64, Path), ("pool" = i64, Path)), responses((status = 200, body = PoolView), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn get_pool(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, pool_id)): ApiPath<(i64, i64)>,
) -> Result<Json<PoolView>, ApiError> {
    let pool = pools::get(&state.pools(), operator.org_id, cluster_id, pool_id).await?;
    Ok(Json(view(pool)?))
}

/// Changes a pool's count, labels or taints. Scaling down drains the newest workers first.
#[utoipa::path(
    patch, path = "/clusters/{id}/node-pools/{pool}", request_body = UpdatePoolRequest,
    params(("id" = i64, Path), ("pool" = i64, Path)),
    responses((status = 202, body = PoolView), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn update_pool(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, pool_id)): ApiPath<(i64, i64)>,
    ApiJson(request): ApiJson<UpdatePoolRequest>,
) -> Result<(StatusCode, Json<PoolView>), ApiError> {
    let change = request.validate().map_err(PoolError::from)?;
    let pool = pools::update(
        &state.pools(),
        operator.org_id,
        cluster_id,
        pool_id,
        &change,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(view(pool)?)))
}

/// Deletes a pool: its workers are drained and their VMs deleted, then the pool goes.
#[utoipa::path(delete, path = "/clusters/{id}/node-pools/{pool}", params(("id" = i64, Path), ("pool" = i64, Path)), responses((status = 202, body = PoolView), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn delete_pool(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((cluster_id, pool_id)): ApiPath<(i64, i64)>,
) -> Result<(StatusCode, Json<PoolView>), ApiError> {
    let pool = pools::delete(&state.pools(), operator.org_id, cluster_id, pool_id).await?;
    Ok((StatusCode::ACCEPTED, Json(view(pool)?)))
}
