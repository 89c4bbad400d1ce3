//! Liveness, readiness, metrics and the OpenAPI document.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use utoipa::OpenApi as _;

use super::ApiDoc;
use super::error::ApiError;
use crate::app::AppState;

/// 200 while serving; 418 while draining for shutdown (load balancers take it out).
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "serving"), (status = 418, description = "draining")))]
pub async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    if state.draining.load(Ordering::SeqCst) {
        (StatusCode::IM_A_TEAPOT, "draining\n")
    } else {
        (StatusCode::OK, "ok\n")
    }
}

/// 200 when the database takes writes; 503 while it cannot (down, disk full, a commit failed
/// moments ago).
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "ready"), (status = 503, description = "the database cannot take writes", body = super::error::ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Result<&'static str, ApiError> {
    state.db.check_writable().await?;
    Ok("ok\n")
}

/// Prometheus text metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain")))]
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
        let mut text = state.metrics.render();
        crate::metrics::render_key_pool(&mut text, state.key_pool.stats());
        text
    })
}

pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
