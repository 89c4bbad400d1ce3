//! `exk8s restore CLUSTER SNAPSHOT --yes [--wait]`: restores a cluster's etcd in place from
//! one of its stored snapshots. Every member stops, restores the same snapshot and starts
//! again; everything written since the snapshot is gone, so it asks for `--yes`. With `--wait`
//! it follows the restore on the cluster's event stream, one line per change of phase, until
//! it is done or has failed.

use std::time::Duration;

use exk8s_api_types::{ChangeEvent, RestoreRequest, RestoreView};

use crate::client::Api;
use crate::error::CliError;
use crate::output::{self, Format, table};

/// The `restore` command's arguments.
pub(crate) struct Ask<'a> {
    pub cluster: &'a str,
    pub snapshot: i64,
    pub yes: bool,
    pub wait: Option<Duration>,
}

pub(crate) fn run(api: &Api, ask: &Ask<'_>, format: Format) -> Result<(), CliError> {
    if !ask.yes {
        return Err(CliError::Usage(format!(
            "restoring snapshot {} replaces everything cluster {} stored since it was taken, and \
             its control plane is down meanwhile: add --yes",
            ask.snapshot, ask.cluster
        )));
    }
    let id = api.cluster_id(ask.cluster)?;
    let started: RestoreView = api
        .send(
            "POST",
            &format!("/clusters/{id}/restore"),
            Some(&RestoreRequest {
                snapshot_id: Some(ask.snapshot),
            }),
            None,
        )?
        .ok_or_else(|| CliError::Unexpected("a restore without a body".into()))?;
    let view = match ask.wait {
        None => started,
        Some(timeout) => follow(api, id, &started, timeout)?,
    };
    output::show(format, &view, |v| {
        let mut t = table(&["RESTORE", "SNAPSHOT", "PHASE", "MEMBERS", "ERROR"]);
        t.add_row(vec![
            v.id.to_string(),
            v.snapshot_id.to_string(),
            v.phase.clone(),
            v.members
                .iter()
                .map(|m| format!("{} {}", m.member, m.state))
                .collect::<Vec<_>>()
                .join(", "),
            v.error.clone().unwrap_or_default(),
        ]);
        t
    })?;
    if view.phase == "failed" {
        return Err(CliError::Failed(format!(
            "restore {} failed: {}",
            view.id,
            view.error.unwrap_or_default()
        )));
    }
    Ok(())
}

/// Follows the restore until it is done or has failed, at most `timeout`, saying each phase
/// as the cluster's stream tells it: a `restore` event carries the phase it entered, and a
/// member's step can be so short that reading the restore after its event already finds the
/// next phase. The restore is read at each of its events (and at the stream's keep-alive) to
/// know when it has ended.
fn follow(
    api: &Api,
    cluster: i64,
    started: &RestoreView,
    timeout: Duration,
) -> Result<RestoreView, CliError> {
    let path = format!("/clusters/{cluster}/restore");
    let read = || -> Result<RestoreView, CliError> {
        let view: RestoreView = api.get(&path)?;
        if view.id != started.id {
            return Err(CliError::Failed(format!(
                "restore {} was followed by restore {}",
                started.id, view.id
            )));
        }
        Ok(view)
    };
    let mut said = String::new();
    let mut say = |phase: &str| {
        if phase != said {
            eprintln!("restore {}: {phase}", started.id);
            said = phase.to_owned();
        }
    };
    let ended = |phase: &str| phase == "done" || phase == "failed";
    let first = read()?;
    say(&first.phase);
    if ended(&first.phase) {
        return Ok(first);
    }
    crate::follow::until(
        api,
        cluster,
        timeout,
        |event| {
            match event {
                Some(e) if e.kind != "restore" => return Ok(None),
                Some(e) => {
                    let change: ChangeEvent = serde_json::from_str(&e.data).map_err(|e| {
                        CliError::Unexpected(format!("an event the CLI cannot read ({e})"))
                    })?;
                    say(&change.phase);
                    if !ended(&change.phase) {
                        return Ok(None);
                    }
                }
                // The keep-alive: quiet for a while, so every event has come.
                None => {}
            }
            let view = read()?;
            say(&view.phase);
            Ok(ended(&view.phase).then_some(view))
        },
        || {
            let view: RestoreView = api.get(&path)?;
            if view.phase == "done" || view.phase == "failed" {
                return Ok(view);
            }
            Err(CliError::Failed(format!(
                "restore {} is still in its {} phase after {}s",
                view.id,
                view.phase,
                timeout.as_secs()
            )))
        },
    )
}
