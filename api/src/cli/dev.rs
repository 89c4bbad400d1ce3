//! `exk8s-api dev`: the whole stack on a laptop — SQLite, keys and the simulators' state kept in
//! a data dir (a restarted stack continues where it stopped), and the simulated compute, DNS and
//! instance-metadata services in the same process. With `--machines nspawn` every VM the compute
//! simulator makes boots for real (`crate::sim::machines`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use exk8s_common::BundleSigner;

use super::{
    build_state, load_catalog, load_keks, load_signer, sim_routes, stop_signal, write_secret_file,
};
use crate::Application;
use crate::app::ApiConfig;
use crate::compute::Compute;
use crate::crypto::Kek;
use crate::db::{self, Db};
use crate::dns::Dns;
use crate::sim::Simulators;
use crate::sim::machines::{CpuShare, MachineConfig, NspawnMachines};
use crate::tokens::{self, Scope};

#[derive(Debug, Args)]
pub(super) struct DevArgs {
    #[arg(long, env = "EXK8S_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Holds the database, the KEK, the signing key, the trusted-keys dir and the operator token.
    #[arg(long, env = "EXK8S_DATA_DIR", default_value = "./exk8s-dev")]
    data_dir: PathBuf,
    /// Use this database instead of SQLite in the data dir.
    #[arg(long, env = "EXK8S_DATABASE_URL")]
    database_url: Option<String>,
    /// Addresses the compute SIMULATOR gives VMs. Default: 127.0.10.0/24 (loopback, so an agent
    /// run with `--root` works locally); with `--machines nspawn`, 10.240.0.0/24 (the machines'
    /// LAN, which loopback addresses cannot be).
    #[arg(long, env = "EXK8S_SIM_CIDR")]
    sim_cidr: Option<String>,
    /// Pinned downloads of node binaries (TOML; see `serve --help`).
    #[arg(long, env = "EXK8S_ARTIFACT_CATALOG")]
    artifact_catalog: Option<PathBuf>,
    /// Where sealed etcd snapshots are kept (see `serve --help`). Default: `snapshots` in
    /// --data-dir.
    #[arg(long, env = "EXK8S_SNAPSHOT_STORE")]
    snapshot_store: Option<crate::snapshots::Location>,
    /// Kubernetes versions offered; the first is the default (see `serve --help`).
    #[arg(
        long,
        env = "EXK8S_KUBERNETES_VERSIONS",
        value_delimiter = ',',
        default_value = "v1.35.3"
    )]
    kubernetes_versions: Vec<String>,
    /// What a VM is: `sim`, a row only (boot its agent yourself with `exk8s-agent run
    /// --root`); `nspawn`, a machine booted from --node-image under systemd-nspawn (Linux,
    /// root).
    #[arg(long, env = "EXK8S_DEV_MACHINES", value_enum, default_value = "sim")]
    machines: MachinesChoice,
    /// `--machines nspawn`: the baked node image (a root with systemd and exk8s-agent, its
    /// agent.toml naming this stack; `scripts/dev-cluster.sh` makes one). Its own variable,
    /// not the tests' `EXK8S_NODE_IMAGE` (an image before baking).
    #[arg(long, env = "EXK8S_DEV_NODE_IMAGE")]
    node_image: Option<PathBuf>,
    /// `--machines nspawn`: more host loopback ports every machine reaches at 127.0.0.1 and
    /// the same port (a package mirror, a registry); the API's own port always is.
    #[arg(long, env = "EXK8S_DEV_MACHINE_FORWARDS", value_delimiter = ',')]
    machine_forward: Vec<u16>,
    /// `--machines nspawn`: the most CPU time each machine gets, in cores (for example 0.4),
    /// as a VM's vCPUs cap it; unset, the machines share every core of this host.
    #[arg(long, env = "EXK8S_DEV_MACHINE_CPUS")]
    machine_cpus: Option<f64>,
    #[command(flatten)]
    rates: super::limits::NodeRateArgs,
    #[command(flatten)]
    changes: super::limits::ChangeArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum MachinesChoice {
    Sim,
    Nspawn,
}

/// The booted machines `--machines nspawn` asks for, checked before anything starts.
fn machines(args: &DevArgs, sims: &Simulators) -> Result<Option<Arc<NspawnMachines>>, String> {
    if args.machines == MachinesChoice::Sim {
        if args.node_image.is_some()
            || !args.machine_forward.is_empty()
            || args.machine_cpus.is_some()
        {
            return Err(
                "--node-image, --machine-forward and --machine-cpus need --machines nspawn".into(),
            );
        }
        return Ok(None);
    }
    let image = args
        .node_image
        .clone()
        .ok_or("--machines nspawn needs --node-image (scripts/dev-cluster.sh makes one)")?;
    let listen: std::net::SocketAddr = args
        .listen
        .parse()
        .map_err(|e| format!("--listen {}: {e}", args.listen))?;
    if listen.port() == 0 || !listen.ip().is_loopback() {
        return Err(format!(
            "--machines nspawn needs --listen on a loopback address and a fixed port (the \
             machines reach the API there), not {listen}"
        ));
    }
    let cidr = sims.compute.cidr();
    let network: ipnet::Ipv4Net = cidr
        .parse()
        .map_err(|e| format!("--sim-cidr {cidr}: {e}"))?;
    if network.network().is_loopback() {
        return Err(format!(
            "--machines nspawn: --sim-cidr {cidr} is loopback, which a machine's LAN cannot use \
             (for example 10.240.0.0/24)"
        ));
    }
    let prefix = network.prefix_len();
    let mut forwards = vec![listen.port()];
    forwards.extend(
        args.machine_forward
            .iter()
            .copied()
            .filter(|p| *p != listen.port()),
    );
    let cpus = args.machine_cpus.map(CpuShare::new).transpose()?;
    let config = MachineConfig {
        image,
        dir: args.data_dir.join("machines"),
        prefix,
        forwards,
        cpus,
    };
    NspawnMachines::new(config, sims.dns.clone())
        .map(Some)
        .map_err(|e| e.to_string())
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
pub(super) async fn dev(args: DevArgs) -> Result<(), String> {
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
    let cidr = match (&args.sim_cidr, args.machines) {
        (Some(cidr), _) => cidr.clone(),
        (None, MachinesChoice::Sim) => "127.0.10.0/24".to_owned(),
        (None, MachinesChoice::Nspawn) => "10.240.0.0/24".to_owned(),
    };
    let mut sims = Simulators::persistent(&cidr, dir)?;
    let machines = machines(&args, &sims)?;
    if let Some(machines) = &machines {
        sims.compute = sims.compute.with_machines(Arc::clone(machines));
    }
    let listener_hint = format!("http://{}", args.listen);
    super::check_versions(&args.kubernetes_versions)?;
    let config = ApiConfig {
        public_url: listener_hint.clone(),
        imds_url: format!("{listener_hint}/sim/imds"),
        agent_insecure_http: true,
        artifacts,
        kubernetes_versions: args.kubernetes_versions,
        snapshot_store: args
            .snapshot_store
            .clone()
            .unwrap_or_else(|| crate::snapshots::Location::Local(dir.join("snapshots"))),
        rate_per_vm: args.rates.limits().0,
        rate_per_source: args.rates.limits().1,
        source_ipv6_prefix: args.rates.ipv6_prefix,
        reconcile_interval: args.changes.reconcile_interval(),
        member_join_timeout: args.changes.member_join_timeout(),
        keep_deleted: args.changes.keep_deleted(),
        update_wait: args.changes.update_wait(),
        cpu_queue_per_core: args.rates.cpu_queue_per_core,
        key_pool_max: args.rates.key_pool_max,
        founding_workers: args.changes.founding().0,
        founding_queue: args.changes.founding().1,
        key_maker: crate::pki::KeyMaker::this_binary(),
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
    )?;
    let app = Application::build(state, &args.listen)
        .await
        .map_err(|e| crate::error_chain(&e))?
        .with_routes(sim_routes(db.clone(), &sims));
    let addr = app.local_addr().map_err(|e| e.to_string())?;
    let base = format!("http://{addr}");
    if let Some(machines) = &machines {
        machines.serve(crate::sim::imds::router(db.clone(), sims.compute.clone()));
        sims.compute.boot_machines();
    }

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
    let simulated = if machines.is_some() {
        "compute boots machines (systemd-nspawn); DNS and IMDS are SIMULATED"
    } else {
        "compute, DNS and IMDS are SIMULATED"
    };
    println!("exk8s dev stack on {base} (data in {data}; {simulated})");
    println!();
    println!(
        "log the CLI in (exk8s: `cargo install --path cli`; org 1's operator token is in {token_file}):"
    );
    println!("  exk8s login --api {base} < {token_file}");
    println!("  # or: export EXK8S_API={base} EXK8S_TOKEN={token}");
    println!();
    if machines.is_some() {
        println!("found a 1-node cluster; its machine boots and the agent founds it:");
        println!(
            "  exk8s clusters create shop --control-plane 1 --image 1 --instance-type dev.small --subnet 1 --wait"
        );
        println!();
        println!("each VM is a machine: {data}/machines/vm-<id> is its disk; a shell in VM 101:");
        println!(
            "  nsenter --target \"$(curl -s {base}/sim/compute/sim/machines/101 | jq .init_pid)\" --all bash"
        );
    } else {
        println!("found a 3-node cluster and follow it until its nodes have booted:");
        println!(
            "  exk8s clusters create shop --control-plane 3 --image 1 --instance-type dev.small --subnet 1 --wait"
        );
        println!();
        println!(
            "meanwhile, boot each of its VMs (ids start at 101) into ./vm-<id>, recording host actions:"
        );
        println!("  for vm in 101 102 103; do");
        println!("    cargo run -p exk8s-agent -- --keys-dir {keys} run --root ./vm-$vm \\");
        println!("      --api-url {base} --imds-url {base}/sim/imds/$vm --insecure-http");
        println!("  done");
    }
    println!();
    println!(
        "then: exk8s nodes shop; exk8s certs shop; exk8s kubeconfig shop --merge; exk8s doctor"
    );
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let served = app.run_until_stopped(stop_signal()).await;
    if let Some(machines) = machines {
        // Powered off through their systemd, as a cloud's stop does; their disks stay for
        // the next start, which boots them again.
        let _ = tokio::task::spawn_blocking(move || machines.power_off_all()).await;
    }
    served.map_err(|e| e.to_string())
}
