//! The console's pages: the handlers that fill its templates ([`super::render`]) from the same
//! views the API answers.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::context;

use super::render::{error_page, page};
use super::session::Console;
use crate::app::AppState;
use crate::db;
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;

pub(super) async fn home() -> Redirect {
    Redirect::to("/ui/clusters")
}

pub(super) async fn login_page() -> Response {
    page(
        StatusCode::OK,
        "login.html",
        context! { principal => (), error => () },
    )
}

pub(super) async fn live_script() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("templates/live.js"),
    )
        .into_response()
}

pub(super) async fn style() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("templates/style.css"),
    )
        .into_response()
}

/// The most clusters the list shows (the API's largest page).
const SHOWN: i64 = 500;

/// The org's clusters, oldest first (at most [`SHOWN`]).
pub(super) async fn clusters(State(state): State<AppState>, console: Console) -> Response {
    let principal = console.operator.principal.as_str();
    let listed = async {
        let rows =
            db::clusters::list_page(&state.db.pool, console.operator.org_id, 0, SHOWN).await?;
        crate::http::cluster_view::views(&state, rows).await
    };
    match listed.await {
        Ok(clusters) => page(
            StatusCode::OK,
            "clusters.html",
            context! { principal, clusters },
        ),
        Err(e) => error_page(Some(principal), &e),
    }
}

/// One cluster: its conditions and nodes; another org's is not found.
pub(super) async fn cluster(
    State(state): State<AppState>,
    console: Console,
    ApiPath(id): ApiPath<i64>,
) -> Response {
    let principal = console.operator.principal.as_str();
    let shown = async {
        let row = db::clusters::get(&state.db.pool, console.operator.org_id, id)
            .await?
            .ok_or(ApiError::NotFound)?;
        crate::http::cluster_view::view(&state, row).await
    };
    match shown.await {
        Ok(c) => page(StatusCode::OK, "cluster.html", context! { principal, c }),
        Err(e) => error_page(Some(principal), &e),
    }
}

/// The cluster's event stream for its page's script, as `GET /clusters/{id}/events` gives it
/// to the operator's token (resuming after `Last-Event-ID`, which the browser sends when it
/// reconnects).
pub(super) async fn cluster_events(
    State(state): State<AppState>,
    console: Console,
    ApiPath(id): ApiPath<i64>,
    headers: HeaderMap,
) -> Response {
    let principal = console.operator.principal.clone();
    let opened = async {
        let after = crate::http::events::last_event_id(&headers)?;
        crate::http::events::open(state, console.operator, id, after).await
    };
    match opened.await {
        Ok(stream) => stream.into_response(),
        Err(e) => error_page(Some(&principal), &e),
    }
}
