//! The HTTP surface: the route table ([`router`]), thin handlers, errors and extractors, and
//! the operator console's pages ([`ui`]).

mod agent_format;
pub mod bootstrap;
pub mod certificates;
mod cluster_view;
pub mod clusters;
mod common_responses;
pub mod conditions;
pub mod credentials;
use common_responses::CommonResponses;
pub mod error;
pub mod events;
pub mod extract;
pub mod health;
pub mod health_policy;
mod idempotent;
pub mod kept;
pub mod membership;
pub mod nodes;
pub mod paging;
pub mod patch;
pub mod pools;
mod prefer;
#[cfg(test)]
mod reference;
pub mod restores;
pub mod sa_key;
pub mod server;
mod signed_node;
pub mod snapshots;
mod ui;
pub mod versions;

use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::get;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa_scalar::Servable as _;

use crate::app::AppState;

/// The OpenAPI document, generated from the handlers and types.
#[derive(OpenApi)]
#[openapi(
    info(title = "exk8s API", description = "Founds Kubernetes control planes and serves per-VM signed bootstrap bundles."),
    paths(
        clusters::create_cluster,
        clusters::list_clusters,
        clusters::get_cluster,
        clusters::get_kubeconfig,
        credentials::trust,
        credentials::mint,
        events::cluster_events,
        certificates::inventory,
        certificates::renew,
        certificates::rotate_ca,
        sa_key::rotate_sa_key,
        sa_key::get_sa_key,
        sa_key::put_sa_key,
        health_policy::get_health_policy,
        health_policy::put_health_policy,
        health_policy::get_pool_health_policy,
        health_policy::put_pool_health_policy,
        health_policy::delete_pool_health_policy,
        clusters::delete_cluster,
        kept::list_deleted_clusters,
        kept::get_deleted_cluster,
        kept::purge_deleted_cluster,
        patch::patch_cluster,
        membership::remove_member,
        membership::replace_member,
        pools::create_pool,
        pools::list_pools,
        pools::get_pool,
        pools::update_pool,
        pools::delete_pool,
        versions::kubernetes_versions,
        snapshots::create_snapshot,
        snapshots::get_schedule,
        snapshots::put_schedule,
        snapshots::list_snapshots,
        snapshots::get_snapshot,
        snapshots::delete_snapshot,
        snapshots::snapshot_content,
        snapshots::upload_snapshot,
        restores::start_restore,
        restores::get_restore,
        restores::acknowledge,
        restores::member_content,
        bootstrap::rearm,
        bootstrap::bundle,
        bootstrap::status,
        bootstrap::bundle_alias,
        bootstrap::status_alias,
        bootstrap::keys,
        nodes::start_rollout,
        nodes::generation,
        nodes::bundle,
        nodes::status,
        health::healthz,
        health::readyz,
        health::metrics,
    ),
    components(schemas(error::ErrorBody, error::ErrorDetail, exk8s_api_types::ChangeEvent, exk8s_api_types::StatusEvent)),
    modifiers(&SecuritySchemes, &CommonResponses),
)]
pub struct ApiDoc;

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "operator_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An operator-scope principal token"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "bootstrap_token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "A bootstrap-scope principal token (with the VM's IMDS token)",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "node_signature",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Header(
                utoipa::openapi::security::ApiKeyValue::with_description(
                    exk8s_common::node_auth::SIGNATURE_HEADER,
                    "ed25519 signature by the node key registered with the node's first bundle \
                     fetch (X-Exk8s-Node-Key), over `exk8s-node-request-v1`, method, path, \
                     X-Exk8s-Timestamp (±300 s), X-Exk8s-Nonce (never reused) and the body's \
                     SHA-256, one per line",
                ),
            )),
        );
        components.add_security_scheme(
            "imds_token",
            SecurityScheme::ApiKey(utoipa::openapi::security::ApiKey::Header(
                utoipa::openapi::security::ApiKeyValue::new(
                    exk8s_common::contract::IMDS_TOKEN_HEADER,
                ),
            )),
        );
    }
}

/// The route table: the API, its documentation and the console.
pub fn router(state: AppState) -> Router {
    let routes = api_routes()
        .merge(utoipa_scalar::Scalar::with_url("/docs", ApiDoc::openapi()))
        .merge(ui::router());
    layered(routes, state)
}

/// The API's routes alone, layered as [`router`] layers them: what the console's own calls go
/// through (`ui::client`), without building the documentation's OpenAPI document or the
/// console's routes at each call.
pub(crate) fn api_router(state: AppState) -> Router {
    layered(api_routes(), state)
}

/// The API's operations.
#[allow(
    deprecated,
    reason = "the old bootstrap paths are served as deprecated aliases on purpose"
)]
fn api_routes() -> Router<AppState> {
    Router::new()
        .route(
            "/clusters",
            get(clusters::list_clusters).post(clusters::create_cluster),
        )
        .route(
            "/clusters/{id}",
            get(clusters::get_cluster)
                .patch(patch::patch_cluster)
                .delete(clusters::delete_cluster),
        )
        .route("/clusters/{id}/kubeconfig", get(clusters::get_kubeconfig))
        .route("/clusters/{id}/trust", get(credentials::trust))
        .route(
            "/clusters/{id}/credentials",
            axum::routing::post(credentials::mint),
        )
        .route("/clusters/{id}/events", get(events::cluster_events))
        .route(
            "/clusters/{id}/node-pools",
            get(pools::list_pools).post(pools::create_pool),
        )
        .route(
            "/clusters/{id}/node-pools/{pool}",
            get(pools::get_pool)
                .patch(pools::update_pool)
                .delete(pools::delete_pool),
        )
        .route(
            "/clusters/{id}/nodes/{vm_id}/rearm",
            axum::routing::post(bootstrap::rearm),
        )
        .route(
            "/clusters/{id}/nodes/{vm_id}",
            axum::routing::delete(membership::remove_member),
        )
        .route(
            "/clusters/{id}/nodes/{vm_id}/replace",
            axum::routing::post(membership::replace_member),
        )
        .route("/bootstrap/{vm_id}", get(bootstrap::bundle))
        .route(
            "/bootstrap/{vm_id}/status",
            axum::routing::post(bootstrap::status),
        )
        .route(
            "/bootstrap/control-plane/{vm_id}",
            get(bootstrap::bundle_alias),
        )
        .route(
            "/bootstrap/control-plane/{vm_id}/status",
            axum::routing::post(bootstrap::status_alias),
        )
        .route("/bootstrap/keys", get(bootstrap::keys))
        .route(
            "/clusters/{id}/rollout",
            axum::routing::post(nodes::start_rollout),
        )
        .route("/clusters/{id}/certificates", get(certificates::inventory))
        .route(
            "/clusters/{id}/certificates/renew",
            axum::routing::post(certificates::renew),
        )
        .route(
            "/clusters/{id}/certificates/rotate-ca",
            axum::routing::post(certificates::rotate_ca),
        )
        .route(
            "/clusters/{id}/certificates/rotate-sa-key",
            axum::routing::post(sa_key::rotate_sa_key),
        )
        .route(
            "/clusters/{id}/service-account-key",
            get(sa_key::get_sa_key).put(sa_key::put_sa_key),
        )
        .route(
            "/clusters/{id}/health-policy",
            get(health_policy::get_health_policy).put(health_policy::put_health_policy),
        )
        .route(
            "/clusters/{id}/node-pools/{pool}/health-policy",
            get(health_policy::get_pool_health_policy)
                .put(health_policy::put_pool_health_policy)
                .delete(health_policy::delete_pool_health_policy),
        )
        .route("/deleted-clusters", get(kept::list_deleted_clusters))
        .route(
            "/deleted-clusters/{id}",
            get(kept::get_deleted_cluster).delete(kept::purge_deleted_cluster),
        )
        .route(
            "/clusters/{id}/snapshots",
            get(snapshots::list_snapshots).post(snapshots::create_snapshot),
        )
        .route(
            "/clusters/{id}/snapshots/schedule",
            get(snapshots::get_schedule).put(snapshots::put_schedule),
        )
        .route(
            "/clusters/{id}/snapshots/{sid}",
            get(snapshots::get_snapshot).delete(snapshots::delete_snapshot),
        )
        .route(
            "/clusters/{id}/snapshots/{sid}/content",
            get(snapshots::snapshot_content),
        )
        .route(
            "/nodes/{vm_id}/snapshots/{sid}",
            axum::routing::put(snapshots::upload_snapshot).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/clusters/{id}/restore",
            get(restores::get_restore).post(restores::start_restore),
        )
        .route(
            "/nodes/{vm_id}/restores/{rid}",
            axum::routing::put(restores::acknowledge),
        )
        .route(
            "/nodes/{vm_id}/snapshots/{sid}/content",
            get(restores::member_content),
        )
        .route("/nodes/{vm_id}/generation", get(nodes::generation))
        .route("/nodes/{vm_id}/bundle", get(nodes::bundle))
        .route("/nodes/{vm_id}/status", axum::routing::post(nodes::status))
        .route("/kubernetes-versions", get(versions::kubernetes_versions))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .route("/openapi.json", get(health::openapi))
}

/// `routes` with the layers every answer goes through: the body limit, metrics, tracing and
/// the request id.
fn layered(routes: Router<AppState>, state: AppState) -> Router {
    let request_id = axum::http::HeaderName::from_static("x-request-id");
    routes
        .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .layer(
            TraceLayer::new_for_http().make_span_with(|req: &Request| {
                let id = req.headers().get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
                tracing::info_span!("request", method = %req.method(), path = %req.uri().path(), request_id = %id)
            }),
        )
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

/// Records each request's route, status and latency.
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = method_label(request.method());
    let start = Instant::now();
    let response = next.run(request).await;
    state.metrics.observe(
        method,
        &route,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

/// A request method as a metrics label: the methods the API routes, and `other` for any other
/// token a client sends (each distinct token would otherwise add a series, before any
/// authentication).
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}
