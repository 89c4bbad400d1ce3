//! How soon the API's CPU falls idle after a set of fetches ends — for an abandoned storm, the
//! proof that work whose client left stops. Sampled from `/proc/<pid>/stat` (user + system
//! time in clock ticks, which Linux reports at 100 per second on every architecture), for the
//! API and every process it started: its key helpers' work counts as its own, whether they
//! still run or have been reaped.

use std::time::{Duration, Instant};

/// A window counts as idle when the process used at most one tick (10 ms) of it: 5 % of a core.
const WINDOW: Duration = Duration::from_millis(200);
const IDLE_TICKS: u64 = 1;
/// Longest it is watched.
const WATCH: Duration = Duration::from_secs(15);

/// The user + system CPU time of `pid`, its reaped children and its live descendants, in ticks.
fn cpu_ticks(pid: u32) -> Result<u64, String> {
    let mut total = own_ticks(pid)?;
    let mut live = children(pid);
    while let Some(child) = live.pop() {
        // A child that ended since it was listed is in its parent's reaped time, or soon will be.
        if let Ok(ticks) = own_ticks(child) {
            total += ticks;
            live.extend(children(child));
        }
    }
    Ok(total)
}

/// The live children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// One process's user + system time and its reaped children's.
fn own_ticks(pid: u32) -> Result<u64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("reading the API's /proc/{pid}/stat: {e}"))?;
    // Fields after the parenthesised name start at `state` (field 3).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("an unreadable stat line")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| format!("stat field {n} is missing"))
    };
    // utime, stime, then cutime and cstime: children this process has waited for.
    Ok(field(14)? + field(15)? + field(16)? + field(17)?)
}

/// Seconds from `since` to the start of the first idle window; `None` when the CPU was still
/// busy after [`WATCH`].
pub(crate) async fn idle_after(pid: u32, since: Instant) -> Result<Option<f64>, String> {
    loop {
        let window_start = Instant::now();
        let before = cpu_ticks(pid)?;
        tokio::time::sleep(WINDOW).await;
        if cpu_ticks(pid)? - before <= IDLE_TICKS {
            return Ok(Some(
                window_start.saturating_duration_since(since).as_secs_f64(),
            ));
        }
        if since.elapsed() > WATCH {
            return Ok(None);
        }
    }
}
