//! The bounded pool for CPU-heavy work: key generation, certificate signing, sealing. Work runs
//! on tokio's blocking threads, at most one job per core at a time, so the async workers that
//! answer `/healthz`, reports and every other request are never the ones grinding an RSA key.
//!
//! Requests with a deadline go through admission ([`CpuPool::admit`]): when every slot is busy
//! and the jobs already waiting would not let a new one finish within its budget (judged by
//! how long admitted jobs have lately taken), or the queue is at its hard cap, it is refused at
//! once (the caller answers 503 with `Retry-After`) instead of queueing work whose client will
//! have given up. Fast work (ECDSA) queues deep; slow work (RSA) is refused early. A job whose caller goes away (its client disconnected, its deadline passed) is
//! told to stop ([`Stop`]) and stops before its next key generation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

/// Why a job did not produce its value.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("the CPU pool is shut down")]
    Closed,
    #[error("a CPU job panicked")]
    Panicked(#[source] tokio::task::JoinError),
    /// Every slot is busy and the queue is full: the job would not start in time.
    #[error("the CPU pool is saturated")]
    Saturated,
}

/// Tells a running job that nobody waits for its result any more.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// The job should stop before its next expensive step.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn request(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Asks the job to stop when the future awaiting it is dropped before it finished.
struct StopOnDrop {
    stop: Stop,
    finished: bool,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            self.stop.request();
        }
    }
}

/// A semaphore-bounded front to `spawn_blocking`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CpuPool {
    permits: Arc<Semaphore>,
    size: usize,
    /// Jobs waiting for a slot through [`CpuPool::admit`].
    waiting: Arc<AtomicUsize>,
    /// The most that may wait, whatever their cost.
    queue: usize,
    /// How long an admitted job lately ran (microseconds; a moving average, 0 before any).
    typical_micros: Arc<AtomicU64>,
}

/// Counts a waiting job out of the queue however its wait ends.
struct Waiting(Arc<AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CpuPool {
    /// The default hard cap on waiting jobs per slot (the budget usually refuses first).
    pub const QUEUE_PER_SLOT: usize = 64;

    /// A pool running at most `size` jobs at once (at least one), with
    /// [`Self::QUEUE_PER_SLOT`] waiting per slot.
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self::with_queue(size, size * Self::QUEUE_PER_SLOT)
    }

    /// A pool running at most `size` jobs at once and admitting at most `queue` more to wait.
    pub fn with_queue(size: usize, queue: usize) -> Self {
        let size = size.max(1);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
            waiting: Arc::new(AtomicUsize::new(0)),
            queue,
            typical_micros: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How long a new job would take to finish when `ahead` jobs wait before it.
    fn expected(&self, ahead: usize) -> Duration {
        let typical = Duration::from_micros(self.typical_micros.load(Ordering::Relaxed));
        let rounds = u32::try_from(ahead / self.size + 1).unwrap_or(u32::MAX);
        typical.saturating_mul(rounds)
    }

    /// Folds a job's run time into the moving average (an eighth of each new sample).
    fn record(&self, took: Duration) {
        let took = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let _ = self
            .typical_micros
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
                Some(if old == 0 {
                    took
                } else {
                    old - old / 8 + took / 8
                })
            });
    }

    /// Runs `job` once a slot is free, unless every slot is busy and the jobs waiting would
    /// keep it from finishing within `budget`, or the queue is full: then
    /// [`CpuError::Saturated`] at once. The job gets a [`Stop`] that is set when the caller
    /// stops waiting for it; it should check it between expensive steps.
    pub async fn admit<T, F>(&self, budget: Duration, job: F) -> Result<T, CpuError>
    where
        F: FnOnce(&Stop) -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = match Arc::clone(&self.permits).try_acquire_owned() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(CpuError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let queued = self.waiting.fetch_add(1, Ordering::SeqCst);
                let _waiting = Waiting(Arc::clone(&self.waiting));
                if queued >= self.queue || self.expected(queued) > budget {
                    return Err(CpuError::Saturated);
                }
                Arc::clone(&self.permits)
                    .acquire_owned()
                    .await
                    .map_err(|_| CpuError::Closed)?
            }
        };
        let mut guard = StopOnDrop {
            stop: Stop::default(),
            finished: false,
        };
        let stop = guard.stop.clone();
        let pool = self.clone();
        let result = tokio::task::spawn_blocking(move || {
            let _slot = permit;
            let started = Instant::now();
            let value = job(&stop);
            if !stop.requested() {
                pool.record(started.elapsed());
            }
            value
        })
        .await
        .map_err(CpuError::Panicked);
        guard.finished = true;
        result
    }

    /// One job per core.
    pub fn per_core() -> Self {
        Self::new(Self::cores())
    }

    /// One job per core, `queue_per_slot` more waiting per core.
    pub fn per_core_with_queue(queue_per_slot: usize) -> Self {
        let cores = Self::cores();
        Self::with_queue(cores, cores.saturating_mul(queue_per_slot))
    }

    fn cores() -> usize {
        std::thread::available_parallelism().map_or(2, usize::from)
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Runs `job`, a short last step of work already admitted (signing a bundle whose
    /// certificates are made), on a blocking thread at once — never in the queue behind jobs
    /// that start new work. Queued there, every request of a storm would wait for the whole
    /// storm's keys before its last step, and all would finish together, past their deadline.
    /// Admission already bounds how many such steps can be in flight.
    pub async fn finish<T, F>(&self, job: F) -> Result<T, CpuError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        if self.permits.is_closed() {
            return Err(CpuError::Closed);
        }
        tokio::task::spawn_blocking(job)
            .await
            .map_err(CpuError::Panicked)
    }

    /// Runs `job` on a blocking thread once a slot is free. A caller that goes away while
    /// waiting for a slot starts nothing.
    pub async fn run<T, F>(&self, job: F) -> Result<T, CpuError>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| CpuError::Closed)?;
        tokio::task::spawn_blocking(move || {
            let _slot = permit;
            job()
        })
        .await
        .map_err(CpuError::Panicked)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A job that waits for `gate` before finishing, holding its slot.
    fn hold(pool: &CpuPool, gate: &Arc<std::sync::Barrier>) -> tokio::task::JoinHandle<()> {
        let (pool, gate) = (pool.clone(), Arc::clone(gate));
        tokio::spawn(async move {
            pool.run(move || {
                gate.wait();
            })
            .await
            .unwrap();
        })
    }

    /// Holds `pool`'s only slot (until `gate` is passed) and queues one admitted job behind it,
    /// which returns `value`; returns once both are in place.
    async fn held_with_one_queued(
        pool: &CpuPool,
        gate: &Arc<std::sync::Barrier>,
        value: u32,
    ) -> (
        tokio::task::JoinHandle<()>,
        tokio::task::JoinHandle<Result<u32, CpuError>>,
    ) {
        let holder = hold(pool, gate);
        while pool.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let queued = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.admit(Duration::from_secs(60), move |_| value).await })
        };
        while pool.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        (holder, queued)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_last_step_never_waits_behind_jobs_that_start_new_work() {
        let pool = CpuPool::with_queue(1, 8);
        let gate = Arc::new(std::sync::Barrier::new(2));
        let (holder, queued) = held_with_one_queued(&pool, &gate, 1).await;
        // The only slot is held and a job waits for it: the last step runs all the same.
        assert_eq!(pool.finish(|| 5).await.unwrap(), 5);
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 1);
        gate.wait();
        holder.await.unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_saturated_pool_refuses_at_once_and_admits_again_when_a_slot_frees() {
        let pool = CpuPool::with_queue(1, 1);
        let gate = Arc::new(std::sync::Barrier::new(2));
        // One may wait for the slot; the next is refused without waiting.
        let (holder, queued) = held_with_one_queued(&pool, &gate, 7).await;
        assert!(matches!(
            pool.admit(Duration::from_secs(60), |_| 8).await,
            Err(CpuError::Saturated)
        ));
        gate.wait();
        holder.await.unwrap();
        assert_eq!(queued.await.unwrap().unwrap(), 7);
        assert_eq!(pool.admit(Duration::from_secs(60), |_| 9).await.unwrap(), 9);
        assert_eq!(pool.waiting.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_work_is_refused_when_it_could_not_finish_within_its_budget() {
        let pool = CpuPool::with_queue(1, 100);
        // Jobs here take at least 100 ms.
        pool.admit(Duration::from_secs(60), |_| {
            std::thread::sleep(Duration::from_millis(100));
        })
        .await
        .unwrap();
        let gate = Arc::new(std::sync::Barrier::new(2));
        let holder = hold(&pool, &gate);
        while pool.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        // Behind the running job, a new one needs at least 100 ms more: a 50 ms budget is short.
        assert!(matches!(
            pool.admit(Duration::from_millis(50), |_| ()).await,
            Err(CpuError::Saturated)
        ));
        let patient = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.admit(Duration::from_secs(60), |_| 1).await })
        };
        while pool.waiting.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        gate.wait();
        holder.await.unwrap();
        assert_eq!(patient.await.unwrap().unwrap(), 1, "a long budget waits");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_whose_caller_went_away_stops_before_its_next_step() {
        let pool = CpuPool::with_queue(1, 0);
        let started = Arc::new(std::sync::Barrier::new(2));
        let resume = Arc::new(std::sync::Barrier::new(2));
        let steps = Arc::new(AtomicUsize::new(0));
        let (s, r, n) = (started.clone(), resume.clone(), steps.clone());
        let caller = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.admit(Duration::from_secs(60), move |stop| {
                    for _ in 0..10 {
                        if stop.requested() {
                            return;
                        }
                        let step = n.fetch_add(1, Ordering::SeqCst);
                        if step == 0 {
                            s.wait();
                            r.wait();
                        }
                    }
                })
                .await
            }
        });
        tokio::task::spawn_blocking(move || started.wait())
            .await
            .unwrap();
        caller.abort();
        let _ = caller.await;
        tokio::task::spawn_blocking(move || resume.wait())
            .await
            .unwrap();
        // The slot comes back once the job returned.
        let _ = pool.permits.acquire().await.unwrap();
        assert_eq!(
            steps.load(Ordering::SeqCst),
            1,
            "no step after the caller left"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_jobs_run_at_once_than_the_pool_has_slots() {
        let pool = CpuPool::new(2);
        let running = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let jobs: Vec<_> = (0..8)
            .map(|_| {
                let (pool, running, peak) = (pool.clone(), running.clone(), peak.clone());
                tokio::spawn(async move {
                    pool.run(move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(20));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap();
                })
            })
            .collect();
        for job in jobs {
            job.await.unwrap();
        }
        assert_eq!(peak.load(Ordering::SeqCst), 2);
    }
}
