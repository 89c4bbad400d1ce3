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
