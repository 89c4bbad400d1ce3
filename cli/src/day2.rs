//! The day-2 verbs: worker pools, rollouts, certificate renewal and CA rotation, replacing and
//! removing a control-plane member. Each is one API call; what it started is shown, and the
//! cluster's status (`exk8s clusters get`) follows it to the end.

use clap::Subcommand;
use std::collections::BTreeMap;

use exk8s_api_types::{
    CreatePoolRequest, PoolView, RolloutNode, RolloutStarted, RotateCaRequest, RotationStarted,
    TaintRequest, UpdatePoolRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, show, table};

#[derive(Debug, Subcommand)]
pub(crate) enum Pools {
    /// A cluster's worker pools.
    List {
        cluster: String,
        /// Show the list again whenever it changes, until interrupted.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// One pool and its workers.
    Get { cluster: String, pool: String },
    /// A pool of workers that register with the labels and taints given.
    Create {
        cluster: String,
        /// The pool's name (its nodes are `<name>-<vm id>`).
        #[arg(required_unless_present = "name_flag")]
        name: Option<String>,
        /// Deprecated: the name is positional (`node-pools create CLUSTER NAME`).
        #[arg(long = "name", hide = true, conflicts_with = "name")]
        name_flag: Option<String>,
        #[arg(long)]
        count: i64,
        #[arg(long = "instance-type")]
        instance_type: String,
        #[arg(long)]
        image: i64,
        #[arg(long)]
        subnet: i64,
        /// A node label, `key=value`; repeatable.
        #[arg(long = "label")]
        labels: Vec<String>,
        /// A node taint, `key=value:Effect` or `key:Effect`; repeatable.
        #[arg(long = "taint")]
        taints: Vec<String>,
        /// Workers made beyond --count while workers are replaced by a release change (0–10;
        /// 0: each old worker goes before its replacement is made).
        #[arg(long = "max-surge")]
        max_surge: Option<i64>,
    },
    /// Grow or shrink a pool (the newest workers go first, drained before their VM is).
    Scale {
        cluster: String,
        pool: String,
        #[arg(long)]
        count: i64,
    },
    /// Move a pool to another Kubernetes release (never newer than the control plane): its
    /// workers are replaced one at a time, a new one first (unless --max-surge is 0). The
    /// control plane's release unpins it (it follows the control plane's upgrades again).
    Upgrade {
        cluster: String,
        pool: String,
        /// The release, `v1.MINOR.PATCH`.
        #[arg(long)]
        to: String,
        /// Workers made beyond the pool's count while it is replaced (0–10, 0: old ones go
        /// first; kept for later replacements).
        #[arg(long = "max-surge")]
        max_surge: Option<i64>,
    },
    /// Delete a pool: its workers are drained and released.
    Delete {
        cluster: String,
        pool: String,
        /// Confirm: the pool's workers are drained and their VMs deleted.
        #[arg(long)]
        yes: bool,
    },
}

fn pool_id(api: &Api, cluster: i64, pool: &str) -> Result<i64, CliError> {
    if let Ok(id) = pool.parse::<i64>() {
        return Ok(id);
    }
    api.get::<Vec<PoolView>>(&format!("/clusters/{cluster}/node-pools"))?
        .iter()
        .find(|p| p.name == pool)
        .map(|p| p.id)
        .ok_or_else(|| CliError::Failed(format!("cluster {cluster} has no pool named `{pool}`")))
}

fn pools_table(pools: &[PoolView]) -> comfy_table::Table {
    let mut t = table(&[
        "id",
        "name",
        "desired",
        "ready",
        "up to date",
        "version",
        "instance type",
    ]);
    for p in pools {
        let pinned = if p.follow_control_plane {
            ""
        } else {
            " (pinned)"
        };
        t.add_row(vec![
            p.id.to_string(),
            p.name.clone(),
            p.desired.to_string(),
            format!("{}/{}", p.ready_replicas, p.replicas),
            p.up_to_date_replicas.to_string(),
            format!("{}{pinned}", p.kubernetes_version),
            p.instance_type.clone(),
        ]);
    }
    t
}

/// One pool, shown as a table of one.
fn pool_table(pool: &PoolView) -> comfy_table::Table {
    pools_table(std::slice::from_ref(pool))
}

/// `key=value` labels.
fn labels(given: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    given
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| CliError::Usage(format!("--label `{l}` is not key=value")))
        })
        .collect()
}

/// `key=value:Effect` or `key:Effect` taints, as kubectl writes them.
fn taints(given: &[String]) -> Result<Vec<TaintRequest>, CliError> {
    given
        .iter()
        .map(|t| {
            let (pair, effect) = t
                .rsplit_once(':')
                .ok_or_else(|| CliError::Usage(format!("--taint `{t}` is not key=value:Effect")))?;
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok(TaintRequest {
                key: key.to_owned(),
                value: value.to_owned(),
                effect: effect.to_owned(),
            })
        })
        .collect()
}

pub(crate) fn pools(api: &Api, command: Pools, format: Format) -> Result<(), CliError> {
    match command {
        Pools::List { cluster, watch } => {
            let id = api.cluster_id(&cluster)?;
            let text = || {
                let pools: Vec<PoolView> = api.get(&format!("/clusters/{id}/node-pools"))?;
                crate::output::render(format, &pools, |p: &Vec<PoolView>| pools_table(p))
            };
            if watch {
                return crate::follow::changes(api, id, format, text);
            }
            crate::output::line(&text()?)
        }
        Pools::Get { cluster, pool } => {
            let id = api.cluster_id(&cluster)?;
            let pool = pool_id(api, id, &pool)?;
            let view: PoolView = api.get(&format!("/clusters/{id}/node-pools/{pool}"))?;
            show(format, &view, pool_table)
        }
        Pools::Create {
            cluster,
            name,
            name_flag,
            count,
            instance_type,
            image,
            subnet,
            labels: given_labels,
            taints: given_taints,
            max_surge,
        } => {
            let name = match (name, name_flag) {
                (Some(name), _) => name,
                (None, Some(name)) => {
                    eprintln!(
                        "warning: --name is deprecated; the name is positional: exk8s node-pools create {cluster} {name} …"
                    );
                    name
                }
                (None, None) => {
                    return Err(CliError::Usage(
                        "name the pool: exk8s node-pools create CLUSTER NAME …".into(),
                    ));
                }
            };
            let id = api.cluster_id(&cluster)?;
            let body = CreatePoolRequest {
                name: Some(name.clone()),
                count: Some(count),
                instance_type: Some(instance_type),
                image_id: Some(image),
                subnet_id: Some(subnet),
                labels: Some(labels(&given_labels)?),
                taints: Some(taints(&given_taints)?),
                max_surge,
            };
            // Keyed: the CLI's own retries of a busy API make the pool once.
            let key = crate::retry::new_key()?;
            let made: PoolView = answer(api.send(
                "POST",
                &format!("/clusters/{id}/node-pools"),
                Some(&body),
                Some(&key),
            )?)?;
            eprintln!("pool {name} created; its workers are made in the background");
            show(format, &made, pool_table)
        }
        Pools::Scale {
            cluster,
            pool,
            count,
        } => {
            let id = api.cluster_id(&cluster)?;
            let pool = pool_id(api, id, &pool)?;
            let path = format!("/clusters/{id}/node-pools/{pool}");
            let body = UpdatePoolRequest {
                count: Some(count),
                ..UpdatePoolRequest::default()
            };
            let changed: PoolView = answer(api.send("PATCH", &path, Some(&body), None)?)?;
            show(format, &changed, pool_table)
        }
        Pools::Upgrade {
            cluster,
            pool,
            to,
            max_surge,
        } => {
            let id = api.cluster_id(&cluster)?;
            let pool = pool_id(api, id, &pool)?;
            let path = format!("/clusters/{id}/node-pools/{pool}");
            let body = UpdatePoolRequest {
                kubernetes_version: Some(to.clone()),
                max_surge,
                ..UpdatePoolRequest::default()
            };
            let changed: PoolView = answer(api.send("PATCH", &path, Some(&body), None)?)?;
            eprintln!(
                "pool {} goes to {to}: up to {} new workers are made first, then the old ones \
                 are drained and released one at a time",
                changed.name, changed.max_surge
            );
            show(format, &changed, pool_table)
        }
        Pools::Delete { cluster, pool, yes } => {
            if !yes {
                return Err(CliError::Usage(format!(
                    "deleting pool {pool} drains and deletes its workers; run again with --yes"
                )));
            }
            let id = api.cluster_id(&cluster)?;
            let pool_id = pool_id(api, id, &pool)?;
            api.send::<PoolView>(
                "DELETE",
                &format!("/clusters/{id}/node-pools/{pool_id}"),
                None::<&()>,
                None,
            )?;
            eprintln!("pool {pool} is being deleted: its workers are drained and released");
            Ok(())
        }
    }
}

/// A started rollout, renewal or rotation: its nodes' new generations.
pub(crate) fn started_table(nodes: &[RolloutNode]) -> comfy_table::Table {
    let mut t = table(&["vm", "generation"]);
    for n in nodes {
        t.add_row(vec![n.vm_id.to_string(), n.desired_generation.to_string()]);
    }
    t
}

/// `POST /clusters/{id}/rollout` or `…/certificates/renew`, the answer shown.
pub(crate) fn start_rollout(
    api: &Api,
    cluster: &str,
    what: &str,
    format: Format,
) -> Result<(), CliError> {
    let started: RolloutStarted = start(api, cluster, what, None::<&()>)?;
    show(format, &started, |s| started_table(&s.nodes))
}

/// `POST /clusters/{id}/certificates/rotate-ca` for `ca`, the answer shown.
pub(crate) fn rotate_ca(
    api: &Api,
    cluster: &str,
    ca: String,
    format: Format,
) -> Result<(), CliError> {
    let body = RotateCaRequest { ca: Some(ca) };
    let started: RotationStarted = start(api, cluster, "certificates/rotate-ca", Some(&body))?;
    eprintln!(
        "the {} CA's rotation is in phase {}",
        started.ca, started.phase
    );
    show(format, &started, |s| started_table(&s.nodes))
}

/// An answer that must carry a body.
fn answer<T>(body: Option<T>) -> Result<T, CliError> {
    body.ok_or_else(|| CliError::Unexpected("the API answered without a body".into()))
}

/// `POST /clusters/{id}/<what>` with `body`: what it started.
fn start<T: DeserializeOwned>(
    api: &Api,
    cluster: &str,
    what: &str,
    body: Option<&impl Serialize>,
) -> Result<T, CliError> {
    let id = api.cluster_id(cluster)?;
    let started = answer(api.send("POST", &format!("/clusters/{id}/{what}"), body, None)?)?;
    eprintln!("started; every node takes its next generation, one control-plane node at a time");
    Ok(started)
}

#[derive(Debug, Subcommand)]
pub(crate) enum Members {
    /// Replace a member: a healthy one new-member-first, a dead one after its removal.
    Replace { cluster: String, vm: i64 },
    /// Remove a member (refused when a majority would not hold, or it is the last).
    Remove {
        cluster: String,
        vm: i64,
        /// Confirm: the member leaves etcd and its VM is deleted.
        #[arg(long)]
        yes: bool,
    },
}

/// `members replace|remove`: the request, then the cluster as it is now (its members, the one
/// leaving among them), as `exk8s scale` shows it.
pub(crate) fn members(api: &Api, command: Members, format: Format) -> Result<(), CliError> {
    let id = match command {
        Members::Replace { cluster, vm } => {
            let id = api.cluster_id(&cluster)?;
            api.send::<exk8s_api_types::ScalingView>(
                "POST",
                &format!("/clusters/{id}/nodes/{vm}/replace"),
                None::<&()>,
                None,
            )?;
            eprintln!("replacing VM {vm}; `exk8s clusters get {cluster}` shows each step");
            id
        }
        Members::Remove { cluster, vm, yes } => {
            if !yes {
                return Err(CliError::Usage(format!(
                    "removing VM {vm} takes it out of etcd and deletes it; run again with --yes"
                )));
            }
            let id = api.cluster_id(&cluster)?;
            api.send::<exk8s_api_types::ScalingView>(
                "DELETE",
                &format!("/clusters/{id}/nodes/{vm}"),
                None::<&()>,
                None,
            )?;
            eprintln!("removing VM {vm}; `exk8s clusters get {cluster}` shows each step");
            id
        }
    };
    let view: exk8s_api_types::ClusterView = api.get(&format!("/clusters/{id}"))?;
    show(format, &view, crate::clusters::cluster_detail)
}

/// How often [`wait_pools`] looks.
const POOLS_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits until every pool of cluster `id` that follows its control plane runs `to` on each of
/// its workers, showing each pool's progress as it changes; a pinned pool is named and left.
pub(crate) fn wait_pools(
    api: &Api,
    id: i64,
    to: &str,
    deadline: std::time::Instant,
) -> Result<(), CliError> {
    let mut said = BTreeMap::new();
    loop {
        let pools: Vec<PoolView> = api.get(&format!("/clusters/{id}/node-pools"))?;
        let mut left = 0;
        for p in &pools {
            let line = pool_progress(p, to);
            if !p.follow_control_plane || p.deleting || pool_runs(p, to) {
                // Settled: said once.
            } else {
                left += 1;
            }
            if said.get(&p.id) != Some(&line) {
                eprintln!("{line}");
                said.insert(p.id, line);
            }
        }
        if left == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(CliError::Failed(format!(
                "{left} pool(s) of cluster {id} did not run {to} in time; they go on in the \
                 background: `exk8s node-pools list {id}`"
            )));
        }
        std::thread::sleep(POOLS_POLL);
    }
}

/// Whether every worker of `pool` runs `to` and none is being replaced.
fn pool_runs(pool: &PoolView, to: &str) -> bool {
    pool.kubernetes_version == to
        && pool.replicas == pool.desired
        && pool.nodes.len() as i64 == pool.desired
        && pool
            .nodes
            .iter()
            .all(|n| n.kubernetes_version.as_deref() == Some(to) && n.removal.is_none())
}

/// One line on where `pool` stands on its way to `to`.
fn pool_progress(pool: &PoolView, to: &str) -> String {
    if !pool.follow_control_plane {
        return format!(
            "pool {}: pinned at {}, left there (`exk8s node-pools upgrade`)",
            pool.name, pool.kubernetes_version
        );
    }
    if pool.deleting {
        return format!("pool {}: being deleted, left", pool.name);
    }
    let at = pool
        .nodes
        .iter()
        .filter(|n| n.kubernetes_version.as_deref() == Some(to) && n.removal.is_none())
        .count();
    let error = pool
        .error_message
        .as_deref()
        .map_or(String::new(), |e| format!(" (retrying: {e})"));
    format!(
        "pool {}: {at}/{} workers run {to}, {} in all{error}",
        pool.name,
        pool.desired,
        pool.nodes.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_and_labels_read_as_kubectl_writes_them() {
        let t = taints(&["dedicated=blue:NoSchedule".into(), "gpu:NoExecute".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        let taint = |key: &str, value: &str, effect: &str| TaintRequest {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        };
        assert_eq!(
            t,
            [
                taint("dedicated", "blue", "NoSchedule"),
                taint("gpu", "", "NoExecute")
            ]
        );
        assert!(taints(&["nocolon".into()]).is_err());
        let l = labels(&["node.kubernetes.io/pool=blue".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l["node.kubernetes.io/pool"], "blue");
        assert!(labels(&["novalue".into()]).is_err());
    }
}
