//! How soon the API's CPU falls idle after a set of fetches ends — for an abandoned storm, the
//! proof that work whose client left stops. Sampled with [`crate::cpu::ticks`]: the API and
//! every process it started (its key helpers' work counts as its own).

use std::time::{Duration, Instant};

/// A window counts as idle when the process used at most one tick (10 ms) of it: 5 % of a core.
const WINDOW: Duration = Duration::from_millis(200);
const IDLE_TICKS: u64 = 1;
/// Longest it is watched.
const WATCH: Duration = Duration::from_secs(15);

/// Seconds from `since` to the start of the first idle window; `None` when the CPU was still
/// busy after [`WATCH`].
pub(crate) async fn idle_after(pid: u32, since: Instant) -> Result<Option<f64>, String> {
    loop {
        let window_start = Instant::now();
        let before = crate::cpu::ticks(pid)?;
        tokio::time::sleep(WINDOW).await;
        if crate::cpu::ticks(pid)? - before <= IDLE_TICKS {
            return Ok(Some(
                window_start.saturating_duration_since(since).as_secs_f64(),
            ));
        }
        if since.elapsed() > WATCH {
            return Ok(None);
        }
    }
}
