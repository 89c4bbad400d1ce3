//! The service's shared state and configuration. It wires nothing: the router and the
//! background workers are attached by the server ([`crate::Application`]).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use ed25519_dalek::VerifyingKey;
use exk8s_common::BundleSigner;

use crate::compute::Compute;
pub use crate::config::ApiConfig;
use crate::crypto::Keyring;
use crate::db::Db;
use crate::dns::Dns;
use crate::metrics::Metrics;

/// Everything a handler may use. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppState {
    pub db: Db,
    pub keks: Arc<Keyring>,
    /// The active bundle-signing key.
    pub signer: Arc<BundleSigner>,
    /// Further public keys published at `/bootstrap/keys` during a rotation.
    pub extra_trusted_keys: Arc<Vec<VerifyingKey>>,
    pub compute: Arc<dyn Compute>,
    pub dns: Option<Arc<dyn Dns>>,
    pub config: Arc<ApiConfig>,
    pub metrics: Arc<Metrics>,
    pub draining: Arc<AtomicBool>,
    pub limits: Arc<BootstrapLimits>,
    /// Where key generation and signing run (never on the async workers).
    pub cpu: crate::cpu::CpuPool,
    /// What certificate lifetimes are made and judged by (a manual clock in tests).
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Clusters' opened trust, kept between bundle requests.
    pub issuers: Arc<crate::records::issuers::IssuerCache>,
    /// Clusters' recorded certificates, kept between pages of views and renewal passes.
    pub recorded: Arc<crate::cert_cache::CertificateCache>,
    /// Where foundings run after `POST /clusters` answered.
    pub founders: crate::founding::queue::Founders,
    /// RSA leaf keys made ahead of demand.
    pub key_pool: crate::keypool::KeyPool,
    /// The process's change feed, shared by every event stream.
    pub feed: Arc<crate::feed::Feed>,
    /// Where sealed etcd snapshots go.
    pub snapshot_store: crate::snapshots::Store,
}

/// The bootstrap routes' rate limiters: every request is charged to its source address; only
/// a request that proved it is a VM is charged to that VM.
#[derive(Debug)]
pub struct BootstrapLimits {
    pub per_vm: crate::ratelimit::Limiter<i64>,
    pub per_source: crate::ratelimit::Limiter<std::net::IpAddr>,
    /// The network an IPv6 source is keyed by.
    pub ipv6_prefix: crate::ratelimit::Ipv6Prefix,
}

impl BootstrapLimits {
    /// Charges one request to its source (an IPv4 address or an IPv6 network).
    pub fn charge_source(&self, address: std::net::IpAddr) -> Result<(), std::time::Duration> {
        self.per_source
            .check(&crate::ratelimit::source_key(address, self.ipv6_prefix))
    }

    /// Forgets idle keys (the server does, every [`crate::ratelimit::PRUNE_EVERY`]).
    pub fn prune(&self) {
        self.per_source.prune();
        self.per_vm.prune();
    }

    pub fn new(config: &ApiConfig) -> Self {
        Self {
            per_vm: crate::ratelimit::Limiter::new(config.rate_per_vm),
            per_source: crate::ratelimit::Limiter::new(config.rate_per_source),
            ipv6_prefix: config.source_ipv6_prefix,
        }
    }
}

/// The domain contexts, each made of the handles it uses and nothing more: `http/` hands a
/// domain call its context, never the whole state. Each is a few reference-count increments.
impl AppState {
    pub fn snapshots(&self) -> crate::snapshots::Snapshots {
        crate::snapshots::Snapshots {
            db: self.db.clone(),
            keks: self.keks.clone(),
            store: self.snapshot_store.clone(),
            clock: self.clock.clone(),
            compute: self.compute.clone(),
        }
    }

    pub fn machines(&self) -> crate::machines::Machines {
        crate::machines::Machines {
            db: self.db.clone(),
            compute: Arc::clone(&self.compute),
            dns: self.dns.clone(),
            config: Arc::clone(&self.config),
        }
    }

    pub fn founder(&self) -> crate::founding::Founder {
        crate::founding::Founder {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            config: Arc::clone(&self.config),
            keks: Arc::clone(&self.keks),
            cpu: self.cpu.clone(),
            key_pool: self.key_pool.clone(),
            founders: self.founders.clone(),
            metrics: Arc::clone(&self.metrics),
            machines: self.machines(),
        }
    }

    pub fn issuer(&self) -> crate::issuance::Issuer {
        crate::issuance::Issuer {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            config: Arc::clone(&self.config),
            keks: Arc::clone(&self.keks),
            issuers: Arc::clone(&self.issuers),
            key_pool: self.key_pool.clone(),
            cpu: self.cpu.clone(),
            signer: Arc::clone(&self.signer),
            metrics: Arc::clone(&self.metrics),
        }
    }

    pub fn reporter(&self) -> crate::issuance::report::Reporter {
        crate::issuance::report::Reporter {
            db: self.db.clone(),
            rotator: self.rotator(),
            pools: self.pools(),
            membership: self.membership(),
            snapshots: self.snapshots(),
        }
    }

    pub fn certifier(&self) -> crate::certificates::Certifier {
        crate::certificates::Certifier {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            keks: Arc::clone(&self.keks),
            issuers: Arc::clone(&self.issuers),
            cpu: self.cpu.clone(),
            metrics: Arc::clone(&self.metrics),
        }
    }

    pub fn renewer(&self) -> crate::renewal::Renewer {
        crate::renewal::Renewer {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            renew_at: self.config.renew_at,
            keks: Arc::clone(&self.keks),
            issuers: Arc::clone(&self.issuers),
            recorded: Arc::clone(&self.recorded),
            cpu: self.cpu.clone(),
            metrics: Arc::clone(&self.metrics),
        }
    }

    pub fn rotator(&self) -> crate::rotation::Rotator {
        crate::rotation::Rotator {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            keks: Arc::clone(&self.keks),
            issuers: Arc::clone(&self.issuers),
            cpu: self.cpu.clone(),
        }
    }

    pub fn pools(&self) -> crate::pools::Pools {
        crate::pools::Pools {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            config: Arc::clone(&self.config),
            key_pool: self.key_pool.clone(),
            machines: self.machines(),
        }
    }

    pub fn membership(&self) -> crate::membership::Membership {
        crate::membership::Membership {
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            config: Arc::clone(&self.config),
            keks: Arc::clone(&self.keks),
            issuers: Arc::clone(&self.issuers),
            cpu: self.cpu.clone(),
            key_pool: self.key_pool.clone(),
            machines: self.machines(),
        }
    }

    pub fn upgrader(&self) -> crate::upgrade::Upgrader {
        crate::upgrade::Upgrader {
            db: self.db.clone(),
            config: Arc::clone(&self.config),
            clock: Arc::clone(&self.clock),
        }
    }

    pub fn reconciler(&self) -> crate::founding::reconcile::Reconciler {
        crate::founding::reconcile::Reconciler {
            snapshots: self.snapshots(),
            db: self.db.clone(),
            clock: Arc::clone(&self.clock),
            provisioning_deadline: self.config.provisioning_deadline,
            interval: self.config.reconcile_interval,
            metrics: Arc::clone(&self.metrics),
            key_pool: self.key_pool.clone(),
            machines: self.machines(),
            renewer: self.renewer(),
            rotator: self.rotator(),
            pools: self.pools(),
            membership: self.membership(),
            health: self.health(),
        }
    }

    pub fn health(&self) -> crate::health::pass::Checks {
        crate::health::pass::Checks {
            db: self.db.clone(),
            compute: Arc::clone(&self.compute),
            clock: Arc::clone(&self.clock),
            gap_secs: crate::health::pass::Checks::gap_for(self.config.reconcile_interval),
        }
    }
}
