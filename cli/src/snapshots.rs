//! `exk8s snapshots`: a cluster's etcd snapshots — list them, take one now (and with `--wait`
//! follow it until it is stored), delete one, or download one as etcd wrote it, for
//! `etcdutl snapshot restore` outside exk8s.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;
use exk8s_api_types::{ChangeEvent, SnapshotSchedule, SnapshotView};

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, age, cell, now, show, table};

#[derive(Debug, Subcommand)]
pub(crate) enum Snapshots {
    /// A cluster's etcd snapshots, newest first.
    List {
        cluster: String,
        /// Show the list again whenever it changes, until interrupted.
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// Ask a healthy etcd voter for a snapshot now (its agent takes it at its next sync, within
    /// minutes); with --wait, follow it until it is stored or has failed.
    Create {
        cluster: String,
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, in seconds.
        #[arg(long, default_value_t = 1800)]
        timeout: u64,
    },
    /// Show the cluster's snapshot schedule, or set it with --every-hours and --retain.
    Schedule {
        cluster: String,
        /// Hours between snapshots (0: only when asked).
        #[arg(long = "every-hours", requires = "retain")]
        every_hours: Option<i64>,
        /// How many stored snapshots are kept.
        #[arg(long, requires = "every_hours")]
        retain: Option<i64>,
    },
    /// Delete a snapshot and its object in the store.
    Delete {
        cluster: String,
        snapshot: i64,
        /// Confirm: the snapshot cannot be restored afterwards.
        #[arg(long)]
        yes: bool,
    },
    /// Write a stored snapshot as etcd wrote it — every object of the cluster, Secrets as etcd
    /// holds them — to a new file (mode 0600), checked against its recorded SHA-256.
    Download {
        cluster: String,
        snapshot: i64,
        /// The file to write (it must not exist).
        #[arg(long, short = 'f')]
        file: PathBuf,
    },
}

fn snapshots_table(snapshots: &[SnapshotView]) -> comfy_table::Table {
    let mut t = table(&[
        "id", "state", "member", "age", "revision", "size", "etcd", "error",
    ]);
    let now = now();
    for s in snapshots {
        t.add_row(vec![
            s.id.to_string(),
            s.state.clone(),
            s.member.clone(),
            age(s.taken_at.unwrap_or(s.requested_at), now),
            cell(s.revision),
            cell(s.size_bytes),
            cell(s.etcd_version.as_deref()),
            cell(s.error.as_deref()),
        ]);
    }
    t
}

pub(crate) fn run(api: &Api, command: Snapshots, format: Format) -> Result<(), CliError> {
    match command {
        Snapshots::List { cluster, watch } => {
            let id = api.cluster_id(&cluster)?;
            let text = || {
                let all: Vec<SnapshotView> = api.get(&format!("/clusters/{id}/snapshots"))?;
                crate::output::render(format, &all, |s: &Vec<SnapshotView>| snapshots_table(s))
            };
            if watch {
                return crate::follow::changes(api, id, format, text);
            }
            crate::output::line(&text()?)
        }
        Snapshots::Create {
            cluster,
            wait,
            timeout,
        } => {
            let id = api.cluster_id(&cluster)?;
            let asked: SnapshotView = api
                .send(
                    "POST",
                    &format!("/clusters/{id}/snapshots"),
                    None::<&()>,
                    None,
                )?
                .ok_or_else(|| CliError::Unexpected("the API answered without a body".into()))?;
            eprintln!(
                "snapshot {} asked of {}; its agent takes it at its next sync",
                asked.id, asked.member
            );
            let shown = if wait {
                follow(api, id, asked.id, Duration::from_secs(timeout))?
            } else {
                asked
            };
            show(format, &vec![shown.clone()], |s: &Vec<SnapshotView>| {
                snapshots_table(s)
            })?;
            match shown.state.as_str() {
                "failed" => Err(CliError::Failed(format!(
                    "snapshot {} failed: {}",
                    shown.id,
                    shown.error.unwrap_or_default()
                ))),
                _ => Ok(()),
            }
        }
        Snapshots::Schedule {
            cluster,
            every_hours,
            retain,
        } => {
            let id = api.cluster_id(&cluster)?;
            let path = format!("/clusters/{id}/snapshots/schedule");
            let schedule: SnapshotSchedule = match every_hours.zip(retain) {
                Some((every_hours, retain)) => {
                    api.send(
                        "PUT",
                        &path,
                        Some(&SnapshotSchedule {
                            every_hours,
                            retain,
                        }),
                        None,
                    )?
                    .ok_or_else(|| CliError::Unexpected("the API answered without a body".into()))?
                }
                None => api.get(&path)?,
            };
            show(format, &schedule, |s: &SnapshotSchedule| {
                let mut t = table(&["every", "retain"]);
                let every = match s.every_hours {
                    0 => "only when asked".to_owned(),
                    h => format!("{h}h"),
                };
                t.add_row(vec![every, s.retain.to_string()]);
                t
            })
        }
        Snapshots::Delete {
            cluster,
            snapshot,
            yes,
        } => {
            if !yes {
                return Err(CliError::Usage(format!(
                    "deleting snapshot {snapshot} cannot be undone: add --yes"
                )));
            }
            let id = api.cluster_id(&cluster)?;
            api.send::<serde_json::Value>(
                "DELETE",
                &format!("/clusters/{id}/snapshots/{snapshot}"),
                None::<&()>,
                None,
            )?;
            eprintln!("snapshot {snapshot} deleted");
            Ok(())
        }
        Snapshots::Download {
            cluster,
            snapshot,
            file,
        } => {
            let id = api.cluster_id(&cluster)?;
            let path = format!("/clusters/{id}/snapshots/{snapshot}");
            let view: SnapshotView = api.get(&path)?;
            let written = api.download(&format!("{path}/content"), &file)?;
            if view.sha256.as_deref() != Some(written.as_str()) {
                let _ = std::fs::remove_file(&file);
                return Err(CliError::Failed(format!(
                    "snapshot {snapshot} came back with SHA-256 {written}, not the recorded {}; \
                     nothing was kept",
                    view.sha256.unwrap_or_default()
                )));
            }
            eprintln!(
                "snapshot {snapshot} ({} bytes, SHA-256 {written}) written to {}",
                view.size_bytes.unwrap_or_default(),
                file.display()
            );
            Ok(())
        }
    }
}

/// Follows snapshot `id` on the cluster's event stream until its `snapshot` event says it
/// ended — stored or failed —, then reads it; past `timeout`, it is still being taken.
fn follow(api: &Api, cluster: i64, id: i64, timeout: Duration) -> Result<SnapshotView, CliError> {
    let view = format!("/clusters/{cluster}/snapshots/{id}");
    crate::follow::until(
        api,
        cluster,
        timeout,
        |event| {
            let Some(event) = event.filter(|e| e.kind == "snapshot") else {
                return Ok(None);
            };
            let change: ChangeEvent = serde_json::from_str(&event.data)
                .map_err(|e| CliError::Unexpected(format!("an event the CLI cannot read ({e})")))?;
            if change.snapshot_id == Some(id) && change.phase != "requested" {
                return api.get(&view).map(Some);
            }
            Ok(None)
        },
        || {
            let now: SnapshotView = api.get(&view)?;
            if now.state != "requested" {
                return Ok(now);
            }
            Err(CliError::Failed(format!(
                "snapshot {id} is still being taken by {} after {}s",
                now.member,
                timeout.as_secs()
            )))
        },
    )
}
