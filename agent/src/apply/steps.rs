//! Running the plan: each step in order, the phase it belongs to reported, with the health of
//! each component a wait proved (or found failing). A unit restarts
//! only when a file it watches changed; a static pod manifest is installed at its step (not
//! with the other files), and its wait runs only when it changed. While putting a failed
//! update back, manifests are not installed again (the restore wrote the previous ones) and
//! their waits are skipped.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_common::contract::BootPhase;
use exk8s_common::names::{BundlePath, HttpUrl};
use exk8s_common::payload::{BundlePayload, PlanStep};

use crate::error::{AgentError, chain};
use crate::log::log_info;
use crate::report::{Reporter, State as Phase};

use super::files::{self, Change, FileAction};
use super::host::{Host, HostAction};
use super::{Options, waits};

/// One run of a bundle's plan.
pub(super) struct Run<'a> {
    pub bundle: &'a BundlePayload,
    pub options: &'a Options,
    /// Files changed by this apply or owed by an interrupted one.
    pub changed: &'a BTreeSet<String>,
    /// The planned file actions, whose static pod manifests steps install; `None` while
    /// putting a failed update back.
    pub deferred: Option<&'a [FileAction<'a>]>,
}

fn in_root(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

/// The phase a plan step belongs to (for reports).
fn phase_of(step: &PlanStep) -> BootPhase {
    match step {
        PlanStep::DaemonReload {} | PlanStep::EnableStart { .. } => BootPhase::Services,
        PlanStep::WaitEtcdHealthy { .. }
        | PlanStep::EtcdJoin { .. }
        | PlanStep::EtcdPromote { .. }
        | PlanStep::EtcdRemove { .. } => BootPhase::Etcd,
        PlanStep::WaitApiserverReady { .. }
        | PlanStep::WaitComponentHealthy { .. }
        | PlanStep::WaitNodeRegistered { .. }
        | PlanStep::InstallStaticPod { .. }
        | PlanStep::WaitStaticPod { .. } => BootPhase::Apiserver,
        // Cluster-wide work done by this node's agent.
        PlanStep::KubectlApply { .. }
        | PlanStep::HelmInstall { .. }
        | PlanStep::WaitRollout { .. }
        | PlanStep::DrainNode { .. } => BootPhase::Addons,
    }
}

/// The plan's steps in order, reporting the phase each belongs to.
pub(super) fn run_plan(
    run: &Run<'_>,
    host: &mut dyn Host,
    reporter: &Reporter<'_>,
) -> Result<(), AgentError> {
    let mut current: Option<BootPhase> = None;
    for step in &run.bundle.plan {
        let name = phase_of(step);
        if current != Some(name) {
            if let Some(done) = current {
                reporter.report(done, Phase::Succeeded, "");
            }
            reporter.report(name, Phase::Started, "");
            current = Some(name);
        }
        let ran = run_step(step, run, host);
        // A static pod wait skipped (its manifest unchanged) proves nothing.
        let waited = match step {
            PlanStep::WaitStaticPod { manifest, .. } => {
                run.deferred.is_some() && run.changed.contains(manifest.as_str())
            }
            _ => true,
        };
        if let Some(component) = super::components::proven_by(step).filter(|_| waited) {
            let seen = ran.as_ref().map(|_| ()).map_err(|e| chain(e));
            reporter.saw(super::components::health(component, seen));
        }
        if let Err(e) = ran {
            reporter.report(name, Phase::Failed, &chain(&e));
            return Err(e);
        }
    }
    if let Some(done) = current {
        reporter.report(done, Phase::Succeeded, "");
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

fn membership(
    voters: &[HttpUrl],
    peer_url: &HttpUrl,
    ca_file: &BundlePath,
    cert_file: &BundlePath,
    key_file: &BundlePath,
    timeout_secs: u32,
) -> super::membership::Membership {
    super::membership::Membership {
        voters: voters.iter().map(ToString::to_string).collect(),
        peer_url: peer_url.to_string(),
        ca_file: ca_file.as_str().into(),
        cert_file: cert_file.as_str().into(),
        key_file: key_file.as_str().into(),
        timeout: Duration::from_secs(u64::from(timeout_secs)),
    }
}

fn run_step(step: &PlanStep, run: &Run<'_>, host: &mut dyn Host) -> Result<(), AgentError> {
    let (bundle, changed) = (run.bundle, run.changed);
    let root = &run.options.root;
    let secs = |s: &u32| Duration::from_secs(u64::from(*s));
    match step {
        PlanStep::InstallStaticPod { manifest } => {
            let Some(deferred) = run.deferred else {
                // Putting back: the restore already wrote the previous manifest.
                return Ok(());
            };
            let pending = deferred
                .iter()
                .filter(|a| a.file.path == *manifest && a.change != Change::Unchanged);
            for action in pending {
                // The pod it replaces stops first, so the replacement starts at once.
                let running = (action.change == Change::Update)
                    .then(|| super::retire::running_uid(&action.target))
                    .flatten();
                if let Some(uid) = running {
                    host.perform(&HostAction::RetireStaticPod {
                        manifest: manifest.as_str().into(),
                        uid,
                    })?;
                }
                log_info!("installing static pod manifest {manifest}");
                if !run.options.dry_run {
                    files::apply(root, std::slice::from_ref(action), run.options.strict_owner)?;
                }
            }
        }
        PlanStep::WaitStaticPod {
            kubeconfig,
            manifest,
            mirror_pod,
            inputs_sha256,
            timeout_secs,
        } => {
            if run.deferred.is_none() || !changed.contains(manifest.as_str()) {
                // Unchanged (or put back): the running pod is the right one.
                return Ok(());
            }
            host.perform(&HostAction::WaitStaticPod(waits::StaticPodProbe {
                kubeconfig: kubeconfig.as_str().into(),
                manifest: manifest.as_str().into(),
                mirror_pod: mirror_pod.to_string(),
                inputs_sha256: inputs_sha256.to_hex(),
                timeout: secs(timeout_secs),
            }))?;
        }
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
        PlanStep::WaitComponentHealthy {
            component,
            port,
            timeout_secs,
        } => {
            host.perform(&HostAction::WaitComponent(waits::ComponentProbe {
                component: component.to_string(),
                port: *port,
                timeout: secs(timeout_secs),
            }))?;
        }
        PlanStep::WaitNodeRegistered {
            kubeconfig,
            node,
            timeout_secs,
        } => {
            host.perform(&HostAction::WaitNodeRegistered(waits::NodeProbe {
                kubeconfig: kubeconfig.as_str().into(),
                node: node.to_string(),
                timeout: secs(timeout_secs),
            }))?;
        }
        PlanStep::EtcdJoin {
            voters,
            peer_url,
            ca_file,
            cert_file,
            key_file,
        } => {
            host.perform(&HostAction::EtcdJoin(membership(
                voters, peer_url, ca_file, cert_file, key_file, 0,
            )))?;
        }
        PlanStep::EtcdPromote {
            voters,
            peer_url,
            ca_file,
            cert_file,
            key_file,
            timeout_secs,
        } => {
            host.perform(&HostAction::EtcdPromote(membership(
                voters,
                peer_url,
                ca_file,
                cert_file,
                key_file,
                *timeout_secs,
            )))?;
        }
        PlanStep::EtcdRemove {
            voters,
            member_client_url,
            member_peer_url,
            ca_file,
            cert_file,
            key_file,
            timeout_secs,
        } => {
            host.perform(&HostAction::EtcdRemove(
                membership(
                    voters,
                    member_peer_url,
                    ca_file,
                    cert_file,
                    key_file,
                    *timeout_secs,
                ),
                member_client_url.to_string(),
            ))?;
        }
        PlanStep::DrainNode {
            kubeconfig,
            node,
            timeout_secs,
        } => {
            host.perform(&HostAction::DrainNode(super::drain::Drain {
                kubectl: tool(bundle, root, "kubectl"),
                kubeconfig: in_root(root, kubeconfig.as_str()),
                node,
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
