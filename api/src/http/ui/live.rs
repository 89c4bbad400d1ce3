//! `/ui/events`: what keeps the clusters list live — a `changed` event (its data the cluster's
//! id) whenever one of the operator's org's clusters records a change (founded, a phase, a
//! node, a report, a deletion's start, ...), read from the process's change feed
//! ([`crate::feed`]) as the API's cluster streams are. Bounded like them (the token's and the
//! process's stream limits), it ends when the token is revoked or expires, at the server's
//! stream lifetime, and when the server drains; the page's script then opens it again.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast::error::RecvError;

use super::render::error_page;
use super::session::Console;
use crate::app::AppState;
use crate::db;
use crate::feed::{Item, Subscription};
use crate::http::error::ApiError;

/// The org's stream of changed clusters.
pub(super) async fn org_events(State(state): State<AppState>, console: Console) -> Response {
    let operator = console.operator;
    let subscription = match state.feed.subscribe(operator.token_id) {
        Ok(subscription) => subscription,
        Err(refused) => {
            let e = ApiError::TooManyStreams {
                message: refused.to_string(),
                retry_after_secs: 30,
            };
            return error_page(Some(&operator.principal), &e);
        }
    };
    let now = Instant::now();
    let follow = Follow {
        org_id: operator.org_id,
        token_id: operator.token_id,
        recheck: state.config.event_stream_token_recheck,
        lifetime: state.config.event_stream_lifetime,
        state,
        subscription,
        ours: HashMap::new(),
        opened: now,
        token_checked: now,
    };
    let stream = futures_util::stream::unfold(follow, |mut follow| async move {
        let event = follow.next().await?;
        Some((Ok::<_, Infallible>(event), follow))
    });
    (
        StatusCode::OK,
        Sse::new(stream).keep_alive(KeepAlive::default()),
    )
        .into_response()
}

/// One list page's place on the feed.
struct Follow {
    state: AppState,
    org_id: i64,
    token_id: i64,
    recheck: Duration,
    lifetime: Duration,
    subscription: Subscription,
    /// Whether each cluster seen on the feed is the org's (asked of the store once).
    ours: HashMap<i64, bool>,
    opened: Instant,
    token_checked: Instant,
}

impl Follow {
    /// The next `changed` event; `None` ends the stream.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if !self.still_open().await {
                return None;
            }
            let received = tokio::select! {
                received = self.subscription.changes.recv() => received,
                () = tokio::time::sleep(self.recheck) => continue,
            };
            let cluster_id = match received.as_deref() {
                Ok(Item::Change { cluster_id, .. }) => *cluster_id,
                Ok(Item::Read(_)) => continue,
                // Fallen behind: something may have changed; the page reads itself again.
                Err(RecvError::Lagged(_)) => return Some(changed("")),
                Err(RecvError::Closed) => return None,
            };
            if self.is_ours(cluster_id).await {
                return Some(changed(&cluster_id.to_string()));
            }
        }
    }

    async fn is_ours(&mut self, cluster_id: i64) -> bool {
        if let Some(known) = self.ours.get(&cluster_id) {
            return *known;
        }
        match db::clusters::get(&self.state.db.pool, self.org_id, cluster_id).await {
            Ok(found) => *self.ours.entry(cluster_id).or_insert(found.is_some()),
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "console: cannot tell whose cluster changed");
                // Told as a change: a spare reading of the list costs less than a missed one.
                true
            }
        }
    }

    /// False once the server drains, the stream outlived its lifetime, or (checked every
    /// `recheck`) its token was revoked or expired.
    async fn still_open(&mut self) -> bool {
        if self.state.draining.load(Ordering::Relaxed) || self.opened.elapsed() >= self.lifetime {
            return false;
        }
        if self.token_checked.elapsed() >= self.recheck {
            self.token_checked = Instant::now();
            match db::tokens::api_token_valid(&self.state.db.pool, self.token_id, db::now()).await {
                Ok(valid) => return valid,
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "console: cannot check a stream's token");
                }
            }
        }
        true
    }
}

fn changed(data: &str) -> Event {
    Event::default().event("changed").data(data)
}
