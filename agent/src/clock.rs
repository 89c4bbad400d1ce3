//! The wall clock, below everything that stamps a request or a state file with it (the signed
//! node requests, the bundles' freshness checks).

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds now.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}
