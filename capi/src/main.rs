//! `exk8s-capi`: exk8s as a Cluster API provider. `exk8s-capi crds` prints its CRDs,
//! `exk8s-capi rbac` the permissions it needs; `exk8s-capi run` runs the controllers of
//! `ExK8sCluster` (infrastructure), `ExK8sControlPlane` (control plane) and `ExK8sMachinePool`
//! (workers) against the management cluster the kubeconfig names (`KUBECONFIG`, or the pod's
//! service account in a cluster).

use std::io::Write as _;

use clap::{Parser, Subcommand};
use exk8s_capi::{crd, rbac, run};

#[derive(Parser)]
#[command(
    name = "exk8s-capi",
    version,
    about = "exk8s as a Cluster API control-plane and infrastructure provider"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the provider's CRDs (ExK8sCluster, ExK8sControlPlane, ExK8sMachinePool) as YAML for
    /// `kubectl apply -f -`.
    Crds,
    /// Print the ClusterRole `run` needs and a ClusterRoleBinding granting it, as YAML for
    /// `kubectl apply -f -`: its kinds and their status, Cluster API's Cluster and MachinePool
    /// (read), Secrets (read; create and patch the kubeconfig Secrets).
    #[command(group = clap::ArgGroup::new("identity").required(true).multiple(false))]
    Rbac {
        /// The service account it runs as, NAMESPACE/NAME.
        #[arg(long, value_name = "NAMESPACE/NAME", group = "identity")]
        service_account: Option<rbac::Identity>,
        /// The user it runs as (its kubeconfig's client certificate's common name).
        #[arg(long, group = "identity")]
        user: Option<String>,
    },
    /// Run the controllers against the management cluster: the one `KUBECONFIG` names, or,
    /// in a pod, its service account's. Each object's exk8s API and token come from the Secret
    /// its `credentialsRef` names. `RUST_LOG` sets the log level (default `info`).
    Run,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds => print("the CRDs", crd::crds_yaml()),
        Command::Rbac {
            service_account,
            user,
        } => {
            let identity = match (service_account, user) {
                (Some(account), _) => account,
                (None, Some(user)) => rbac::Identity::User(user),
                // clap requires one of them.
                (None, None) => return std::process::ExitCode::FAILURE,
            };
            print("the RBAC", rbac::rbac_yaml(&identity))
        }
        Command::Run => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime,
                Err(e) => {
                    eprintln!("exk8s-capi: no async runtime: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run()) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("exk8s-capi: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

/// Writes `yaml` (what `what` is) to stdout.
fn print(what: &str, yaml: Result<String, yaml_serde::Error>) -> std::process::ExitCode {
    match yaml {
        Ok(yaml) => {
            let mut out = std::io::stdout().lock();
            if out
                .write_all(yaml.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("exk8s-capi: {what} cannot be written as YAML: {e}");
            std::process::ExitCode::FAILURE
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
            "docs/reference/exk8s-capi.md",
        );
        assert_eq!(checked, Ok(()));
    }
}
