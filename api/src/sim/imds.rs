//! The instance-metadata SIMULATOR of the dev stack: per VM under `/sim/imds/{vm_id}/`, the
//! same paths as the real service. It writes real `imds_tokens` rows and real bootstrap-scope
//! `api_tokens` rows, so the agent and the bootstrap endpoint work exactly as in production.
//!
//! * `GET|PUT token` → a session token (text), for a VM the compute simulator knows;
//! * `GET latest/identity/node-identity` → `{"node_id": <vm id>}`;
//! * `GET latest/identity/access-token` → `{"access_token": "<bootstrap token>"}`.
//!
//! The last two require the session token in `X-exc-imds-token`.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use super::ComputeSim;
use crate::compute::Compute;
use crate::db::{self, Db};
use crate::tokens::{self, Scope};

/// Session tokens live six hours; access tokens one hour.
const SESSION_TTL: i64 = 6 * 3600;
const ACCESS_TTL: i64 = 3600;

#[derive(Clone)]
struct Imds {
    db: Db,
    compute: ComputeSim,
}

pub fn router(db: Db, compute: ComputeSim) -> Router {
    Router::new()
        .route("/sim/imds/{vm_id}/token", get(session).put(session))
        .route(
            "/sim/imds/{vm_id}/latest/identity/node-identity",
            get(identity),
        )
        .route(
            "/sim/imds/{vm_id}/latest/identity/access-token",
            get(access_token),
        )
        .with_state(Imds { db, compute })
}

fn failed(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "IMDS simulator failure");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "metadata service unavailable\n",
    )
        .into_response()
}

/// The org a simulated VM belongs to (through its cluster tag), if the VM exists.
async fn org_of(imds: &Imds, vm_id: i64) -> Result<Option<i64>, Response> {
    let Some(vm) = imds.compute.get_vm(vm_id).await.map_err(failed)? else {
        return Ok(None);
    };
    let Some(cluster) = vm
        .tags
        .get("exk8s.io/cluster")
        .and_then(|c| c.parse::<i64>().ok())
    else {
        return Ok(None);
    };
    Ok(db::clusters::get_by_id(&imds.db.pool, cluster)
        .await
        .map_err(failed)?
        .map(|c| c.org_id))
}

async fn session(State(imds): State<Imds>, Path(vm_id): Path<i64>) -> Response {
    let org = match org_of(&imds, vm_id).await {
        Ok(Some(org)) => org,
        Ok(None) => return (StatusCode::NOT_FOUND, "no such instance\n").into_response(),
        Err(r) => return r,
    };
    let token = match tokens::generate("exk8s_imds") {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let now = db::now();
    if let Err(e) = db::tokens::insert_imds_token(
        &imds.db.pool,
        &tokens::hash(&token),
        vm_id,
        org,
        now,
        now + SESSION_TTL,
    )
    .await
    {
        return failed(e);
    }
    token.to_string().into_response()
}

/// The session's org when `X-exc-imds-token` is a live token of this VM.
async fn authorised(imds: &Imds, vm_id: i64, headers: &HeaderMap) -> Result<i64, Response> {
    let token = headers
        .get("x-exc-imds-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let session = db::tokens::find_imds_token(&imds.db.pool, &tokens::hash(token))
        .await
        .map_err(failed)?;
    match session {
        Some(s) if s.vm_id == vm_id && s.expires_at > db::now() => Ok(s.org_id),
        _ => Err((StatusCode::UNAUTHORIZED, "invalid session token\n").into_response()),
    }
}

async fn identity(
    State(imds): State<Imds>,
    Path(vm_id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    match authorised(&imds, vm_id, &headers).await {
        Ok(_) => Json(json!({ "node_id": vm_id })).into_response(),
        Err(r) => r,
    }
}

async fn access_token(
    State(imds): State<Imds>,
    Path(vm_id): Path<i64>,
    headers: HeaderMap,
) -> Response {
    let org = match authorised(&imds, vm_id, &headers).await {
        Ok(org) => org,
        Err(r) => return r,
    };
    let token = match tokens::generate("exk8s_bs") {
        Ok(t) => t,
        Err(e) => return failed(e),
    };
    let now = db::now();
    let principal = format!("vm-{vm_id}");
    let stored = db::tokens::insert_api_token(
        &imds.db.pool,
        &tokens::hash(&token),
        org,
        &principal,
        Scope::Bootstrap,
        now,
        now + ACCESS_TTL,
    )
    .await;
    match stored {
        Ok(_) => Json(json!({ "access_token": token.as_str() })).into_response(),
        Err(e) => failed(e),
    }
}
