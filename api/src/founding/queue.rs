//! The founding workers: `POST /clusters` answers once the request is recorded, and founding
//! goes on here in the background. At most `workers` foundings run at once; at most `admitted`
//! are accepted (running or waiting for a worker). A request beyond that is refused before
//! anything is recorded, so an operator's burst never turns into an unbounded backlog.
//!
//! A founding that a crash stops (running or still waiting) leaves its cluster `provisioning`
//! with its journal; the reconciler undoes it once it is stale (see [`super::reconcile`]).

use std::future::Future;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

/// The bounded pool of founding workers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Founders {
    workers: Arc<Semaphore>,
    admitted: Arc<Semaphore>,
}

/// A place in the pool, held from acceptance until the founding ends.
#[derive(Debug)]
pub struct Admission {
    _place: OwnedSemaphorePermit,
}

impl Founders {
    /// A pool running at most `workers` foundings and accepting at most `admitted` (each at
    /// least one; `admitted` at least `workers`).
    pub fn new(workers: usize, admitted: usize) -> Self {
        let workers = workers.max(1);
        Self {
            workers: Arc::new(Semaphore::new(workers)),
            admitted: Arc::new(Semaphore::new(admitted.max(workers))),
        }
    }

    /// A place for one more founding, or `None` when the pool is full.
    pub fn admit(&self) -> Option<Admission> {
        Arc::clone(&self.admitted)
            .try_acquire_owned()
            .ok()
            .map(|place| Admission { _place: place })
    }

    /// Runs `work` on a worker once one is free, in the background: it goes on whether or not
    /// anyone waits for the answer.
    pub fn spawn<F>(&self, admission: Admission, work: F) -> oneshot::Receiver<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let workers = Arc::clone(&self.workers);
        tokio::spawn(async move {
            let _admitted = admission;
            // The semaphore is never closed; were it, the founding runs unbounded rather than
            // being lost.
            let _worker = workers.acquire_owned().await.ok();
            // Nobody waiting for the answer is the normal case after a 202.
            let _ = tx.send(work.await);
        });
        rx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_pool_refuses_and_a_finished_founding_frees_its_place() {
        let pool = Founders::new(1, 2);
        let gate = Arc::new(tokio::sync::Notify::new());
        let first = pool.admit().expect("a first place");
        let second = pool.admit().expect("a second place");
        assert!(pool.admit().is_none(), "a third founding is refused");
        let held = Arc::clone(&gate);
        let running = pool.spawn(first, async move {
            held.notified().await;
            1
        });
        let mut waiting = pool.spawn(second, async { 2 });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            waiting.try_recv().is_err(),
            "one worker: the second founding waits for the first"
        );
        assert!(pool.admit().is_none(), "both places are still taken");
        gate.notify_one();
        assert_eq!(running.await.unwrap(), 1);
        assert_eq!(waiting.await.unwrap(), 2);
        assert!(pool.admit().is_some(), "the places are free again");
    }
}
