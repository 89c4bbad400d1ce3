//! The extractors of a node's day-2 request, signed with its node key (the IMDS token as
//! second factor): the source's rate limit is charged first, then the request is
//! authenticated as `/nodes/{vm_id}/…`'s VM, then that VM's own rate limit is charged. A handler
//! that takes one works only with a VM that proved who it is.
//!
//! [`SignedNode`] reads the body whole (its signature covers the bytes); [`SignedUpload`] leaves
//! a streamed body unread (its signature covers the digest the node declares, which the handler
//! checks the body against as it comes).

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts as _, Request};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use exk8s_common::names::Sha256Digest;
use exk8s_common::node_auth::CONTENT_SHA256_HEADER;

use super::bootstrap::{limit_source, limit_vm};
use super::error::ApiError;
use super::extract::{ApiPath, MAX_BODY_BYTES};
use crate::app::AppState;
use crate::issuance::signed::{SignedBody, SignedRequest};
use crate::issuance::{self, Vm};

/// A signed node request read whole: the VM it proved to be, where it came from, its headers
/// and its body.
pub struct SignedNode {
    pub vm: Vm,
    pub peer: SocketAddr,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl FromRequest<AppState> for SignedNode {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let (peer, vm_id) = addressed(&mut parts, state).await?;
        let body = axum::body::to_bytes(body, MAX_BODY_BYTES)
            .await
            .map_err(|_| ApiError::PayloadTooLarge(MAX_BODY_BYTES))?;
        let vm = authenticate(state, peer, &parts, SignedBody::Bytes(&body), vm_id).await?;
        Ok(Self {
            vm,
            peer,
            headers: parts.headers,
            body,
        })
    }
}

/// A signed node request whose body streams: the VM, its headers, the digest it declared and
/// signed, and the body still unread.
pub struct SignedUpload {
    pub vm: Vm,
    pub headers: HeaderMap,
    pub declared: Sha256Digest,
    pub body: Body,
}

impl FromRequest<AppState> for SignedUpload {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, ApiError> {
        let (mut parts, body) = request.into_parts();
        let (peer, vm_id) = addressed(&mut parts, state).await?;
        let declared: Sha256Digest = parts
            .headers
            .get(CONTENT_SHA256_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|d| d.parse().ok())
            .ok_or_else(|| {
                ApiError::invalid(
                    CONTENT_SHA256_HEADER,
                    format!("{CONTENT_SHA256_HEADER} must be the body's SHA-256 in hex"),
                )
            })?;
        let vm = authenticate(state, peer, &parts, SignedBody::Declared(&declared), vm_id).await?;
        Ok(Self {
            vm,
            headers: parts.headers,
            declared,
            body,
        })
    }
}

/// The `vm_id` a node route names, and the peer that asks — its source's rate limit charged
/// first, before anything is read or verified.
async fn addressed(parts: &mut Parts, state: &AppState) -> Result<(SocketAddr, i64), ApiError> {
    #[derive(serde::Deserialize)]
    struct NodePath {
        vm_id: i64,
    }
    let ApiPath(NodePath { vm_id }) = ApiPath::<NodePath>::from_request_parts(parts, state).await?;
    let ConnectInfo(peer) = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .copied()
        .ok_or_else(|| ApiError::Internal("the server runs without the peer's address".into()))?;
    limit_source(state, peer.ip())?;
    Ok((peer, vm_id))
}

/// Authenticates the request as `vm_id`'s and charges that VM's rate limit; a refusal is
/// audited with the source address.
async fn authenticate(
    state: &AppState,
    peer: SocketAddr,
    parts: &Parts,
    body: SignedBody<'_>,
    vm_id: i64,
) -> Result<Vm, ApiError> {
    let request = SignedRequest {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        headers: &parts.headers,
        body,
    };
    // A stalled database answers 503 with `Retry-After` within the bootstrap deadline, never
    // a hanging agent (the bundle route bounds its own work by the same deadline after this).
    let authenticated = tokio::time::timeout(
        state.config.bootstrap_deadline,
        issuance::signed::authenticate(&state.db, &request, vm_id, state.clock.unix()),
    )
    .await
    .map_err(|_| ApiError::Unavailable {
        retry_after_secs: 5,
    })?;
    let vm = match authenticated? {
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
