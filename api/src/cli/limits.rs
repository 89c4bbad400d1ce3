//! The rate limits on node requests and the pace of day-2 changes, shared by `serve` and `dev`.

use std::time::Duration;

use clap::Args;

use crate::ratelimit::Limit;

#[derive(Debug, Clone, Args)]
pub(super) struct NodeRateArgs {
    /// Node requests (bundle fetches, syncs and reports) allowed per VM per minute; half of it
    /// at once.
    #[arg(long, env = "EXK8S_BOOTSTRAP_RATE_PER_VM", default_value_t = 60)]
    bootstrap_rate_per_vm: u32,
    /// Node requests allowed per source address per minute; a fifth of it at once.
    #[arg(long, env = "EXK8S_BOOTSTRAP_RATE_PER_SOURCE", default_value_t = 600)]
    bootstrap_rate_per_source: u32,
}

impl NodeRateArgs {
    /// (per VM, per source address).
    pub(super) fn limits(&self) -> (Limit, Limit) {
        (
            Limit::per_minute_half_burst(self.bootstrap_rate_per_vm),
            Limit {
                per_minute: self.bootstrap_rate_per_source,
                burst: self.bootstrap_rate_per_source.div_ceil(5).max(1),
            },
        )
    }
}

#[derive(Debug, Clone, Args)]
pub(super) struct ChangeArgs {
    /// Seconds between reconciler passes.
    #[arg(long, env = "EXK8S_RECONCILE_INTERVAL_SECS", default_value_t = 60)]
    reconcile_interval_secs: u64,
    /// Seconds a new control-plane member may take to join etcd before it is released.
    #[arg(long, env = "EXK8S_MEMBER_JOIN_TIMEOUT_SECS", default_value_t = 1800)]
    member_join_timeout_secs: u64,
}

impl ChangeArgs {
    /// How often the reconciler runs (at least once a second).
    pub(super) fn reconcile_interval(&self) -> Duration {
        Duration::from_secs(self.reconcile_interval_secs.max(1))
    }

    pub(super) fn member_join_timeout(&self) -> Duration {
        Duration::from_secs(self.member_join_timeout_secs)
    }
}
