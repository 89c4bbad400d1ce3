//! The `exk8s-api` command: `serve`, `migrate`, `tokens`, `keys`, and `sim` (the compute and DNS
//! SIMULATORS as their own HTTP service). Every flag has an `EXK8S_*` environment fallback.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use exk8s_common::BundleSigner;

use crate::app::{ApiConfig, AppState, Application};
use crate::compute::Compute;
use crate::compute::http::HttpCompute;
use crate::crypto::{Kek, Keyring};
use crate::db::{self, Db};
use crate::dns::{Dns, HttpDns};
use crate::keyfiles;
use crate::metrics::Metrics;
use crate::sim::Simulators;
use crate::tokens::{self, Scope};

/// exk8s-api: found Kubernetes control planes and serve their signed bootstrap bundles.
#[derive(Debug, Parser)]
#[command(name = "exk8s-api", version)]
pub struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        env = "EXK8S_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the API server.
    Serve(Box<ServeArgs>),
    /// Apply database migrations and exit.
    Migrate(DbArgs),
    /// Manage principal tokens.
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Manage the bundle-signing key and the key-encryption key.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Run the compute and DNS SIMULATORS as an HTTP service (for development and tests).
    Sim(SimArgs),
    /// The whole stack on a laptop: SQLite, generated keys kept in the data dir, and the
    /// compute, DNS and instance-metadata SIMULATORS. Prints a token and what to run next.
    Dev(DevArgs),
}

#[derive(Debug, Args)]
struct DevArgs {
    #[arg(long, env = "EXK8S_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Holds the database, the KEK, the signing key, the trusted-keys dir and the operator token.
    #[arg(long, env = "EXK8S_DATA_DIR", default_value = "./exk8s-dev")]
    data_dir: PathBuf,
    /// Use this database instead of SQLite in the data dir.
    #[arg(long, env = "EXK8S_DATABASE_URL")]
    database_url: Option<String>,
    /// Addresses the compute SIMULATOR gives VMs (loopback, so rendered units work locally).
    #[arg(long, env = "EXK8S_SIM_CIDR", default_value = "127.0.10.0/24")]
    sim_cidr: String,
    /// Pinned downloads of node binaries (TOML; see `serve --help`).
    #[arg(long, env = "EXK8S_ARTIFACT_CATALOG")]
    artifact_catalog: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct DbArgs {
    /// Database URL: `sqlite://PATH?mode=rwc` or `postgres://…`. Default: SQLite in --data-dir.
    #[arg(long, env = "EXK8S_DATABASE_URL")]
    database_url: Option<String>,
    /// Directory for the embedded SQLite database.
    #[arg(long, env = "EXK8S_DATA_DIR", default_value = "./exk8s-data")]
    data_dir: PathBuf,
}

impl DbArgs {
    fn url(&self) -> Result<String, String> {
        if let Some(url) = &self.database_url {
            return Ok(url.clone());
        }
        std::fs::create_dir_all(&self.data_dir)
            .map_err(|e| format!("creating {}: {e}", self.data_dir.display()))?;
        Ok(format!(
            "sqlite://{}/exk8s.db?mode=rwc",
            self.data_dir.display()
        ))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SimChoice {
    Sim,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum DnsChoice {
    None,
    Sim,
}

#[derive(Debug, Args)]
struct ServeArgs {
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
    /// Seconds between reconciler passes.
    #[arg(long, env = "EXK8S_RECONCILE_INTERVAL_SECS", default_value_t = 60)]
    reconcile_interval_secs: u64,
    /// Seconds /healthz answers 418 before shutdown.
    #[arg(long, env = "EXK8S_DRAIN_SECS", default_value_t = 5)]
    drain_secs: u64,
    /// Seconds a bundle stays valid.
    #[arg(long, env = "EXK8S_BUNDLE_TTL_SECS", default_value_t = 900)]
    bundle_ttl_secs: u64,
    /// Milliseconds a bundle request may take before it answers 503 with Retry-After.
    #[arg(long, env = "EXK8S_BOOTSTRAP_DEADLINE_MS", default_value_t = 10_000)]
    bootstrap_deadline_ms: u64,
    /// Bootstrap requests (bundle fetches and reports) allowed per VM per minute.
    #[arg(long, env = "EXK8S_BOOTSTRAP_RATE_PER_VM", default_value_t = 60)]
    bootstrap_rate_per_vm: u32,
    /// Bootstrap requests allowed per source address per minute.
    #[arg(long, env = "EXK8S_BOOTSTRAP_RATE_PER_SOURCE", default_value_t = 600)]
    bootstrap_rate_per_source: u32,
    /// Pinned downloads of node binaries: a TOML file of `[[artifact]]` entries with `name`
    /// (etcd, etcdctl, kubelet, kubectl, helm), `version`, `url` and `sha256` (of the file at
    /// url). Checked at start. Without an entry nodes use the upstream URL and its published
    /// `<url>.sha256`; etcd publishes none, so pin etcd unless images are pre-baked.
    #[arg(long, env = "EXK8S_ARTIFACT_CATALOG")]
    artifact_catalog: Option<PathBuf>,
}

/// Reads and checks `--artifact-catalog`; no file means an empty catalog.
fn load_catalog(path: Option<&Path>) -> Result<crate::render::ArtifactCatalog, String> {
    let Some(path) = path else {
        return Ok(crate::render::ArtifactCatalog::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the artifact catalog {}: {e}", path.display()))?;
    let catalog = crate::render::ArtifactCatalog::parse(&text)
        .map_err(|e| format!("the artifact catalog {} is invalid: {e}", path.display()))?;
    tracing::info!(path = %path.display(), entries = catalog.len(), "artifact catalog loaded");
    Ok(catalog)
}

#[derive(Debug, Subcommand)]
enum TokensCommand {
    /// Create a token and print it once.
    Create {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        org: i64,
        #[arg(long)]
        principal: String,
        #[arg(long, value_enum)]
        scope: Scope,
        /// Lifetime: seconds, or a number with s/m/h/d (e.g. 30d).
        #[arg(long, default_value = "30d")]
        ttl: String,
    },
    /// List tokens (never their values).
    List {
        #[command(flatten)]
        db: DbArgs,
    },
    /// Revoke a token by id.
    Revoke {
        #[command(flatten)]
        db: DbArgs,
        #[arg(long)]
        id: i64,
    },
}

#[derive(Debug, Subcommand)]
enum KeysCommand {
    /// Generate an ed25519 bundle-signing key (written 0600) and print its public line.
    Generate {
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the `.pub` line agents trust for a signing key.
    Public {
        #[arg(long, env = "EXK8S_SIGNING_KEY")]
        signing_key: PathBuf,
    },
    /// Generate a key-encryption key file (written 0600). To rotate: serve with
    /// `--kek-file NEW,OLD` (NEW seals, both open), then drop OLD once re-sealed.
    GenerateKek {
        #[arg(long)]
        out: PathBuf,
        /// The KEK's id, stored beside every ciphertext it seals.
        #[arg(long, default_value = "kek-1")]
        id: String,
    },
}

#[derive(Debug, Args)]
struct SimArgs {
    #[arg(long, env = "EXK8S_SIM_LISTEN", default_value = "127.0.0.1:8090")]
    listen: String,
    #[arg(long, env = "EXK8S_SIM_CIDR", default_value = "127.0.10.0/24")]
    cidr: String,
    /// Added latency per call, milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
}

/// Parses a lifetime: plain seconds or a number with s, m, h or d.
pub fn parse_ttl(text: &str) -> Result<i64, String> {
    let (number, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let n: i64 = number
        .parse()
        .map_err(|_| format!("invalid lifetime `{text}`"))?;
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => {
            return Err(format!(
                "invalid lifetime unit in `{text}` (use s, m, h or d)"
            ));
        }
    };
    if n <= 0 {
        return Err(format!("lifetime `{text}` must be positive"));
    }
    n.checked_mul(factor)
        .ok_or_else(|| format!("lifetime `{text}` is too long"))
}

fn write_secret_file(path: &Path, text: &str) -> Result<(), String> {
    keyfiles::write_secret(path, text).map_err(|e| crate::error_chain(&e))
}

fn load_keks(paths: &[PathBuf]) -> Result<Keyring, String> {
    keyfiles::load_keks(paths).map_err(|e| crate::error_chain(&e))
}

fn load_signer(path: &Path) -> Result<BundleSigner, String> {
    keyfiles::load_signer(path).map_err(|e| crate::error_chain(&e))
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("EXK8S_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(false).init(),
    }
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
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
    let config = ApiConfig {
        public_url: args.public_url,
        imds_url: args.imds_url,
        agent_insecure_http: args.agent_insecure_http,
        dns_zone: args.dns_zone,
        kubernetes_versions: args.kubernetes_versions,
        address_timeout: Duration::from_secs(args.address_timeout_secs),
        provisioning_deadline: Duration::from_secs(args.provisioning_deadline_secs),
        reconcile_interval: Duration::from_secs(args.reconcile_interval_secs.max(1)),
        drain: Duration::from_secs(args.drain_secs),
        bundle_ttl: Duration::from_secs(args.bundle_ttl_secs),
        bootstrap_deadline: Duration::from_millis(args.bootstrap_deadline_ms.max(1)),
        rate_per_vm: crate::ratelimit::Limit {
            per_minute: args.bootstrap_rate_per_vm,
            burst: args.bootstrap_rate_per_vm.div_ceil(2).max(1),
        },
        rate_per_source: crate::ratelimit::Limit {
            per_minute: args.bootstrap_rate_per_source,
            burst: args.bootstrap_rate_per_source.div_ceil(5).max(1),
        },
        artifacts,
        ..ApiConfig::default()
    };
    let imds = match (args.imds, args.compute) {
        (Some(SimChoice::Sim), Some(SimChoice::Sim)) => true,
        (Some(SimChoice::Sim), None) => {
            return Err("--imds sim needs --compute sim (it serves the simulated VMs)".into());
        }
        _ => false,
    };
    let state = build_state(db.clone(), keks, signer, extra, compute, dns, config);
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

fn build_state(
    db: Db,
    keks: Keyring,
    signer: BundleSigner,
    extra: Vec<ed25519_dalek::VerifyingKey>,
    compute: Arc<dyn Compute>,
    dns: Option<Arc<dyn Dns>>,
    config: ApiConfig,
) -> AppState {
    AppState {
        db,
        keks: Arc::new(keks),
        signer: Arc::new(signer),
        extra_trusted_keys: Arc::new(extra),
        compute,
        dns,
        limits: Arc::new(crate::app::BootstrapLimits::new(&config)),
        config: Arc::new(config),
        metrics: Arc::new(Metrics::default()),
        draining: Arc::new(AtomicBool::new(false)),
        cpu: crate::cpu::CpuPool::per_core(),
    }
}

/// The simulated instance-metadata service, and the simulators' state for inspection under
/// `/sim/compute` (e.g. `GET /sim/compute/v1/vms`).
fn sim_routes(db: Db, sims: &Simulators) -> axum::Router {
    crate::sim::imds::router(db, sims.compute.clone())
        .nest("/sim/compute", crate::sim::server::router(sims.clone()))
}

/// Creates a key file with `make` the first time; later starts reuse it.
fn reuse_or_create(
    path: &Path,
    make: impl FnOnce() -> Result<zeroize::Zeroizing<String>, String>,
) -> Result<(), String> {
    if path.exists() {
        return Ok(());
    }
    write_secret_file(path, &make()?)
}

#[allow(
    clippy::print_stdout,
    reason = "the dev stack's instructions are its output"
)]
async fn dev(args: DevArgs) -> Result<(), String> {
    let artifacts = load_catalog(args.artifact_catalog.as_deref())?;
    let dir = &args.data_dir;
    std::fs::create_dir_all(dir.join("trusted-keys"))
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let kek_path = dir.join("kek.key");
    let signing_path = dir.join("signing.key");
    reuse_or_create(&kek_path, || {
        Kek::generate_file_text("dev-1").map_err(|e| e.to_string())
    })?;
    reuse_or_create(&signing_path, || {
        Ok(BundleSigner::generate()
            .map_err(|e| e.to_string())?
            .to_secret_text())
    })?;
    let signer = load_signer(&signing_path)?;
    let pub_path = dir.join("trusted-keys/exk8s-dev.pub");
    std::fs::write(
        &pub_path,
        format!("{}\n", signer.pub_line("exk8s dev stack")),
    )
    .map_err(|e| format!("writing {}: {e}", pub_path.display()))?;
    let url = match &args.database_url {
        Some(url) => url.clone(),
        None => format!("sqlite://{}/exk8s.db?mode=rwc", dir.display()),
    };
    let db = Db::connect(&url).map_err(|e| crate::error_chain(&e))?;
    let sims = Simulators::persistent(&args.sim_cidr, dir)?;
    let listener_hint = format!("http://{}", args.listen);
    let config = ApiConfig {
        public_url: listener_hint.clone(),
        imds_url: format!("{listener_hint}/sim/imds"),
        agent_insecure_http: true,
        artifacts,
        ..ApiConfig::default()
    };
    let compute: Arc<dyn Compute> = Arc::new(sims.compute.clone());
    let dns: Option<Arc<dyn Dns>> = Some(Arc::new(sims.dns.clone()));
    let state = build_state(
        db.clone(),
        load_keks(&[kek_path])?,
        signer,
        Vec::new(),
        compute,
        dns,
        config,
    );
    let app = Application::build(state, &args.listen)
        .await
        .map_err(|e| crate::error_chain(&e))?
        .with_routes(sim_routes(db.clone(), &sims));
    let addr = app.local_addr().map_err(|e| e.to_string())?;
    let base = format!("http://{addr}");

    let token = tokens::generate("exk8s_op").map_err(|e| e.to_string())?;
    let now = db::now();
    db::tokens::insert_api_token(
        &db.pool,
        &tokens::hash(&token),
        1,
        "dev",
        Scope::Operator,
        now,
        now + 7 * 86_400,
    )
    .await
    .map_err(|e| crate::error_chain(&e))?;
    let token_path = dir.join("operator.token");
    let _ = std::fs::remove_file(&token_path);
    write_secret_file(&token_path, &format!("{}\n", token.as_str()))?;
    let keys = dir.join("trusted-keys");
    let data = dir.display();
    let token_file = token_path.display();
    let keys = keys.display();
    let token = token.as_str();
    println!("exk8s dev stack on {base} (data in {data}; compute, DNS and IMDS are SIMULATED)");
    println!();
    println!("operator token for org 1 (also in {token_file}):");
    println!("  export EXK8S_TOKEN={token}");
    println!();
    println!("found a 3-node cluster:");
    println!("  curl -s -X POST {base}/clusters -H \"Authorization: Bearer $EXK8S_TOKEN\" \\");
    println!("    -H 'Content-Type: application/json' \\");
    println!(
        "    -d '{{\"control_plane_count\": 3, \"control_plane_image_id\": 1, \"control_plane_instance_type\": \"dev.small\", \"subnet_id\": 1}}'"
    );
    println!();
    println!("bootstrap its first VM (ids start at 101) into ./vm-101, recording host actions:");
    println!("  cargo run -p exk8s-agent -- --keys-dir {keys} run --root ./vm-101 \\");
    println!("    --api-url {base} --imds-url {base}/sim/imds/101 --insecure-http");
    println!();
    println!("and watch the node phases:");
    println!("  curl -s {base}/clusters -H \"Authorization: Bearer $EXK8S_TOKEN\"");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    app.run_until_stopped(stop_signal())
        .await
        .map_err(|e| e.to_string())
}

async fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Migrate(args) => {
            let db = Db::connect(&args.url()?).map_err(|e| crate::error_chain(&e))?;
            db.migrate().await.map_err(|e| crate::error_chain(&e))?;
            eprintln!("migrations applied");
            Ok(())
        }
        Command::Tokens(command) => tokens_command(command).await,
        Command::Dev(args) => dev(args).await,
        Command::Keys(command) => keys_command(command),
        Command::Sim(args) => {
            let sims = Simulators::new(&args.cidr)?;
            sims.set_faults(crate::sim::Faults {
                latency_ms: args.latency_ms,
                ..Default::default()
            });
            let listener = tokio::net::TcpListener::bind(&args.listen)
                .await
                .map_err(|e| format!("binding {}: {e}", args.listen))?;
            tracing::info!(addr = %listener.local_addr().map_err(|e| e.to_string())?, "compute and DNS SIMULATORS listening");
            axum::serve(listener, crate::sim::server::router(sims))
                .with_graceful_shutdown(stop_signal())
                .await
                .map_err(|e| e.to_string())
        }
    }
}

#[allow(
    clippy::print_stdout,
    reason = "tokens and keys are the commands' output"
)]
async fn tokens_command(command: TokensCommand) -> Result<(), String> {
    match command {
        TokensCommand::Create {
            db,
            org,
            principal,
            scope,
            ttl,
        } => {
            if org <= 0 {
                return Err("--org must be positive".into());
            }
            let ttl = parse_ttl(&ttl)?;
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            db.migrate().await.map_err(|e| crate::error_chain(&e))?;
            let prefix = match scope {
                Scope::Operator => "exk8s_op",
                Scope::Bootstrap => "exk8s_bs",
            };
            let token = tokens::generate(prefix).map_err(|e| e.to_string())?;
            let now = db::now();
            let id = db::tokens::insert_api_token(
                &db.pool,
                &tokens::hash(&token),
                org,
                &principal,
                scope,
                now,
                now + ttl,
            )
            .await
            .map_err(|e| crate::error_chain(&e))?;
            eprintln!(
                "token {id} for {principal} (org {org}, {}) — shown once:",
                scope.as_str()
            );
            println!("{}", token.as_str());
            Ok(())
        }
        TokensCommand::List { db } => {
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            let tokens = db::tokens::list_api_tokens(&db.pool)
                .await
                .map_err(|e| crate::error_chain(&e))?;
            println!("   id    org scope      expires_at          state principal");
            let now = db::now();
            for t in tokens {
                let state = if t.revoked {
                    "revoked"
                } else if t.expires_at <= now {
                    "expired"
                } else {
                    "active"
                };
                println!(
                    "{:>5} {:>6} {:<10} {:<12} {:>12} {}",
                    t.id,
                    t.org_id,
                    t.scope.as_str(),
                    t.expires_at,
                    state,
                    t.principal
                );
            }
            Ok(())
        }
        TokensCommand::Revoke { db, id } => {
            let db = Db::connect(&db.url()?).map_err(|e| crate::error_chain(&e))?;
            if db::tokens::revoke_api_token(&db.pool, id)
                .await
                .map_err(|e| crate::error_chain(&e))?
            {
                eprintln!("token {id} revoked");
                Ok(())
            } else {
                Err(format!("no token with id {id}"))
            }
        }
    }
}

#[allow(clippy::print_stdout, reason = "public keys are the commands' output")]
fn keys_command(command: KeysCommand) -> Result<(), String> {
    match command {
        KeysCommand::Generate { out } => {
            let signer = BundleSigner::generate().map_err(|e| e.to_string())?;
            write_secret_file(&out, &signer.to_secret_text())?;
            eprintln!("wrote {} (key id {})", out.display(), signer.key_id());
            println!("{}", signer.pub_line("exk8s bundle signing key"));
            Ok(())
        }
        KeysCommand::Public { signing_key } => {
            println!(
                "{}",
                load_signer(&signing_key)?.pub_line("exk8s bundle signing key")
            );
            Ok(())
        }
        KeysCommand::GenerateKek { out, id } => {
            let text = Kek::generate_file_text(&id).map_err(|e| e.to_string())?;
            write_secret_file(&out, &text)?;
            eprintln!("wrote {} (KEK id {id})", out.display());
            Ok(())
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exk8s-api: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exk8s-api: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_ttl;

    #[test]
    fn lifetimes_parse_with_units() {
        assert_eq!(parse_ttl("90").unwrap(), 90);
        assert_eq!(parse_ttl("15m").unwrap(), 900);
        assert_eq!(parse_ttl("30d").unwrap(), 2_592_000);
        for bad in ["", "0", "-5m", "3w", "d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
