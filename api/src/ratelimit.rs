//! Rate limits for the bootstrap routes, on `governor`'s keyed GCRA limiters: one keyed by
//! source address, charged by every request before anything else is looked at, and one keyed by
//! VM, charged only by requests that proved they are that VM. A flood of bad credentials
//! therefore spends the flooder's address budget, never the VM's own (SECURITY.md 7).
//!
//! In memory, per process: with several replicas behind a balancer each enforces its own share.

use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// `burst` requests at once, refilled at `per_minute`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub per_minute: u32,
    pub burst: u32,
}

impl Limit {
    /// `per_minute`, half of it allowed at once.
    pub fn per_minute_half_burst(per_minute: u32) -> Self {
        Self {
            per_minute,
            burst: per_minute.div_ceil(2).max(1),
        }
    }

    fn quota(self) -> Quota {
        let at_least_one = |n: u32| NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN);
        Quota::per_minute(at_least_one(self.per_minute)).allow_burst(at_least_one(self.burst))
    }
}

/// Keys remembered before idle ones are forgotten (a forgotten key starts with a full burst,
/// which is what an idle key would have anyway).
const MAX_KEYS: usize = 100_000;

/// A keyed limiter.
pub struct Limiter<K: Hash + Eq + Clone> {
    inner: DefaultKeyedRateLimiter<K>,
    clock: DefaultClock,
}

impl<K: Hash + Eq + Clone> std::fmt::Debug for Limiter<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("keys", &self.inner.len())
            .finish()
    }
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    pub fn new(limit: Limit) -> Self {
        Self {
            inner: RateLimiter::keyed(limit.quota()),
            clock: DefaultClock::default(),
        }
    }

    /// Takes one request from `key`'s allowance; `Err(wait)` when it has none left.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        if self.inner.len() > MAX_KEYS {
            self.inner.retain_recent();
            self.inner.shrink_to_fit();
        }
        self.inner
            .check_key(key)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn a_burst_is_allowed_then_refused_with_a_wait() {
        let limiter = Limiter::new(Limit {
            per_minute: 60,
            burst: 3,
        });
        for _ in 0..3 {
            assert!(limiter.check(&1).is_ok());
        }
        let wait = limiter.check(&1).unwrap_err();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::ZERO,
            "{wait:?}"
        );
        assert!(limiter.check(&2).is_ok(), "keys are independent");
    }
}
