//! The `ExK8sControlPlane` controller: founds the exk8s cluster once its Cluster's
//! infrastructure is provisioned, reports it in Cluster API's control-plane contract
//! (`initialization.controlPlaneInitialized`, replicas, version, selector, `Available` and
//! exk8s's own conditions), keeps `<cluster>-kubeconfig` valid, turns `spec.replicas` and
//! `spec.version` into exk8s changes (one at a time; a refusal is the `SpecApplied` condition's
//! message), honours `paused`, and deletes the exk8s cluster before its finalizer goes.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api_types::{ClusterPatch, ClusterPhase, ClusterView, CreateClusterRequest};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use reqwest::StatusCode;
use serde_json::json;

use crate::conditions::{self, set};
use crate::crd::{
    ApiEndpoint, ExK8sControlPlane, ExK8sControlPlaneStatus, KeyAlgorithm, PodNetwork,
};
use crate::exk8s::{Deletion, Exk8s};
use crate::owner::{self, CLUSTER_NAME_LABEL, Owner};
use crate::{Context, ReconcileError, credentials, kubeconfig};

/// The finalizer that keeps an `ExK8sControlPlane` until its exk8s cluster is deleted.
pub const FINALIZER: &str = "controlplane.cluster.x-k8s.io/exk8s";
/// exk8s's apiservers listen there on the control plane's DNS name.
const APISERVER_PORT: i32 = 6443;
/// Looked at again this often while something changes (a CA rotation included: the
/// kubeconfig Secret is minted again at each of its steps), and this often once settled — a
/// rotation started meanwhile is seen within it, well before its first step ends (every
/// member applies a generation).
const BUSY: Duration = Duration::from_secs(5);
const SETTLED: Duration = Duration::from_secs(15);

/// One pass over `cp`.
pub async fn reconcile(
    cp: Arc<ExK8sControlPlane>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let namespace = cp.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let api: Api<ExK8sControlPlane> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(cluster) = owner::owner_cluster(cp.as_ref()) else {
        // Cluster API sets the reference once a Cluster's controlPlaneRef names this object.
        return Ok(Action::requeue(BUSY));
    };
    let owner = owner::get(&ctx.client, &namespace, &cluster).await?;
    let paused = conditions::paused_because(
        owner.as_ref().is_some_and(|o| o.paused),
        owner::annotated_paused(cp.as_ref()),
        "ExK8sControlPlane",
    );
    let mut status = cp.status.clone().unwrap_or_default();
    conditions::set_paused(
        &mut status.conditions,
        paused.as_deref(),
        cp.meta().generation,
    );
    if paused.is_some() {
        patch_status(&api, &cp, &status).await?;
        return Ok(Action::await_change());
    }
    finalizer(&api, FINALIZER, cp, |event| async {
        match event {
            Event::Apply(cp) => apply(&api, &cp, owner, status, &ctx).await,
            Event::Cleanup(cp) => cleanup(&api, &cp, status, &ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

async fn patch_status(
    api: &Api<ExK8sControlPlane>,
    cp: &ExK8sControlPlane,
    status: &ExK8sControlPlaneStatus,
) -> Result<(), kube::Error> {
    if cp.status.as_ref() == Some(status) {
        return Ok(());
    }
    api.patch_status(
        &cp.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map(drop)
}

/// Stops the pass with `Founded` False for `reason`, looked at again after `again`.
async fn not_founded(
    api: &Api<ExK8sControlPlane>,
    cp: &ExK8sControlPlane,
    mut status: ExK8sControlPlaneStatus,
    reason: &str,
    message: &str,
    again: Duration,
) -> Result<Action, ReconcileError> {
    set(
        &mut status.conditions,
        "Founded",
        "False",
        reason,
        message,
        cp.meta().generation,
    );
    if status.cluster_id.is_none() {
        set(
            &mut status.conditions,
            "Available",
            "False",
            reason,
            message,
            cp.meta().generation,
        );
    }
    patch_status(api, cp, &status).await?;
    Ok(Action::requeue(again))
}

async fn apply(
    api: &Api<ExK8sControlPlane>,
    cp: &ExK8sControlPlane,
    owner: Option<Owner>,
    mut status: ExK8sControlPlaneStatus,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let generation = cp.meta().generation;
    status.observed_generation = generation;
    let Some(owner) = owner else {
        let message = "its Cluster is not there (yet)";
        return not_founded(api, cp, status, "WaitingForCluster", message, BUSY).await;
    };
    if !owner.infrastructure_provisioned {
        let message = format!(
            "Cluster {}'s infrastructure is not provisioned yet",
            owner.name
        );
        return not_founded(api, cp, status, "WaitingForInfrastructure", &message, BUSY).await;
    }
    let namespace = cp.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let exk8s = match credentials::client(&ctx.client, &namespace, &cp.spec.credentials_ref).await {
        Ok(client) => client,
        Err(e) => {
            let message = e.to_string();
            return not_founded(api, cp, status, "CredentialsUnusable", &message, SETTLED).await;
        }
    };
    let id = match status.cluster_id {
        Some(id) => id,
        None => {
            let name = cp.spec.name.clone().unwrap_or_else(|| owner.name.clone());
            // A cluster of that name in the org is taken as this one's (founded with `exk8s`
            // before, or by a pass whose answer was lost); only a new one is founded.
            let found = match exk8s.find(&name).await {
                Ok(Some(existing)) => {
                    tracing::info!(
                        name,
                        id = existing.id,
                        "adopting the exk8s cluster of this name"
                    );
                    Ok(existing.id)
                }
                Ok(None) if !valid_name(&name) => {
                    let message = format!(
                        "the exk8s cluster would be named {name:?} (the Cluster's name): set \
                         spec.name to 1-40 of a-z, 0-9 and '-', starting with a letter, not \
                         ending with '-', not starting with 'exk8s-'"
                    );
                    return not_founded(api, cp, status, "InvalidName", &message, SETTLED).await;
                }
                Ok(None) => exk8s.found(&founding(cp, &name)).await,
                Err(e) => Err(e),
            };
            match found {
                Ok(id) => {
                    status.cluster_id = Some(id);
                    // Kept at once: a pass that ends early must not found it again.
                    patch_status(api, cp, &status).await?;
                    id
                }
                Err(e) => {
                    let message = e.to_string();
                    return not_founded(api, cp, status, "FoundingRefused", &message, SETTLED)
                        .await;
                }
            }
        }
    };
    let view = match exk8s.cluster(id).await {
        Ok(Some(view)) => view,
        Ok(None) => {
            let message = format!("exk8s cluster {id} no longer exists");
            return not_founded(api, cp, status, "ClusterGone", &message, SETTLED).await;
        }
        Err(e) => {
            let message = e.to_string();
            return not_founded(api, cp, status, "APIUnreachable", &message, BUSY).await;
        }
    };
    if cp.spec.control_plane_endpoint.is_none() {
        let endpoint = ApiEndpoint {
            host: view.control_plane_dns_name.clone(),
            port: APISERVER_PORT,
        };
        api.patch(
            &cp.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "controlPlaneEndpoint": endpoint } })),
        )
        .await?;
    }
    report(&mut status, &view, &owner.name, generation);
    if view.phase == ClusterPhase::Founded {
        // The cluster CA's rotation step: the admin kubeconfig is minted again at each.
        let rotation = view
            .ca_rotation
            .as_ref()
            .filter(|r| r.ca == "cluster")
            .map_or_else(|| "none".to_owned(), |r| format!("cluster/{}", r.phase));
        if let Err(e) =
            keep_kubeconfig(&exk8s, cp, &namespace, &owner.name, id, &rotation, ctx).await
        {
            set(
                &mut status.conditions,
                "KubeconfigAvailable",
                "False",
                "KubeconfigFailed",
                &e.to_string(),
                generation,
            );
        } else {
            set(
                &mut status.conditions,
                "KubeconfigAvailable",
                "True",
                "Available",
                "",
                generation,
            );
        }
        // The generation SpecApplied was last judged at: a newer spec is asked of exk8s again.
        let previous = cp
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "SpecApplied"));
        let new_spec = previous.and_then(|c| c.observed_generation) != generation;
        let (applied, reason, message) = match previous {
            // A refusal stands until the spec changes: asking again would be refused again.
            Some(c) if !new_spec && REFUSALS.contains(&c.reason.as_str()) => {
                (false, c.reason.clone(), c.message.clone())
            }
            _ => change(&exk8s, cp, &view, new_spec).await,
        };
        set(
            &mut status.conditions,
            "SpecApplied",
            &conditions::status(applied),
            &reason,
            &message,
            generation,
        );
    }
    let settled = view.initialized
        && view.ready
        && view.replicas == i64::from(cp.spec.replicas)
        && view.up_to_date_replicas == view.replicas
        && view.version == cp.spec.version
        && view.ca_rotation.is_none();
    patch_status(api, cp, &status).await?;
    Ok(Action::requeue(if settled { SETTLED } else { BUSY }))
}

/// `POST /clusters` for `cp`, named `name`.
fn founding(cp: &ExK8sControlPlane, name: &str) -> CreateClusterRequest {
    let spec = &cp.spec;
    CreateClusterRequest {
        name: Some(name.to_owned()),
        control_plane_count: Some(i64::from(spec.replicas)),
        control_plane_image_id: Some(spec.image_id),
        control_plane_instance_type: Some(spec.instance_type.clone()),
        zone_id: spec.zone_id,
        subnet_id: Some(spec.subnet_id),
        key_algorithm: spec.key_algorithm.map(|a| {
            match a {
                KeyAlgorithm::EcdsaP256 => "ecdsa-p256",
                KeyAlgorithm::EcdsaP384 => "ecdsa-p384",
                KeyAlgorithm::Rsa2048 => "rsa-2048",
                KeyAlgorithm::Rsa3072 => "rsa-3072",
                KeyAlgorithm::Rsa4096 => "rsa-4096",
            }
            .to_owned()
        }),
        kubernetes_version: Some(spec.version.clone()),
        leaf_lifetime_days: spec.leaf_lifetime_days,
        pod_network: spec.pod_network.map(|n| {
            match n {
                PodNetwork::Cilium => "cilium",
                PodNetwork::Flannel => "flannel",
                PodNetwork::None => "none",
            }
            .to_owned()
        }),
        ..CreateClusterRequest::default()
    }
}

/// An exk8s cluster name: 1–40 of a-z, 0-9 and '-', a letter first, no '-' last.
fn valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=40).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes[bytes.len() - 1] != b'-'
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && !name.starts_with("exk8s-")
}

/// The contract's status fields and conditions from exk8s's view of the cluster.
fn report(
    status: &mut ExK8sControlPlaneStatus,
    view: &ClusterView,
    cluster: &str,
    generation: Option<i64>,
) {
    let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    status.replicas = Some(count(view.replicas));
    status.ready_replicas = Some(count(view.ready_replicas));
    status.available_replicas = Some(count(view.ready_replicas));
    status.up_to_date_replicas = Some(count(view.up_to_date_replicas));
    status.version = (!view.version.is_empty()).then(|| view.version.clone());
    status.initialization.control_plane_initialized = Some(view.initialized);
    status.selector = Some(format!(
        "{CLUSTER_NAME_LABEL}={cluster},cluster.x-k8s.io/control-plane"
    ));
    set(
        &mut status.conditions,
        "Founded",
        "True",
        "Founded",
        &format!("exk8s cluster {}", view.id),
        generation,
    );
    for c in &view.conditions {
        set(
            &mut status.conditions,
            &c.type_,
            &c.status,
            &c.reason,
            &c.message,
            generation,
        );
    }
}

/// Renews `<cluster>-kubeconfig` when [`kubeconfig::stale`] says so (`rotation`: the cluster
/// CA's rotation step now, `none` outside one).
async fn keep_kubeconfig(
    exk8s: &Exk8s,
    cp: &ExK8sControlPlane,
    namespace: &str,
    cluster: &str,
    id: i64,
    rotation: &str,
    ctx: &Context,
) -> Result<(), ReconcileError> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let stored = secrets.get_opt(&kubeconfig::secret_name(cluster)).await?;
    let trust = exk8s.trust(id).await?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let Some(why) = kubeconfig::stale(stored.as_ref(), &trust, rotation, now) else {
        return Ok(());
    };
    tracing::info!(cluster, id, why, "writing the kubeconfig Secret");
    let text = exk8s.kubeconfig(id).await?;
    let owner = cp
        .controller_owner_ref(&())
        .ok_or(ReconcileError::NotNamespaced)?;
    let secret = kubeconfig::secret(cluster, namespace, owner, &text, rotation);
    secrets
        .patch(
            &kubeconfig::secret_name(cluster),
            &PatchParams::apply("exk8s-capi").force(),
            &Patch::Apply(&secret),
        )
        .await?;
    Ok(())
}

/// `SpecApplied`'s reasons for a change exk8s refused as asked (400, 422).
const REFUSALS: [&str; 2] = ["UpgradeRefused", "ScalingRefused"];

/// Asks exk8s for the change `cp`'s spec wants of `view`, one at a time: whether the spec is
/// applied, and the condition's reason and message. An upgrade under way is asked again when
/// the spec changed since (`new_spec`): how it goes on (`snapshotBeforeUpgrade`) may have. A
/// change exk8s cannot take now (409, 5xx, unreachable) is `ChangePending`, asked again.
async fn change(
    exk8s: &Exk8s,
    cp: &ExK8sControlPlane,
    view: &ClusterView,
    new_spec: bool,
) -> (bool, String, String) {
    let wanted = i64::from(cp.spec.replicas);
    let upgrading = view.version != cp.spec.version;
    let (patch, what, refused) =
        if cp.spec.version != view.kubernetes_version || (upgrading && new_spec) {
            let patch = ClusterPatch {
                kubernetes_version: Some(cp.spec.version.clone()),
                snapshot_first: cp.spec.snapshot_before_upgrade,
                ..ClusterPatch::default()
            };
            (
                patch,
                format!("upgrading to {}", cp.spec.version),
                "UpgradeRefused",
            )
        } else if wanted != view.control_plane_members.desired {
            let patch = ClusterPatch {
                control_plane_count: Some(wanted),
                ..ClusterPatch::default()
            };
            (patch, format!("scaling to {wanted}"), "ScalingRefused")
        } else if view.version != cp.spec.version || view.replicas != wanted {
            // exk8s says where the change stands (or why it stopped) in RollingOut and Scaling*.
            let progress: Vec<&str> = view
                .conditions
                .iter()
                .filter(|c| {
                    c.status == "True"
                        && ["RollingOut", "ScalingUp", "ScalingDown"].contains(&c.type_.as_str())
                })
                .map(|c| c.message.as_str())
                .collect();
            let message = match progress.as_slice() {
                [] => "exk8s is applying the spec".to_owned(),
                said => format!("exk8s is applying the spec: {}", said.join("; ")),
            };
            return (false, "InProgress".into(), message);
        } else {
            return (true, "Applied".into(), String::new());
        };
    match exk8s.change(view.id, &patch).await {
        Ok(()) => (false, "InProgress".into(), what),
        Err(e)
            if e.is_status(StatusCode::BAD_REQUEST)
                || e.is_status(StatusCode::UNPROCESSABLE_ENTITY) =>
        {
            (false, refused.into(), e.to_string())
        }
        Err(e) => (false, "ChangePending".into(), e.to_string()),
    }
}

/// Deletes the exk8s cluster; the finalizer goes once it is gone.
async fn cleanup(
    api: &Api<ExK8sControlPlane>,
    cp: &ExK8sControlPlane,
    mut status: ExK8sControlPlaneStatus,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let Some(id) = status.cluster_id else {
        return Ok(Action::await_change());
    };
    let namespace = cp.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let exk8s = credentials::client(&ctx.client, &namespace, &cp.spec.credentials_ref).await?;
    match exk8s.delete(id).await? {
        Deletion::Gone => {
            tracing::info!(id, "the exk8s cluster is deleted");
            Ok(Action::await_change())
        }
        Deletion::Pending => {
            let message = format!("exk8s is deleting cluster {id}");
            set(
                &mut status.conditions,
                "Deleting",
                "True",
                "Deleting",
                &message,
                cp.meta().generation,
            );
            patch_status(api, cp, &status).await?;
            Err(ReconcileError::DeletePending(id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exk8s_names_are_checked_as_the_api_checks_them() {
        for good in ["shop", "a", "shop-1", &"a".repeat(40)] {
            assert!(valid_name(good), "{good}");
        }
        for bad in [
            "",
            "Shop",
            "1shop",
            "shop-",
            "exk8s-x",
            &"a".repeat(41),
            "sh_op",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
