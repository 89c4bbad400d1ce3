//! Token-bucket rate limits for the bootstrap routes, per VM and per source address. In memory,
//! per process: with several replicas behind a balancer each enforces its own share.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `burst` requests at once, refilled at `per_minute`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    pub per_minute: u32,
    pub burst: u32,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

#[derive(Debug)]
pub struct Limiter {
    limit: Limit,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Limiter {
    pub fn new(limit: Limit) -> Self {
        Self {
            limit,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key`; `Err(wait)` when none is left.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        let rate = f64::from(self.limit.per_minute.max(1)) / 60.0;
        let burst = f64::from(self.limit.burst.max(1));
        let now = Instant::now();
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if buckets.len() > 100_000 {
            // Bound memory: forget full buckets (they would allow a request anyway).
            buckets.retain(|_, b| b.tokens + now.duration_since(b.at).as_secs_f64() * rate < burst);
        }
        let bucket = buckets.entry(key.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        bucket.tokens =
            (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_refused_with_a_wait() {
        let limiter = Limiter::new(Limit {
            per_minute: 60,
            burst: 3,
        });
        for _ in 0..3 {
            assert!(limiter.check("vm-1").is_ok());
        }
        let wait = limiter.check("vm-1").unwrap_err();
        assert!(wait <= Duration::from_secs(1) && wait > Duration::ZERO);
        assert!(limiter.check("vm-2").is_ok(), "keys are independent");
    }
}
