//! What each command does: calls to the API, shown through [`crate::output`].

use std::io::Read as _;
use std::time::Duration;

use clap::CommandFactory as _;
use exk8s_api_types::{
    CertificateInventory, ClusterChange, ClusterPatch, ClusterView, KubernetesVersionView,
    NodeView, UpgradeState,
};

use crate::client::Api;
use crate::clusters::cluster_detail;
use crate::config::{self, Config, Session, Token};
use crate::error::CliError;
use crate::output::{self, Format, cell, line, show, table};
use crate::{Cli, Command, day2, kubeconfig, watch};

pub(crate) fn run(cli: Cli) -> Result<(), CliError> {
    let format = cli.output;
    match cli.command {
        Command::Login { no_verify } => login(cli.api, cli.token, no_verify),
        Command::Doctor => crate::doctor::run(cli.api, cli.token),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "exk8s", &mut std::io::stdout());
            Ok(())
        }
        command => {
            let api = Api::new(config::session(cli.api, cli.token)?);
            match command {
                Command::Clusters(c) => crate::clusters::clusters(&api, c, format),
                Command::Nodes { cluster, watch } => nodes(&api, &cluster, format, watch),
                Command::Certs { cluster, watch } => certs(&api, &cluster, format, watch),
                Command::Kubeconfig {
                    cluster,
                    refresh: true,
                    ..
                } => crate::refresh::run(&api, cluster.as_deref()),
                Command::Kubeconfig {
                    cluster,
                    merge,
                    exec,
                    ..
                } => get_kubeconfig(&api, cluster.as_deref().unwrap_or_default(), merge, exec),
                Command::Credential { cluster } => crate::credential::run(&api, &cluster),
                Command::Scale {
                    cluster,
                    control_plane,
                } => scale(&api, &cluster, control_plane, format),
                Command::NodePools(p) => day2::pools(&api, p, format),
                Command::Members(m) => day2::members(&api, m, format),
                Command::Snapshots(s) => crate::snapshots::run(&api, s, format),
                Command::Restore {
                    cluster,
                    snapshot,
                    yes,
                    wait,
                    timeout,
                } => crate::restore::run(
                    &api,
                    &crate::restore::Ask {
                        cluster: &cluster,
                        snapshot,
                        yes,
                        wait: wait.then(|| Duration::from_secs(timeout)),
                    },
                    format,
                ),
                Command::Rollout { cluster } => {
                    day2::start_rollout(&api, &cluster, "rollout", format)
                }
                Command::RenewCerts { cluster } => {
                    day2::start_rollout(&api, &cluster, "certificates/renew", format)
                }
                Command::RotateCa { cluster, ca } => day2::rotate_ca(&api, &cluster, ca, format),
                Command::RotateSaKey {
                    cluster,
                    drop_old_after,
                } => crate::sa_key::rotate(&api, &cluster, drop_old_after, format),
                Command::SaKey {
                    cluster,
                    max_age_days,
                    auto_rotate,
                } => crate::sa_key::key(&api, &cluster, max_age_days, auto_rotate, format),
                Command::Upgrade {
                    cluster,
                    to,
                    wait,
                    pools,
                    timeout,
                    no_snapshot,
                } => upgrade(
                    &api,
                    (&cluster, &to, !no_snapshot),
                    wait.then(|| Wait {
                        timeout: Duration::from_secs(timeout),
                        pools,
                    }),
                    format,
                ),
                Command::Versions => versions(&api, format),
                Command::Login { .. } | Command::Completions { .. } | Command::Doctor => Ok(()),
            }
        }
    }
}

fn login(api: Option<String>, token: Option<String>, no_verify: bool) -> Result<(), CliError> {
    let api = api
        .ok_or_else(|| CliError::Usage("login needs --api URL (or EXK8S_API)".into()))?
        .trim_end_matches('/')
        .to_owned();
    if !(api.starts_with("https://") || api.starts_with("http://")) {
        return Err(CliError::Usage(format!(
            "--api must be an http(s) URL, got `{api}`"
        )));
    }
    let token = match token {
        Some(t) => Token::new(t),
        None => {
            eprintln!("operator token (read from stdin):");
            let mut text = zeroize::Zeroizing::new(String::new());
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| CliError::io("reading the token from stdin", e))?;
            Token::new(text.trim().to_owned())
        }
    };
    if token.expose().is_empty() {
        return Err(CliError::Usage("the token is empty".into()));
    }
    let session = Session {
        api: api.clone(),
        token: token.clone(),
    };
    if !no_verify {
        Api::new(session).get::<Vec<ClusterView>>("/clusters")?;
    }
    let file = config::path()?;
    config::save(&file, &Config { api, token })?;
    eprintln!("logged in; saved to {} (mode 0600)", file.display());
    Ok(())
}

fn nodes(api: &Api, cluster: &str, format: Format, watch: bool) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    if watch {
        return crate::follow::changes(api, id, format, || nodes_text(api, id, format));
    }
    line(&nodes_text(api, id, format)?)
}

fn nodes_text(api: &Api, id: i64, format: Format) -> Result<String, CliError> {
    let view: ClusterView = api.get(&format!("/clusters/{id}"))?;
    output::render(format, &view.nodes, |nodes: &Vec<NodeView>| {
        let mut t = table(&[
            "name",
            "vm",
            "role",
            "phase",
            "etcd",
            "generation",
            "version",
            "address",
        ]);
        for n in nodes {
            t.add_row(vec![
                n.name.clone(),
                n.vm_id.to_string(),
                n.role.to_string(),
                n.phase.clone(),
                cell(n.etcd_membership),
                format!("{}/{}", n.applied_generation, n.desired_generation),
                cell(n.kubernetes_version.as_deref()),
                n.private_ipv4.clone(),
            ]);
        }
        t
    })
}

fn certs(api: &Api, cluster: &str, format: Format, watch: bool) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    if watch {
        return crate::follow::changes(api, id, format, || certs_text(api, id, format));
    }
    line(&certs_text(api, id, format)?)
}

fn certs_text(api: &Api, id: i64, format: Format) -> Result<String, CliError> {
    let inventory: CertificateInventory = api.get(&format!("/clusters/{id}/certificates"))?;
    output::render(format, &inventory, |inv| {
        let mut t = table(&["name", "vm", "kind", "subject", "expires", "days left"]);
        for c in &inv.certificates {
            t.add_row(vec![
                c.name.clone(),
                cell(c.vm_id),
                c.kind.clone(),
                c.subject.clone(),
                output::date(c.not_after),
                c.days_left.to_string(),
            ]);
        }
        t
    })
}

fn get_kubeconfig(api: &Api, cluster: &str, merge: bool, exec: bool) -> Result<(), CliError> {
    let text = if exec {
        zeroize::Zeroizing::new(crate::credential::kubeconfig(api, cluster)?)
    } else {
        let id = api.cluster_id(cluster)?;
        api.get_text(&format!("/clusters/{id}/kubeconfig"))?
    };
    if !merge {
        return line(text.trim_end());
    }
    let file = kubeconfig::target()?;
    let context = kubeconfig::merge_into(&file, &text)?;
    eprintln!("merged into {}; current context: {context}", file.display());
    Ok(())
}

fn scale(api: &Api, cluster: &str, count: i64, format: Format) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let body = ClusterPatch {
        control_plane_count: Some(count),
        ..ClusterPatch::default()
    };
    api.send::<exk8s_api_types::ScalingView>(
        "PATCH",
        &format!("/clusters/{id}"),
        Some(&body),
        None,
    )?;
    eprintln!("scaling cluster {cluster} to {count} control-plane members, one at a time");
    let view: ClusterView = api.get(&format!("/clusters/{id}"))?;
    show(format, &view, cluster_detail)
}

/// How `exk8s upgrade --wait` waits.
struct Wait {
    timeout: Duration,
    /// The pools that follow the control plane too.
    pools: bool,
}

/// Upgrades `cluster` to `to` (after an etcd snapshot when `snapshot_first`).
fn upgrade(
    api: &Api,
    (cluster, to, snapshot_first): (&str, &str, bool),
    wait: Option<Wait>,
    format: Format,
) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let body = ClusterPatch {
        kubernetes_version: Some(to.to_owned()),
        snapshot_first: Some(snapshot_first),
        ..ClusterPatch::default()
    };
    let change: Option<ClusterChange> =
        api.send("PATCH", &format!("/clusters/{id}"), Some(&body), None)?;
    let Some(ClusterChange::Upgrade(started)) = change else {
        return Err(CliError::Unexpected(
            "the API did not answer the upgrade with where it stands".into(),
        ));
    };
    match started.upgrade {
        UpgradeState::Current => eprintln!(
            "cluster {cluster} runs {} on all {} control-plane members already",
            started.to_version, started.members
        ),
        UpgradeState::Upgrading => eprintln!(
            "upgrading cluster {cluster}'s control plane from {} to {}, one member at a time \
             ({} of {} done)",
            started.from_version, started.to_version, started.done, started.members
        ),
        UpgradeState::RollingBack => eprintln!(
            "rolling cluster {cluster}'s control plane back from {} to {}, one member at a time",
            started.from_version, started.to_version
        ),
    }
    if let Some(snapshot) = started.snapshot_id {
        eprintln!(
            "no member changes before etcd snapshot {snapshot} is stored (`exk8s snapshots \
             list {cluster}`)"
        );
    }
    let view: ClusterView = match wait {
        Some(wait) => {
            let deadline = std::time::Instant::now() + wait.timeout;
            let view = watch::until(api, id, watch::Goal::Runs(to.to_owned()), wait.timeout)?;
            if wait.pools {
                crate::day2::wait_pools(api, id, to, deadline)?;
                api.get(&format!("/clusters/{id}"))?
            } else {
                view
            }
        }
        None => api.get(&format!("/clusters/{id}"))?,
    };
    show(format, &view, cluster_detail)
}

fn versions(api: &Api, format: Format) -> Result<(), CliError> {
    let offered: Vec<KubernetesVersionView> = api.get("/kubernetes-versions")?;
    show(format, &offered, |offered: &Vec<KubernetesVersionView>| {
        let mut t = table(&["version", "default", "etcd", "coredns", "pause", "pinned"]);
        for o in offered {
            let pinned = o.downloads.iter().filter(|d| d.sha256.is_some()).count();
            t.add_row(vec![
                o.version.clone(),
                if o.default { "yes" } else { "" }.to_owned(),
                o.etcd.clone(),
                o.coredns.clone(),
                o.pause.clone(),
                format!("{pinned}/{}", o.downloads.len()),
            ]);
        }
        t
    })
}
