//! The API's time source. Everything that judges or makes certificate lifetimes — minting,
//! the inventory's days left, the renewal policy — asks [`Clock`] rather than the system, so
//! tests move time forward with a [`ManualClock`] instead of sleeping through it.

use std::sync::Mutex;

use time::{Duration, OffsetDateTime};

/// Now, as the API sees it.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> OffsetDateTime;

    /// Unix seconds.
    fn unix(&self) -> i64 {
        self.now().unix_timestamp()
    }
}

/// The system clock: production's.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// Test hook: when set to a file's path, the API's clock is the system's moved forward by the
/// whole seconds the file holds (none while it is missing or empty), re-read at every call, so a
/// test moves a real `exk8s-api` process's time past a timeout instead of sleeping through it.
/// Unset in production.
pub const OFFSET_FILE_HOOK: &str = "EXK8S_API_TEST_CLOCK_OFFSET_FILE";

/// The system clock moved forward by the seconds in a file ([`OFFSET_FILE_HOOK`]).
#[derive(Debug, Clone)]
pub struct OffsetFileClock(std::path::PathBuf);

impl OffsetFileClock {
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        Self(path.into())
    }

    /// The offset in seconds: 0 while the file is missing, empty or not a number.
    pub fn offset(&self) -> i64 {
        std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Clock for OffsetFileClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + Duration::seconds(self.offset())
    }
}

/// The clock a process runs by: the system's, unless [`OFFSET_FILE_HOOK`] names a file.
pub fn from_env() -> std::sync::Arc<dyn Clock> {
    match std::env::var_os(OFFSET_FILE_HOOK).filter(|p| !p.is_empty()) {
        Some(path) => {
            tracing::warn!(
                file = %std::path::Path::new(&path).display(),
                "test hook {OFFSET_FILE_HOOK} is set: this API's clock runs ahead by the seconds that file holds"
            );
            std::sync::Arc::new(OffsetFileClock::new(path))
        }
        None => std::sync::Arc::new(SystemClock),
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock(Mutex<OffsetDateTime>);

impl ManualClock {
    pub fn starting_at(now: OffsetDateTime) -> Self {
        Self(Mutex::new(now))
    }

    pub fn advance(&self, by: Duration) {
        let mut now = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::{Clock as _, OffsetFileClock};

    #[test]
    fn the_offset_file_moves_the_clock_forward_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("offset");
        let clock = OffsetFileClock::new(&file);
        assert_eq!(clock.offset(), 0, "no file: no offset");
        std::fs::write(&file, "not a number").unwrap();
        assert_eq!(clock.offset(), 0);
        std::fs::write(&file, "180\n").unwrap();
        assert_eq!(clock.offset(), 180);
        let ahead = clock.unix() - time::OffsetDateTime::now_utc().unix_timestamp();
        assert!((179..=181).contains(&ahead), "{ahead}");
    }
}
