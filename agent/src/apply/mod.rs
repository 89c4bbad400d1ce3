//! Applying a verified bundle: files first (all staged, then all renamed), then prerequisites
//! (packages, artifacts), then the plan's steps in order, reporting each phase. State is saved
//! after the files landed, and the serial is recorded only after everything succeeded.
//!
//! Only files whose content or mode differ are written, and a step restarts a unit only when a
//! file it watches changed — in this apply or in an earlier one that was interrupted before its
//! restarts ran (`State::pending`). An update (`Options::restore_on_failure`) that fails after
//! its files landed puts the previous files back, runs the steps again so the units run them,
//! and reports the failure; the next sync tries again.

pub mod artifacts;
pub mod components;
mod drain;
pub mod etcd_data;
mod exec;
pub mod files;
pub mod host;
mod kubelet_log;
pub mod membership;
pub mod releases;
pub mod restore;
mod retire;
mod steps;
pub mod waits;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_common::payload::{BundlePayload, PlanStep};

use crate::error::{AgentError, chain};
use exk8s_common::contract::BootPhase;

use crate::log::{log_error, log_info, log_warn};
use crate::report::{Reporter, State as Phase};
use crate::state::State;

pub use files::Change;
use host::{Host, HostAction};
use restore::Snapshot;
use steps::{Run, run_plan};

/// How to apply.
#[derive(Debug, Clone)]
pub struct Options {
    /// `/` on a node; a prefix for tests and image builders.
    pub root: PathBuf,
    /// Show what would change; write nothing, perform nothing.
    pub dry_run: bool,
    /// A failed chown is an error (a real node) rather than a warning.
    pub strict_owner: bool,
    /// The phase reported once everything succeeded: `complete` at first boot, `sync` after.
    pub finish: BootPhase,
    /// On a failure after the files landed, put the previous files back (updates).
    pub restore_on_failure: bool,
}

impl Options {
    /// Options for applying under `root` (`/` on a node), finishing with `finish`.
    pub fn new(root: PathBuf, finish: BootPhase) -> Self {
        Self {
            root,
            dry_run: false,
            strict_owner: false,
            finish,
            restore_on_failure: false,
        }
    }
}

/// What an apply did (or, in a dry run, would do).
#[derive(Debug, Default)]
pub struct Outcome {
    pub files: Vec<(String, Change)>,
}

/// Runs one phase: reports started, then succeeded or failed with the error chain.
fn phase<T>(
    reporter: &Reporter<'_>,
    name: BootPhase,
    work: impl FnOnce() -> Result<T, AgentError>,
) -> Result<T, AgentError> {
    reporter.report(name, Phase::Started, "");
    match work() {
        Ok(value) => {
            reporter.report(name, Phase::Succeeded, "");
            Ok(value)
        }
        Err(e) => {
            reporter.report(name, Phase::Failed, &chain(&e));
            Err(e)
        }
    }
}

/// Applies `bundle` under `options.root` with `host` performing (or recording) host actions.
/// An update's failure is reported under `options.finish`, with what became of the previous
/// files.
pub fn apply(
    bundle: &BundlePayload,
    options: &Options,
    host: &mut dyn Host,
    reporter: &Reporter<'_>,
) -> Result<Outcome, AgentError> {
    apply_steps(bundle, options, host, reporter).map_err(|(e, restored)| {
        if options.restore_on_failure {
            let mut message = chain(&e);
            if let Some(restored) = restored {
                message = format!("{message}; {restored}");
            }
            reporter.outcome(options.finish, Phase::Failed, &message);
        }
        e
    })
}

/// The error, and for an update what happened to the previous files.
type Failure = (AgentError, Option<String>);

fn apply_steps(
    bundle: &BundlePayload,
    options: &Options,
    host: &mut dyn Host,
    reporter: &Reporter<'_>,
) -> Result<Outcome, Failure> {
    let root = &options.root;
    let plain = |e| (e, None);
    let actions = files::plan(root, &bundle.files).map_err(plain)?;
    let outcome = Outcome {
        files: actions
            .iter()
            .map(|a| (a.file.path.to_string(), a.change))
            .collect(),
    };
    let mut state = State::load(root).map_err(plain)?;
    let previous_files = state.files.clone();
    let mut changed = state.pending.clone();
    changed.extend(
        actions
            .iter()
            .filter(|a| a.change != Change::Unchanged)
            .map(|a| a.file.path.to_string()),
    );
    let restoring = options.restore_on_failure && !options.dry_run;
    let snapshot = if restoring {
        Snapshot::take(&actions).map_err(plain)?
    } else {
        Snapshot::default()
    };
    // Static pod manifests land at their plan step, once what runs before them is healthy.
    let manifests: BTreeSet<&str> = bundle
        .plan
        .iter()
        .filter_map(|step| match step {
            PlanStep::InstallStaticPod { manifest } => Some(manifest.as_str()),
            _ => None,
        })
        .collect();
    let (deferred, now): (Vec<_>, Vec<_>) = actions
        .into_iter()
        .partition(|a| manifests.contains(a.file.path.as_str()));
    let mut ran = Ok(());
    if !options.dry_run {
        ran = phase(reporter, BootPhase::Files, || {
            // Owed restarts are recorded before any file lands.
            state.pending = changed.clone();
            state.save(root)?;
            files::apply(root, &now, options.strict_owner)?;
            state.vm_id = Some(bundle.identity.vm_id);
            state.files = bundle
                .files
                .iter()
                .map(|f| (f.path.to_string(), f.sha256.to_hex()))
                .collect();
            state.save(root)
        });
    }
    let ran = ran
        .and_then(|()| {
            phase(reporter, BootPhase::Prereqs, || {
                prerequisites(bundle, options, host)
            })
        })
        .and_then(|()| {
            let run = Run {
                bundle,
                options,
                changed: &changed,
                deferred: Some(&deferred),
            };
            run_plan(&run, host, reporter)
        });
    if let Err(e) = ran {
        if !restoring {
            return Err((e, None));
        }
        let restored = put_back(
            bundle,
            options,
            &snapshot,
            previous_files,
            &changed,
            host,
            &e,
        );
        return Err((e, Some(restored)));
    }
    if options.dry_run {
        return Ok(outcome);
    }
    let finished = State::load(root).and_then(|mut state| {
        state.applied_serial = Some(bundle.freshness.serial);
        state.applied_generation = Some(bundle.identity.generation);
        state.pending.clear();
        state.etcd_health = etcd_health(bundle);
        state.reported_unhealthy = false;
        state.component_checks = components::checks(bundle, &state.component_checks);
        state.reported_components = reporter.seen();
        // The releases this bundle runs, and the last other one the node ran, stay.
        for shelf in releases::SHELVES {
            let kept = match shelf {
                releases::Shelf::Kubernetes => &mut state.releases,
                releases::Shelf::Etcd => &mut state.etcd_releases,
            };
            *kept = releases::used(kept, &releases::of_bundle(bundle, shelf));
            let keep: BTreeSet<String> = kept.iter().cloned().collect();
            match releases::prune(root, shelf, &keep) {
                Ok(removed) if !removed.is_empty() => {
                    log_info!(
                        "removed {shelf} releases no longer needed: {}",
                        removed.join(", ")
                    );
                }
                Ok(_) => {}
                Err(e) => log_warn!("removing old {shelf} releases failed: {e}"),
            }
        }
        state.save(root)?;
        crate::state::mark_done(root, bundle.freshness.serial)
    });
    finished.map_err(plain)?;
    reporter.outcome(options.finish, Phase::Succeeded, "");
    Ok(outcome)
}

/// After a failed update: the previous files back, the steps again so the units run them.
/// Returns what happened, for the failure report.
fn put_back(
    bundle: &BundlePayload,
    options: &Options,
    snapshot: &Snapshot,
    previous_files: std::collections::BTreeMap<String, String>,
    changed: &BTreeSet<String>,
    host: &mut dyn Host,
    cause: &AgentError,
) -> String {
    log_warn!(
        "the update failed ({}); putting the previous files back",
        chain(cause)
    );
    let root = &options.root;
    let restored = snapshot.restore(options.strict_owner).and_then(|()| {
        let mut state = State::load(root)?;
        state.files = previous_files;
        state.save(root)
    });
    if let Err(e) = restored {
        log_error!("restoring the previous files failed: {}", chain(&e));
        return format!("restoring the previous files failed: {}", chain(&e));
    }
    let run = Run {
        bundle,
        options,
        changed,
        deferred: None,
    };
    match run_plan(&run, host, &Reporter::none()) {
        Ok(()) => {
            // The units run what is on disk again: nothing is owed.
            let cleared = State::load(root).and_then(|mut state| {
                state.pending.clear();
                state.save(root)
            });
            if let Err(e) = cleared {
                log_warn!("recording the restored state failed: {}", chain(&e));
            }
            log_info!("the previous files are back and their units restarted");
            "the previous files were put back and their units restarted".into()
        }
        Err(e) => {
            log_error!(
                "the previous files are back, but restarting their units failed: {}",
                chain(&e)
            );
            format!(
                "the previous files were put back, but restarting their units failed: {}",
                chain(&e)
            )
        }
    }
}

/// The packages missing and the artifacts not already installed, side by side: apt-get in one
/// lane, the downloads (verified by the agent itself, with its own TLS roots) one after another
/// in the other, as each records itself in the state.
pub fn prerequisites(
    bundle: &BundlePayload,
    options: &Options,
    host: &mut dyn Host,
) -> Result<(), AgentError> {
    let names: Vec<_> = bundle.packages.iter().map(|p| &p.name).collect();
    let missing = host.missing_packages(&names)?;
    let packages = if missing.is_empty() {
        Vec::new()
    } else {
        vec![HostAction::InstallPackages(missing)]
    };
    let state = State::load(&options.root)?;
    let downloads = bundle
        .artifacts
        .iter()
        .filter(|artifact| !artifacts::is_installed(&options.root, &state, artifact))
        .map(HostAction::InstallArtifact)
        .collect();
    host.perform_lanes(&[packages, downloads])
}

/// The probe a later `sync` checks etcd with: the plan's own etcd health wait.
fn etcd_health(bundle: &BundlePayload) -> Option<crate::state::EtcdHealth> {
    bundle.plan.iter().find_map(|step| match step {
        PlanStep::WaitEtcdHealthy {
            endpoint,
            ca_file,
            cert_file,
            key_file,
            ..
        } => Some(crate::state::EtcdHealth {
            endpoint: endpoint.to_string(),
            ca_file: ca_file.as_str().to_owned(),
            cert_file: cert_file.as_str().to_owned(),
            key_file: key_file.as_str().to_owned(),
        }),
        _ => None,
    })
}

/// How long a sync's etcd health check waits for a healthy answer.
const CHECK_ETCD: Duration = Duration::from_secs(6);

/// Checks this node's etcd between updates, through the host that would perform an apply
/// (`root`: recorded under it, as `apply` does).
pub fn check_etcd(
    root: Option<&Path>,
    root_dir: &Path,
    health: &crate::state::EtcdHealth,
    request_timeout: Duration,
) -> Result<(), AgentError> {
    let action = HostAction::CheckEtcd(waits::EtcdProbe {
        endpoint: health.endpoint.clone(),
        ca_file: health.ca_file.clone().into(),
        cert_file: health.cert_file.clone().into(),
        key_file: health.key_file.clone().into(),
        timeout: CHECK_ETCD,
    });
    between_updates(root, root_dir, request_timeout).perform(&action)
}

/// Streams this node's etcd snapshot to `to` (metadata in `meta`) through the host, as
/// [`check_etcd`] probes it.
pub fn save_etcd_snapshot(
    root: Option<&Path>,
    root_dir: &Path,
    health: &crate::state::EtcdHealth,
    (to, meta): (&Path, &Path),
    request_timeout: Duration,
) -> Result<(), AgentError> {
    let action = HostAction::SaveEtcdSnapshot {
        probe: waits::EtcdProbe {
            endpoint: health.endpoint.clone(),
            ca_file: health.ca_file.clone().into(),
            cert_file: health.cert_file.clone().into(),
            key_file: health.key_file.clone().into(),
            timeout: CHECK_ETCD,
        },
        to: to.to_path_buf(),
        meta: meta.to_path_buf(),
    };
    between_updates(root, root_dir, request_timeout).perform(&action)
}

/// Probes this node's other components once each, as [`check_etcd`] does etcd.
pub fn check_components(
    root: Option<&Path>,
    root_dir: &Path,
    checks: &[components::Check],
    request_timeout: Duration,
) -> Vec<exk8s_common::contract::ComponentHealth> {
    let mut host = between_updates(root, root_dir, request_timeout);
    components::probe(checks, CHECK_ETCD, |action| host.perform(action))
}

/// The host a check between updates goes through: the one an apply would use (`root`:
/// recorded under it).
pub fn between_updates(
    root: Option<&Path>,
    root_dir: &Path,
    request_timeout: Duration,
) -> Box<dyn Host> {
    if root.is_some() {
        Box::new(host::RecordingHost::new(root_dir, true))
    } else {
        Box::new(host::SystemHost::new(
            root_dir.to_path_buf(),
            request_timeout,
        ))
    }
}
