//! The rate limits on node requests, shared by `serve` and `dev`.

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
