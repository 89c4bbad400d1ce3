//! Rate limits for the bootstrap routes, on `governor`'s keyed GCRA limiters: one keyed by
//! source, charged by every request before anything else is looked at, and one keyed by VM,
//! charged only by requests that proved they are that VM. A flood of bad credentials therefore
//! spends the flooder's source budget, never the VM's own (SECURITY.md 7).
//!
//! A source is an IPv4 address, or an IPv6 address's network prefix (/64 by default): one host
//! is given a whole /64, so keying by address would hand a client a fresh budget per address it
//! rotates to. The key table is bounded: idle keys are pruned on a timer ([`Limiter::prune`],
//! never on the request path), and while the table is full every request shares one overflow
//! budget, so a flood from more sources than the bound cannot grow memory.
//!
//! In memory, per process: with several replicas behind a balancer each enforces its own share.

use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DefaultKeyedStateStore;
use governor::{Quota, RateLimiter};

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

/// Keys remembered at most (a pruned key starts with a full burst, which is what an idle key
/// would have anyway).
pub const MAX_KEYS: usize = 100_000;

/// How often the server prunes idle keys.
pub const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// What a keyed limiter charges: a key, or the budget every request shares while the key table
/// is full.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Slot<K> {
    Key(K),
    Overflow,
}

/// governor's keyed limiter over slots, on `C`.
type Keyed<K, C> =
    RateLimiter<Slot<K>, DefaultKeyedStateStore<Slot<K>>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// A keyed limiter with at most `max_keys` keys.
pub struct Limiter<K: Hash + Eq + Clone, C: Clock = DefaultClock> {
    inner: Keyed<K, C>,
    clock: C,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone, C: Clock> std::fmt::Debug for Limiter<K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("keys", &self.inner.len())
            .field("max_keys", &self.max_keys)
            .finish()
    }
}

impl<K: Hash + Eq + Clone> Limiter<K> {
    pub fn new(limit: Limit) -> Self {
        Self::with_clock(limit, MAX_KEYS, DefaultClock::default())
    }
}

impl<K: Hash + Eq + Clone, C: Clock + Clone> Limiter<K, C> {
    /// A limiter of at most `max_keys` keys on `clock`.
    pub fn with_clock(limit: Limit, max_keys: usize, clock: C) -> Self {
        Self {
            inner: RateLimiter::new(
                limit.quota(),
                DefaultKeyedStateStore::default(),
                clock.clone(),
            ),
            clock,
            max_keys: max_keys.max(1),
        }
    }

    /// Takes one request from `key`'s allowance (the overflow budget's while the table is
    /// full); `Err(wait)` when it has none left. O(1): pruning is [`Limiter::prune`]'s job.
    pub fn check(&self, key: &K) -> Result<(), Duration> {
        let slot = if self.inner.len() >= self.max_keys {
            Slot::Overflow
        } else {
            Slot::Key(key.clone())
        };
        self.inner
            .check_key(&slot)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets every key whose allowance is full again (indistinguishable from a new one).
    pub fn prune(&self) {
        self.inner.retain_recent();
        self.inner.shrink_to_fit();
    }

    /// Keys remembered now.
    pub fn keys(&self) -> usize {
        self.inner.len()
    }
}

/// The network prefix an IPv6 client is keyed by (`--bootstrap-rate-ipv6-prefix`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Prefix(u8);

impl Ipv6Prefix {
    /// /64: the smallest network a host is given (RFC 6177), so one host cannot rotate out of it.
    pub const DEFAULT: Self = Self(64);

    /// A prefix of `bits` (1 to 128).
    pub fn new(bits: u8) -> Result<Self, String> {
        if (1..=128).contains(&bits) {
            Ok(Self(bits))
        } else {
            Err(format!(
                "an IPv6 prefix length is 1 to 128 bits, not {bits}"
            ))
        }
    }
}

impl Default for Ipv6Prefix {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The source a request is charged to: its IPv4 address (an IPv4-mapped IPv6 address is its
/// IPv4 address), or its IPv6 address's network.
pub fn source_key(address: IpAddr, prefix: Ipv6Prefix) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mask = u128::MAX << (128 - u32::from(prefix.0));
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use governor::clock::FakeRelativeClock;

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

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn an_ipv6_client_is_keyed_by_its_network() {
        let limit = Limit {
            per_minute: 60,
            burst: 2,
        };
        let limiter = Limiter::new(limit);
        let slash64 = Ipv6Prefix::DEFAULT;
        // A client rotating through its /64 spends one budget.
        assert!(
            limiter
                .check(&source_key(ip("2001:db8:1:2::1"), slash64))
                .is_ok()
        );
        assert!(
            limiter
                .check(&source_key(ip("2001:db8:1:2::2"), slash64))
                .is_ok()
        );
        assert!(
            limiter
                .check(&source_key(ip("2001:db8:1:2:ffff::9"), slash64))
                .is_err(),
            "a third address of the same /64 finds the budget spent"
        );
        assert!(
            limiter
                .check(&source_key(ip("2001:db8:1:3::1"), slash64))
                .is_ok(),
            "the next /64 is another client"
        );
        // Per address when configured so; IPv4 and IPv4-mapped addresses are one source.
        let per_address = Ipv6Prefix::new(128).unwrap();
        assert_ne!(
            source_key(ip("2001:db8::1"), per_address),
            source_key(ip("2001:db8::2"), per_address)
        );
        assert_eq!(source_key(ip("::ffff:192.0.2.7"), slash64), ip("192.0.2.7"));
        assert_eq!(source_key(ip("192.0.2.7"), slash64), ip("192.0.2.7"));
        assert_eq!(
            source_key(ip("2001:db8::1"), Ipv6Prefix::new(1).unwrap()),
            ip("::")
        );
        for bad in [0, 129] {
            let refused = Ipv6Prefix::new(bad).unwrap_err();
            assert!(refused.contains(&bad.to_string()), "{refused}");
        }
    }

    #[test]
    fn the_key_table_is_bounded_and_pruned() {
        let clock = FakeRelativeClock::default();
        let limit = Limit {
            per_minute: 60,
            burst: 5,
        };
        let limiter = Limiter::with_clock(limit, 100, clock.clone());
        for key in 0..10_000 {
            let _ = limiter.check(&key);
        }
        assert!(
            limiter.keys() <= 101,
            "10,000 sources leave at most the bound and the overflow key: {}",
            limiter.keys()
        );
        // Sources beyond the bound share the overflow budget, long spent by now.
        assert!(limiter.check(&20_000).is_err());
        // Pruning while every key is still refilling keeps them (their state is not fresh).
        limiter.prune();
        assert!(limiter.keys() > 100);
        // Once their allowance is full again, they are forgotten and new sources have budgets.
        clock.advance(Duration::from_secs(6));
        limiter.prune();
        assert_eq!(limiter.keys(), 0);
        assert!(limiter.check(&20_000).is_ok());
    }
}
