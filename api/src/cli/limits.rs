//! The rate limits on node requests, the pace of day-2 changes and the founding workers,
//! shared by `serve` and `dev`.

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
    /// The network prefix an IPv6 source is counted by for the per-source limit (1–128): one
    /// host is given a whole /64, so counting by address would give it a budget per address.
    #[arg(long, env = "EXK8S_BOOTSTRAP_RATE_IPV6_PREFIX", default_value = "64", value_parser = parse_ipv6_prefix)]
    pub(super) ipv6_prefix: crate::ratelimit::Ipv6Prefix,
    /// Bundle requests that may wait per core for key generation, at most. A request is refused
    /// at once with 503 and Retry-After beyond it, or sooner when the work already waiting
    /// would keep it from finishing before the bootstrap deadline.
    #[arg(long, env = "EXK8S_CPU_QUEUE_PER_CORE", default_value_t = crate::cpu::CpuPool::QUEUE_PER_SLOT)]
    pub(super) cpu_queue_per_core: usize,
    /// Leaf keys made ahead of demand for RSA clusters' boot storms, at most, in all (held in
    /// memory only; 0 turns the pool off).
    #[arg(long, env = "EXK8S_KEY_POOL_MAX", default_value_t = crate::keypool::DEFAULT_MAX_KEYS)]
    pub(super) key_pool_max: usize,
}

fn parse_ipv6_prefix(text: &str) -> Result<crate::ratelimit::Ipv6Prefix, String> {
    let bits = text.parse::<u8>().map_err(|_| {
        format!("an IPv6 prefix length is a number of bits (1 to 128), not '{text}'")
    })?;
    crate::ratelimit::Ipv6Prefix::new(bits)
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
    /// Seconds a node applying an update waits for each component it restarted before its
    /// agent puts the previous files back and reports the update failed (rendered into
    /// update bundles; 10 to 86400).
    #[arg(long, env = "EXK8S_UPDATE_WAIT_SECS", default_value_t = crate::render::DEFAULT_UPDATE_WAIT_SECS,
          value_parser = clap::value_parser!(u32).range(10..=86_400))]
    update_wait_secs: u32,
    /// Foundings run at once in the background (each mostly waits on the compute API).
    #[arg(long, env = "EXK8S_FOUNDING_WORKERS", default_value_t = crate::config::DEFAULT_FOUNDING_WORKERS)]
    founding_workers: usize,
    /// Foundings accepted at once, running or waiting for a worker; `POST /clusters` beyond
    /// it answers 503 with Retry-After.
    #[arg(long, env = "EXK8S_FOUNDING_QUEUE", default_value_t = crate::config::DEFAULT_FOUNDING_QUEUE)]
    founding_queue: usize,
    /// Days a deleted cluster's trust and stored snapshots are kept, so a cluster can be
    /// founded from it (`restore_from`), before the reconciler purges them; 0 purges them at
    /// its next pass.
    #[arg(long, env = "EXK8S_KEEP_DELETED_DAYS", default_value_t = 30,
          value_parser = clap::value_parser!(u32).range(0..=3650))]
    keep_deleted_days: u32,
}

impl ChangeArgs {
    /// How long a deleted cluster is kept.
    pub(super) fn keep_deleted(&self) -> Duration {
        Duration::from_secs(u64::from(self.keep_deleted_days) * 86_400)
    }

    /// How often the reconciler runs (at least once a second).
    pub(super) fn reconcile_interval(&self) -> Duration {
        Duration::from_secs(self.reconcile_interval_secs.max(1))
    }

    pub(super) fn member_join_timeout(&self) -> Duration {
        Duration::from_secs(self.member_join_timeout_secs)
    }

    pub(super) fn update_wait(&self) -> Duration {
        Duration::from_secs(u64::from(self.update_wait_secs))
    }

    /// (foundings running at once, foundings accepted at once).
    pub(super) fn founding(&self) -> (usize, usize) {
        (self.founding_workers, self.founding_queue)
    }
}
