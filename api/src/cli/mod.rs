//! The `exk8s-api` command: [`serve`], `migrate`, `tokens` and `keys` ([`admin`]), `sim` (the
//! compute and DNS SIMULATORS as their own HTTP service) and [`dev`]. Every flag has an
//! `EXK8S_*` environment fallback.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use clap::{Args, Parser, Subcommand};
use exk8s_common::BundleSigner;

mod admin;
mod dev;
mod limits;
mod serve;

use admin::{KeysCommand, OrgsCommand, TokensCommand, keys_command, orgs_command, tokens_command};
use dev::{DevArgs, dev};
use serve::{ServeArgs, serve};

use crate::app::{ApiConfig, AppState};
use crate::compute::Compute;
use crate::crypto::Keyring;
use crate::db::Db;
use crate::dns::Dns;
use crate::keyfiles;
use crate::metrics::Metrics;
use crate::sim::Simulators;

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
    /// Manage an org's own settings (how long its deleted clusters are kept).
    #[command(subcommand)]
    Orgs(OrgsCommand),
    /// Manage the bundle-signing key and the key-encryption key.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Run the compute and DNS SIMULATORS as an HTTP service (for development and tests).
    Sim(SimArgs),
    /// The whole stack on a laptop: SQLite, generated keys kept in the data dir, and the
    /// compute, DNS and instance-metadata SIMULATORS. Prints a token and what to run next.
    Dev(Box<DevArgs>),
    /// The server's own key helper: writes one fresh private key (PKCS #8 DER) to a pipe.
    #[command(name = crate::pki::HELPER_COMMAND, hide = true)]
    Keygen {
        /// ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072 or rsa-4096.
        algorithm: String,
    },
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

/// Checks `--kubernetes-versions`: at least one, each a release (`v1.MINOR.PATCH`), none twice.
fn check_versions(versions: &[String]) -> Result<(), String> {
    if versions.is_empty() {
        return Err("--kubernetes-versions names no release".into());
    }
    for (i, version) in versions.iter().enumerate() {
        version
            .parse::<crate::upgrade::skew::Release>()
            .map_err(|e| format!("--kubernetes-versions: {e}"))?;
        if versions[..i].contains(version) {
            return Err(format!("--kubernetes-versions names {version} twice"));
        }
    }
    Ok(())
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

fn build_state(
    db: Db,
    keks: Keyring,
    signer: BundleSigner,
    extra: Vec<ed25519_dalek::VerifyingKey>,
    compute: Arc<dyn Compute>,
    dns: Option<Arc<dyn Dns>>,
    config: ApiConfig,
) -> Result<AppState, String> {
    let key_pool = crate::keypool::KeyPool::start(config.key_pool_max)
        .map_err(|e| format!("starting the key pool's thread: {e}"))?;
    let feed = Arc::new(crate::feed::Feed::new(db.clone(), config.event_streams));
    let snapshot_store = crate::snapshots::Store::open(&config.snapshot_store)
        .map_err(|e| crate::error_chain(&e))?;
    tracing::info!(
        store = snapshot_store.location(),
        "etcd snapshots are kept here"
    );
    Ok(AppState {
        snapshot_store,
        feed,
        db,
        keks: Arc::new(keks),
        signer: Arc::new(signer),
        extra_trusted_keys: Arc::new(extra),
        compute,
        dns,
        limits: Arc::new(crate::app::BootstrapLimits::new(&config)),
        cpu: crate::cpu::CpuPool::per_core_with_queue(config.cpu_queue_per_core),
        founders: crate::founding::queue::Founders::new(
            config.founding_workers,
            config.founding_queue,
        ),
        config: Arc::new(config),
        metrics: Arc::new(Metrics::default()),
        draining: Arc::new(AtomicBool::new(false)),
        clock: crate::clock::from_env(),
        issuers: Arc::new(crate::records::issuers::IssuerCache::new(
            crate::records::issuers::DEFAULT_CAPACITY,
        )),
        recorded: Arc::new(crate::cert_cache::CertificateCache::new(
            crate::cert_cache::DEFAULT_BOUND_ROWS,
        )),
        key_pool,
    })
}

/// The simulated instance-metadata service, and the simulators' state for inspection under
/// `/sim/compute` (e.g. `GET /sim/compute/v1/vms`).
fn sim_routes(db: Db, sims: &Simulators) -> axum::Router {
    crate::sim::imds::router(db, sims.compute.clone())
        .nest("/sim/compute", crate::sim::server::router(sims.clone()))
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
        Command::Orgs(command) => orgs_command(command).await,
        Command::Dev(args) => dev(*args).await,
        Command::Keys(command) => keys_command(command),
        Command::Keygen { algorithm } => keygen(&algorithm),
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

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Keygen { algorithm } = &cli.command {
        return exit_code(keygen(algorithm));
    }
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exk8s-api: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    exit_code(runtime.block_on(run(cli)))
}

fn exit_code(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exk8s-api: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The key helper ([`crate::pki::KeyMaker`]): no runtime, no logging, one key to stdout.
fn keygen(algorithm: &str) -> Result<(), String> {
    use std::io::IsTerminal;
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        return Err(
            "keygen writes a private key for the API server's own use, not to a terminal".into(),
        );
    }
    crate::pki::write_helper_key(algorithm, &mut stdout.lock())
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

/// The command-line reference page is what this definition renders.
#[cfg(test)]
mod reference {
    #[test]
    fn the_reference_page_is_current() {
        use clap::CommandFactory as _;
        let checked = exk8s_cli_reference::check(
            super::Cli::command(),
            env!("CARGO_MANIFEST_DIR"),
            "docs/reference/exk8s-api.md",
        );
        assert_eq!(checked, Ok(()));
    }
}
