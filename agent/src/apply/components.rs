//! The node's components and their health: which plan step proves which component healthy
//! (reported as the plan runs), and the one-shot probes a `sync` makes of each between
//! updates — the same waits the applied plans made, kept in the state file.

use std::time::Duration;

use exk8s_common::contract::{Component, ComponentHealth, MAX_REPORT_MESSAGE_CHARS};
use exk8s_common::payload::{BundlePayload, PlanStep};

use super::host::HostAction;
use super::waits;

pub use crate::state::Check;

/// The host action that probes `check` once, within `timeout`.
pub fn action(check: &Check, timeout: Duration) -> HostAction<'static> {
    match check {
        Check::Readyz { kubeconfig } => HostAction::WaitApiserver(waits::ApiserverProbe {
            kubeconfig: kubeconfig.into(),
            timeout,
        }),
        Check::Healthz { component, port } => HostAction::WaitComponent(waits::ComponentProbe {
            component: component.to_string(),
            port: *port,
            timeout,
        }),
        Check::NodeRegistered { kubeconfig, node } => {
            HostAction::WaitNodeRegistered(waits::NodeProbe {
                kubeconfig: kubeconfig.into(),
                node: node.clone(),
                timeout,
            })
        }
    }
}

/// The component a plan step proves healthy when it succeeds (or unhealthy when it fails).
pub fn proven_by(step: &PlanStep) -> Option<Component> {
    match step {
        PlanStep::WaitEtcdHealthy { .. } | PlanStep::EtcdPromote { .. } => Some(Component::Etcd),
        PlanStep::WaitApiserverReady { .. } => Some(Component::Apiserver),
        PlanStep::WaitComponentHealthy { component, .. } => component.as_str().parse().ok(),
        PlanStep::WaitNodeRegistered { .. } => Some(Component::Kubelet),
        PlanStep::WaitStaticPod { mirror_pod, .. } => [
            Component::Apiserver,
            Component::ControllerManager,
            Component::Scheduler,
        ]
        .into_iter()
        .find(|c| mirror_pod.as_str().starts_with(&format!("{c}-"))),
        _ => None,
    }
}

/// What a probe saw, its message cut to what a report carries.
pub fn health(component: Component, result: Result<(), String>) -> ComponentHealth {
    ComponentHealth {
        component,
        healthy: result.is_ok(),
        message: result
            .err()
            .unwrap_or_default()
            .chars()
            .take(MAX_REPORT_MESSAGE_CHARS)
            .collect(),
    }
}

/// The checks a bundle's plan makes possible, over `previous` (an update's plan waits for
/// fewer components than a first boot's: those it does not name keep their earlier check).
pub fn checks(bundle: &BundlePayload, previous: &[Check]) -> Vec<Check> {
    let mut checks: Vec<Check> = bundle
        .plan
        .iter()
        .filter_map(|step| match step {
            PlanStep::WaitApiserverReady { kubeconfig, .. } => Some(Check::Readyz {
                kubeconfig: kubeconfig.as_str().to_owned(),
            }),
            PlanStep::WaitComponentHealthy {
                component, port, ..
            } => component
                .as_str()
                .parse()
                .ok()
                .map(|component| Check::Healthz {
                    component,
                    port: *port,
                }),
            PlanStep::WaitNodeRegistered {
                kubeconfig, node, ..
            } => Some(Check::NodeRegistered {
                kubeconfig: kubeconfig.as_str().to_owned(),
                node: node.to_string(),
            }),
            _ => None,
        })
        .collect();
    for kept in previous {
        if !checks.iter().any(|c| c.component() == kept.component()) {
            checks.push(kept.clone());
        }
    }
    checks.sort_by_key(Check::component);
    checks.dedup_by_key(|c| c.component());
    checks
}

/// Probes each of `checks` once through `perform` (the host an apply would use).
pub fn probe(
    checks: &[Check],
    timeout: Duration,
    mut perform: impl FnMut(&HostAction<'_>) -> Result<(), crate::error::AgentError>,
) -> Vec<ComponentHealth> {
    checks
        .iter()
        .map(|check| {
            let result = perform(&action(check, timeout)).map_err(|e| crate::error::chain(&e));
            health(check.component(), result)
        })
        .collect()
}
