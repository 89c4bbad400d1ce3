//! The bounded pool for CPU-heavy work: key generation, certificate signing, sealing. Work runs
//! on tokio's blocking threads, at most one job per core at a time, so the async workers that
//! answer `/healthz`, reports and every other request are never the ones grinding an RSA key.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Why a job did not produce its value.
#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    #[error("the CPU pool is shut down")]
    Closed,
    #[error("a CPU job panicked")]
    Panicked(#[source] tokio::task::JoinError),
}

/// A semaphore-bounded front to `spawn_blocking`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CpuPool {
    permits: Arc<Semaphore>,
    size: usize,
}

impl CpuPool {
    /// A pool running at most `size` jobs at once (at least one).
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// One job per core.
    pub fn per_core() -> Self {
        Self::new(std::thread::available_parallelism().map_or(2, usize::from))
    }

    pub fn size(&self) -> usize {
        self.size
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
