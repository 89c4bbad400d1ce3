//! Short leases renewed while their holder works: one API process at a time moves a cluster's
//! control-plane membership or a node pool on. A lease lasts [`TTL`] and a heartbeat renews it
//! every third of that while the holder lives, so a holder killed mid-change stalls nothing for
//! longer than the TTL: the next reconciler pass (of this process restarted, or of another
//! replica) takes the change over. A holder that lost its lease (paused past the TTL while
//! another took over) learns it at its next step and stops.
//!
//! Within one process, passes at a lease take turns ([`crate::db::turns`]) before they claim it,
//! so a pass asked for while a sibling holds the lease runs after it instead of being lost.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::db::{self, Db, DbError, leases::Leased};

/// How long a lease lasts without renewal.
pub const TTL: Duration = Duration::from_secs(15);

/// The lease was taken over by another process while this one held it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the lease on {0:?} was lost to another API process; the change is left to it")]
pub struct LeaseLost(pub Leased);

/// This process's name as a lease holder: unique per process start.
pub fn holder() -> &'static str {
    static HOLDER: OnceLock<String> = OnceLock::new();
    HOLDER.get_or_init(|| {
        let mut nonce = [0u8; 8];
        // Without the OS's randomness the pid and start time still tell processes apart.
        let _ = getrandom::fill(&mut nonce);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{started:x}-{}", std::process::id(), hex::encode(nonce))
    })
}

/// A lease this process holds; dropping it stops the heartbeat (the lease then expires).
#[derive(Debug)]
pub struct Held {
    what: Leased,
    db: Db,
    lost: Arc<AtomicBool>,
    heartbeat: tokio::task::JoinHandle<()>,
}

fn unix(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Takes `what`'s lease when it is free or its holder's expired; `None` when another holds it.
pub async fn claim(db: &Db, what: Leased) -> Result<Option<Held>, DbError> {
    let now = db::now();
    if !db::leases::claim(&db.pool, what, holder(), now, now + unix(TTL)).await? {
        return Ok(None);
    }
    let lost = Arc::new(AtomicBool::new(false));
    let heartbeat = tokio::spawn(beat(db.clone(), what, Arc::clone(&lost)));
    Ok(Some(Held {
        what,
        db: db.clone(),
        lost,
        heartbeat,
    }))
}

/// Renews the lease every third of [`TTL`] until it is lost (or the task is stopped).
async fn beat(db: Db, what: Leased, lost: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(TTL / 3).await;
        match db::leases::renew(&db.pool, what, holder(), db::now() + unix(TTL)).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(lease = ?what, "a lease was taken over by another process");
                lost.store(true, Ordering::Relaxed);
                return;
            }
            // The next beat tries again; the TTL leaves two more.
            Err(e) => {
                tracing::warn!(lease = ?what, error = %crate::error_chain(&e), "cannot renew a lease");
            }
        }
    }
}

/// Runs `pass` (of `kind`) under `what`'s lease, after any pass of this process that holds it
/// ([`db::turns`]); `None` when another process holds it, or a pass of the same kind waits
/// already. The lease is given back with the pass's error recorded, unless the pass lost it
/// (then it is another process's to give back).
pub async fn run<T, E: std::error::Error + Send + Sync + 'static>(
    db: &Db,
    what: Leased,
    kind: &'static str,
    pass: impl AsyncFnOnce(&Held) -> Result<T, E>,
) -> Result<Option<Result<T, E>>, DbError> {
    let Some(_turn) = db.turns().turn(what, kind).await else {
        return Ok(None);
    };
    let Some(held) = claim(db, what).await? else {
        return Ok(None);
    };
    let result = pass(&held).await;
    if held.ensure().is_err() {
        return Ok(Some(result));
    }
    let error = result.as_ref().err().map(|e| crate::error_chain(e));
    held.release(error.as_deref()).await?;
    Ok(Some(result))
}

impl Held {
    /// Errs once the lease was lost: the holder stops before its next step.
    pub fn ensure(&self) -> Result<(), LeaseLost> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(LeaseLost(self.what));
        }
        Ok(())
    }

    /// Gives the lease back, recording how the change ended (see [`db::leases::release`]).
    pub async fn release(self, error: Option<&str>) -> Result<(), DbError> {
        self.heartbeat.abort();
        db::leases::release(&self.db.pool, self.what, holder(), error).await
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}
