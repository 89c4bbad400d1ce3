//! The change feed: one reader of `cluster_events` per process, whatever the number of event
//! streams, broadcasting each new change to the streams that follow its cluster; and the bounds on
//! those streams (per operator token and per process). A thousand idle streams cost one query
//! every [`POLL`], not a thousand.
//!
//! PostgreSQL hands out ids before commit, so a change may land below ids already read. The
//! reader keeps ids it delivered for [`LATE_COMMIT`] and reads again from below them, so a late
//! commit inside that window is still delivered, once.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;

use crate::db::{self, Db, events::EventRow};

/// How often the store is read for new changes while any stream listens.
pub const POLL: Duration = Duration::from_millis(500);
/// A change whose id was taken before a higher one's but committed after it is still delivered
/// if it lands within this long.
pub const LATE_COMMIT: Duration = Duration::from_secs(5);
/// Changes read at once.
const PAGE: i64 = 500;
/// Changes a slow stream may fall behind before it must catch up from the store.
const CHANNEL: usize = 4096;

/// What the feed broadcasts.
#[derive(Debug, Clone)]
pub enum Item {
    /// One change of one cluster.
    Change { cluster_id: i64, row: EventRow },
    /// A read of the store ended at this instant: every change committed before it (late
    /// commits within [`LATE_COMMIT`] aside) was sent. Streams compute statuses after this.
    Read(Instant),
}

/// How many streams may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Per operator token (0: unlimited).
    pub per_token: usize,
    /// In this process (0: unlimited).
    pub per_process: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            per_token: 100,
            per_process: 10_000,
        }
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("this token already has {open} event streams open, the most one token may hold")]
    PerToken { open: usize },
    #[error("this server already serves {open} event streams, the most it serves at once")]
    PerProcess { open: usize },
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    per_token: HashMap<i64, usize>,
}

/// A cluster's status as computed for its streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The `status` event's data.
    pub json: Arc<str>,
    /// The cluster's newest change id, read after the status: every change the status reflects
    /// has an id at most this. A stream sends the status once it has sent that change.
    pub reflects: i64,
}

/// A cluster's status as streams last had it computed: when the computation began, and the
/// status (`None`: the cluster is gone).
type Status = Option<(Instant, Option<ClusterStatus>)>;

/// Statuses kept before those no stream waits on are dropped.
const STATUSES_KEPT: usize = 10_000;

/// The process's change feed. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Feed {
    db: Db,
    sender: broadcast::Sender<Arc<Item>>,
    limits: StreamLimits,
    open: Arc<Mutex<Open>>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Per cluster: computed once for every stream that asks at about the same time.
    statuses: Mutex<HashMap<i64, Arc<tokio::sync::Mutex<Status>>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Counters and a handle: nothing a panic elsewhere could leave half-written.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A stream's place on the feed; dropping it frees its place under the limits.
#[derive(Debug)]
pub struct Subscription {
    pub changes: broadcast::Receiver<Arc<Item>>,
    token_id: i64,
    open: Arc<Mutex<Open>>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut open = lock(&self.open);
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_token.get_mut(&self.token_id) {
            *n -= 1;
            if *n == 0 {
                open.per_token.remove(&self.token_id);
            }
        }
    }
}

impl Feed {
    pub fn new(db: Db, limits: StreamLimits) -> Self {
        Self {
            db,
            sender: broadcast::channel(CHANNEL).0,
            limits,
            open: Arc::default(),
            reader: Mutex::new(None),
            statuses: Mutex::default(),
        }
    }

    /// Cluster `cluster_id`'s status as computed no earlier than `fresh_since`: the one
    /// computation of it that began since then, shared by every stream that asks, or a new one
    /// by `compute` (`None` when the cluster is gone).
    pub async fn status<F, Fut, E>(
        &self,
        cluster_id: i64,
        fresh_since: Instant,
        compute: F,
    ) -> Result<Option<ClusterStatus>, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<Option<ClusterStatus>, E>>,
    {
        let slot = {
            let mut statuses = lock(&self.statuses);
            if statuses.len() >= STATUSES_KEPT {
                statuses.retain(|_, slot| Arc::strong_count(slot) > 1);
            }
            Arc::clone(statuses.entry(cluster_id).or_default())
        };
        let mut slot = slot.lock().await;
        if let Some((began, json)) = &*slot {
            if *began >= fresh_since {
                return Ok(json.clone());
            }
        }
        let began = Instant::now();
        let status = compute().await?;
        *slot = Some((began, status.clone()));
        Ok(status)
    }

    /// A place for one more stream of operator token `token_id`, or why not. Starts the reader
    /// on first use (inside a tokio runtime).
    pub fn subscribe(&self, token_id: i64) -> Result<Subscription, Refused> {
        {
            let mut open = lock(&self.open);
            let of_token = open.per_token.get(&token_id).copied().unwrap_or(0);
            if self.limits.per_token != 0 && of_token >= self.limits.per_token {
                return Err(Refused::PerToken { open: of_token });
            }
            if self.limits.per_process != 0 && open.total >= self.limits.per_process {
                return Err(Refused::PerProcess { open: open.total });
            }
            open.total += 1;
            *open.per_token.entry(token_id).or_default() += 1;
        }
        let changes = self.sender.subscribe();
        let mut reader = lock(&self.reader);
        if reader.as_ref().is_none_or(|r| r.is_finished()) {
            *reader = Some(tokio::spawn(read(self.db.clone(), self.sender.clone())));
        }
        Ok(Subscription {
            changes,
            token_id,
            open: Arc::clone(&self.open),
        })
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(reader) = lock(&self.reader).take() {
            reader.abort();
        }
    }
}

/// The reader: every [`POLL`] while anyone listens, the changes after the floor, each sent once.
async fn read(db: Db, sender: broadcast::Sender<Arc<Item>>) {
    let mut window = Window::default();
    // Only changes from now on: a stream reads what came before from the store itself.
    loop {
        match db::events::last_id(&db.pool).await {
            Ok(last) => {
                window.floor = last;
                break;
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "change feed: cannot read the last change");
                tokio::time::sleep(POLL).await;
            }
        }
    }
    loop {
        tokio::time::sleep(POLL).await;
        if sender.receiver_count() == 0 {
            continue;
        }
        window.age();
        loop {
            let rows = match db::events::after_all(&db.pool, window.floor, PAGE).await {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "change feed: cannot read changes");
                    break;
                }
            };
            let read_at = Instant::now();
            let full = rows.len() as i64 == PAGE;
            let mut newest = window.floor;
            for (cluster_id, row) in rows {
                newest = newest.max(row.id);
                if window.take(row.id) {
                    // No receiver is not an error: the next poll is skipped.
                    let _ = sender.send(Arc::new(Item::Change { cluster_id, row }));
                }
            }
            if !full {
                let _ = sender.send(Arc::new(Item::Read(read_at)));
                break;
            }
            // A full page: what it held is delivered; read on above it.
            window.advance_to(newest);
        }
    }
}

/// Which ids were delivered lately (late commits below them are still taken) and the floor
/// below which nothing is read again.
#[derive(Debug, Default)]
struct Window {
    floor: i64,
    delivered: VecDeque<(Instant, i64)>,
    seen: BTreeSet<i64>,
}

impl Window {
    /// True the first time `id` comes.
    fn take(&mut self, id: i64) -> bool {
        if id <= self.floor || !self.seen.insert(id) {
            return false;
        }
        self.delivered.push_back((Instant::now(), id));
        true
    }

    /// Moves the floor past ids delivered longer than [`LATE_COMMIT`] ago.
    fn age(&mut self) {
        while let Some((at, id)) = self.delivered.front().copied() {
            if at.elapsed() < LATE_COMMIT {
                break;
            }
            self.delivered.pop_front();
            self.seen.remove(&id);
            self.floor = self.floor.max(id);
        }
    }

    /// After a full page: the floor moves to `id` at once (a backlog that large is not read
    /// twice), forgetting what lies below it.
    fn advance_to(&mut self, id: i64) {
        self.floor = self.floor.max(id);
        self.delivered.retain(|(_, d)| *d > id);
        self.seen = self.seen.split_off(&(id + 1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_id_is_taken_once_and_late_ones_within_the_window() {
        let mut w = Window::default();
        assert!(w.take(3));
        assert!(!w.take(3));
        // 2 committed after 3 was read: still delivered.
        assert!(w.take(2));
        w.advance_to(3);
        assert!(!w.take(1));
        assert!(w.take(4));
    }
}
