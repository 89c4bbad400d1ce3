//! `GET /clusters/{id}/events`: the cluster's changes as Server-Sent Events. Every stored change
//! (`cluster`: a phase; `node`: a node added; `report`: a node's report) carries its id, so a
//! client that reconnects with `Last-Event-ID` gets what it missed and nothing twice; a
//! `status` event (readiness, replicas, conditions) comes on connecting and whenever it
//! changes. The stream ends with `deleted` when the cluster is gone, and ends (for the client
//! to resume elsewhere) when this server drains.

use std::collections::{BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Serialize;
use utoipa::ToSchema;

use super::clusters::ClusterView;
use super::conditions::Condition;
use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use crate::app::AppState;
use crate::db::{self, events::Change, phase::ClusterPhase};

/// How often the store is read for new changes.
const POLL: Duration = Duration::from_millis(500);
/// How often `status` is recomputed when no change arrived (conditions also move with time).
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// Changes read at once.
const PAGE: i64 = 200;
/// A change whose id was taken by a transaction that commits later than a higher one is still
/// delivered if it lands within this long (PostgreSQL hands out ids before commit).
const LATE_COMMIT: Duration = Duration::from_secs(5);

/// The data of a `cluster`, `node` or `report` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChangeEvent {
    /// Unix seconds.
    pub at: i64,
    /// A cluster phase (`cluster`), or a node's phase as `GET /clusters/{id}` shows it.
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// A failure's message, or the text of a node's report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The data of a `status` event.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct StatusEvent {
    pub phase: ClusterPhase,
    pub ready: bool,
    pub initialized: bool,
    pub replicas: i64,
    pub ready_replicas: i64,
    pub up_to_date_replicas: i64,
    pub conditions: Vec<Condition>,
}

impl From<&ClusterView> for StatusEvent {
    fn from(v: &ClusterView) -> Self {
        Self {
            phase: v.phase,
            ready: v.ready,
            initialized: v.initialized,
            replicas: v.replicas,
            ready_replicas: v.ready_replicas,
            up_to_date_replicas: v.up_to_date_replicas,
            conditions: v.conditions.clone(),
        }
    }
}

/// The cluster's changes as they happen (`text/event-stream`).
#[utoipa::path(
    get, path = "/clusters/{id}/events",
    params(
        ("id" = i64, Path),
        ("Last-Event-ID" = Option<i64>, Header, description = "resume after this event"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", description = "events `cluster`, `node`, `report` (data: ChangeEvent, with an `id`), `status` (data: StatusEvent) and `deleted`"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
    ),
    security(("operator_token" = [])),
)]
pub async fn cluster_events(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(id): ApiPath<i64>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let after = last_event_id(&headers)?;
    db::clusters::get(&state.db.pool, operator.org_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let watch = Watch {
        state,
        org_id: operator.org_id,
        id,
        floor: after,
        delivered: VecDeque::new(),
        seen: BTreeSet::new(),
        queued: VecDeque::new(),
        status: None,
        status_at: None,
        ended: false,
    };
    let stream = futures_util::stream::unfold(watch, |mut watch| async move {
        let event = watch.next().await?;
        Some((Ok(event), watch))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

fn last_event_id(headers: &HeaderMap) -> Result<i64, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(0);
    };
    value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .filter(|v| *v >= 0)
        .ok_or_else(|| {
            ApiError::invalid(
                "Last-Event-ID",
                "Last-Event-ID must be the id of an event this stream sent",
            )
        })
}

/// One client's place in the stream.
struct Watch {
    state: AppState,
    org_id: i64,
    id: i64,
    /// Changes up to this id are delivered (or were before the client reconnected).
    floor: i64,
    /// Ids delivered lately, oldest first, with when: the floor moves past them once no
    /// earlier id can still commit.
    delivered: VecDeque<(Instant, i64)>,
    seen: BTreeSet<i64>,
    queued: VecDeque<Event>,
    status: Option<StatusEvent>,
    status_at: Option<Instant>,
    ended: bool,
}

impl Watch {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            if self.ended || self.state.draining.load(Ordering::Relaxed) {
                return None;
            }
            let changed = self.read_changes().await;
            if changed || self.status_at.is_none_or(|at| at.elapsed() >= STATUS_EVERY) {
                self.read_status().await;
            }
            if self.queued.is_empty() && !self.ended {
                tokio::time::sleep(POLL).await;
            }
        }
    }

    /// Queues the changes stored since the last read; true when there were some.
    async fn read_changes(&mut self) -> bool {
        while let Some((at, id)) = self.delivered.front().copied() {
            if at.elapsed() < LATE_COMMIT {
                break;
            }
            self.delivered.pop_front();
            self.seen.remove(&id);
            self.floor = self.floor.max(id);
        }
        let rows = match db::events::after(&self.state.db.pool, self.id, self.floor, PAGE).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(cluster_id = self.id, error = %crate::error_chain(&e), "events: cannot read changes");
                return false;
            }
        };
        let mut any = false;
        for row in rows {
            if !self.seen.insert(row.id) {
                continue;
            }
            self.delivered.push_back((Instant::now(), row.id));
            any = true;
            let (kind, data) = describe(row.at, row.change);
            let event = Event::default()
                .id(row.id.to_string())
                .event(kind)
                .json_data(data);
            match event {
                Ok(event) => self.queued.push_back(event),
                Err(e) => {
                    tracing::warn!(cluster_id = self.id, error = %e, "events: cannot encode a change")
                }
            }
        }
        any
    }

    /// Queues `status` when it differs from the last one sent, or `deleted` when the cluster is
    /// gone.
    async fn read_status(&mut self) {
        self.status_at = Some(Instant::now());
        let row = match db::clusters::get(&self.state.db.pool, self.org_id, self.id).await {
            Ok(Some(row)) => row,
            Ok(None) => {
                self.queued
                    .push_back(Event::default().event("deleted").data("{}"));
                self.ended = true;
                return;
            }
            Err(e) => {
                tracing::warn!(cluster_id = self.id, error = %crate::error_chain(&e), "events: cannot read the cluster");
                return;
            }
        };
        let view = match super::cluster_view::view(&self.state, row).await {
            Ok(view) => view,
            Err(e) => {
                tracing::warn!(cluster_id = self.id, error = %e, "events: cannot read the cluster's status");
                return;
            }
        };
        let status = StatusEvent::from(&view);
        if self.status.as_ref() == Some(&status) {
            return;
        }
        if let Ok(event) = Event::default().event("status").json_data(&status) {
            self.queued.push_back(event);
        }
        self.status = Some(status);
    }
}

fn describe(at: i64, change: Change) -> (&'static str, ChangeEvent) {
    let event = |phase: String| ChangeEvent {
        at,
        phase,
        vm_id: None,
        error_reason: None,
        message: None,
    };
    match change {
        Change::Cluster {
            phase,
            reason,
            message,
        } => (
            "cluster",
            ChangeEvent {
                error_reason: reason,
                message,
                ..event(phase.to_string())
            },
        ),
        Change::Node { vm_id, phase } => (
            "node",
            ChangeEvent {
                vm_id: Some(vm_id),
                ..event(phase.to_string())
            },
        ),
        Change::Report {
            vm_id,
            phase,
            message,
        } => (
            "report",
            ChangeEvent {
                vm_id: Some(vm_id),
                message: Some(message).filter(|m| !m.is_empty()),
                ..event(phase.to_string())
            },
        ),
    }
}
