//! `exk8s-api serve`: the API server against real (or, by flag, simulated) compute and DNS.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::{
    DbArgs, DnsChoice, SimChoice, build_state, load_catalog, load_keks, load_signer, sim_routes,
    stop_signal,
};
use crate::Application;
use crate::app::ApiConfig;
use crate::compute::Compute;
use crate::compute::http::HttpCompute;
use crate::db::Db;
use crate::dns::{Dns, HttpDns};
use crate::sim::Simulators;

#[derive(Debug, Args)]
pub(super) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "EXK8S_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    #[command(flatten)]
    db: DbArgs,
    /// KEK file(s): the first seals, all open (repeat during a rotation). See `keys generate-kek`.
    #[arg(
        long = "kek-file",
        env = "EXK8S_KEK_FILE",
        value_delimiter = ',',
        required = true
    )]
    kek_files: Vec<PathBuf>,
    /// The active bundle-signing key (see `keys generate`).
    #[arg(long, env = "EXK8S_SIGNING_KEY")]
    signing_key: PathBuf,
    /// Further public keys (`.pub` files) published at /bootstrap/keys during a rotation.
    #[arg(
        long = "extra-trusted-key",
        env = "EXK8S_EXTRA_TRUSTED_KEYS",
        value_delimiter = ','
    )]
    extra_trusted_keys: Vec<PathBuf>,
    /// The compute API base URL.
    #[arg(long, env = "EXK8S_COMPUTE_URL", conflicts_with = "compute")]
    compute_url: Option<String>,
    /// Use the in-process compute SIMULATOR instead.
    #[arg(long, env = "EXK8S_COMPUTE", value_enum)]
    compute: Option<SimChoice>,
    /// The DNS API base URL.
    #[arg(long, env = "EXK8S_DNS_URL", conflicts_with = "dns")]
    dns_url: Option<String>,
    /// `none` (no DNS records) or `sim` (in-process SIMULATOR).
    #[arg(long, env = "EXK8S_DNS", value_enum)]
    dns: Option<DnsChoice>,
    /// Serve the instance-metadata SIMULATOR under /sim/imds (needs --compute sim).
    #[arg(long, env = "EXK8S_IMDS", value_enum)]
    imds: Option<SimChoice>,
    /// Addresses the compute SIMULATOR gives VMs.
    #[arg(long, env = "EXK8S_SIM_CIDR", default_value = "127.0.10.0/24")]
    sim_cidr: String,
    /// The bootstrap base URL VMs reach this API at (written into their userdata).
    #[arg(long, env = "EXK8S_PUBLIC_URL")]
    public_url: String,
    /// The instance-metadata URL written into userdata.
    #[arg(long, env = "EXK8S_IMDS_URL", default_value = "http://169.254.169.254")]
    imds_url: String,
    /// Tell agents a plain-HTTP API is acceptable (dev stack only).
    #[arg(long, env = "EXK8S_AGENT_INSECURE_HTTP")]
    agent_insecure_http: bool,
    /// DNS zone of the clusters' shared control-plane names.
    #[arg(long, env = "EXK8S_DNS_ZONE", default_value = "k8s.internal")]
    dns_zone: String,
    /// Where sealed etcd snapshots are kept: a directory, or s3://BUCKET[/PREFIX] of any
    /// S3-compatible service (credentials, region and endpoint from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT, AWS_ALLOW_HTTP). Default: `snapshots`
    /// in --data-dir.
    #[arg(long, env = "EXK8S_SNAPSHOT_STORE")]
    snapshot_store: Option<crate::snapshots::Location>,
    /// Kubernetes versions offered; the first is the default.
    #[arg(
        long,
        env = "EXK8S_KUBERNETES_VERSIONS",
        value_delimiter = ',',
        default_value = "v1.35.3"
    )]
    kubernetes_versions: Vec<String>,
    /// Seconds founding waits for a VM's address.
    #[arg(long, env = "EXK8S_ADDRESS_TIMEOUT_SECS", default_value_t = 120)]
    address_timeout_secs: u64,
    /// Seconds after which a cluster stuck in provisioning is compensated.
    #[arg(long, env = "EXK8S_PROVISIONING_DEADLINE_SECS", default_value_t = 600)]
    provisioning_deadline_secs: u64,
    /// Seconds a worker being removed may take to drain before its VM is deleted anyway.
    #[arg(long, env = "EXK8S_NODE_DRAIN_TIMEOUT_SECS", default_value_t = 600)]
    node_drain_timeout_secs: u64,
    /// Renew a leaf certificate when less than this share of its validity remains.
    #[arg(long, env = "EXK8S_RENEW_WHEN_REMAINING", default_value = "1/3", value_parser = crate::pki::RenewAt::parse)]
    renew_when_remaining: crate::pki::RenewAt,
    /// Seconds /healthz answers 418 before shutdown.
    #[arg(long, env = "EXK8S_DRAIN_SECS", default_value_t = 5)]
    drain_secs: u64,
    /// Seconds a bundle stays valid.
    #[arg(long, env = "EXK8S_BUNDLE_TTL_SECS", default_value_t = 900)]
    bundle_ttl_secs: u64,
    /// Clusters one org may have (those not failed; 0: unlimited).
    #[arg(long, env = "EXK8S_QUOTA_CLUSTERS", default_value_t = crate::quotas::Quotas::default().clusters)]
    quota_clusters: i64,
    /// VMs one org's clusters and pools may have or ask for (0: unlimited).
    #[arg(long, env = "EXK8S_QUOTA_VMS", default_value_t = crate::quotas::Quotas::default().vms)]
    quota_vms: i64,
    /// Node pools one org may have (0: unlimited).
    #[arg(long, env = "EXK8S_QUOTA_POOLS", default_value_t = crate::quotas::Quotas::default().pools)]
    quota_pools: i64,
    /// Event streams (`GET /clusters/{id}/events`) one operator token may hold open at once
    /// (0: unlimited); beyond it 429 with Retry-After.
    #[arg(long, env = "EXK8S_EVENT_STREAMS_PER_TOKEN", default_value_t = crate::feed::StreamLimits::default().per_token)]
    event_streams_per_token: usize,
    /// Event streams this process serves at once (0: unlimited). Each holds a socket: the
    /// packaged unit's LimitNOFILE leaves room for the default.
    #[arg(long, env = "EXK8S_EVENT_STREAMS", default_value_t = crate::feed::StreamLimits::default().per_process)]
    event_streams: usize,
    /// Seconds between an event stream's checks that its token is still valid.
    #[arg(
        long,
        env = "EXK8S_EVENT_STREAM_TOKEN_RECHECK_SECS",
        default_value_t = 10
    )]
    event_stream_token_recheck_secs: u64,
    /// Seconds an event stream lasts before the server ends it (clients resume with
    /// Last-Event-ID).
    #[arg(long, env = "EXK8S_EVENT_STREAM_LIFETIME_SECS", default_value_t = 3600)]
    event_stream_lifetime_secs: u64,
    /// Milliseconds a bundle request may take before it answers 503 with Retry-After.
    #[arg(long, env = "EXK8S_BOOTSTRAP_DEADLINE_MS", default_value_t = 10_000)]
    bootstrap_deadline_ms: u64,
    #[command(flatten)]
    rates: super::limits::NodeRateArgs,
    #[command(flatten)]
    changes: super::limits::ChangeArgs,
    /// Pinned downloads of node binaries: a TOML file of `[[artifact]]` entries with `name`
    /// (etcd, etcdctl, kubelet, kubectl, helm), `version`, `url` and `sha256` (of the file at
    /// url). Checked at start. Without an entry nodes use the upstream URL and its published
    /// `<url>.sha256`; etcd publishes none, so pin etcd unless images are pre-baked.
    #[arg(long, env = "EXK8S_ARTIFACT_CATALOG")]
    artifact_catalog: Option<PathBuf>,
}

pub(super) async fn serve(args: ServeArgs) -> Result<(), String> {
    let artifacts = load_catalog(args.artifact_catalog.as_deref())?;
    let db = Db::connect(&args.db.url()?).map_err(|e| crate::error_chain(&e))?;
    let keks = load_keks(&args.kek_files)?;
    let signer = load_signer(&args.signing_key)?;
    let mut extra = Vec::new();
    for path in &args.extra_trusted_keys {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let mut ring = exk8s_common::Keyring::new();
        ring.add_pub_text(&text, &path.display().to_string())
            .map_err(|e| e.to_string())?;
        extra.extend(ring.key_ids().filter_map(|id| ring.get(&id).copied()));
    }
    let sims = Simulators::new(&args.sim_cidr)?;
    let compute: Arc<dyn Compute> = match (&args.compute_url, args.compute) {
        (Some(url), None) => Arc::new(HttpCompute::new(url)?),
        (None, Some(SimChoice::Sim)) => Arc::new(sims.compute.clone()),
        _ => return Err("choose the compute API: --compute-url URL or --compute sim".into()),
    };
    let dns: Option<Arc<dyn Dns>> = match (&args.dns_url, args.dns) {
        (Some(url), None) => Some(Arc::new(HttpDns::new(url)?)),
        (None, Some(DnsChoice::Sim)) => Some(Arc::new(sims.dns.clone())),
        (None, Some(DnsChoice::None)) | (None, None) => None,
        _ => return Err("choose at most one of --dns-url and --dns".into()),
    };
    super::check_versions(&args.kubernetes_versions)?;
    let config = ApiConfig {
        public_url: args.public_url,
        imds_url: args.imds_url,
        agent_insecure_http: args.agent_insecure_http,
        dns_zone: args.dns_zone,
        kubernetes_versions: args.kubernetes_versions,
        snapshot_store: args.snapshot_store.unwrap_or_else(|| {
            crate::snapshots::Location::Local(args.db.data_dir.join("snapshots"))
        }),
        address_timeout: Duration::from_secs(args.address_timeout_secs),
        provisioning_deadline: Duration::from_secs(args.provisioning_deadline_secs),
        reconcile_interval: args.changes.reconcile_interval(),
        renew_at: args.renew_when_remaining,
        node_drain_timeout: Duration::from_secs(args.node_drain_timeout_secs),
        member_join_timeout: args.changes.member_join_timeout(),
        keep_deleted: args.changes.keep_deleted(),
        update_wait: args.changes.update_wait(),
        cpu_queue_per_core: args.rates.cpu_queue_per_core,
        key_pool_max: args.rates.key_pool_max,
        founding_workers: args.changes.founding().0,
        founding_queue: args.changes.founding().1,
        drain: Duration::from_secs(args.drain_secs),
        bundle_ttl: Duration::from_secs(args.bundle_ttl_secs),
        quotas: crate::quotas::Quotas {
            clusters: args.quota_clusters.max(0),
            vms: args.quota_vms.max(0),
            pools: args.quota_pools.max(0),
        },
        event_streams: crate::feed::StreamLimits {
            per_token: args.event_streams_per_token,
            per_process: args.event_streams,
        },
        event_stream_token_recheck: Duration::from_secs(
            args.event_stream_token_recheck_secs.max(1),
        ),
        event_stream_lifetime: Duration::from_secs(args.event_stream_lifetime_secs.max(1)),
        bootstrap_deadline: Duration::from_millis(args.bootstrap_deadline_ms.max(1)),
        rate_per_vm: args.rates.limits().0,
        rate_per_source: args.rates.limits().1,
        source_ipv6_prefix: args.rates.ipv6_prefix,
        artifacts,
        key_maker: crate::pki::KeyMaker::this_binary(),
        ..ApiConfig::default()
    };
    let imds = match (args.imds, args.compute) {
        (Some(SimChoice::Sim), Some(SimChoice::Sim)) => true,
        (Some(SimChoice::Sim), None) => {
            return Err("--imds sim needs --compute sim (it serves the simulated VMs)".into());
        }
        _ => false,
    };
    let state = build_state(db.clone(), keks, signer, extra, compute, dns, config)?;
    let mut app = Application::build(state, &args.listen)
        .await
        .map_err(|e| crate::error_chain(&e))?;
    if imds {
        app = app.with_routes(sim_routes(db, &sims));
    }
    let addr = app.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(%addr, "exk8s-api listening");
    app.run_until_stopped(stop_signal())
        .await
        .map_err(|e| e.to_string())
}
