//! The day-2 routes a node's `exk8s-agent sync` calls, signed with the node key (IMDS token as
//! second factor): its generations, its update bundle, its reports; and the operator's
//! `POST /clusters/{id}/rollout`.

use std::net::SocketAddr;

use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::bootstrap::{StatusReport, limit_source, limit_vm};
use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator, decode_json};
use crate::app::AppState;
use crate::issuance::signed::{SignedBody, SignedRequest};
use crate::issuance::{self, NONCE_HEADER, Update};
use crate::rollout::{self, RolloutError};
use exk8s_api_types::{RolloutNode, RolloutStarted};
use exk8s_common::contract::Generations;

/// How long a node told to wait should wait before asking again.
const WAIT_SECS: u64 = 30;

/// Authenticates a signed node request (its method, path, headers and body) and charges its
/// rate limits.
pub(super) async fn signed_vm(
    state: &AppState,
    peer: SocketAddr,
    (method, uri, headers, body): (&Method, &Uri, &HeaderMap, &[u8]),
    vm_id: i64,
) -> Result<issuance::Vm, ApiError> {
    signed_vm_over(
        state,
        peer,
        (method, uri, headers, SignedBody::Bytes(body)),
        vm_id,
    )
    .await
}

/// [`signed_vm`] for a request whose signature covers `body` (a streamed body's digest).
pub(super) async fn signed_vm_over(
    state: &AppState,
    peer: SocketAddr,
    (method, uri, headers, body): (&Method, &Uri, &HeaderMap, SignedBody<'_>),
    vm_id: i64,
) -> Result<issuance::Vm, ApiError> {
    let request = SignedRequest {
        method: method.as_str(),
        path: uri.path(),
        headers,
        body,
    };
    limit_source(state, peer.ip())?;
    let vm = match issuance::signed::authenticate(&state.db, &request, vm_id, state.clock.unix())
        .await?
    {
        Ok(vm) => vm,
        Err(refusal) => {
            let source = peer.ip().to_string();
            return Err(issuance::refuse(&state.db, vm_id, refusal, &source)
                .await
                .into());
        }
    };
    limit_vm(state, &vm)?;
    Ok(vm)
}

/// The node's desired and applied generations.
#[utoipa::path(
    get, path = "/nodes/{vm_id}/generation", params(("vm_id" = i64, Path)),
    responses((status = 200, body = Generations), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn generation(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(vm_id): ApiPath<i64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<axum::Json<Generations>, ApiError> {
    let vm = signed_vm(&state, peer, (&method, &uri, &headers, b""), vm_id).await?;
    // Generations are at least 0 (a CHECK of the schema).
    let generation = |g: i64| u64::try_from(g).map_err(ApiError::internal);
    let snapshot = crate::snapshots::asked_of(&state.snapshots(), vm.node.id).await?;
    let restore =
        crate::snapshots::restore::task_for(&state.snapshots(), vm.cluster.id, vm.node.id).await?;
    Ok(axum::Json(Generations {
        desired_generation: generation(vm.node.desired_generation)?,
        applied_generation: generation(vm.node.applied_generation)?,
        up_to_date: vm.node.up_to_date(),
        snapshot,
        restore,
    }))
}

/// The node's update bundle: 200 with the envelope when its desired generation is newer and
/// the rollout lets it update now; 204 when it is up to date; 409 with `Retry-After` while it
/// must wait for another control-plane node.
#[utoipa::path(
    get, path = "/nodes/{vm_id}/bundle",
    params(("vm_id" = i64, Path), ("X-Exk8s-Nonce" = String, Header, description = "16–64 URL-safe characters, signed and echoed in the payload")),
    responses(
        (status = 200, description = "DSSE envelope around an application/vnd.exk8s.bundle.v2+json payload of kind `update`"),
        (status = 204, description = "the node runs its desired generation"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "wait for the rollout (Retry-After)"),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn bundle(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(vm_id): ApiPath<i64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let deadline = state.config.bootstrap_deadline;
    let work = async {
        let vm = signed_vm(&state, peer, (&method, &uri, &headers, b""), vm_id).await?;
        let nonce = headers.get(NONCE_HEADER).and_then(|v| v.to_str().ok());
        let source = peer.ip().to_string();
        Ok::<_, ApiError>(issuance::issue_update(&state.issuer(), &vm, nonce, &source).await?)
    };
    // Dropping the work at the deadline rolls its transaction back: no serial is spent.
    let update =
        tokio::time::timeout(deadline, work)
            .await
            .map_err(|_| ApiError::Unavailable {
                retry_after_secs: 5,
            })??;
    match update {
        Update::Current => Ok(StatusCode::NO_CONTENT.into_response()),
        Update::Wait(hold) => Err(ApiError::Wait {
            message: format!("the rollout holds this node's update: {hold}"),
            retry_after_secs: WAIT_SECS,
        }),
        Update::Bundle(envelope) => {
            Ok(([(header::CONTENT_TYPE, "application/json")], envelope).into_response())
        }
    }
}

/// A phase report from the node's `sync`.
#[utoipa::path(
    post, path = "/nodes/{vm_id}/status", request_body = StatusReport, params(("vm_id" = i64, Path)),
    responses((status = 204, description = "recorded"), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn status(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(vm_id): ApiPath<i64>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let vm = signed_vm(&state, peer, (&method, &uri, &headers, &body), vm_id).await?;
    let report: StatusReport = decode_json(&body)?;
    issuance::report::record(&state.reporter(), &vm, &report.as_report()).await?;
    Ok(StatusCode::NO_CONTENT)
}

impl From<rollout::Started> for RolloutStarted {
    fn from(started: rollout::Started) -> Self {
        Self {
            cluster_id: started.cluster_id,
            nodes: started
                .nodes
                .into_iter()
                .map(|(vm_id, desired_generation)| RolloutNode {
                    vm_id,
                    desired_generation,
                })
                .collect(),
        }
    }
}

/// Gives every node a new generation: per-bundle leaves are minted afresh, the CAs and the
/// stored apiserver and etcd serving certificates are kept until due (`certificates/renew`
/// re-mints those). Nodes fetch it with `exk8s-agent sync`, one control-plane node at a time.
#[utoipa::path(
    post, path = "/clusters/{id}/rollout", params(("id" = i64, Path)),
    responses((status = 202, body = RolloutStarted), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn start_rollout(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
) -> Result<(StatusCode, axum::Json<RolloutStarted>), ApiError> {
    let started = rollout::start(&state.db, operator.org_id, id)
        .await
        .map_err(|e| match e {
            RolloutError::NotFound => ApiError::NotFound,
            e @ (RolloutError::NotFounded { .. } | RolloutError::Restoring(_)) => {
                ApiError::Conflict(e.to_string())
            }
            RolloutError::Db(db) => db.into(),
        })?;
    tracing::info!(cluster_id = id, principal = %operator.principal, "rollout requested");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(RolloutStarted::from(started)),
    ))
}
