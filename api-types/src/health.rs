//! A cluster's health policy (`GET /clusters/{id}` shows it, `PATCH` changes it): how long each
//! sign of trouble must last before a machine is unhealthy, how much may be unhealthy before
//! remediation stops, and whether remediation runs at all.

use serde::{Deserialize, Serialize};

/// How much of a machine set may be unhealthy at once for remediation to go on (Cluster API's
/// `maxUnhealthy`): a count, or a percent of the set rounded down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxUnhealthy {
    Count(u32),
    Percent(u8),
}

impl MaxUnhealthy {
    /// How many of `total` machines may be unhealthy.
    pub fn of(self, total: usize) -> usize {
        match self {
            Self::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Self::Percent(p) => total * usize::from(p) / 100,
        }
    }
}

impl std::fmt::Display for MaxUnhealthy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

impl std::str::FromStr for MaxUnhealthy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("max_unhealthy {text:?}: a count (2) or a percent from 0% to 100% (40%)");
        match text.strip_suffix('%') {
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= 100 => Ok(Self::Percent(p)),
                _ => Err(bad()),
            },
            None => text.parse().map(Self::Count).map_err(|_| bad()),
        }
    }
}

impl Serialize for MaxUnhealthy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MaxUnhealthy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The policy. Every duration is in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields, default)]
pub struct HealthPolicy {
    /// Whether unhealthy machines are replaced without an operator. The checks run and show
    /// either way.
    pub remediation: bool,
    /// A machine whose agent made no signed request for this long is unreachable (its sync
    /// timer polls every five minutes, with up to two of jitter: the default misses two).
    pub unreachable_after_secs: u32,
    /// A component (etcd, the apiserver, the kubelet, ...) reported unhealthy this long.
    pub unhealthy_after_secs: u32,
    /// The compute API saying the VM is stopped (or no longer exists) this long.
    pub vm_down_after_secs: u32,
    /// A new machine that has not reported healthy this long after it was made.
    pub startup_timeout_secs: u32,
    /// More unhealthy machines than this in a set (the control plane, or a pool) stop its
    /// remediation: something larger than one machine is wrong.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^([0-9]+|([0-9]|[1-9][0-9]|100)%)$"))]
    pub max_unhealthy: MaxUnhealthy,
    /// A machine set remediates at most this many machines per `retry_period_secs`; past it,
    /// the set is left alone and flagged (no replacement loop burning VMs).
    pub max_remediations: u32,
    pub retry_period_secs: u32,
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self {
            remediation: true,
            unreachable_after_secs: 15 * 60,
            unhealthy_after_secs: 10 * 60,
            vm_down_after_secs: 2 * 60,
            startup_timeout_secs: 20 * 60,
            max_unhealthy: MaxUnhealthy::Percent(40),
            max_remediations: 3,
            retry_period_secs: 24 * 3600,
        }
    }
}

/// The policy a pool's workers are judged and remediated by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PoolHealthPolicy {
    /// The pool's own (`PUT`), or false: its cluster's (until one is put; `DELETE` goes back).
    pub own: bool,
    pub policy: HealthPolicy,
}
