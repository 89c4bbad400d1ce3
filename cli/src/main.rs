//! `exk8s`, the operator CLI of exk8s: log in once, then found clusters and watch them come
//! up, list, inspect, scale and delete them, and merge their kubeconfigs — each answer as a
//! table, or as the API's JSON or YAML (`-o json|yaml`). Errors name the API's field and
//! message; the exit status is 1 on any failure, 2 on a usage error.

mod client;
mod clusters;
mod commands;
mod config;
mod credential;
mod day2;
mod doctor;
mod error;
mod follow;
mod kubeconfig;
mod output;
mod private_file;
mod refresh;
mod restore;
mod retry;
mod sa_key;
mod snapshots;
mod sse;
mod watch;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use output::Format;

#[derive(Debug, Parser)]
#[command(
    name = "exk8s",
    version,
    about = "Found and run Kubernetes control planes with exk8s"
)]
struct Cli {
    /// The API's base URL (default: the one `exk8s login` saved).
    #[arg(long, env = "EXK8S_API", global = true)]
    api: Option<String>,
    /// The operator token (default: the one `exk8s login` saved; prefer EXK8S_TOKEN to this
    /// flag, which other users of the machine can see in its process list).
    #[arg(long, env = "EXK8S_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// How answers are shown.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Save the API's URL and an operator token (read from stdin) in a private config file.
    Login {
        /// Save without checking the token against the API first.
        #[arg(long)]
        no_verify: bool,
    },
    /// Found, list, inspect and delete clusters.
    #[command(subcommand)]
    Clusters(Clusters),
    /// A cluster's nodes: role, phase, generations, etcd membership.
    Nodes {
        cluster: String,
        /// Show the list again whenever it changes (the cluster's event stream), until
        /// interrupted.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// A cluster's certificates, soonest expiry first.
    Certs {
        cluster: String,
        /// Show the list again whenever it changes (a rollout, a renewal, a rotation), until
        /// interrupted.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// A fresh admin kubeconfig: printed, or merged into your kubeconfig with --merge.
    Kubeconfig {
        /// The cluster (with --refresh: only its entry; without, every exk8s entry).
        #[arg(required_unless_present = "refresh")]
        cluster: Option<String>,
        /// Merge into $KUBECONFIG (its first file) or ~/.kube/config and make it current.
        #[arg(long)]
        merge: bool,
        /// The recommended form: a kubeconfig whose user runs `exk8s credential` (client-go's
        /// exec plugin), so kubectl always gets a current certificate and trust, through leaf
        /// expiry and cluster-CA rotations, instead of one embedded certificate.
        #[arg(long, conflicts_with = "refresh")]
        exec: bool,
        /// Fetch again each exk8s entry of your kubeconfig that is past two thirds of its life,
        /// expired, or trusts another CA than the cluster's apiservers now; keep the others.
        #[arg(long, conflicts_with = "merge")]
        refresh: bool,
    },
    /// client-go's exec credential plugin (what `kubeconfig --exec` writes): prints an
    /// ExecCredential with a short-lived admin certificate, cached and reused, and refreshes the
    /// cluster's trust file.
    Credential { cluster: String },
    /// Grow or shrink a cluster's control plane (1, 3, 5 or 7 members), one member at a time.
    Scale {
        cluster: String,
        #[arg(long = "control-plane")]
        control_plane: i64,
    },
    /// Worker pools: list, get, create, scale, delete.
    #[command(subcommand, name = "node-pools")]
    NodePools(day2::Pools),
    /// etcd snapshots: list, create (--wait), schedule, delete, download.
    #[command(subcommand)]
    Snapshots(snapshots::Snapshots),
    /// Restore the cluster's etcd in place from one of its stored snapshots: every member
    /// stops, restores it and starts again (what was written since is gone).
    Restore {
        cluster: String,
        /// The stored snapshot's id (`exk8s snapshots list`).
        snapshot: i64,
        /// Confirm: the cluster's control plane stops, and what it stored since is lost.
        #[arg(long)]
        yes: bool,
        /// Follow the restore until it is done or has failed.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Control-plane members: replace or remove one.
    #[command(subcommand)]
    Members(day2::Members),
    /// Give every node a new generation (re-issues every leaf), one control-plane node at a time.
    Rollout { cluster: String },
    /// Renew every leaf certificate now (after a suspected key leak).
    RenewCerts { cluster: String },
    /// Replace one of the cluster's CAs in three phases, no client ever cut off.
    RotateCa {
        cluster: String,
        #[arg(long, value_parser = ["cluster", "etcd", "front_proxy", "front-proxy"])]
        ca: String,
    },
    /// Rotate the cluster's service-account signing key in three phases, one control-plane node
    /// at a time: both keys trusted, the new one signs, then the old one is dropped; tokens
    /// signed before keep authenticating until then.
    RotateSaKey {
        cluster: String,
        /// Seconds the old key stays trusted once every apiserver signs with the new one
        /// (default 90000: 25 h, within which kubelets refresh their pods' tokens; 0 after a
        /// leak: tokens signed by the old key stop authenticating at once).
        #[arg(long)]
        drop_old_after: Option<i64>,
    },
    /// The service-account signing key: its age, its policy and its rotation in progress;
    /// --max-age-days and --auto-rotate set the policy.
    SaKey {
        cluster: String,
        /// Past this age (1–3650 days) the ServiceAccountKeyFresh condition turns False.
        #[arg(long)]
        max_age_days: Option<i64>,
        /// Rotate the key by itself once it is past its maximum age.
        #[arg(long)]
        auto_rotate: Option<bool>,
    },
    /// Upgrade a cluster's control plane to another Kubernetes release (see `exk8s versions`),
    /// one member at a time within the version skew policy, after an etcd snapshot; during an
    /// upgrade, the version the other members run rolls it back. Asked again after its
    /// snapshot failed, it takes another.
    Upgrade {
        cluster: String,
        /// The release to run, `v1.MINOR.PATCH`.
        #[arg(long)]
        to: String,
        /// Follow the upgrade until every member runs it.
        #[arg(long)]
        wait: bool,
        /// With --wait: then follow the pools that follow the control plane until every one of
        /// their workers runs it too (pinned pools are named and left).
        #[arg(long, requires = "wait")]
        pools: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
        /// Do not wait for an etcd snapshot before the first member changes (by default a
        /// voter stores one first). Also goes on with an upgrade whose snapshot failed.
        #[arg(long)]
        no_snapshot: bool,
    },
    /// The Kubernetes releases the API installs (the default first) and what a node of each runs.
    Versions,
    /// Check the login, the API, the token, this machine's clock and the kubeconfig's exk8s
    /// identities, and say what is wrong.
    Doctor,
    /// Shell completions, e.g. `exk8s completions bash > /etc/bash_completion.d/exk8s`.
    Completions { shell: clap_complete::Shell },
}

#[derive(Debug, Subcommand)]
enum Clusters {
    /// Every cluster of your organisation; with --deleted, the deleted ones still kept.
    List {
        /// The deleted clusters whose trust and snapshots are kept (to found a cluster from
        /// one of them: `clusters create --restore-from`), and until when.
        #[arg(long)]
        deleted: bool,
    },
    /// One cluster, by id or name.
    Get { cluster: String },
    /// Found a cluster; with --wait, follow it until it is ready.
    Create(Box<CreateArgs>),
    /// Delete a cluster and its VMs (its trust and snapshots are kept until the purge).
    Delete {
        cluster: String,
        /// Confirm: the cluster's VMs and data are destroyed.
        #[arg(long)]
        yes: bool,
    },
    /// Purge a deleted cluster now: its kept trust and snapshots, by id or name.
    Purge {
        cluster: String,
        /// Confirm: no cluster can be founded from its snapshots any more.
        #[arg(long)]
        yes: bool,
    },
}

/// `CLUSTER_ID:SNAPSHOT_ID`.
fn parse_restore_from(text: &str) -> Result<(i64, i64), String> {
    let (cluster, snapshot) = text
        .split_once(':')
        .ok_or_else(|| format!("`{text}` is not CLUSTER_ID:SNAPSHOT_ID"))?;
    let number = |what: &str, n: &str| {
        n.parse::<i64>()
            .map_err(|_| format!("{what} `{n}` is not a number (CLUSTER_ID:SNAPSHOT_ID)"))
    };
    Ok((
        number("cluster id", cluster)?,
        number("snapshot id", snapshot)?,
    ))
}

#[derive(Debug, Args)]
pub(crate) struct CreateArgs {
    /// The cluster's name (a-z, 0-9, '-'; starting with a letter); without one the API names
    /// it `exk8s-<org>-<id>`. Other commands take the name or the id.
    pub(crate) name: Option<String>,
    /// Control-plane members: 1 or 3.
    #[arg(long = "control-plane", default_value_t = 1)]
    pub(crate) control_plane: i64,
    /// Image id of the control-plane VMs.
    #[arg(long)]
    pub(crate) image: i64,
    /// Instance type of the control-plane VMs.
    #[arg(long = "instance-type")]
    pub(crate) instance_type: String,
    /// Subnet the VMs join.
    #[arg(long)]
    pub(crate) subnet: i64,
    /// Zone of the VMs (default 1).
    #[arg(long)]
    pub(crate) zone: Option<i64>,
    /// ecdsa-p256 (default), ecdsa-p384, rsa-2048, rsa-3072, rsa-4096.
    #[arg(long = "key-algorithm")]
    pub(crate) key_algorithm: Option<String>,
    /// One of the versions the API offers (default: its first).
    #[arg(long = "kubernetes-version")]
    pub(crate) kubernetes_version: Option<String>,
    /// An OpenSSH public key file for the VMs.
    #[arg(long = "ssh-key-file")]
    pub(crate) ssh_key_file: Option<std::path::PathBuf>,
    /// Give the VMs public IPv4 addresses.
    #[arg(long = "public-ip")]
    pub(crate) public_ip: bool,
    /// Days every leaf certificate lasts (default 365); renewed automatically.
    #[arg(long = "leaf-lifetime-days")]
    pub(crate) leaf_lifetime_days: Option<i64>,
    /// The pod network the first node installs: cilium (default), flannel (VXLAN between
    /// nodes), or none (bring your own; until then pods use each node's own bridge).
    #[arg(long = "pod-network")]
    pub(crate) pod_network: Option<String>,
    /// Found it from another cluster's stored snapshot (disaster recovery): its CAs and keys
    /// kept, its etcd restored once its control plane is up. `CLUSTER_ID:SNAPSHOT_ID`.
    #[arg(long = "restore-from", value_parser = parse_restore_from)]
    pub(crate) restore_from: Option<(i64, i64)>,
    /// Bring your own cluster CA: its certificate (PEM file; with --cluster-ca-key).
    #[arg(long = "cluster-ca-cert", requires = "cluster_ca_key")]
    pub(crate) cluster_ca_cert: Option<std::path::PathBuf>,
    /// The cluster CA's private key (PEM file).
    #[arg(long = "cluster-ca-key", requires = "cluster_ca_cert")]
    pub(crate) cluster_ca_key: Option<std::path::PathBuf>,
    /// Bring your own etcd CA: its certificate (PEM file; with --etcd-ca-key).
    #[arg(long = "etcd-ca-cert", requires = "etcd_ca_key")]
    pub(crate) etcd_ca_cert: Option<std::path::PathBuf>,
    /// The etcd CA's private key (PEM file).
    #[arg(long = "etcd-ca-key", requires = "etcd_ca_cert")]
    pub(crate) etcd_ca_key: Option<std::path::PathBuf>,
    /// Bring your own front-proxy CA: its certificate (PEM file; with --front-proxy-ca-key).
    #[arg(long = "front-proxy-ca-cert", requires = "front_proxy_ca_key")]
    pub(crate) front_proxy_ca_cert: Option<std::path::PathBuf>,
    /// The front-proxy CA's private key (PEM file).
    #[arg(long = "front-proxy-ca-key", requires = "front_proxy_ca_cert")]
    pub(crate) front_proxy_ca_key: Option<std::path::PathBuf>,
    /// Sent as Idempotency-Key: a retry with the same key founds nothing twice (without it, the
    /// CLI makes one for this command: its own retries of a busy API found once).
    #[arg(long = "idempotency-key")]
    pub(crate) idempotency_key: Option<String>,
    /// Follow the cluster until it is ready.
    #[arg(long)]
    pub(crate) wait: bool,
    /// How long --wait waits, in seconds.
    #[arg(long, default_value_t = 1800)]
    pub(crate) timeout: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(match e {
                error::CliError::Usage(_) => 2,
                _ => 1,
            })
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
            "docs/reference/exk8s.md",
        );
        assert_eq!(checked, Ok(()));
    }
}
