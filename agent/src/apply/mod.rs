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
pub mod files;
pub mod host;
pub mod restore;
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

fn in_root(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
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

/// The phase a plan step belongs to (for reports).
fn phase_of(step: &PlanStep) -> BootPhase {
    match step {
        PlanStep::DaemonReload {} | PlanStep::EnableStart { .. } => BootPhase::Services,
        PlanStep::WaitEtcdHealthy { .. } => BootPhase::Etcd,
        PlanStep::WaitApiserverReady { .. } => BootPhase::Apiserver,
        PlanStep::KubectlApply { .. }
        | PlanStep::HelmInstall { .. }
        | PlanStep::WaitRollout { .. } => BootPhase::Addons,
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
            reporter.report(options.finish, Phase::Failed, &message);
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
    let mut ran = Ok(());
    if !options.dry_run {
        ran = phase(reporter, BootPhase::Files, || {
            // Owed restarts are recorded before any file lands.
            state.pending = changed.clone();
            state.save(root)?;
            files::apply(root, &actions, options.strict_owner)?;
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
        .and_then(|()| run_plan(bundle, options, &changed, host, reporter));
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
        state.save(root)?;
        crate::state::mark_done(root, bundle.freshness.serial)
    });
    finished.map_err(plain)?;
    reporter.report(options.finish, Phase::Succeeded, "");
    Ok(outcome)
}

/// The plan's steps in order, reporting the phase each belongs to.
fn run_plan(
    bundle: &BundlePayload,
    options: &Options,
    changed: &BTreeSet<String>,
    host: &mut dyn Host,
    reporter: &Reporter<'_>,
) -> Result<(), AgentError> {
    let mut current: Option<BootPhase> = None;
    for step in &bundle.plan {
        let name = phase_of(step);
        if current != Some(name) {
            if let Some(done) = current {
                reporter.report(done, Phase::Succeeded, "");
            }
            reporter.report(name, Phase::Started, "");
            current = Some(name);
        }
        if let Err(e) = run_step(step, bundle, options, changed, host) {
            reporter.report(name, Phase::Failed, &chain(&e));
            return Err(e);
        }
    }
    if let Some(done) = current {
        reporter.report(done, Phase::Succeeded, "");
    }
    Ok(())
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
    match run_plan(bundle, options, changed, host, &Reporter::none()) {
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

/// Packages first (the artifacts' tools may need them), then artifacts not already installed.
pub fn prerequisites(
    bundle: &BundlePayload,
    options: &Options,
    host: &mut dyn Host,
) -> Result<(), AgentError> {
    let names: Vec<_> = bundle.packages.iter().map(|p| &p.name).collect();
    let missing = host.missing_packages(&names)?;
    if !missing.is_empty() {
        host.perform(&HostAction::InstallPackages(missing))?;
    }
    let state = State::load(&options.root)?;
    for artifact in &bundle.artifacts {
        if !artifacts::is_installed(&options.root, &state, artifact) {
            host.perform(&HostAction::InstallArtifact(artifact))?;
        }
    }
    Ok(())
}

fn tool(bundle: &BundlePayload, root: &Path, name: &str) -> PathBuf {
    bundle
        .artifacts
        .iter()
        .find(|a| a.name.as_str() == name)
        .map(|a| in_root(root, a.dest.as_str()))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn run_step(
    step: &PlanStep,
    bundle: &BundlePayload,
    options: &Options,
    changed: &BTreeSet<String>,
    host: &mut dyn Host,
) -> Result<(), AgentError> {
    let root = &options.root;
    let secs = |s: &u32| Duration::from_secs(u64::from(*s));
    match step {
        PlanStep::DaemonReload {} => {
            if changed
                .iter()
                .any(|p| p.starts_with("/etc/systemd/system/"))
            {
                host.perform(&HostAction::DaemonReload)?;
            }
        }
        PlanStep::EnableStart { unit, watch } => {
            host.perform(&HostAction::Enable(unit))?;
            if !host.is_active(unit)? {
                host.perform(&HostAction::Start(unit))?;
            } else if watch.iter().any(|p| changed.contains(p.as_str())) {
                host.perform(&HostAction::Restart(unit))?;
            }
        }
        PlanStep::WaitEtcdHealthy {
            endpoint,
            ca_file,
            cert_file,
            key_file,
            timeout_secs,
        } => {
            host.perform(&HostAction::WaitEtcd(waits::EtcdProbe {
                endpoint: endpoint.to_string(),
                ca_file: ca_file.as_str().into(),
                cert_file: cert_file.as_str().into(),
                key_file: key_file.as_str().into(),
                timeout: secs(timeout_secs),
            }))?;
        }
        PlanStep::WaitApiserverReady {
            kubeconfig,
            timeout_secs,
        } => {
            host.perform(&HostAction::WaitApiserver(waits::ApiserverProbe {
                kubeconfig: kubeconfig.as_str().into(),
                timeout: secs(timeout_secs),
            }))?;
        }
        PlanStep::KubectlApply { kubeconfig, file } => {
            host.perform(&HostAction::Command {
                program: tool(bundle, root, "kubectl"),
                args: vec![
                    "apply".into(),
                    "-f".into(),
                    in_root(root, file.as_str()).display().to_string(),
                ],
                kubeconfig: in_root(root, kubeconfig.as_str()),
                timeout: Duration::from_secs(300),
            })?;
        }
        PlanStep::HelmInstall {
            kubeconfig,
            release,
            chart,
            version,
            namespace,
            values_file,
            timeout_secs,
        } => {
            host.perform(&HostAction::Command {
                program: tool(bundle, root, "helm"),
                args: vec![
                    "upgrade".into(),
                    "--install".into(),
                    release.to_string(),
                    chart.to_string(),
                    "--version".into(),
                    version.to_string(),
                    "--namespace".into(),
                    namespace.to_string(),
                    "--create-namespace".into(),
                    "--values".into(),
                    in_root(root, values_file.as_str()).display().to_string(),
                    "--wait".into(),
                    "--timeout".into(),
                    format!("{timeout_secs}s"),
                ],
                kubeconfig: in_root(root, kubeconfig.as_str()),
                timeout: secs(timeout_secs),
            })?;
        }
        PlanStep::WaitRollout {
            kubeconfig,
            kind,
            name,
            namespace,
            timeout_secs,
        } => {
            let kind = match kind {
                exk8s_common::payload::RolloutKind::Deployment => "deployment",
                exk8s_common::payload::RolloutKind::DaemonSet => "daemonset",
            };
            host.perform(&HostAction::Command {
                program: tool(bundle, root, "kubectl"),
                args: vec![
                    "rollout".into(),
                    "status".into(),
                    format!("{kind}/{name}"),
                    "--namespace".into(),
                    namespace.to_string(),
                    format!("--timeout={timeout_secs}s"),
                ],
                kubeconfig: in_root(root, kubeconfig.as_str()),
                timeout: secs(timeout_secs),
            })?;
        }
    }
    Ok(())
}
