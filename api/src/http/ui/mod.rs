//! The operator console under `/ui`: server-rendered pages (minijinja templates compiled into
//! the binary, HTML-escaped; one stylesheet, and one small script that keeps a cluster's page
//! following its event stream — the page works without it), authenticated by the operator's own
//! token kept in an `HttpOnly`, `SameSite=Strict` cookie ([`session`]), so it sees exactly what
//! the token's org sees through the API. Every page is answered with a strict
//! Content-Security-Policy (nothing but this origin's stylesheet and script loads, and only
//! this origin is fetched from; forms post only here; no framing) and is never cached. Its
//! actions ([`actions`]) are forms keyed to their session that become the API's own requests
//! ([`client`]).

mod actions;
mod client;
mod forms;
mod live;
mod pages;
mod render;
mod session;
mod timeline;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::{get, post};

use crate::app::AppState;

/// What every console response carries.
const CSP: &str = "default-src 'none'; style-src 'self'; script-src 'self'; \
                   connect-src 'self'; img-src 'self'; form-action 'self'; \
                   frame-ancestors 'none'; base-uri 'none'";

/// The console's routes.
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(pages::home))
        .route("/ui/login", get(pages::login_page).post(session::login))
        .route("/ui/logout", post(session::logout))
        .route("/ui/clusters", get(pages::clusters).post(actions::found))
        .route("/ui/clusters/new", get(actions::found_page))
        .route("/ui/events", get(live::org_events))
        .route("/ui/clusters/{id}", get(pages::cluster))
        .route("/ui/clusters/{id}/events", get(pages::cluster_events))
        .route(
            "/ui/clusters/{id}/certificates",
            get(timeline::certificates),
        )
        .route(
            "/ui/clusters/{id}/actions/{action}",
            get(actions::action_page).post(actions::act),
        )
        .route("/ui/style.css", get(pages::style))
        .route("/ui/live.js", get(pages::live_script))
        .layer(axum::middleware::map_response(secure))
}

async fn secure(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        // Not `no-referrer`: with it a browser names no origin on the console's own form posts
        // (`Origin: null`), which the cross-site check must refuse.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}
