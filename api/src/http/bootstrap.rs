//! VM routes: the bundle, phase reports, and the published signing keys; plus the operator's
//! re-arm of a finished node.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::ToSchema;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::db;
use crate::issuance::{self, NONCE_HEADER};
use exk8s_common::contract::{BootPhase, Component, ComponentHealth, ReportState};
use exk8s_common::node_auth::NODE_KEY_HEADER;

/// A phase report (`exk8s_common::contract::PhaseReport` on the wire).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusReport {
    /// One of fetch, verify, files, prereqs, services, etcd, apiserver, addons, complete, sync.
    #[schema(value_type = String, pattern = "^(fetch|verify|files|prereqs|services|etcd|apiserver|addons|complete|sync)$")]
    pub phase: BootPhase,
    /// started, succeeded or failed.
    #[schema(value_type = String, pattern = "^(started|succeeded|failed)$")]
    pub state: ReportState,
    /// Up to 1000 characters.
    #[serde(default)]
    pub message: String,
    /// The generation of the bundle being applied (agents that predate generations omit it).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub generation: Option<u64>,
    /// The components this node's probes checked, at most one entry each.
    #[serde(default)]
    #[schema(max_items = 5)]
    pub components: Vec<ComponentReport>,
}

/// One component's health as the node's probe saw it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ComponentReport {
    /// etcd, kube-apiserver, kube-controller-manager, kube-scheduler or kubelet.
    #[schema(value_type = String, pattern = "^(etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kubelet)$")]
    pub component: Component,
    pub healthy: bool,
    /// What the probe saw when unhealthy (up to 1000 characters).
    #[serde(default)]
    pub message: String,
}

impl StatusReport {
    pub(super) fn as_report(&self) -> issuance::report::Report<'_> {
        issuance::report::Report {
            phase: self.phase,
            state: self.state,
            message: &self.message,
            generation: self.generation,
            components: self
                .components
                .iter()
                .map(|c| ComponentHealth {
                    component: c.component,
                    healthy: c.healthy,
                    message: c.message.clone(),
                })
                .collect(),
        }
    }
}

pub(super) fn rate_limited(wait: std::time::Duration) -> ApiError {
    ApiError::RateLimited {
        retry_after_secs: wait.as_secs().max(1),
    }
}

/// Charged before anything is looked at: a flood costs its own address, nothing else.
pub(super) fn limit_source(state: &AppState, source: std::net::IpAddr) -> Result<(), ApiError> {
    state.limits.charge_source(source).map_err(rate_limited)
}

/// Charged only once the caller proved it is `vm`: nobody else can spend a VM's allowance.
pub(super) fn limit_vm(state: &AppState, vm: &issuance::Vm) -> Result<(), ApiError> {
    state
        .limits
        .per_vm
        .check(&vm.node.vm_id)
        .map_err(rate_limited)
}

/// What `GET /bootstrap/{vm_id}` answers, and its deprecated alias.
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "the answers as the OpenAPI document describes them; the handler builds its own"
)]
enum BundleAnswers {
    /// DSSE envelope (application/json) around an application/vnd.exk8s.bundle.v2+json payload
    #[response(status = 200)]
    Envelope,
    #[response(status = 400)]
    BadRequest(ErrorBody),
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    #[response(status = 403)]
    Forbidden(ErrorBody),
    #[response(status = 404)]
    NotFound(ErrorBody),
    /// the agent's `Accept` names none of the formats this API renders
    #[response(status = 406)]
    NotAcceptable(ErrorBody),
    #[response(status = 410)]
    Gone(ErrorBody),
    #[response(status = 429)]
    TooManyRequests(ErrorBody),
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// What `POST /bootstrap/{vm_id}/status` answers, and its deprecated alias.
#[derive(utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "the answers as the OpenAPI document describes them; the handler builds its own"
)]
enum StatusAnswers {
    /// recorded
    #[response(status = 204)]
    Recorded,
    #[response(status = 400)]
    BadRequest(ErrorBody),
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    #[response(status = 404)]
    NotFound(ErrorBody),
    #[response(status = 429)]
    TooManyRequests(ErrorBody),
}

/// The signed bundle for exactly this VM, whatever its role.
#[utoipa::path(
    get, path = "/bootstrap/{vm_id}",
    params(("vm_id" = i64, Path), ("X-Exk8s-Nonce" = String, Header, description = "16–64 URL-safe characters, echoed in the payload"), ("Accept" = Option<String>, Header, description = "the bundle formats the agent reads (application/vnd.exk8s.bundle.v2+json); absent: v2")),
    responses(BundleAnswers),
    security(("imds_token" = [], "bootstrap_token" = [])),
)]
pub async fn bundle(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(vm_id): ApiPath<i64>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    limit_source(&state, peer.ip())?;
    let agent_version = super::agent_format::check(&headers)?;
    let source = peer.ip().to_string();
    let deadline = state.config.bootstrap_deadline;
    // Dropping the work at the deadline rolls its transaction back: no serial is spent.
    let envelope = tokio::time::timeout(deadline, async {
        let vm = bootstrap_vm(&state, &headers, vm_id, &source).await?;
        // Written only when it changed: the node's row is loaded already.
        if let Some(version) = agent_version
            .as_ref()
            .filter(|v| vm.node.agent_version.as_ref() != Some(*v))
        {
            db::nodes::set_agent_version(&state.db.pool, vm.node.id, version).await?;
        }
        let nonce = headers.get(NONCE_HEADER).and_then(|v| v.to_str().ok());
        let node_key = headers.get(NODE_KEY_HEADER).and_then(|v| v.to_str().ok());
        Ok::<_, ApiError>(issuance::issue(&state.issuer(), &vm, nonce, node_key, &source).await?)
    })
    .await
    .map_err(|_| {
        tracing::warn!(
            vm_id,
            deadline_ms = deadline.as_millis() as u64,
            "bundle request passed its deadline"
        );
        ApiError::Unavailable {
            retry_after_secs: 5,
        }
    })??;
    Ok(([(header::CONTENT_TYPE, "application/json")], envelope).into_response())
}

/// The VM a bootstrap request (IMDS and bootstrap tokens) proves to be, its own rate limit
/// charged; a refusal is audited with the source address.
async fn bootstrap_vm(
    state: &AppState,
    headers: &HeaderMap,
    vm_id: i64,
    source: &str,
) -> Result<issuance::Vm, ApiError> {
    let vm = match issuance::authenticate(&state.db, headers, vm_id).await? {
        Ok(vm) => vm,
        Err(refusal) => {
            return Err(issuance::refuse(&state.db, vm_id, refusal, source)
                .await
                .into());
        }
    };
    limit_vm(state, &vm)?;
    Ok(vm)
}

/// A phase report from the VM's agent.
#[utoipa::path(
    post, path = "/bootstrap/{vm_id}/status", request_body = StatusReport,
    params(("vm_id" = i64, Path)),
    responses(StatusAnswers),
    security(("imds_token" = [], "bootstrap_token" = [])),
)]
pub async fn status(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    ApiPath(vm_id): ApiPath<i64>,
    headers: HeaderMap,
    ApiJson(report): ApiJson<StatusReport>,
) -> Result<StatusCode, ApiError> {
    limit_source(&state, peer.ip())?;
    let source = peer.ip().to_string();
    let vm = bootstrap_vm(&state, &headers, vm_id, &source).await?;
    crate::health::heartbeat(&state.db, &vm.node, state.clock.unix()).await?;
    issuance::report::record(&state.reporter(), &vm, &report.as_report()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The path agents before the role-neutral one fetch from (workers too, despite its name):
/// an alias of `GET /bootstrap/{vm_id}`, served until the next bundle payload version.
#[utoipa::path(
    get, path = "/bootstrap/control-plane/{vm_id}",
    params(("vm_id" = i64, Path), ("X-Exk8s-Nonce" = String, Header, description = "16–64 URL-safe characters, echoed in the payload"), ("Accept" = Option<String>, Header, description = "the bundle formats the agent reads (application/vnd.exk8s.bundle.v2+json); absent: v2")),
    responses(BundleAnswers),
    security(("imds_token" = [], "bootstrap_token" = [])),
)]
#[deprecated = "an alias kept for agents baked before `GET /bootstrap/{vm_id}`"]
pub async fn bundle_alias(
    state: State<AppState>,
    peer: ConnectInfo<SocketAddr>,
    vm_id: ApiPath<i64>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    bundle(state, peer, vm_id, headers).await
}

/// An alias of `POST /bootstrap/{vm_id}/status` for agents baked before it, served until the
/// next bundle payload version.
#[utoipa::path(
    post, path = "/bootstrap/control-plane/{vm_id}/status", request_body = StatusReport,
    params(("vm_id" = i64, Path)),
    responses(StatusAnswers),
    security(("imds_token" = [], "bootstrap_token" = [])),
)]
#[deprecated = "an alias kept for agents baked before `POST /bootstrap/{vm_id}/status`"]
pub async fn status_alias(
    state: State<AppState>,
    peer: ConnectInfo<SocketAddr>,
    vm_id: ApiPath<i64>,
    headers: HeaderMap,
    report: ApiJson<StatusReport>,
) -> Result<StatusCode, ApiError> {
    status(state, peer, vm_id, headers, report).await
}

/// The public bundle-signing keys, in the agent's `.pub` format (active key first).
#[utoipa::path(get, path = "/bootstrap/keys", responses((status = 200, description = "one `ed25519 <base64> <comment>` line per key", content_type = "text/plain")))]
pub async fn keys(State(state): State<AppState>) -> Response {
    let mut text = format!(
        "{}\n",
        state.signer.pub_line("exk8s bundle signing key (active)")
    );
    for key in state.extra_trusted_keys.iter() {
        text.push_str(&exk8s_common::keyring::pub_line(
            key,
            "exk8s bundle signing key",
        ));
        text.push('\n');
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response()
}

/// Allows one more bundle for a node that finished (certificate renewal or repair).
#[utoipa::path(post, path = "/clusters/{id}/nodes/{vm_id}/rearm", params(("id" = i64, Path), ("vm_id" = i64, Path)), responses((status = 204, description = "re-armed"), (status = 404, body = ErrorBody)), security(("operator_token" = [])))]
pub async fn rearm(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath((id, vm_id)): ApiPath<(i64, i64)>,
) -> Result<StatusCode, ApiError> {
    db::clusters::get(&state.db.pool, operator.org_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    if !db::nodes::rearm(&state.db.pool, id, vm_id).await? {
        return Err(ApiError::NotFound);
    }
    tracing::info!(cluster_id = id, vm_id, principal = %operator.principal, "node re-armed for one more bundle");
    Ok(StatusCode::NO_CONTENT)
}
