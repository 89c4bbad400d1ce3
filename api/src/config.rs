//! The service's settings: what shapes clusters and the service's timing. Read-only once the
//! server starts; every domain context holds the same `Arc<ApiConfig>`.

use std::time::Duration;

/// Default foundings running at once: founding mostly waits on the compute API (its key
/// generation runs on the CPU pool, one job per core), so a few more than the cores.
pub const DEFAULT_FOUNDING_WORKERS: usize = 8;
/// Default foundings accepted at once (running or waiting).
pub const DEFAULT_FOUNDING_QUEUE: usize = 256;

/// Settings that shape clusters and the service's timing.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Where VMs reach this API (written into userdata).
    pub public_url: String,
    /// Instance-metadata base URL written into userdata.
    pub imds_url: String,
    /// Tell agents plain HTTP is acceptable (dev stack only).
    pub agent_insecure_http: bool,
    /// Zone of the shared control-plane names: `<cluster>.<zone>`.
    pub dns_zone: String,
    pub cluster_domain: String,
    pub service_cidr: String,
    pub pod_cidr: String,
    /// The allow-list; the first is the default.
    pub kubernetes_versions: Vec<String>,
    /// How long founding waits for a VM's address.
    pub address_timeout: Duration,
    /// A `provisioning` cluster untouched this long is abandoned (reconciler).
    pub provisioning_deadline: Duration,
    pub reconcile_interval: Duration,
    /// How long a worker being removed may take to drain before its VM is deleted anyway.
    pub node_drain_timeout: Duration,
    /// How long a new control-plane member may take to join before it is released.
    pub member_join_timeout: Duration,
    /// How long a node applying an update waits for each component it restarted (etcd, each
    /// static pod running its new inputs, the apiserver's `/readyz`) before its agent puts
    /// every previous file back and reports the update failed. Rendered into update bundles.
    pub update_wait: Duration,
    /// Bundle requests that may wait per core for the CPU pool, at most; beyond them (or when
    /// the waiting work would outlast the bootstrap deadline) one is refused at once (503,
    /// `Retry-After`).
    pub cpu_queue_per_core: usize,
    /// Leaf keys the key pool holds at most (0: no pool).
    pub key_pool_max: usize,
    /// Foundings run at once in the background.
    pub founding_workers: usize,
    /// Foundings accepted at once (running or waiting); beyond it `POST /clusters` is 503.
    pub founding_queue: usize,
    /// How long a deleted cluster's trust and stored snapshots are kept (`--keep-deleted-days`).
    pub keep_deleted: Duration,
    /// How long `/healthz` answers 418 before the server stops accepting.
    pub drain: Duration,
    /// Bundle lifetime.
    pub bundle_ttl: Duration,
    /// Longest a bundle request may take (a slow or stalled database): past it, 503 with
    /// `Retry-After`, never a hanging agent.
    pub bootstrap_deadline: Duration,
    /// Pinned downloads of node binaries (`--artifact-catalog`).
    pub artifacts: crate::render::ArtifactCatalog,
    /// Bootstrap requests allowed per VM.
    pub rate_per_vm: crate::ratelimit::Limit,
    /// Bootstrap requests allowed per source address.
    pub rate_per_source: crate::ratelimit::Limit,
    /// The network an IPv6 source is keyed by for `rate_per_source` (/64 by default).
    pub source_ipv6_prefix: crate::ratelimit::Ipv6Prefix,
    /// Per-org bounds on clusters, VMs and pools.
    pub quotas: crate::quotas::Quotas,
    /// Where sealed etcd snapshots are kept (`--snapshot-store`).
    pub snapshot_store: crate::snapshot_store::Location,
    /// Event streams open at once, per operator token and per process.
    pub event_streams: crate::feed::StreamLimits,
    /// How often an open event stream checks that its token is still valid.
    pub event_stream_token_recheck: Duration,
    /// How long an event stream lasts before the server ends it (the client reconnects with
    /// `Last-Event-ID`).
    pub event_stream_lifetime: Duration,
    /// Leaves are renewed when less than this share of their validity remains.
    pub renew_at: crate::pki::RenewAt,
    /// How a bundle's fresh leaf keys are made (the server: RSA keys in a killable helper).
    pub key_maker: crate::pki::KeyMaker,
}

impl Default for ApiConfig {
    fn default() -> Self {
        Self {
            public_url: "http://127.0.0.1:8080".into(),
            imds_url: "http://169.254.169.254".into(),
            agent_insecure_http: false,
            dns_zone: "k8s.internal".into(),
            cluster_domain: "cluster.local".into(),
            service_cidr: "10.96.0.0/12".into(),
            pod_cidr: "172.16.0.0/12".into(),
            kubernetes_versions: vec!["v1.35.3".into()],
            address_timeout: Duration::from_secs(120),
            provisioning_deadline: Duration::from_secs(600),
            reconcile_interval: Duration::from_secs(60),
            node_drain_timeout: Duration::from_secs(600),
            member_join_timeout: Duration::from_secs(1800),
            keep_deleted: Duration::from_secs(30 * 86_400),
            update_wait: Duration::from_secs(u64::from(crate::render::DEFAULT_UPDATE_WAIT_SECS)),
            cpu_queue_per_core: crate::cpu::CpuPool::QUEUE_PER_SLOT,
            key_pool_max: crate::keypool::DEFAULT_MAX_KEYS,
            founding_workers: DEFAULT_FOUNDING_WORKERS,
            founding_queue: DEFAULT_FOUNDING_QUEUE,
            drain: Duration::from_secs(5),
            bundle_ttl: Duration::from_secs(900),
            quotas: crate::quotas::Quotas::default(),
            snapshot_store: crate::snapshot_store::Location::Local("exk8s-data/snapshots".into()),
            event_streams: crate::feed::StreamLimits::default(),
            event_stream_token_recheck: Duration::from_secs(10),
            event_stream_lifetime: Duration::from_secs(3600),
            bootstrap_deadline: Duration::from_secs(10),
            artifacts: crate::render::ArtifactCatalog::default(),
            rate_per_vm: crate::ratelimit::Limit {
                per_minute: 60,
                burst: 30,
            },
            rate_per_source: crate::ratelimit::Limit {
                per_minute: 600,
                burst: 120,
            },
            source_ipv6_prefix: crate::ratelimit::Ipv6Prefix::DEFAULT,
            renew_at: crate::pki::RenewAt::THIRD,
            key_maker: crate::pki::KeyMaker::InProcess,
        }
    }
}
