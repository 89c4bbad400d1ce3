//! The day-2 routes a node's `exk8s-agent sync` calls, signed with the node key (IMDS token as
//! second factor): its generations, its update bundle, its reports; and the operator's
//! `POST /clusters/{id}/rollout`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::bootstrap::StatusReport;
use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator, decode_json};
use super::signed_node::SignedNode;
use crate::app::AppState;
use crate::issuance::{self, NONCE_HEADER, Update};
use crate::rollout::{self, RolloutError};
use exk8s_api_types::{RolloutNode, RolloutStarted};
use exk8s_common::contract::Generations;

/// How long a node told to wait should wait before asking again.
const WAIT_SECS: u64 = 30;

/// The node's desired and applied generations.
#[utoipa::path(
    get, path = "/nodes/{vm_id}/generation", params(("vm_id" = i64, Path)),
    responses((status = 200, body = Generations), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody), (status = 429, body = ErrorBody)),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn generation(
    State(state): State<AppState>,
    signed: SignedNode,
) -> Result<axum::Json<Generations>, ApiError> {
    let vm = signed.vm;
    // Generations are at least 0 (a CHECK of the schema).
    let generation = |g: i64| u64::try_from(g).map_err(ApiError::internal);
    let snapshot = crate::snapshots::asked_of(&state.snapshots(), vm.node.id).await?;
    let restore = crate::restore::task_for(&state.snapshots(), vm.cluster.id, vm.node.id).await?;
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
    params(("vm_id" = i64, Path), ("X-Exk8s-Nonce" = String, Header, description = "16–64 URL-safe characters, signed and echoed in the payload"), ("Accept" = Option<String>, Header, description = "the bundle formats the agent reads (application/vnd.exk8s.bundle.v2+json); absent: v2")),
    responses(
        (status = 200, description = "DSSE envelope around an application/vnd.exk8s.bundle.v2+json payload of kind `update`"),
        (status = 204, description = "the node runs its desired generation"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 406, body = ErrorBody, description = "the agent's `Accept` names none of the formats this API renders"),
        (status = 409, body = ErrorBody, description = "wait for the rollout (Retry-After)"),
        (status = 429, body = ErrorBody), (status = 503, body = ErrorBody),
    ),
    security(("imds_token" = [], "node_signature" = [])),
)]
pub async fn bundle(
    State(state): State<AppState>,
    signed: SignedNode,
) -> Result<Response, ApiError> {
    let SignedNode {
        vm, peer, headers, ..
    } = signed;
    let agent_version = super::agent_format::check(&headers)?;
    let deadline = state.config.bootstrap_deadline;
    let work = async {
        // Written only when it changed: the node's row is loaded already.
        if let Some(version) = agent_version
            .as_ref()
            .filter(|v| vm.node.agent_version.as_ref() != Some(*v))
        {
            crate::db::nodes::set_agent_version(&state.db.pool, vm.node.id, version).await?;
        }
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
    signed: SignedNode,
) -> Result<StatusCode, ApiError> {
    let SignedNode { vm, body, .. } = signed;
    let report: StatusReport = decode_json(&body)?;
    issuance::report::record(&state.reporter(), &vm, &report.as_report()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Each node a rollout bumped, `(vm_id, desired_generation)`, as operators read it.
pub(super) fn rollout_nodes(nodes: Vec<(i64, i64)>) -> Vec<RolloutNode> {
    nodes
        .into_iter()
        .map(|(vm_id, desired_generation)| RolloutNode {
            vm_id,
            desired_generation,
        })
        .collect()
}

impl From<rollout::Started> for RolloutStarted {
    fn from(started: rollout::Started) -> Self {
        Self {
            cluster_id: started.cluster_id,
            nodes: rollout_nodes(started.nodes),
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
