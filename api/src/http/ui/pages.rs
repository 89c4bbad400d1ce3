//! The console's pages: the handlers that fill its templates ([`super::render`]) from the same
//! views the API answers.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::context;

use super::client::{self, Call};
use super::render::{error_page, page};
use super::session::Console;
use crate::app::AppState;
use crate::db;
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;
use exk8s_api_types::{RestoreView, SnapshotView};

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

/// How many of a cluster's latest changes its page lists.
const CHANGES: i64 = 25;

/// One change as the cluster's page lists it: the stream's event, its kind, and when.
#[derive(Debug, serde::Serialize)]
struct Listed {
    kind: &'static str,
    at: String,
    event: exk8s_api_types::ChangeEvent,
}

/// How many of a cluster's latest snapshots its page lists.
const SNAPSHOTS: usize = 10;

/// One snapshot as the cluster's page lists it.
#[derive(Debug, serde::Serialize)]
struct ListedSnapshot {
    #[serde(flatten)]
    snapshot: SnapshotView,
    asked: String,
}

/// A cluster's latest restore as its page shows it: the API's view, and when it started and
/// last moved.
#[derive(Debug, serde::Serialize)]
struct ShownRestore {
    #[serde(flatten)]
    restore: RestoreView,
    started: String,
    updated: String,
}

/// One cluster: its conditions, nodes, health policy, worker pools, the upgrades offered, latest
/// snapshots, latest restore and latest changes; another org's is not found.
pub(super) async fn cluster(
    State(state): State<AppState>,
    console: Console,
    ApiPath(id): ApiPath<i64>,
) -> Response {
    let principal = console.operator.principal.as_str();
    let shown = async {
        let row = console.cluster(&state, id).await?;
        let changes: Vec<Listed> = db::events::latest(&state.db.pool, id, CHANGES)
            .await?
            .into_iter()
            .filter_map(|e| crate::http::events::describe(e.at, e.change))
            .map(|(kind, event)| Listed {
                kind,
                at: crate::http::conditions::rfc3339(event.at),
                event,
            })
            .collect();
        // The page's stream starts after the last change it shows.
        let last_event = db::events::last_of(&state.db.pool, id).await?;
        let view = crate::http::cluster_view::view(&state, row).await?;
        let snapshots = client::call(
            &state,
            &console,
            Call::get(format!("/clusters/{id}/snapshots")),
        )
        .await
        .json::<Vec<SnapshotView>>()?
        .into_iter()
        .take(SNAPSHOTS)
        .map(|s| ListedSnapshot {
            asked: crate::http::conditions::rfc3339(s.requested_at),
            snapshot: s,
        })
        .collect::<Vec<_>>();
        // The cluster is the operator's (read above): not found here is "never restored".
        let restore = client::call(
            &state,
            &console,
            Call::get(format!("/clusters/{id}/restore")),
        )
        .await;
        let restore = match restore.status {
            StatusCode::NOT_FOUND => None,
            _ => {
                let r = restore.json::<RestoreView>()?;
                Some(ShownRestore {
                    started: crate::http::conditions::rfc3339(r.started_at),
                    updated: crate::http::conditions::rfc3339(r.updated_at),
                    restore: r,
                })
            }
        };
        let upgrades = super::actions::upgrade_choices(&state, &console, id).await?;
        Ok::<_, ApiError>((view, changes, last_event, snapshots, restore, upgrades))
    };
    match shown.await {
        Ok((c, changes, last_event, snapshots, restore, upgrades)) => page(
            StatusCode::OK,
            "cluster.html",
            context! { principal, c, changes, last_event, snapshots, restore, upgrades },
        ),
        Err(e) => error_page(Some(principal), &e),
    }
}

/// Where a page's stream starts: after the last change the page showed (`?after=`).
#[derive(Debug, serde::Deserialize)]
pub(super) struct Since {
    after: Option<i64>,
}

/// The cluster's event stream for its page's script, as `GET /clusters/{id}/events` gives it
/// to the operator's token: after the change `?after=` names (the last the page showed), or
/// after `Last-Event-ID` when the browser reconnects.
pub(super) async fn cluster_events(
    State(state): State<AppState>,
    console: Console,
    ApiPath(id): ApiPath<i64>,
    Query(since): Query<Since>,
    headers: HeaderMap,
) -> Response {
    let principal = console.operator.principal.clone();
    let opened = async {
        let after = match since.after {
            Some(after) if !headers.contains_key("last-event-id") => {
                if after < 0 {
                    return Err(ApiError::invalid(
                        "after",
                        "after must be the id of a change the page showed",
                    ));
                }
                after
            }
            _ => crate::http::events::last_event_id(&headers)?,
        };
        crate::http::events::open(state, console.operator, id, after).await
    };
    match opened.await {
        Ok(stream) => stream.into_response(),
        Err(e) => error_page(Some(&principal), &e),
    }
}
