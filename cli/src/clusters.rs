//! `exk8s clusters`: list (the deleted ones kept, too), show, create (following the founding
//! with `--wait`), delete, purge — the tables operators read and the requests the API takes.

use std::time::Duration;

use exk8s_api_types::{
    ClusterCreated, ClusterView, CreateClusterRequest, DeletedClusterView, SecretPem,
    SuppliedCaRequest, SuppliedCasRequest,
};

use crate::client::Api;
use crate::error::CliError;
use crate::output::{self, Format, age, show, table};
use crate::{Clusters, CreateArgs, watch};

pub(crate) fn clusters(api: &Api, command: Clusters, format: Format) -> Result<(), CliError> {
    match command {
        Clusters::List { deleted: false } => {
            let list: Vec<ClusterView> = api.get_all("/clusters")?;
            show(format, &list, cluster_table)
        }
        Clusters::List { deleted: true } => {
            let list: Vec<DeletedClusterView> = api.get("/deleted-clusters")?;
            show(format, &list, deleted_table)
        }
        Clusters::Purge { cluster, yes } => purge(api, &cluster, yes),
        Clusters::Get { cluster } => {
            let id = api.cluster_id(&cluster)?;
            let view: ClusterView = api.get(&format!("/clusters/{id}"))?;
            show(format, &view, cluster_detail)
        }
        Clusters::Create(args) => create(api, &args, format),
        Clusters::Delete { cluster, yes } => {
            let id = api.cluster_id(&cluster)?;
            if !yes {
                return Err(CliError::Usage(format!(
                    "deleting cluster {cluster} destroys its VMs and everything on them; run \
                     again with --yes"
                )));
            }
            let answer: Option<exk8s_api_types::DeleteAccepted> =
                api.send("DELETE", &format!("/clusters/{id}"), None::<&()>, None)?;
            match answer {
                // 202: the API accepted the delete and finishes it in the background.
                Some(accepted) => {
                    eprintln!("cluster {cluster} is being deleted: {}", accepted.message);
                }
                None => eprintln!("cluster {cluster} deleted"),
            }
            Ok(())
        }
    }
}

/// Purges deleted cluster `cluster` (an id or a name), naming it to the API as it asks.
fn purge(api: &Api, cluster: &str, yes: bool) -> Result<(), CliError> {
    let list: Vec<DeletedClusterView> = api.get("/deleted-clusters")?;
    let kept = list
        .iter()
        .find(|c| c.name == cluster || c.cluster_id.to_string() == cluster)
        .ok_or_else(|| {
            CliError::Failed(format!(
                "no deleted cluster `{cluster}` is kept (`exk8s clusters list --deleted`)"
            ))
        })?;
    if !yes {
        return Err(CliError::Usage(format!(
            "purging deleted cluster {cluster} drops its trust and {} snapshot(s): no cluster \
             can be founded from it any more; run again with --yes",
            kept.snapshots
        )));
    }
    // A cluster's name is a-z, 0-9 and '-' (the API names an unnamed one `exk8s-<org>-<id>`):
    // nothing in it needs escaping in a query.
    let _: Option<serde_json::Value> = api.send(
        "DELETE",
        &format!(
            "/deleted-clusters/{}?confirm={}",
            kept.cluster_id, kept.name
        ),
        None::<&()>,
        None,
    )?;
    eprintln!("deleted cluster {cluster} purged");
    Ok(())
}

fn deleted_table(list: &Vec<DeletedClusterView>) -> comfy_table::Table {
    let mut t = table(&[
        "id",
        "name",
        "version",
        "deleted",
        "kept",
        "snapshots",
        "kept until",
    ]);
    let now = output::now();
    for c in list {
        t.add_row(vec![
            c.cluster_id.to_string(),
            c.name.clone(),
            c.kubernetes_version.clone(),
            format!("{} ago", age(c.deleted_at, now)),
            c.kept.join(", "),
            format!("{} ({} bytes)", c.snapshots, c.snapshot_bytes),
            output::date(c.kept_until),
        ]);
    }
    t
}

fn cluster_table(list: &Vec<ClusterView>) -> comfy_table::Table {
    let mut t = table(&[
        "id",
        "name",
        "phase",
        "ready",
        "control plane",
        "nodes",
        "version",
        "age",
    ]);
    let now = output::now();
    for c in list {
        t.add_row(vec![
            c.id.to_string(),
            c.name.clone(),
            c.phase.to_string(),
            c.ready.to_string(),
            format!("{}/{}", c.ready_replicas, c.replicas),
            c.nodes.len().to_string(),
            c.version.clone(),
            age(c.created_at, now),
        ]);
    }
    t
}

pub(crate) fn cluster_detail(c: &ClusterView) -> comfy_table::Table {
    let mut t = table(&["field", "value"]);
    let fields = [
        ("id", Some(c.id.to_string())),
        ("name", Some(c.name.clone())),
        ("phase", Some(c.phase.to_string())),
        ("ready", Some(c.ready.to_string())),
        ("initialized", Some(c.initialized.to_string())),
        ("replicas", Some(c.replicas.to_string())),
        ("ready_replicas", Some(c.ready_replicas.to_string())),
        (
            "up_to_date_replicas",
            Some(c.up_to_date_replicas.to_string()),
        ),
        (
            "control_plane_dns_name",
            Some(c.control_plane_dns_name.clone()),
        ),
        ("version", Some(c.version.clone())),
        ("key_algorithm", Some(c.key_algorithm.clone())),
        ("service_cidr", Some(c.service_cidr.clone())),
        ("pod_cidr", Some(c.pod_cidr.clone())),
        ("pod_network", Some(c.pod_network.clone())),
        ("error_reason", c.error_reason.clone()),
        ("error_message", c.error_message.clone()),
        ("membership_error", c.membership_error.clone()),
    ];
    for (key, value) in fields {
        if let Some(value) = value {
            t.add_row(vec![key.to_owned(), value]);
        }
    }
    let members = &c.control_plane_members;
    t.add_row(vec![
        "control_plane_members".to_owned(),
        format!(
            "{} voters, {} joining, {} leaving (desired {})",
            members.voters, members.joining, members.leaving, members.desired
        ),
    ]);
    for condition in &c.conditions {
        t.add_row(vec![
            format!("condition {}", condition.type_),
            format!(
                "{} {}: {}",
                condition.status, condition.reason, condition.message
            ),
        ]);
    }
    t
}

fn create(api: &Api, args: &CreateArgs, format: Format) -> Result<(), CliError> {
    let ssh_pubkey = match &args.ssh_key_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| CliError::io(format!("reading {}", file.display()), e))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let brought = |cert: &Option<std::path::PathBuf>, key: &Option<std::path::PathBuf>| {
        let (Some(cert), Some(key)) = (cert, key) else {
            return Ok(None);
        };
        let read = |file: &std::path::Path| {
            std::fs::read_to_string(file)
                .map_err(|e| CliError::io(format!("reading {}", file.display()), e))
        };
        Ok::<_, CliError>(Some(SuppliedCaRequest {
            cert_pem: Some(read(cert)?),
            // Read straight into memory that is wiped when the request is dropped.
            key_pem: Some(SecretPem::new(read(key)?)),
        }))
    };
    let cas = SuppliedCasRequest {
        cluster: brought(&args.cluster_ca_cert, &args.cluster_ca_key)?,
        etcd: brought(&args.etcd_ca_cert, &args.etcd_ca_key)?,
        front_proxy: brought(&args.front_proxy_ca_cert, &args.front_proxy_ca_key)?,
    };
    let brings_cas = cas.cluster.is_some() || cas.etcd.is_some() || cas.front_proxy.is_some();
    let body = CreateClusterRequest {
        name: args.name.clone(),
        control_plane_count: Some(args.control_plane),
        control_plane_image_id: Some(args.image),
        control_plane_instance_type: Some(args.instance_type.clone()),
        zone_id: args.zone,
        subnet_id: Some(args.subnet),
        security_group_ids: None,
        allocate_public_ipv4: Some(args.public_ip),
        ssh_pubkey,
        root_volume_size_gib: None,
        key_algorithm: args.key_algorithm.clone(),
        kubernetes_version: args.kubernetes_version.clone(),
        leaf_lifetime_days: args.leaf_lifetime_days,
        pod_network: args.pod_network.clone(),
        certificate_authorities: brings_cas.then_some(cas),
        restore_from: args
            .restore_from
            .map(|(cluster, snapshot)| exk8s_api_types::RestoreFrom {
                cluster_id: Some(cluster),
                snapshot_id: Some(snapshot),
            }),
    };
    // A key even when none was given: the CLI's own retries of a busy API found once.
    let key = match &args.idempotency_key {
        Some(key) => key.clone(),
        None => crate::retry::new_key()?,
    };
    let accepted: Founding = api
        .send("POST", "/clusters", Some(&body), Some(&key))?
        .ok_or_else(|| CliError::Unexpected("the answer to POST /clusters was empty".into()))?;
    let (id, name) = match &accepted {
        Founding::Founded(created) => (created.cluster_id, created.name.as_str()),
        Founding::Accepted(view) => (view.id, view.name.as_str()),
    };
    eprintln!(
        "cluster {name} ({id}) accepted; it is being founded, then its VMs boot and their agents report"
    );
    let view = if args.wait {
        watch::until_ready(api, id, Duration::from_secs(args.timeout))?
    } else {
        api.get(&format!("/clusters/{id}"))?
    };
    show(format, &view, cluster_detail)
}

/// What `POST /clusters` answers: the founded cluster when founding ended within the wait the
/// request preferred (201), else the cluster being founded (202).
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Founding {
    Founded(Box<ClusterCreated>),
    Accepted(Box<ClusterView>),
}
