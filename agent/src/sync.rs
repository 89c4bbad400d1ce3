//! `exk8s-agent sync`: keeps a bootstrapped node at the generation the API wants for it. Run by
//! `exk8s-agent-sync.timer` every few minutes (and by `run` on a node that finished booting):
//!
//! 1. instance metadata gives the VM id and a session token (no bootstrap token: after the
//!    first bundle the node proves itself with its own key, [`crate::nodekey`]);
//! 2. `GET /nodes/{vm}/generation`; when the applied generation is current, probe the node's
//!    components once and report what changed since the last report;
//! 3. an etcd snapshot asked of this member is taken and uploaded first (an upgrade waits for
//!    it); then `GET /nodes/{vm}/bundle`: the update bundle, or "wait" while the rollout updates
//!    another control-plane node or the upgrade's snapshot is not stored (the next sync asks
//!    again);
//! 4. every check `verify` makes, plus: kind `update`, the echoed nonce, a serial above the
//!    applied one and a generation above the applied one;
//! 5. apply: only changed files, then the plan's restarts in order with their health waits;
//!    a failure puts the previous files back ([`crate::apply::restore`]) and reports why.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_common::contract::{BootPhase, BundleKind, Component, ComponentHealth};
use exk8s_common::{Disposition, Expected, verify};

use crate::apply::Options;
use crate::clock::now;
use crate::config::NetConfig;
use crate::error::{AgentError, chain};
use crate::log::{log_info, log_warn};
use crate::machine::{apply_verified, clients, load_keyring};
use crate::node_api::{NodeApi, Update};
use crate::report::{Reporter, State as Phase, Target};
use crate::state::{State, is_done, marker_path};
use crate::{imds, nodekey};

/// How long a snapshot's upload may take.
const SNAPSHOT_UPLOAD: Duration = Duration::from_secs(30 * 60);

/// One sync: look for a newer generation and apply it.
pub fn sync(
    net: &NetConfig,
    keys: &Path,
    root: Option<&Path>,
    clock_skew_secs: i64,
) -> Result<(), AgentError> {
    let started_at = now();
    let root_dir = root.map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    net.validate()?;
    if !is_done(&root_dir)? {
        log_info!(
            "{} does not exist: this node has not finished bootstrapping (`run` does that); nothing to sync",
            marker_path(&root_dir).display()
        );
        return Ok(());
    }
    let _lock = crate::state::lock(&root_dir)?;
    let Some(key) = nodekey::load(&root_dir)? else {
        return Err(AgentError::Config(format!(
            "this node has no node key in {}: it was bootstrapped by an agent without day-2 \
             support; an operator must re-arm it, then remove {} and run `exk8s-agent run`",
            crate::state::state_dir(&root_dir).display(),
            marker_path(&root_dir).display()
        )));
    };
    let keyring = load_keyring(keys)?;
    let (api, metadata) = clients(net)?;
    let session = imds::session(
        &metadata,
        &net.imds_url,
        Duration::from_secs(net.imds_timeout_secs),
    )?;
    let node = NodeApi {
        agent: &api,
        api_url: &net.api_url,
        session: &session,
        key: &key,
    };
    let deadline = Duration::from_secs(net.fetch_timeout_secs);
    let state = State::load(&root_dir)?;
    let applied = state.applied_generation.unwrap_or(0);
    let generations = node.generations(deadline)?;
    // A restore of the cluster's etcd holds every other change: its step first, alone.
    if let Some(task) = &generations.restore {
        let timeout = Duration::from_secs(net.request_timeout_secs);
        let mut host = crate::apply::between_updates(root, &root_dir, timeout);
        return crate::etcd_restore::perform(
            &node,
            host.as_mut(),
            (&root_dir, applied),
            state.etcd_health.as_ref(),
            task,
            deadline,
        );
    }
    if generations.desired_generation <= applied {
        if generations.applied_generation < applied {
            // The report of the last apply did not arrive: say it again.
            Reporter::to(Target::Node(&node))
                .with_generation(applied)
                .outcome(
                    BootPhase::Sync,
                    Phase::Succeeded,
                    "generation already applied",
                );
        }
        log_info!("generation {applied} is applied and current");
        let etcd = state.etcd_health.clone();
        check_components(&node, net, root, &root_dir, state, applied)?;
        return match generations.snapshot {
            Some(task) => take_snapshot(&node, net, root, &root_dir, &task, etcd),
            None => Ok(()),
        };
    }
    // A snapshot asked of this member goes first: an upgrade's waits for it before any member
    // takes the new version (and this member's update may be that version).
    if let Some(task) = &generations.snapshot {
        let etcd = state.etcd_health.clone();
        if let Err(e) = take_snapshot(&node, net, root, &root_dir, task, etcd) {
            log_warn!(
                "etcd snapshot {} failed ({}); asking for the update anyway",
                task.id,
                chain(&e)
            );
        }
    }
    log_info!(
        "generation {} is wanted (applied: {applied}); asking for it",
        generations.desired_generation
    );
    let (envelope, nonce) = match node.update(deadline)? {
        Update::Current => {
            log_warn!(
                "the API has no update for this node although generation {} is wanted; the next sync asks again",
                generations.desired_generation
            );
            return Ok(());
        }
        Update::Wait(reason) => {
            log_info!("the update waits: {reason}; the next sync asks again");
            return Ok(());
        }
        Update::Bundle { envelope, nonce } => (envelope, nonce),
    };
    let reporter = Reporter::to(Target::Node(&node));
    let checked = verify(&envelope, &keyring).and_then(|bundle| {
        let disposition = bundle.check_binding(&Expected {
            vm_id: session.vm_id,
            nonce: Some(&nonce),
            cluster_id: None,
            org_id: None,
            kind: Some(BundleKind::Update),
            now: started_at,
            clock_skew_secs,
            applied_serial: state.applied_serial,
        })?;
        Ok((bundle, disposition))
    });
    let bundle = match checked {
        Ok((bundle, Disposition::Apply)) => bundle,
        Ok((bundle, Disposition::AlreadyApplied)) => {
            let e = AgentError::RefusedOnDisk(format!(
                "the update repeats the applied serial {}",
                bundle.payload().freshness.serial
            ));
            reporter.outcome(BootPhase::Sync, Phase::Failed, &chain(&e));
            return Err(e);
        }
        Err(e) => {
            reporter.outcome(BootPhase::Sync, Phase::Failed, &e.to_string());
            return Err(e.into());
        }
    };
    let generation = bundle.payload().identity.generation;
    let reporter = reporter.with_generation(generation);
    if generation <= applied {
        let e = AgentError::RefusedOnDisk(format!(
            "the update's generation {generation} is not above the applied generation {applied}"
        ));
        reporter.outcome(BootPhase::Sync, Phase::Failed, &chain(&e));
        return Err(e);
    }
    reporter.report(
        BootPhase::Sync,
        Phase::Started,
        &format!(
            "generation {generation}, serial {}, signed by {}",
            bundle.payload().freshness.serial,
            bundle.key_id()
        ),
    );
    let options = Options {
        restore_on_failure: true,
        ..Options::new(root_dir, BootPhase::Sync)
    };
    // A failure is reported by the apply, with what became of the previous files.
    apply_verified(
        &bundle,
        root,
        options,
        Duration::from_secs(net.request_timeout_secs),
        &reporter,
    )
}

/// Takes the etcd snapshot `task` asks of this node and uploads it; one the node cannot take
/// (it runs no etcd member) is reported failed.
fn take_snapshot(
    node: &NodeApi<'_>,
    net: &NetConfig,
    root: Option<&Path>,
    root_dir: &Path,
    task: &exk8s_common::contract::SnapshotTask,
    etcd: Option<crate::state::EtcdHealth>,
) -> Result<(), AgentError> {
    let Some(health) = etcd else {
        return node.snapshot_failed(task.id, "this node runs no etcd member");
    };
    let timeout = Duration::from_secs(net.request_timeout_secs);
    crate::snapshot::take(
        node,
        root_dir,
        task,
        |to, meta| crate::apply::save_etcd_snapshot(root, root_dir, &health, (to, meta), timeout),
        SNAPSHOT_UPLOAD,
    )
}

/// Between updates the node probes its components once. A control-plane node whose etcd stops
/// answering reports the sync failed (the API then counts it out, e.g. replaces it by removing
/// it first) and says when it recovers; any other change in what the probes see is reported
/// with the sync succeeded, so each component's condition follows.
fn check_components(
    node: &NodeApi<'_>,
    net: &NetConfig,
    root: Option<&Path>,
    root_dir: &Path,
    mut state: State,
    applied: u64,
) -> Result<(), AgentError> {
    let request_timeout = Duration::from_secs(net.request_timeout_secs);
    let mut seen =
        crate::apply::check_components(root, root_dir, &state.component_checks, request_timeout);
    let etcd = state
        .etcd_health
        .clone()
        .map(|health| crate::apply::check_etcd(root, root_dir, &health, request_timeout));
    if let Some(result) = &etcd {
        let result = result.as_ref().map(|_| ()).map_err(|e| chain(e));
        seen.push(crate::apply::components::health(Component::Etcd, result));
    }
    // What was last reported, with what these probes saw in place of it (a component no
    // probe checks keeps its last report).
    let mut merged: std::collections::BTreeMap<Component, ComponentHealth> = state
        .reported_components
        .iter()
        .map(|h| (h.component, h.clone()))
        .collect();
    merged.extend(seen.iter().map(|h| (h.component, h.clone())));
    let seen: Vec<ComponentHealth> = merged.into_values().collect();
    let etcd_failed = matches!(etcd, Some(Err(_)));
    let recovered = state.reported_unhealthy && !etcd_failed;
    if seen == state.reported_components && !etcd_failed && !recovered {
        log_info!("every component is as last reported; nothing to do");
        return Ok(());
    }
    let reporter = Reporter::to(Target::Node(node)).with_generation(applied);
    for health in &seen {
        reporter.saw(health.clone());
    }
    let unhealthy: Vec<&str> = seen
        .iter()
        .filter(|h| !h.healthy)
        .map(|h| h.component.as_str())
        .collect();
    state.reported_unhealthy = etcd_failed;
    state.reported_components = seen;
    state.save(root_dir)?;
    match etcd {
        Some(Err(e)) => {
            let why = format!("etcd on this node is not healthy: {}", chain(&e));
            reporter.outcome(BootPhase::Sync, Phase::Failed, &why);
            Err(e)
        }
        _ => {
            let message = if recovered {
                "etcd is healthy again".to_owned()
            } else if unhealthy.is_empty() {
                "every component is healthy".to_owned()
            } else {
                format!("unhealthy: {}", unhealthy.join(", "))
            };
            reporter.outcome(BootPhase::Sync, Phase::Succeeded, &message);
            Ok(())
        }
    }
}
