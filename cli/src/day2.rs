//! The day-2 verbs: worker pools, rollouts, certificate renewal and CA rotation, replacing and
//! removing a control-plane member. Each is one API call; what it started is shown, and the
//! cluster's status (`exk8s clusters get`) follows it to the end.

use clap::Subcommand;
use serde_json::{Map, Value, json};

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, cell, show, table};

#[derive(Debug, Subcommand)]
pub(crate) enum Pools {
    /// A cluster's worker pools.
    List { cluster: String },
    /// One pool and its workers.
    Get { cluster: String, pool: String },
    /// A pool of workers that register with the labels and taints given.
    Create {
        cluster: String,
        #[arg(long)]
        name: String,
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
    },
    /// Grow or shrink a pool (the newest workers go first, drained before their VM is).
    Scale {
        cluster: String,
        pool: String,
        #[arg(long)]
        count: i64,
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
    api.get(&format!("/clusters/{cluster}/node-pools"))?
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == pool)
        .and_then(|p| p["id"].as_i64())
        .ok_or_else(|| CliError::Failed(format!("cluster {cluster} has no pool named `{pool}`")))
}

fn pools_table(list: &Value) -> comfy_table::Table {
    let mut t = table(&[
        "id",
        "name",
        "desired",
        "ready",
        "up to date",
        "instance type",
    ]);
    let rows: Vec<&Value> = match list {
        Value::Array(items) => items.iter().collect(),
        one => vec![one],
    };
    for p in rows {
        t.add_row(vec![
            cell(&p["id"]),
            cell(&p["name"]),
            cell(&p["desired"]),
            format!("{}/{}", cell(&p["ready_replicas"]), cell(&p["replicas"])),
            cell(&p["up_to_date_replicas"]),
            cell(&p["instance_type"]),
        ]);
    }
    t
}

/// `key=value` labels.
fn labels(given: &[String]) -> Result<Map<String, Value>, CliError> {
    given
        .iter()
        .map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_owned(), Value::from(v)))
                .ok_or_else(|| CliError::Usage(format!("--label `{l}` is not key=value")))
        })
        .collect()
}

/// `key=value:Effect` or `key:Effect` taints, as kubectl writes them.
fn taints(given: &[String]) -> Result<Vec<Value>, CliError> {
    given
        .iter()
        .map(|t| {
            let (pair, effect) = t
                .rsplit_once(':')
                .ok_or_else(|| CliError::Usage(format!("--taint `{t}` is not key=value:Effect")))?;
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let mut taint = json!({"key": key, "effect": effect});
            if !value.is_empty() {
                taint["value"] = Value::from(value);
            }
            Ok(taint)
        })
        .collect()
}

pub(crate) fn pools(api: &Api, command: Pools, format: Format) -> Result<(), CliError> {
    match command {
        Pools::List { cluster } => {
            let id = api.cluster_id(&cluster)?;
            show(
                format,
                &api.get(&format!("/clusters/{id}/node-pools"))?,
                pools_table,
            )
        }
        Pools::Get { cluster, pool } => {
            let id = api.cluster_id(&cluster)?;
            let pool = pool_id(api, id, &pool)?;
            let view = api.get(&format!("/clusters/{id}/node-pools/{pool}"))?;
            show(format, &view, pools_table)
        }
        Pools::Create {
            cluster,
            name,
            count,
            instance_type,
            image,
            subnet,
            labels: given_labels,
            taints: given_taints,
        } => {
            let id = api.cluster_id(&cluster)?;
            let body = json!({
                "name": name,
                "count": count,
                "instance_type": instance_type,
                "image_id": image,
                "subnet_id": subnet,
                "labels": labels(&given_labels)?,
                "taints": taints(&given_taints)?,
            });
            let made = api.send(
                "POST",
                &format!("/clusters/{id}/node-pools"),
                Some(&body),
                None,
            )?;
            eprintln!("pool {name} created; its workers are made in the background");
            show(format, &made, pools_table)
        }
        Pools::Scale {
            cluster,
            pool,
            count,
        } => {
            let id = api.cluster_id(&cluster)?;
            let pool = pool_id(api, id, &pool)?;
            let path = format!("/clusters/{id}/node-pools/{pool}");
            let changed = api.send("PATCH", &path, Some(&json!({"count": count})), None)?;
            show(format, &changed, pools_table)
        }
        Pools::Delete { cluster, pool, yes } => {
            if !yes {
                return Err(CliError::Usage(format!(
                    "deleting pool {pool} drains and deletes its workers; run again with --yes"
                )));
            }
            let id = api.cluster_id(&cluster)?;
            let pool_id = pool_id(api, id, &pool)?;
            api.send(
                "DELETE",
                &format!("/clusters/{id}/node-pools/{pool_id}"),
                None,
                None,
            )?;
            eprintln!("pool {pool} is being deleted: its workers are drained and released");
            Ok(())
        }
    }
}

/// A started rollout, renewal or rotation: its nodes.
fn started_table(started: &Value) -> comfy_table::Table {
    let mut t = table(&["vm", "generation"]);
    for n in started["nodes"].as_array().into_iter().flatten() {
        t.add_row(vec![cell(&n["vm_id"]), cell(&n["desired_generation"])]);
    }
    t
}

/// `POST /clusters/{id}/<what>` with `body`, the answer shown.
pub(crate) fn start(
    api: &Api,
    cluster: &str,
    what: &str,
    body: Option<Value>,
    format: Format,
) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let started = api.send(
        "POST",
        &format!("/clusters/{id}/{what}"),
        body.as_ref(),
        None,
    )?;
    eprintln!("started; every node takes its next generation, one control-plane node at a time");
    show(format, &started, started_table)
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

pub(crate) fn members(api: &Api, command: Members) -> Result<(), CliError> {
    match command {
        Members::Replace { cluster, vm } => {
            let id = api.cluster_id(&cluster)?;
            api.send(
                "POST",
                &format!("/clusters/{id}/nodes/{vm}/replace"),
                None,
                None,
            )?;
            eprintln!("replacing VM {vm}; `exk8s clusters get {cluster}` shows each step");
        }
        Members::Remove { cluster, vm, yes } => {
            if !yes {
                return Err(CliError::Usage(format!(
                    "removing VM {vm} takes it out of etcd and deletes it; run again with --yes"
                )));
            }
            let id = api.cluster_id(&cluster)?;
            api.send("DELETE", &format!("/clusters/{id}/nodes/{vm}"), None, None)?;
            eprintln!("removing VM {vm}; `exk8s clusters get {cluster}` shows each step");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taints_and_labels_read_as_kubectl_writes_them() {
        let t = taints(&["dedicated=blue:NoSchedule".into(), "gpu:NoExecute".into()])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            t,
            [
                json!({"key": "dedicated", "value": "blue", "effect": "NoSchedule"}),
                json!({"key": "gpu", "effect": "NoExecute"})
            ]
        );
        assert!(taints(&["nocolon".into()]).is_err());
        let l = labels(&["node.kubernetes.io/pool=blue".into()]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(l["node.kubernetes.io/pool"], "blue");
        assert!(labels(&["novalue".into()]).is_err());
    }
}
