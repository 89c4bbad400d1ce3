//! Operator routes: found, list, show, kubeconfig, delete. Thin: extract, call
//! `founding`/`db`/`pki`, respond.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::db::{self, phase::ClusterPhase};
use crate::field::FieldError;
use crate::founding::{
    self,
    request::{CreateClusterRequest, ValidateCluster as _},
};
pub use exk8s_api_types::{CaRotationView, ClusterView, MembersView, NodeView, PoolSummary};
use exk8s_api_types::{ClusterCreated, DeleteAccepted, DnsRecord};

fn created_response(state: &AppState, f: &founding::Founded) -> ClusterCreated {
    let config = &state.config;
    let wildcard = format!("*.{}", f.dns_name);
    ClusterCreated {
        cluster_id: f.id,
        name: f.name.clone(),
        kubeconfig: f.admin_kubeconfig.expose().to_owned(),
        control_plane_vm_ids: f.vm_ids.clone(),
        control_plane_dns_name: f.dns_name.clone(),
        service_cidr: config.service_cidr.clone(),
        pod_cidr: config.pod_cidr.clone(),
        dns_configured: f.dns_configured,
        dns_error: f.dns_error.clone(),
        bootstrap_path_template: "/bootstrap/{vm_id}".into(),
        suggested_dns_records: vec![
            DnsRecord {
                name: f.dns_name.clone(),
                kind: "A".into(),
                values: f.node_ips.clone(),
            },
            DnsRecord {
                name: wildcard.clone(),
                kind: "A".into(),
                values: f.node_ips.clone(),
            },
        ],
        wildcard_ingress_dns_name: wildcard,
    }
}

/// Found a cluster. The request is checked (fields, placement, brought CAs) and recorded, and
/// the answer is `202 Accepted` with the cluster, `provisioning`, at its `Location`: founding
/// goes on in the background (follow it with `GET /clusters/{id}` or its events). A client
/// that sends `Prefer: wait=N` gets `201 Created` with the kubeconfig when founding ends within
/// N seconds, or the founding's error.
#[utoipa::path(
    post, path = "/clusters", request_body = CreateClusterRequest,
    params(
        ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key and body return the first response; while it is still in progress, 409 `wait` with Retry-After"),
        ("Prefer" = Option<String>, Header, description = "`wait=N` (RFC 7240): wait up to N seconds (at most 3600) for founding to end; a founding that failed is undone and its error not kept for an Idempotency-Key, so a retry with the key founds afresh"),
    ),
    responses(
        (status = 201, body = ClusterCreated, description = "founded within the preferred wait", headers(("Location" = String))),
        (status = 202, body = ClusterView, description = "accepted; founding goes on", headers(("Location" = String))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 502, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("operator_token" = [])),
)]
pub async fn create_cluster(
    State(state): State<AppState>,
    operator: Operator,
    headers: HeaderMap,
    ApiJson(request): ApiJson<CreateClusterRequest>,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let wait = super::prefer::wait(&headers)?;
    let supplied = request.certificate_authorities.clone();
    let mut spec = request
        .clone()
        .validate(&state.config.kubernetes_versions)?;
    let restore_from = restore_source(&state, operator.org_id, &request, &mut spec).await?;
    let body = serde_json::to_vec(&request).map_err(ApiError::internal)?;
    let request = super::idempotent::Request {
        scope: "",
        body: &body,
        locate: Some(cluster_location),
    };
    super::idempotent::run(&state, operator.org_id, key, request, || async {
        let started = founding::start(
            &state.founder(),
            operator.org_id,
            &spec,
            supplied,
            restore_from,
        )
        .await?;
        let (id, accepted) = (started.id, started.accepted.clone());
        match started.outcome_within(wait).await {
            Some(founded) => {
                let created = created_response(&state, &founded?);
                let body = serde_json::to_vec(&created).map_err(ApiError::internal)?;
                Ok((StatusCode::CREATED, body))
            }
            None => {
                // The cluster exists from here on: no failure may answer this request, or a
                // retry of its key would found another. Its view is read as it is now, or else
                // given as it was accepted.
                let view = match owned_by(&state, operator.org_id, id).await {
                    Ok(row) => super::cluster_view::view(&state, row).await,
                    Err(e) => Err(e),
                };
                let view = view.unwrap_or_else(|e| {
                    tracing::warn!(
                        cluster_id = id,
                        error = %e,
                        "cannot read an accepted cluster's view: answering it as accepted"
                    );
                    super::cluster_view::as_accepted(&state, accepted)
                });
                let body = serde_json::to_vec(&view).map_err(ApiError::internal)?;
                Ok((StatusCode::ACCEPTED, body))
            }
        }
    })
    .await
}

/// The cluster and snapshot `restore_from` names, checked before anything is made (the org's
/// founded cluster, its stored snapshot read back intact); the new cluster takes the source's
/// key algorithm, as it keeps its CAs and service-account key.
async fn restore_source(
    state: &AppState,
    org_id: i64,
    request: &CreateClusterRequest,
    spec: &mut crate::founding::request::ClusterSpecRequest,
) -> Result<Option<(i64, i64)>, ApiError> {
    let Some(from) = request.restore_from else {
        return Ok(None);
    };
    if request.certificate_authorities.is_some() {
        return Err(FieldError::new(
            "restore_from",
            "a cluster restored from a snapshot keeps its source's CAs: leave out certificate_authorities",
        )
        .into());
    }
    let source = from.cluster_id.ok_or_else(|| {
        FieldError::new(
            "restore_from.cluster_id",
            "restore_from.cluster_id is required",
        )
    })?;
    let snapshot = from.snapshot_id.ok_or_else(|| {
        FieldError::new(
            "restore_from.snapshot_id",
            "restore_from.snapshot_id is required",
        )
    })?;
    let checked = crate::restore::check_source(&state.snapshots(), org_id, source, snapshot)
        .await
        .map_err(|e| match e {
            crate::restore::RestoreError::NotFound => ApiError::from(FieldError::new(
                "restore_from",
                format!("cluster {source} has no snapshot {snapshot}"),
            )),
            e => e.into(),
        })?;
    let algorithm: crate::pki::KeyAlgorithm =
        checked.key_algorithm.parse().map_err(ApiError::internal)?;
    if request.key_algorithm.is_some() && spec.key_algorithm != algorithm {
        return Err(FieldError::new(
            "key_algorithm",
            format!(
                "a cluster restored from cluster {source} keeps its CAs and service-account key, \
                 whose algorithm is {algorithm}: leave key_algorithm out or set it to that"
            ),
        )
        .into());
    }
    spec.key_algorithm = algorithm;
    Ok(Some((source, snapshot)))
}

/// `/clusters/{id}` of a founding's answer (201: `cluster_id`; 202: the cluster's `id`).
fn cluster_location(status: StatusCode, body: &[u8]) -> Option<String> {
    let field = match status {
        StatusCode::CREATED => "cluster_id",
        StatusCode::ACCEPTED => "id",
        _ => return None,
    };
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    value[field].as_i64().map(|id| format!("/clusters/{id}"))
}

/// The org's clusters, a page at a time (`limit` ≤ 500, default 500); a fuller list says so
/// with `Link: <…>; rel="next"`.
#[utoipa::path(
    get, path = "/clusters",
    params(
        ("limit" = Option<i64>, Query, description = "rows per page, 1–500 (default 500)"),
        ("cursor" = Option<String>, Query, description = "from the previous page's Link header"),
    ),
    responses(
        (status = 200, body = Vec<ClusterView>, headers(("Link" = String, description = "the next page, when there is one"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
    ),
    security(("operator_token" = [])),
)]
pub async fn list_clusters(
    State(state): State<AppState>,
    operator: Operator,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, ApiError> {
    let page = super::paging::parse(&super::paging::params(query.as_deref())?)?;
    let mut rows =
        db::clusters::list_page(&state.db.pool, operator.org_id, page.after, page.limit + 1)
            .await?;
    let more = i64::try_from(rows.len()).unwrap_or(i64::MAX) > page.limit;
    rows.truncate(usize::try_from(page.limit).unwrap_or(usize::MAX));
    let next = more
        .then(|| {
            rows.last()
                .map(|r| super::paging::next_link("/clusters", page, r.id))
        })
        .flatten();
    let page = super::cluster_view::page_json(&state, rows).await?;
    let mut response = ([(header::CONTENT_TYPE, "application/json")], page).into_response();
    if let Some(link) = next.and_then(|l| header::HeaderValue::from_str(&l).ok()) {
        response.headers_mut().insert(header::LINK, link);
    }
    Ok(response)
}

async fn owned(
    state: &AppState,
    operator: &Operator,
    id: i64,
) -> Result<db::clusters::ClusterRow, ApiError> {
    owned_by(state, operator.org_id, id).await
}

async fn owned_by(
    state: &AppState,
    org_id: i64,
    id: i64,
) -> Result<db::clusters::ClusterRow, ApiError> {
    db::clusters::get(&state.db.pool, org_id, id)
        .await?
        .ok_or(ApiError::NotFound)
}

/// One cluster's status; another org's cluster is 404.
#[utoipa::path(get, path = "/clusters/{id}", params(("id" = i64, Path)), responses((status = 200, body = ClusterView), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn get_cluster(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Json<ClusterView>, ApiError> {
    let row = owned(&state, &operator, id).await?;
    Ok(Json(super::cluster_view::view(&state, row).await?))
}

/// A fresh admin kubeconfig (a new client certificate each call).
#[utoipa::path(get, path = "/clusters/{id}/kubeconfig", params(("id" = i64, Path)), responses((status = 200, description = "kubeconfig YAML", content_type = "application/yaml"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn get_kubeconfig(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Response, ApiError> {
    let row = owned(&state, &operator, id).await?;
    if row.phase != ClusterPhase::Founded {
        return Err(ApiError::Conflict(format!(
            "cluster {id} is {}, not founded",
            row.phase
        )));
    }
    let text = crate::certificates::operator_kubeconfig(&state.certifier(), row)
        .await
        .map_err(super::certificates::certificates_error)?;
    Ok((
        [(header::CONTENT_TYPE, "application/yaml")],
        text.expose().to_owned(),
    )
        .into_response())
}

/// Deletes the cluster's VMs, security group and DNS record, then its rows. Deleting wins over
/// every convergence: membership and pool changes stop first. When one is still in a step after
/// a few seconds (or the compute API fails), the cluster stays `deleting` and the reconciler
/// finishes the delete; retrying the delete also does.
#[utoipa::path(delete, path = "/clusters/{id}", params(("id" = i64, Path)), responses((status = 204, description = "deleted"), (status = 202, body = DeleteAccepted, description = "the cluster is `deleting`: a change was still stopping; the reconciler finishes the delete"), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 502, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn delete_cluster(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<Response, ApiError> {
    let row = owned(&state, &operator, id).await?;
    if row.phase == ClusterPhase::Provisioning {
        return Err(ApiError::Conflict(format!(
            "cluster {id} is still being founded"
        )));
    }
    let deleted = founding::delete::delete(&state.machines(), id, DELETE_WAIT)
        .await
        .map_err(|e| match e {
            founding::delete::DeleteError::Db(db) => ApiError::from(db),
            other => ApiError::BadGateway(crate::error_chain(&other)),
        })?;
    Ok(match deleted {
        founding::delete::Deleted::Done => StatusCode::NO_CONTENT.into_response(),
        founding::delete::Deleted::Pending => (
            StatusCode::ACCEPTED,
            Json(DeleteAccepted {
                cluster_id: id,
                phase: ClusterPhase::Deleting,
                message: "a change of the cluster was still stopping; the reconciler finishes the \
                          delete"
                    .into(),
            }),
        )
            .into_response(),
    })
}

/// How long `DELETE /clusters/{id}` waits for the cluster's changes to stop before it answers
/// 202 and leaves the rest to the reconciler.
const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
