//! CPU time read from `/proc`: user + system time in clock ticks, which Linux reports at 100
//! per second on every architecture. A process's own, its reaped children's and its live
//! descendants' count together, so the API's key helpers' work is the API's, and PostgreSQL's
//! backends' work (live, or ended and reaped by the postmaster) is the server's.

/// Milliseconds in one tick.
pub(crate) const TICK_MS: f64 = 10.0;

/// The user + system CPU time of `pid`, its reaped children and its live descendants, in ticks.
pub(crate) fn ticks(pid: u32) -> Result<u64, String> {
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
        .map_err(|e| format!("reading /proc/{pid}/stat: {e}"))?;
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

/// Every PostgreSQL server on this machine together (each postmaster, and under it its
/// backends and workers), in ticks; `None` when no `postgres` process runs.
pub(crate) fn postgres_ticks() -> Option<u64> {
    let processes: Vec<(u32, u32, String)> = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_owned();
            let parent = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, parent, name))
        })
        .collect();
    let is_postgres = |pid: u32| {
        processes
            .iter()
            .any(|(p, _, name)| *p == pid && name == "postgres")
    };
    let postmasters: Vec<u32> = processes
        .iter()
        .filter(|(_, parent, name)| name == "postgres" && !is_postgres(*parent))
        .map(|(pid, _, _)| *pid)
        .collect();
    if postmasters.is_empty() {
        return None;
    }
    Some(postmasters.into_iter().filter_map(|p| ticks(p).ok()).sum())
}
