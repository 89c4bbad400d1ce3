//! Leaf keys made ahead of demand for RSA clusters, so a cluster survives its own boot storm.
//!
//! Every bundle carries fresh leaf keys: eleven for a control-plane node, three for a worker.
//! An RSA-2048 key takes tens of milliseconds to make, so 32 VMs asking at once need more CPU
//! than two cores have inside one bootstrap deadline. The keys do not depend on the request —
//! only the certificates do — so the API makes them before they are asked for:
//!
//! - **Demand** comes from the database ([`refresh`], [`refresh_cluster`]): each RSA cluster
//!   that is being founded or runs wants the keys of the bundles its nodes will soon ask for
//!   (nodes not yet handed their desired generation). Founding, pool scaling and member
//!   additions refresh their cluster at once; the reconciler refreshes all on every pass, which
//!   also refills the pool after a restart.
//! - **One filler thread** makes the keys at the lowest CPU priority (nice 19), so it runs
//!   while the cores are otherwise idle and yields to every request.
//! - **A bundle** takes what is ready for its cluster ([`KeyPool::take`]) and makes the rest.
//!
//! Keys live only in this process's memory: never written to the database or to disk, never
//! logged, each used at most once and zeroized when used or dropped. The pool holds at most
//! `max` keys in all. ECDSA keys take microseconds and are never pooled.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::db::{self, DbError, keys::PendingBundles};
use crate::pki::{BundleCerts, KeyAlgorithm, LeafKey};
use sqlx::AnyPool;

/// Keys the pool holds in all, by default: a 32-node RSA storm takes about 120.
pub const DEFAULT_MAX_KEYS: usize = 2048;

/// What one cluster wants ready: keys of its algorithm, how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    pub algorithm: KeyAlgorithm,
    pub keys: usize,
}

/// The pool's counts, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Keys made and waiting.
    pub ready: usize,
    /// Keys the clusters want ready (ready ones included).
    pub wanted: usize,
    /// Keys the filler has made since start.
    pub made: u64,
    /// Keys bundles took from the pool since start.
    pub taken: u64,
}

/// The pool; cheap to clone. Its filler thread stops when the last clone is dropped.
#[derive(Clone)]
pub struct KeyPool {
    shared: Arc<Shared>,
    _owner: Arc<Owner>,
}

impl std::fmt::Debug for KeyPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPool")
            .field("max", &self.shared.max)
            .field("stats", &self.stats())
            .finish()
    }
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    max: usize,
    /// The filler thread's id, once it runs (its tests read its nice value).
    filler: std::sync::OnceLock<i32>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    clusters: HashMap<i64, Entry>,
    held: usize,
    stopped: bool,
    made: u64,
    taken: u64,
}

struct Entry {
    algorithm: KeyAlgorithm,
    wanted: usize,
    ready: Vec<LeafKey>,
}

impl State {
    /// Sets (or with `None` forgets) one cluster's demand; keys beyond it are dropped.
    fn set(&mut self, cluster_id: i64, demand: Option<Demand>) {
        let Some(demand) = demand.filter(|d| d.algorithm.is_rsa() && d.keys > 0) else {
            if let Some(gone) = self.clusters.remove(&cluster_id) {
                self.held -= gone.ready.len();
            }
            return;
        };
        let entry = self.clusters.entry(cluster_id).or_insert_with(|| Entry {
            algorithm: demand.algorithm,
            wanted: 0,
            ready: Vec::new(),
        });
        if entry.algorithm != demand.algorithm {
            self.held -= entry.ready.len();
            entry.ready.clear();
            entry.algorithm = demand.algorithm;
        }
        entry.wanted = demand.keys;
        if entry.ready.len() > demand.keys {
            self.held -= entry.ready.len() - demand.keys;
            entry.ready.truncate(demand.keys);
        }
    }

    /// A cluster short of keys, when the pool may hold more.
    fn short(&self, max: usize) -> Option<(i64, KeyAlgorithm)> {
        if self.held >= max {
            return None;
        }
        self.clusters
            .iter()
            .find(|(_, e)| e.ready.len() < e.wanted)
            .map(|(id, e)| (*id, e.algorithm))
    }
}

/// Stops the filler when the last [`KeyPool`] clone goes.
struct Owner(Arc<Shared>);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.lock().stopped = true;
        self.0.work.notify_all();
    }
}

impl KeyPool {
    /// A pool of at most `max` keys, its filler thread started.
    pub fn start(max: usize) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            max,
            filler: std::sync::OnceLock::new(),
        });
        let filler = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("exk8s-keypool".into())
            .spawn(move || fill(&filler))?;
        Ok(Self {
            _owner: Arc::new(Owner(Arc::clone(&shared))),
            shared,
        })
    }

    /// Replaces every cluster's demand: clusters not in `demand` want nothing more.
    pub fn set_demand(&self, demand: &HashMap<i64, Demand>) {
        let mut state = self.shared.lock();
        let gone: Vec<i64> = state
            .clusters
            .keys()
            .filter(|id| !demand.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            state.set(id, None);
        }
        for (id, wanted) in demand {
            state.set(*id, Some(*wanted));
        }
        drop(state);
        self.shared.work.notify_all();
    }

    /// Sets one cluster's demand (`None`: it wants nothing).
    pub fn set_cluster(&self, cluster_id: i64, demand: Option<Demand>) {
        self.shared.lock().set(cluster_id, demand);
        self.shared.work.notify_all();
    }

    /// Up to `n` ready keys of `algorithm` for one of `cluster_id`'s bundles. Its demand falls
    /// by `n` either way: the bundle makes whatever is missing itself.
    pub fn take(&self, cluster_id: i64, algorithm: KeyAlgorithm, n: usize) -> Vec<LeafKey> {
        let mut state = self.shared.lock();
        let Some(entry) = state.clusters.get_mut(&cluster_id) else {
            return Vec::new();
        };
        if entry.algorithm != algorithm {
            return Vec::new();
        }
        let keys = entry.ready.split_off(entry.ready.len().saturating_sub(n));
        entry.wanted = entry.wanted.saturating_sub(n);
        let empty = entry.wanted == 0 && entry.ready.is_empty();
        if empty {
            state.clusters.remove(&cluster_id);
        }
        state.held -= keys.len();
        state.taken += keys.len() as u64;
        drop(state);
        // What was taken made room: another cluster may be short.
        self.shared.work.notify_all();
        keys
    }

    pub fn stats(&self) -> PoolStats {
        let state = self.shared.lock();
        PoolStats {
            ready: state.held,
            wanted: state.clusters.values().map(|e| e.wanted).sum(),
            made: state.made,
            taken: state.taken,
        }
    }
}

/// The filler: while some cluster is short and the pool has room, makes one key for it.
fn fill(shared: &Shared) {
    let _ = shared
        .filler
        .set(rustix::thread::gettid().as_raw_nonzero().get());
    lower_priority();
    let mut state = shared.lock();
    loop {
        if state.stopped {
            return;
        }
        let Some((cluster_id, algorithm)) = state.short(shared.max) else {
            state = shared
                .work
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            continue;
        };
        drop(state);
        let made = LeafKey::generate(algorithm);
        state = shared.lock();
        let key = match made {
            Ok(key) => key,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "key pool: cannot make a key; retrying in 1 s");
                state = shared
                    .work
                    .wait_timeout(state, Duration::from_secs(1))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
                continue;
            }
        };
        state.made += 1;
        let room = state.held < shared.max;
        if let Some(entry) = state.clusters.get_mut(&cluster_id)
            && entry.algorithm == algorithm
            && entry.ready.len() < entry.wanted
            && room
        {
            entry.ready.push(key);
            state.held += 1;
        }
    }
}

/// Nice 19 for the calling thread (Linux keeps a nice value per thread), so key making only
/// takes CPU that requests leave idle.
fn lower_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
        tracing::warn!(error = %e, "key pool: cannot lower the filler's priority");
    }
}

/// The keys `rows`' bundles take, by cluster. A stored algorithm that is not one exk8s knows
/// is logged and skipped (such a cluster's bundles fail on their own).
fn demand(rows: &[PendingBundles]) -> HashMap<i64, Demand> {
    let mut demand: HashMap<i64, Demand> = HashMap::new();
    for row in rows {
        let Ok(algorithm) = row.key_algorithm.parse::<KeyAlgorithm>() else {
            tracing::warn!(
                cluster_id = row.cluster_id,
                "key pool: the cluster's stored key algorithm is unknown"
            );
            continue;
        };
        let nodes = usize::try_from(row.nodes).unwrap_or(0);
        let keys = nodes.saturating_mul(BundleCerts::keys(row.role));
        demand
            .entry(row.cluster_id)
            .and_modify(|d| d.keys = d.keys.saturating_add(keys))
            .or_insert(Demand { algorithm, keys });
    }
    demand
}

impl KeyPool {
    /// Sets every cluster's demand from the database (the reconciler, each pass).
    pub async fn refresh(&self, db: &AnyPool) -> Result<(), DbError> {
        let rows = db::keys::pending(db).await?;
        self.set_demand(&demand(&rows));
        Ok(())
    }

    /// Sets one cluster's demand from the database, right after its nodes were recorded. A
    /// failure is logged: the pool only saves time, and the next reconciler pass catches up.
    pub async fn refresh_cluster(&self, db: &AnyPool, cluster_id: i64) {
        match db::keys::pending_in(db, cluster_id).await {
            Ok(rows) => {
                let wanted = demand(&rows).remove(&cluster_id);
                self.set_cluster(cluster_id, wanted);
            }
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "key pool: cannot read the cluster's pending bundles");
            }
        }
    }
}

#[cfg(test)]
mod tests;
