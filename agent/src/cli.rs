//! The command line: flags override `EXK8S_*` environment variables, which override
//! `/etc/exk8s/agent.toml`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::balancer::{self, DEFAULT_LISTEN, Endpoint, Options};
use crate::commands::{self, DEFAULT_SKEW, LocalCheck};
use crate::config::{ConfigFile, DEFAULT_CONFIG_PATH, DEFAULT_KEYS_DIR, NetConfig};
use crate::error::{AgentError, chain, exit};
use crate::log::log_error;

const EXIT_CODES: &str = "\
Exit codes:
  0  success, or nothing to do (already bootstrapped, serial already applied)
  2  usage or configuration error
  3  no bundle obtained: network retries exhausted, or the API or IMDS refused (4xx)
  4  bundle refused: signature, key id, payload type, content, identity, nonce,
     freshness or rollback
  5  applying failed: writing files, packages or artifacts
  6  a plan step failed: systemd, a wait for etcd or the apiserver, an addon;
     or the apiserver balancer could not listen or accept";

/// exk8s-agent: fetch, verify and apply this machine's signed bootstrap bundle.
#[derive(Debug, Parser)]
#[command(name = "exk8s-agent", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, env = "EXK8S_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    /// Directory of trusted bundle-signing keys (`*.pub`). [default: /etc/exk8s/trusted-keys.d]
    #[arg(long, global = true, env = "EXK8S_TRUSTED_KEYS_DIR")]
    keys_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The boot path: identity from instance metadata, fetch the bundle with both credentials
    /// and a fresh nonce, verify, apply, start services, wait, install addons (initial node),
    /// reporting each phase to the API.
    Run(RunArgs),
    /// Day 2 (run by exk8s-agent-sync.timer): ask the API for this node's desired generation;
    /// when it is newer, fetch the signed update, write only changed files, restart what reads
    /// them in a safe order with health waits, and put the previous files back on failure.
    Sync(RunArgs),
    /// Apply a local bundle file (or show what would change with --dry-run).
    Apply(ApplyArgs),
    /// Verify a local bundle file: signature, payload type, contents, binding.
    Verify(VerifyArgs),
    /// Install only the bundle's artifacts (and packages on a live system): for image baking.
    Prereqs(PrereqsArgs),
    /// The node-local apiserver load balancer (exk8s-apiserver-balancer.service runs it):
    /// passes each connection on loopback, untouched, to an apiserver whose /readyz answers
    /// ok, until SIGTERM.
    Balance(BalanceArgs),
}

#[derive(Debug, Args)]
struct BalanceArgs {
    /// The apiservers: the control plane's DNS name, resolved again every round, and port.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_endpoint)]
    apiserver: Endpoint,
    /// The cluster CA certificates the apiservers' certificates are checked against (read
    /// again every round: two during a CA rotation).
    #[arg(long, value_name = "PEM")]
    ca_file: PathBuf,
    /// The members the node's bundle lists, one IP:PORT a line: the apiservers until the
    /// name first resolves.
    #[arg(long, value_name = "FILE")]
    seeds_file: Option<PathBuf>,
    /// Where to listen when systemd passes no socket (exk8s-apiserver-balancer.socket does).
    #[arg(long, value_name = "ADDRESS:PORT", default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Milliseconds between two rounds of /readyz checks.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval_ms: u64,
}

fn parse_endpoint(text: &str) -> Result<Endpoint, String> {
    text.parse()
}

#[derive(Debug, Clone, Args)]
struct RunArgs {
    /// Bootstrap API base URL.
    #[arg(long, env = "EXK8S_API_URL")]
    api_url: Option<String>,
    /// Instance-metadata base URL.
    #[arg(long, env = "EXK8S_IMDS_URL")]
    imds_url: Option<String>,
    /// PEM file of the only root CA trusted for the API's TLS.
    #[arg(long, env = "EXK8S_API_CA_FILE")]
    api_ca_file: Option<PathBuf>,
    /// Allow a plain-HTTP API URL (the dev stack only).
    #[arg(long, env = "EXK8S_INSECURE_HTTP")]
    insecure_http: bool,
    /// Apply under this directory and record host actions instead of performing them.
    #[arg(long, env = "EXK8S_ROOT")]
    root: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct LocalArgs {
    /// The signed bundle (DSSE envelope JSON).
    #[arg(long)]
    bundle: PathBuf,
    /// Require the bundle to be for this VM.
    #[arg(long)]
    vm_id: Option<u64>,
    /// Judge freshness at this unix time instead of now (for fixture bundles).
    #[arg(long)]
    at: Option<i64>,
}

#[derive(Debug, Args)]
struct ApplyArgs {
    #[command(flatten)]
    local: LocalArgs,
    /// Apply under this directory and record host actions instead of performing them.
    #[arg(long)]
    root: Option<PathBuf>,
    /// Print what would change and which actions would run; write nothing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    #[command(flatten)]
    local: LocalArgs,
}

#[derive(Debug, Args)]
struct PrereqsArgs {
    /// A signed bundle whose artifact list to install.
    #[arg(long)]
    bundle: PathBuf,
    /// Install artifacts under this image root.
    #[arg(long)]
    root: Option<PathBuf>,
}

fn required(value: Option<String>, name: &str) -> Result<String, AgentError> {
    value.ok_or_else(|| {
        AgentError::Config(format!(
            "{name} is not set (agent.toml, --{}, or EXK8S_{})",
            name.replace('_', "-"),
            name.to_uppercase()
        ))
    })
}

/// The connection settings of `run` and `sync`: flags, then environment, then the file.
fn net_config(args: RunArgs, file: &ConfigFile) -> Result<NetConfig, AgentError> {
    Ok(NetConfig {
        api_url: required(args.api_url.or(file.api_url.clone()), "api_url")?,
        imds_url: required(args.imds_url.or(file.imds_url.clone()), "imds_url")?,
        api_ca_file: args.api_ca_file.or(file.api_ca_file.clone()),
        insecure_http: args.insecure_http || file.insecure_http.unwrap_or(false),
        imds_timeout_secs: file.imds_timeout_secs.unwrap_or(600),
        fetch_timeout_secs: file.fetch_timeout_secs.unwrap_or(900),
        request_timeout_secs: file.request_timeout_secs.unwrap_or(30),
    })
}

fn dispatch(cli: Cli) -> Result<String, AgentError> {
    // The configuration file is required for `run` only when it is the explicit choice.
    let file = ConfigFile::load(&cli.config, true)?;
    let keys = cli
        .keys_dir
        .or_else(|| file.trusted_keys_dir.clone())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KEYS_DIR));
    let skew = file.clock_skew_secs.unwrap_or(DEFAULT_SKEW);
    let local = |args: &LocalArgs| LocalCheck {
        vm_id: args.vm_id,
        at: args.at,
        clock_skew_secs: skew,
    };
    match cli.command {
        Command::Run(args) => {
            let net = net_config(args.clone(), &file)?;
            commands::run(&net, &keys, args.root.as_deref(), skew)?;
            Ok(String::new())
        }
        Command::Sync(args) => {
            let net = net_config(args.clone(), &file)?;
            crate::sync::sync(&net, &keys, args.root.as_deref(), skew)?;
            Ok(String::new())
        }
        Command::Apply(args) => commands::apply_file(
            &args.local.bundle,
            &keys,
            args.root.as_deref(),
            args.dry_run,
            &local(&args.local),
        ),
        Command::Verify(args) => {
            let bundle = commands::verify_file(&args.local.bundle, &keys, &local(&args.local))?;
            let p = bundle.payload();
            Ok(format!(
                "ok: bundle {} for vm {} ({}) of cluster {}, serial {}, {} files, signed by {}\n",
                p.identity.bundle_id,
                p.identity.vm_id,
                p.identity.node_name,
                p.identity.cluster_name,
                p.freshness.serial,
                p.files.len(),
                bundle.key_id()
            ))
        }
        Command::Prereqs(args) => {
            commands::prereqs(&args.bundle, &keys, args.root.as_deref())?;
            Ok(String::new())
        }
        Command::Balance(args) => {
            balancer::run(&Options {
                apiserver: args.apiserver,
                ca_file: args.ca_file,
                seeds_file: args.seeds_file,
                listen: args.listen,
                interval: Duration::from_millis(args.interval_ms),
            })
            .map_err(|e| AgentError::Step {
                step: "balance".to_owned(),
                reason: chain(&e),
            })?;
            Ok(String::new())
        }
    }
}

/// Parses arguments, runs, prints, and maps errors to exit codes.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                exit::USAGE
            } else {
                exit::OK
            };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match dispatch(cli) {
        Ok(output) => {
            use std::io::Write as _;
            let _ = std::io::stdout().write_all(output.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            log_error!("{}", chain(&e));
            ExitCode::from(e.exit_code())
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
            "docs/reference/exk8s-agent.md",
        );
        assert_eq!(checked, Ok(()));
    }
}
