//! `GET /clusters/{id}/events`: the cluster's changes as Server-Sent Events. Every stored change
//! (`cluster`: a phase; `node`: a node added; `report`: a node's report; `remediation`: an
//! unhealthy machine being replaced; `snapshot`: a snapshot asked for, stored or failed;
//! `restore`: a restore entering each of its phases)
//! carries its id, so a
//! client that reconnects with `Last-Event-ID` gets what it missed and nothing twice; a
//! `status` event (readiness, replicas, conditions) comes on connecting and whenever it
//! changes, always after every change it reflects. The stream ends with `deleted` when the cluster is gone, and with `end` when its
//! token is revoked or expires, when it reaches the server's stream lifetime, or when this server
//! drains (the client resumes with `Last-Event-ID`).
//!
//! Streams share the process's change feed ([`crate::feed`]): one reader of the store for all
//! of them, and one status computation per cluster for all its streams. A stream reads the store
//! itself only to catch up (at connect, or after falling behind). Streams are bounded per token
//! and per process (429 with `Retry-After` beyond).

use std::collections::{BTreeSet, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use tokio::sync::broadcast;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiPath, Operator};
use crate::app::AppState;
use crate::db::{self, events::Change};
use crate::feed::ClusterStatus;
use exk8s_api_types::{ChangeEvent, StatusEvent, StreamEnd};

/// How often `status` is recomputed when no change arrived (conditions also move with time).
const STATUS_EVERY: Duration = Duration::from_secs(5);
/// Changes read at once from the store while a stream catches up.
const PAGE: i64 = 200;

/// The cluster's changes as they happen (`text/event-stream`).
#[utoipa::path(
    get, path = "/clusters/{id}/events",
    params(
        ("id" = i64, Path),
        ("Last-Event-ID" = Option<i64>, Header, description = "resume after this event (at most the cluster's last event id)"),
    ),
    responses(
        (status = 200, content_type = "text/event-stream", description = "events `cluster`, `node`, `removed`, `report`, `remediation`, `snapshot`, `restore`, `upgrade` (data: ChangeEvent, with an `id`; a kind the client does not know is for it to skip), `status` (data: StatusEvent), `deleted`, and `end` (data: StreamEnd) when the server ends the stream"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "too many streams open for this token or this server; retry after `Retry-After` seconds"),
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
    open(state, operator, id, after).await
}

/// `operator`'s stream of cluster `id`'s changes after event `after` (a request's
/// `Last-Event-ID`, [`last_event_id`]): the API's route, and the console's (its cookie names
/// the operator).
pub(super) async fn open(
    state: AppState,
    operator: Operator,
    id: i64,
    after: i64,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    db::clusters::get(&state.db.pool, operator.org_id, id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let last = db::events::last_of(&state.db.pool, id).await?;
    if after > last {
        return Err(ApiError::invalid(
            "Last-Event-ID",
            format!(
                "Last-Event-ID {after} is beyond cluster {id}'s last event ({last}): \
                 reconnect without it, or with an id this stream sent"
            ),
        ));
    }
    let subscription =
        state
            .feed
            .subscribe(operator.token_id)
            .map_err(|refused| ApiError::TooManyStreams {
                message: refused.to_string(),
                retry_after_secs: STREAM_RETRY_AFTER_SECS,
            })?;
    let now = Instant::now();
    let watch = Watch {
        config: StreamConfig::of(&state.config),
        state,
        subscription,
        org_id: operator.org_id,
        token_id: operator.token_id,
        id,
        after,
        cursor: Some(after),
        early: BTreeSet::new(),
        early_until: now,
        last_sent: after,
        changed: false,
        queued: VecDeque::new(),
        status: None,
        held: None,
        status_at: None,
        token_checked: now,
        opened: now,
        ended: false,
    };
    let stream = futures_util::stream::unfold(watch, |mut watch| async move {
        let event = watch.next().await?;
        Some((Ok(event), watch))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Seconds a refused stream is told to wait before trying again.
const STREAM_RETRY_AFTER_SECS: u64 = 30;

pub(super) fn last_event_id(headers: &HeaderMap) -> Result<i64, ApiError> {
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

/// The stream's periods, from the server's configuration.
#[derive(Debug, Clone, Copy)]
struct StreamConfig {
    token_recheck: Duration,
    lifetime: Duration,
}

impl StreamConfig {
    fn of(config: &crate::app::ApiConfig) -> Self {
        Self {
            token_recheck: config.event_stream_token_recheck,
            lifetime: config.event_stream_lifetime,
        }
    }
}

/// One client's place in the stream.
struct Watch {
    state: AppState,
    config: StreamConfig,
    subscription: crate::feed::Subscription,
    org_id: i64,
    token_id: i64,
    id: i64,
    /// The client's `Last-Event-ID`: nothing at or below it is sent.
    after: i64,
    /// Where the next read from the store starts, while the stream catches up from it (at
    /// connect, and after falling behind the feed); `None` once it follows the feed.
    cursor: Option<i64>,
    /// Ids sent from the store lately: the feed may bring them again until `early_until`.
    early: BTreeSet<i64>,
    early_until: Instant,
    /// The highest change id sent.
    last_sent: i64,
    /// Changes were queued since the last status: the next read's end brings a status.
    changed: bool,
    queued: VecDeque<Event>,
    /// The last `status` sent (its JSON).
    status: Option<std::sync::Arc<str>>,
    /// A status computed after a change this stream has not sent yet: it follows that change.
    held: Option<ClusterStatus>,
    status_at: Option<Instant>,
    token_checked: Instant,
    opened: Instant,
    ended: bool,
}

impl Watch {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(event) = self.queued.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            if let Some(reason) = self.why_end().await {
                self.ended = true;
                if let Ok(event) = Event::default().event("end").json_data(StreamEnd {
                    reason: reason.to_owned(),
                }) {
                    return Some(event);
                }
                return None;
            }
            if let Some(cursor) = self.cursor {
                self.catch_up(cursor).await;
                self.read_status(Instant::now()).await;
                continue;
            }
            let read = tokio::select! {
                received = self.subscription.changes.recv() => self.receive(received),
                () = tokio::time::sleep(STATUS_EVERY.min(self.config.token_recheck)) => None,
            };
            // After a read that brought this cluster's changes, the status follows them; now and
            // then it is recomputed anyway (conditions also move with time) — at the end of a
            // read too (the feed ends one every `POLL` while anyone listens), so the changes the
            // status reflects have mostly come; one that has not holds it back
            // ([`Self::read_status`]).
            match read {
                Some(read_at)
                    if self.changed
                        || self.status_at.is_none_or(|at| at.elapsed() >= STATUS_EVERY) =>
                {
                    self.changed = false;
                    self.read_status(read_at).await;
                }
                _ => {}
            }
        }
    }

    /// Why the stream must end now, if it must: the server drains, the stream outlived its
    /// lifetime, or (checked every `token_recheck`) its token was revoked or expired.
    async fn why_end(&mut self) -> Option<&'static str> {
        if self.state.draining.load(Ordering::Relaxed) {
            return Some("draining");
        }
        if self.opened.elapsed() >= self.config.lifetime {
            return Some("lifetime");
        }
        if self.token_checked.elapsed() >= self.config.token_recheck {
            self.token_checked = Instant::now();
            match db::tokens::api_token_valid(&self.state.db.pool, self.token_id, db::now()).await {
                Ok(true) => {}
                Ok(false) => return Some("token"),
                Err(e) => {
                    tracing::warn!(cluster_id = self.id, error = %crate::error_chain(&e), "events: cannot check the stream's token");
                }
            }
        }
        None
    }

    /// Takes one item from the feed: queues a change when it is this cluster's and new to the
    /// client; returns when the store was read, at the end of a read. Falling behind the feed
    /// sends the stream back to the store.
    fn receive(
        &mut self,
        received: Result<std::sync::Arc<crate::feed::Item>, broadcast::error::RecvError>,
    ) -> Option<Instant> {
        match received.as_deref() {
            Ok(crate::feed::Item::Read(at)) => Some(*at),
            Ok(crate::feed::Item::Change { cluster_id, row }) => {
                if *cluster_id != self.id || row.id <= self.after {
                    return None;
                }
                if Instant::now() < self.early_until {
                    if self.early.contains(&row.id) {
                        return None;
                    }
                } else {
                    self.early.clear();
                }
                self.queue(row);
                self.changed = true;
                None
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                let missed = *missed;
                tracing::debug!(
                    cluster_id = self.id,
                    missed,
                    "events: a slow stream catches up from the store"
                );
                self.cursor = Some(self.last_sent);
                None
            }
            Err(broadcast::error::RecvError::Closed) => {
                self.ended = true;
                None
            }
        }
    }

    /// Reads a page of this cluster's changes after `cursor` from the store; the stream
    /// follows the feed once a page is short.
    async fn catch_up(&mut self, cursor: i64) {
        let rows = match db::events::after(&self.state.db.pool, self.id, cursor, PAGE).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(cluster_id = self.id, error = %crate::error_chain(&e), "events: cannot read changes");
                tokio::time::sleep(crate::feed::POLL).await;
                return;
            }
        };
        let full = rows.len() as i64 == PAGE;
        let mut last = cursor;
        for row in &rows {
            last = last.max(row.id);
            if self.early.insert(row.id) {
                self.queue(row);
            }
        }
        // The feed may bring these again until a late commit could no longer be read twice.
        self.early_until = Instant::now() + 2 * crate::feed::LATE_COMMIT + crate::feed::POLL;
        self.cursor = full.then_some(last);
    }

    fn queue(&mut self, row: &db::events::EventRow) {
        self.last_sent = self.last_sent.max(row.id);
        if let Some((kind, data)) = describe(row.at, row.change.clone()) {
            match Event::default()
                .id(row.id.to_string())
                .event(kind)
                .json_data(data)
            {
                Ok(event) => self.queued.push_back(event),
                Err(e) => {
                    tracing::warn!(cluster_id = self.id, error = %e, "events: cannot encode a change")
                }
            }
        }
        if self
            .held
            .as_ref()
            .is_some_and(|held| held.reflects <= self.last_sent)
            && let Some(held) = self.held.take()
        {
            self.send_status(held.json);
        }
    }

    /// Queues `status` when it differs from the last one sent, or `deleted` when the cluster is
    /// gone; the status is computed once for every stream of the cluster since `fresh_since`.
    /// A status that reflects a change not sent yet (committed after the read that ended at
    /// `fresh_since`, or beyond a page still to catch up) is held until that change is sent:
    /// a client never sees a status ahead of the changes it has. A status already held stays
    /// (a stream whose cluster changes without pause still gets statuses).
    async fn read_status(&mut self, fresh_since: Instant) {
        self.status_at = Some(Instant::now());
        let (state, org_id, id) = (self.state.clone(), self.org_id, self.id);
        let status = self
            .state
            .feed
            .status(id, fresh_since, || status_json(state, org_id, id))
            .await;
        let status = match status {
            Ok(Some(status)) => status,
            Ok(None) => {
                self.queued
                    .push_back(Event::default().event("deleted").data("{}"));
                self.ended = true;
                return;
            }
            Err(e) => {
                tracing::warn!(cluster_id = self.id, error = %e, "events: cannot read the cluster's status");
                return;
            }
        };
        if status.reflects > self.last_sent {
            self.held.get_or_insert(status);
            return;
        }
        self.held = None;
        self.send_status(status.json);
    }

    /// Queues `status` unless it is the last one sent.
    fn send_status(&mut self, json: std::sync::Arc<str>) {
        if self.status.as_ref() == Some(&json) {
            return;
        }
        self.queued
            .push_back(Event::default().event("status").data(&*json));
        self.status = Some(json);
    }
}

/// The cluster's `status` event, or `None` when the cluster is gone.
async fn status_json(
    state: AppState,
    org_id: i64,
    id: i64,
) -> Result<Option<ClusterStatus>, ApiError> {
    let Some(row) = db::clusters::get(&state.db.pool, org_id, id).await? else {
        return Ok(None);
    };
    let view = super::cluster_view::view(&state, row).await?;
    let json = serde_json::to_string(&StatusEvent::from(&view)).map_err(ApiError::internal)?;
    // Read after the view: a change it reflects was committed before this read, with its event.
    let reflects = db::events::last_of(&state.db.pool, id).await?;
    Ok(Some(ClusterStatus {
        json: json.into(),
        reflects,
    }))
}

/// The stream's event for a change (none for a kind this build does not know): its kind and
/// data, as the stream sends them and the console lists them.
pub(super) fn describe(at: i64, change: Change) -> Option<(&'static str, ChangeEvent)> {
    let event = |phase: String| ChangeEvent {
        at,
        phase,
        vm_id: None,
        snapshot_id: None,
        state: None,
        error_reason: None,
        message: None,
    };
    Some(match change {
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
        Change::Removed {
            vm_id,
            set,
            message,
        } => (
            "removed",
            ChangeEvent {
                vm_id: Some(vm_id),
                message: Some(message),
                ..event(set)
            },
        ),
        Change::Remediation {
            vm_id,
            set,
            finished,
            reason,
            message,
        } => (
            "remediation",
            ChangeEvent {
                vm_id: Some(vm_id),
                state: Some(if finished { "finished" } else { "started" }.to_owned()),
                error_reason: Some(reason),
                message: Some(message),
                ..event(set)
            },
        ),
        Change::Snapshot {
            snapshot_id,
            vm_id,
            state,
            reason,
            message,
        } => (
            "snapshot",
            ChangeEvent {
                vm_id,
                snapshot_id: Some(snapshot_id),
                error_reason: reason,
                message: Some(message).filter(|m| !m.is_empty()),
                ..event(state)
            },
        ),
        Change::Restore {
            snapshot_id,
            phase,
            reason,
            message,
        } => (
            "restore",
            ChangeEvent {
                snapshot_id: Some(snapshot_id),
                error_reason: reason,
                message: Some(message).filter(|m| !m.is_empty()),
                ..event(phase)
            },
        ),
        Change::Upgrade {
            step,
            vm_id,
            message,
        } => (
            "upgrade",
            ChangeEvent {
                vm_id,
                message: Some(message),
                ..event(step)
            },
        ),
        Change::Unknown { .. } => return None,
    })
}
