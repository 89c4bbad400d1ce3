//! What each command does: calls to the API, shown through [`crate::output`].

use std::io::Read as _;
use std::time::Duration;

use clap::CommandFactory as _;
use serde_json::{Value, json};

use crate::client::Api;
use crate::config::{self, Config, Session, Token};
use crate::error::CliError;
use crate::output::{self, Format, age, cell, line, show, table};
use crate::{Cli, Clusters, Command, CreateArgs, day2, kubeconfig, watch};

pub(crate) fn run(cli: Cli) -> Result<(), CliError> {
    let format = cli.output;
    match cli.command {
        Command::Login { no_verify } => login(cli.api, cli.token, no_verify),
        Command::Completions { shell } => {
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "exk8s", &mut std::io::stdout());
            Ok(())
        }
        command => {
            let api = Api::new(config::session(cli.api, cli.token)?);
            match command {
                Command::Clusters(c) => clusters(&api, c, format),
                Command::Nodes { cluster } => nodes(&api, &cluster, format),
                Command::Certs { cluster } => certs(&api, &cluster, format),
                Command::Kubeconfig { cluster, merge } => get_kubeconfig(&api, &cluster, merge),
                Command::Scale {
                    cluster,
                    control_plane,
                } => scale(&api, &cluster, control_plane, format),
                Command::NodePools(p) => day2::pools(&api, p, format),
                Command::Members(m) => day2::members(&api, m),
                Command::Rollout { cluster } => {
                    day2::start(&api, &cluster, "rollout", None, format)
                }
                Command::RenewCerts { cluster } => {
                    day2::start(&api, &cluster, "certificates/renew", None, format)
                }
                Command::RotateCa { cluster, ca } => day2::start(
                    &api,
                    &cluster,
                    "certificates/rotate-ca",
                    Some(json!({"ca": ca})),
                    format,
                ),
                Command::Login { .. } | Command::Completions { .. } => Ok(()),
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
        Api::new(session).get("/clusters")?;
    }
    let file = config::path()?;
    config::save(&file, &Config { api, token })?;
    eprintln!("logged in; saved to {} (mode 0600)", file.display());
    Ok(())
}

fn clusters(api: &Api, command: Clusters, format: Format) -> Result<(), CliError> {
    match command {
        Clusters::List => {
            let list = api.get_all("/clusters")?;
            show(format, &list, cluster_table)
        }
        Clusters::Get { cluster } => {
            let id = api.cluster_id(&cluster)?;
            let view = api.get(&format!("/clusters/{id}"))?;
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
            let answer = api.send("DELETE", &format!("/clusters/{id}"), None, None)?;
            match answer["message"].as_str() {
                // 202: the API accepted the delete and finishes it in the background.
                Some(message) => eprintln!("cluster {cluster} is being deleted: {message}"),
                None => eprintln!("cluster {cluster} deleted"),
            }
            Ok(())
        }
    }
}

fn cluster_table(list: &Value) -> comfy_table::Table {
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
    for c in list.as_array().into_iter().flatten() {
        let nodes = c["nodes"].as_array().map_or(0, Vec::len);
        t.add_row(vec![
            cell(&c["id"]),
            cell(&c["name"]),
            cell(&c["phase"]),
            cell(&c["ready"]),
            format!("{}/{}", cell(&c["ready_replicas"]), cell(&c["replicas"])),
            nodes.to_string(),
            cell(&c["version"]),
            age(&c["created_at"], now),
        ]);
    }
    t
}

fn cluster_detail(c: &Value) -> comfy_table::Table {
    let mut t = table(&["field", "value"]);
    for key in [
        "id",
        "name",
        "phase",
        "ready",
        "initialized",
        "replicas",
        "ready_replicas",
        "up_to_date_replicas",
        "control_plane_dns_name",
        "version",
        "key_algorithm",
        "service_cidr",
        "pod_cidr",
        "error_reason",
        "error_message",
        "membership_error",
    ] {
        if !c[key].is_null() {
            t.add_row(vec![key.to_owned(), cell(&c[key])]);
        }
    }
    let members = &c["control_plane_members"];
    if members.is_object() {
        t.add_row(vec![
            "control_plane_members".to_owned(),
            format!(
                "{} voters, {} joining, {} leaving (desired {})",
                cell(&members["voters"]),
                cell(&members["joining"]),
                cell(&members["leaving"]),
                cell(&members["desired"])
            ),
        ]);
    }
    for condition in c["conditions"].as_array().into_iter().flatten() {
        t.add_row(vec![
            format!("condition {}", cell(&condition["type"])),
            format!(
                "{} {}: {}",
                cell(&condition["status"]),
                cell(&condition["reason"]),
                cell(&condition["message"])
            ),
        ]);
    }
    t
}

fn create(api: &Api, args: &CreateArgs, format: Format) -> Result<(), CliError> {
    let mut body = json!({
        "control_plane_count": args.control_plane,
        "control_plane_image_id": args.image,
        "control_plane_instance_type": args.instance_type,
        "subnet_id": args.subnet,
        "allocate_public_ipv4": args.public_ip,
    });
    let optional = [
        ("name", args.name.clone().map(Value::from)),
        ("zone_id", args.zone.map(Value::from)),
        ("key_algorithm", args.key_algorithm.clone().map(Value::from)),
        (
            "kubernetes_version",
            args.kubernetes_version.clone().map(Value::from),
        ),
        (
            "leaf_lifetime_days",
            args.leaf_lifetime_days.map(Value::from),
        ),
    ];
    for (key, value) in optional {
        if let Some(v) = value {
            body[key] = v;
        }
    }
    if let Some(file) = &args.ssh_key_file {
        let key = std::fs::read_to_string(file)
            .map_err(|e| CliError::io(format!("reading {}", file.display()), e))?;
        body["ssh_pubkey"] = Value::from(key.trim());
    }
    let brought = [
        ("cluster", &args.cluster_ca_cert, &args.cluster_ca_key),
        ("etcd", &args.etcd_ca_cert, &args.etcd_ca_key),
        (
            "front_proxy",
            &args.front_proxy_ca_cert,
            &args.front_proxy_ca_key,
        ),
    ];
    for (role, cert, key) in brought {
        if let (Some(cert), Some(key)) = (cert, key) {
            let read = |file: &std::path::Path| {
                std::fs::read_to_string(file)
                    .map(zeroize::Zeroizing::new)
                    .map_err(|e| CliError::io(format!("reading {}", file.display()), e))
            };
            let (cert, key) = (read(cert)?, read(key)?);
            body["certificate_authorities"][role] =
                json!({"cert_pem": cert.as_str(), "key_pem": key.as_str()});
        }
    }
    let sent = api.send(
        "POST",
        "/clusters",
        Some(&body),
        args.idempotency_key.as_deref(),
    );
    // The request held CA keys when some were brought: wipe its copy.
    zeroize_json(&mut body);
    let accepted = sent?;
    // 202: the cluster, founding in the background (`id`); 201 (a founding that ended within
    // a preferred wait): `cluster_id`.
    let id = accepted["id"]
        .as_i64()
        .or_else(|| accepted["cluster_id"].as_i64())
        .ok_or_else(|| CliError::Unexpected("the answer names no cluster id".into()))?;
    eprintln!(
        "cluster {} ({id}) accepted; it is being founded, then its VMs boot and their agents report",
        accepted["name"].as_str().unwrap_or("?")
    );
    let view = if args.wait {
        watch::until_ready(api, id, Duration::from_secs(args.timeout))?
    } else {
        api.get(&format!("/clusters/{id}"))?
    };
    show(format, &view, cluster_detail)
}

/// Overwrites every string in `value` (a request that carried private keys).
fn zeroize_json(value: &mut Value) {
    use zeroize::Zeroize as _;
    match value {
        Value::String(s) => s.zeroize(),
        Value::Array(items) => items.iter_mut().for_each(zeroize_json),
        Value::Object(map) => map.values_mut().for_each(zeroize_json),
        _ => {}
    }
}

fn nodes(api: &Api, cluster: &str, format: Format) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let view = api.get(&format!("/clusters/{id}"))?;
    show(format, &view["nodes"], |nodes| {
        let mut t = table(&[
            "name",
            "vm",
            "role",
            "phase",
            "etcd",
            "generation",
            "address",
        ]);
        for n in nodes.as_array().into_iter().flatten() {
            t.add_row(vec![
                cell(&n["name"]),
                cell(&n["vm_id"]),
                cell(&n["role"]),
                cell(&n["phase"]),
                cell(&n["etcd_membership"]),
                format!(
                    "{}/{}",
                    cell(&n["applied_generation"]),
                    cell(&n["desired_generation"])
                ),
                cell(&n["private_ipv4"]),
            ]);
        }
        t
    })
}

fn certs(api: &Api, cluster: &str, format: Format) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let inventory = api.get(&format!("/clusters/{id}/certificates"))?;
    show(format, &inventory, |inv| {
        let mut t = table(&["name", "vm", "kind", "subject", "expires", "days left"]);
        for c in inv["certificates"].as_array().into_iter().flatten() {
            t.add_row(vec![
                cell(&c["name"]),
                cell(&c["vm_id"]),
                cell(&c["kind"]),
                cell(&c["subject"]),
                output::date(&c["not_after"]),
                cell(&c["days_left"]),
            ]);
        }
        t
    })
}

fn get_kubeconfig(api: &Api, cluster: &str, merge: bool) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let text = api.get_text(&format!("/clusters/{id}/kubeconfig"))?;
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
    api.send(
        "PATCH",
        &format!("/clusters/{id}"),
        Some(&json!({"control_plane_count": count})),
        None,
    )?;
    eprintln!("scaling cluster {cluster} to {count} control-plane members, one at a time");
    let view = api.get(&format!("/clusters/{id}"))?;
    show(format, &view, cluster_detail)
}
