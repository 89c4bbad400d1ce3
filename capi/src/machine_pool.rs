//! The `ExK8sMachinePool` controller: a Cluster API `MachinePool`'s workers as an exk8s worker
//! pool of the cluster its Cluster's `ExK8sControlPlane` founded (through that object's
//! credentials). It makes the pool (or takes the one of its name), turns the MachinePool's
//! `spec.replicas` and `spec.template.spec.version` and its own labels, taints and surge into
//! pool changes, reports the contract's `spec.providerIDList`, `status.replicas` and
//! `initialization.provisioned`, honours `paused`, and deletes the pool before its finalizer
//! goes.

use std::sync::Arc;
use std::time::Duration;

use exk8s_api_types::{CreatePoolRequest, PoolView, TaintRequest, UpdatePoolRequest};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event, finalizer};
use kube::{Resource, ResourceExt};
use reqwest::StatusCode;
use serde_json::json;

use crate::conditions::{self, set};
use crate::crd::{ExK8sControlPlane, ExK8sMachinePool, ExK8sMachinePoolStatus, PoolInstance};
use crate::exk8s::{Deletion, Exk8s};
use crate::owner::{self, MachinePool, Owner};
use crate::{Context, ReconcileError, credentials};

/// The finalizer that keeps an `ExK8sMachinePool` until its exk8s pool is deleted.
pub const FINALIZER: &str = "infrastructure.cluster.x-k8s.io/exk8s-machinepool";
/// Looked at again this often while the pool changes, and this often once settled.
const BUSY: Duration = Duration::from_secs(5);
const SETTLED: Duration = Duration::from_secs(15);

/// One pass over `pool`.
pub async fn reconcile(
    pool: Arc<ExK8sMachinePool>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    let namespace = pool.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let api: Api<ExK8sMachinePool> = Api::namespaced(ctx.client.clone(), &namespace);
    let machine_pool = match owner::owner_machine_pool(pool.as_ref()) {
        Some(name) => owner::machine_pool(&ctx.client, &namespace, &name).await?,
        None => None,
    };
    let cluster = match &machine_pool {
        Some(mp) => owner::get(&ctx.client, &namespace, &mp.cluster).await?,
        None => None,
    };
    let paused = conditions::paused_because(
        cluster.as_ref().is_some_and(|c| c.paused),
        owner::annotated_paused(pool.as_ref()),
        "ExK8sMachinePool",
    );
    let mut status = pool.status.clone().unwrap_or_default();
    conditions::set_paused(
        &mut status.conditions,
        paused.as_deref(),
        pool.meta().generation,
    );
    if paused.is_some() {
        patch_status(&api, &pool, &status).await?;
        // The Cluster's `spec.paused` is not watched from here: looked at again.
        return Ok(Action::requeue(SETTLED));
    }
    finalizer(&api, FINALIZER, pool, |event| async {
        match event {
            Event::Apply(pool) => apply(&api, &pool, machine_pool, cluster, status, &ctx).await,
            Event::Cleanup(pool) => cleanup(&api, &pool, cluster, status, &ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::Finalizer(Box::new(e)))
}

async fn patch_status(
    api: &Api<ExK8sMachinePool>,
    pool: &ExK8sMachinePool,
    status: &ExK8sMachinePoolStatus,
) -> Result<(), kube::Error> {
    if pool.status.as_ref() == Some(status) {
        return Ok(());
    }
    api.patch_status(
        &pool.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .map(drop)
}

/// Why the pool cannot be worked on yet: `Ready` False with this reason and message.
struct Waiting {
    reason: &'static str,
    message: String,
}

/// The exk8s API and cluster the pool belongs to: its Cluster's `ExK8sControlPlane`'s.
async fn target(
    ctx: &Context,
    namespace: &str,
    cluster: Option<&Owner>,
) -> Result<(Exk8s, i64), Waiting> {
    let waiting = |reason, message: String| Waiting { reason, message };
    let cluster = cluster.ok_or_else(|| {
        waiting(
            "WaitingForCluster",
            "its MachinePool's Cluster is not there (yet)".into(),
        )
    })?;
    let name = cluster.control_plane.as_deref().ok_or_else(|| {
        waiting(
            "NoExK8sControlPlane",
            format!(
                "Cluster {}'s controlPlaneRef is not an ExK8sControlPlane: exk8s pools belong to \
                 clusters exk8s founded",
                cluster.name
            ),
        )
    })?;
    let api: Api<ExK8sControlPlane> = Api::namespaced(ctx.client.clone(), namespace);
    let control_plane = match api.get_opt(name).await {
        Ok(Some(cp)) => cp,
        Ok(None) => {
            let message = format!("ExK8sControlPlane {name} is not there (yet)");
            return Err(waiting("WaitingForControlPlane", message));
        }
        Err(e) => return Err(waiting("WaitingForControlPlane", e.to_string())),
    };
    let Some(id) = control_plane.status.as_ref().and_then(|s| s.cluster_id) else {
        let message = format!("ExK8sControlPlane {name} has not founded its exk8s cluster yet");
        return Err(waiting("WaitingForControlPlane", message));
    };
    let exk8s = credentials::client(&ctx.client, namespace, &control_plane.spec.credentials_ref)
        .await
        .map_err(|e| waiting("CredentialsUnusable", e.to_string()))?;
    Ok((exk8s, id))
}

/// Stops the pass with `Ready` False.
async fn not_ready(
    api: &Api<ExK8sMachinePool>,
    pool: &ExK8sMachinePool,
    mut status: ExK8sMachinePoolStatus,
    waiting: Waiting,
    again: Duration,
) -> Result<Action, ReconcileError> {
    set(
        &mut status.conditions,
        "Ready",
        "False",
        waiting.reason,
        &waiting.message,
        pool.meta().generation,
    );
    patch_status(api, pool, &status).await?;
    Ok(Action::requeue(again))
}

async fn apply(
    api: &Api<ExK8sMachinePool>,
    pool: &ExK8sMachinePool,
    machine_pool: Option<MachinePool>,
    cluster: Option<Owner>,
    mut status: ExK8sMachinePoolStatus,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let generation = pool.meta().generation;
    status.observed_generation = generation;
    let Some(machine_pool) = machine_pool else {
        let message = "no MachinePool refers to it yet (Cluster API sets its owner reference once \
                       one's infrastructureRef names it)";
        let waiting = Waiting {
            reason: "WaitingForMachinePool",
            message: message.into(),
        };
        return not_ready(api, pool, status, waiting, BUSY).await;
    };
    let namespace = pool.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let (exk8s, cluster_id) = match target(ctx, &namespace, cluster.as_ref()).await {
        Ok(found) => found,
        Err(waiting) => return not_ready(api, pool, status, waiting, BUSY).await,
    };
    let view = match status.pool_id {
        Some(id) => match exk8s.pool(cluster_id, id).await {
            Ok(Some(view)) => view,
            Ok(None) => {
                let message = format!("exk8s pool {id} of cluster {cluster_id} no longer exists");
                let waiting = Waiting {
                    reason: "PoolGone",
                    message,
                };
                return not_ready(api, pool, status, waiting, SETTLED).await;
            }
            Err(e) => {
                let waiting = Waiting {
                    reason: "APIUnreachable",
                    message: e.to_string(),
                };
                return not_ready(api, pool, status, waiting, BUSY).await;
            }
        },
        None => match made(&exk8s, cluster_id, pool, &machine_pool).await {
            Ok(view) => {
                status.pool_id = Some(view.id);
                // Kept at once: a pass that ends early must not look for it again.
                patch_status(api, pool, &status).await?;
                view
            }
            Err(e) => {
                let waiting = Waiting {
                    reason: "PoolRefused",
                    message: e.to_string(),
                };
                return not_ready(api, pool, status, waiting, SETTLED).await;
            }
        },
    };
    let (applied, reason, message) = change(&exk8s, pool, &machine_pool, &view).await;
    set(
        &mut status.conditions,
        "SpecApplied",
        &conditions::status(applied),
        &reason,
        &message,
        generation,
    );
    let provider_ids: Vec<String> = view.nodes.iter().map(|n| n.provider_id.clone()).collect();
    if pool.spec.provider_id_list != provider_ids {
        api.patch(
            &pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "providerIDList": provider_ids } })),
        )
        .await?;
    }
    let settled = report(&mut status, &view, machine_pool.replicas, generation);
    patch_status(api, pool, &status).await?;
    Ok(Action::requeue(if settled && applied {
        SETTLED
    } else {
        BUSY
    }))
}

/// The pool `pool` names in cluster `cluster_id`: taken when it exists (made before, or by a
/// pass whose answer was lost), made otherwise — once, whatever the retries (the object's UID
/// is the request's idempotency key).
async fn made(
    exk8s: &Exk8s,
    cluster_id: i64,
    pool: &ExK8sMachinePool,
    machine_pool: &MachinePool,
) -> Result<PoolView, crate::exk8s::Exk8sError> {
    let name = pool.spec.name.clone().unwrap_or_else(|| pool.name_any());
    if let Some(existing) = exk8s
        .pools(cluster_id)
        .await?
        .into_iter()
        .find(|p| p.name == name)
    {
        tracing::info!(name, id = existing.id, "taking the exk8s pool of this name");
        return Ok(existing);
    }
    let spec = &pool.spec;
    let request = CreatePoolRequest {
        name: Some(name),
        count: Some(machine_pool.replicas),
        instance_type: Some(spec.instance_type.clone()),
        image_id: Some(spec.image_id),
        subnet_id: Some(spec.subnet_id),
        labels: Some(spec.labels.clone()),
        taints: Some(taints(pool)),
        max_surge: spec.max_surge.map(i64::from),
    };
    let key = format!("exk8s-capi/{}", pool.uid().unwrap_or_default());
    exk8s.create_pool(cluster_id, &request, &key).await
}

fn taints(pool: &ExK8sMachinePool) -> Vec<TaintRequest> {
    pool.spec
        .taints
        .iter()
        .map(|t| TaintRequest {
            key: t.key.clone(),
            value: t.value.clone(),
            effect: t.effect.as_str().to_owned(),
        })
        .collect()
}

/// The pool change `view` needs to match the spec: `None` when it matches. The MachinePool's
/// version pins the pool at it (also when it is the control plane's: the workers stay through
/// the control plane's upgrade until the MachinePool's version changes); without one the pool
/// follows the control plane.
fn wanted(
    pool: &ExK8sMachinePool,
    machine_pool: &MachinePool,
    view: &PoolView,
) -> Option<(UpdatePoolRequest, Vec<String>)> {
    let mut change = UpdatePoolRequest::default();
    let mut what = Vec::new();
    if view.desired != machine_pool.replicas {
        change.count = Some(machine_pool.replicas);
        what.push(format!("scaling to {}", machine_pool.replicas));
    }
    if view.labels != pool.spec.labels {
        change.labels = Some(pool.spec.labels.clone());
        what.push("new labels".to_owned());
    }
    let taints = taints(pool);
    if view.taints != taints {
        change.taints = Some(taints);
        what.push("new taints".to_owned());
    }
    if let Some(surge) = pool.spec.max_surge.map(i64::from)
        && surge != view.max_surge
    {
        change.max_surge = Some(surge);
        what.push(format!("maxSurge {surge}"));
    }
    match &machine_pool.version {
        Some(version) if view.follow_control_plane || view.kubernetes_version != *version => {
            change.kubernetes_version = Some(version.clone());
            change.follow_control_plane = Some(false);
            what.push(format!("workers of {version}"));
        }
        None if !view.follow_control_plane => {
            change.follow_control_plane = Some(true);
            what.push("following the control plane".to_owned());
        }
        _ => {}
    }
    (!what.is_empty()).then_some((change, what))
}

/// Asks exk8s for the change the spec wants: whether the spec is applied, and `SpecApplied`'s
/// reason and message. A change exk8s refuses as asked (400, 422) is `Refused` with its words
/// (asked again on each pass: the MachinePool's replicas may change without this object's
/// generation); one it cannot take now (409, 5xx, unreachable) is `ChangePending`.
async fn change(
    exk8s: &Exk8s,
    pool: &ExK8sMachinePool,
    machine_pool: &MachinePool,
    view: &PoolView,
) -> (bool, String, String) {
    let Some((change, what)) = wanted(pool, machine_pool, view) else {
        return if view.replicas == view.desired && view.up_to_date_replicas == view.replicas {
            (true, "Applied".into(), String::new())
        } else {
            let message = match &view.error_message {
                Some(error) => format!("exk8s is applying the spec: {error}"),
                None => "exk8s is applying the spec".to_owned(),
            };
            (false, "InProgress".into(), message)
        };
    };
    match exk8s.update_pool(view.cluster_id, view.id, &change).await {
        Ok(()) => (false, "InProgress".into(), what.join(", ")),
        Err(e)
            if e.is_status(StatusCode::BAD_REQUEST)
                || e.is_status(StatusCode::UNPROCESSABLE_ENTITY) =>
        {
            (false, "Refused".into(), e.to_string())
        }
        Err(e) => (false, "ChangePending".into(), e.to_string()),
    }
}

/// The contract's status from exk8s's view of the pool; whether it has settled at `wanted`.
fn report(
    status: &mut ExK8sMachinePoolStatus,
    view: &PoolView,
    wanted: i64,
    generation: Option<i64>,
) -> bool {
    let count = |n: i64| i32::try_from(n).unwrap_or(i32::MAX);
    status.initialization.provisioned = Some(true);
    status.ready = Some(true);
    status.replicas = count(view.replicas);
    status.ready_replicas = Some(count(view.ready_replicas));
    status.up_to_date_replicas = Some(count(view.up_to_date_replicas));
    status.version = (!view.kubernetes_version.is_empty()).then(|| view.kubernetes_version.clone());
    status.instances = view
        .nodes
        .iter()
        .map(|n| PoolInstance {
            instance_name: n.name.clone(),
            provider_id: n.provider_id.clone(),
            version: n.kubernetes_version.clone(),
            ready: n.ready,
        })
        .collect();
    let (ready, reason, message) = if view.deleting {
        (
            false,
            "Deleting",
            format!("exk8s is deleting pool {}", view.id),
        )
    } else if let Some(error) = &view.error_message {
        (false, "PoolFailing", error.clone())
    } else if view.replicas < wanted {
        let message = format!("{} of {wanted} workers made", view.replicas);
        (false, "ScalingUp", message)
    } else if view.replicas > wanted {
        let message = format!("{} workers, {wanted} wanted", view.replicas);
        (false, "ScalingDown", message)
    } else if view.ready_replicas < view.replicas {
        let message = format!("{} of {} workers ready", view.ready_replicas, view.replicas);
        (false, "WaitingForWorkers", message)
    } else if view.up_to_date_replicas < view.replicas {
        let message = format!(
            "{} of {} workers up to date",
            view.up_to_date_replicas, view.replicas
        );
        (false, "RollingOut", message)
    } else {
        (true, "Ready", format!("exk8s pool {}", view.id))
    };
    set(
        &mut status.conditions,
        "Ready",
        &conditions::status(ready),
        reason,
        &message,
        generation,
    );
    ready
}

/// Deletes the exk8s pool; the finalizer goes once it is gone (or its cluster is).
async fn cleanup(
    api: &Api<ExK8sMachinePool>,
    pool: &ExK8sMachinePool,
    cluster: Option<Owner>,
    mut status: ExK8sMachinePoolStatus,
    ctx: &Context,
) -> Result<Action, ReconcileError> {
    let Some(id) = status.pool_id else {
        return Ok(Action::await_change());
    };
    let namespace = pool.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let (exk8s, cluster_id) = match target(ctx, &namespace, cluster.as_ref()).await {
        Ok(found) => found,
        Err(waiting) => {
            // No control plane (or Cluster) left: deleting the exk8s cluster takes its pools.
            tracing::info!(
                id,
                reason = waiting.reason,
                "{}: the pool goes with its cluster",
                waiting.message
            );
            return Ok(Action::await_change());
        }
    };
    match exk8s.delete_pool(cluster_id, id).await? {
        Deletion::Gone => {
            tracing::info!(cluster_id, id, "the exk8s pool is deleted");
            Ok(Action::await_change())
        }
        Deletion::Pending => {
            let message = format!("exk8s is deleting pool {id} of cluster {cluster_id}");
            set(
                &mut status.conditions,
                "Ready",
                "False",
                "Deleting",
                &message,
                pool.meta().generation,
            );
            patch_status(api, pool, &status).await?;
            Err(ReconcileError::PoolDeletePending(id))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::ExK8sMachinePoolSpec;

    fn pool() -> ExK8sMachinePool {
        ExK8sMachinePool::new(
            "workers",
            ExK8sMachinePoolSpec {
                name: None,
                instance_type: "e2.medium".into(),
                image_id: 1,
                subnet_id: 1,
                labels: Default::default(),
                taints: Vec::new(),
                max_surge: None,
                provider_id_list: Vec::new(),
            },
        )
    }

    fn view(version: &str, follows: bool) -> PoolView {
        serde_json::from_value(json!({
            "id": 7, "cluster_id": 3, "name": "workers", "instance_type": "e2.medium",
            "image_id": 1, "subnet_id": 1, "labels": {}, "taints": [], "desired": 2,
            "replicas": 2, "ready_replicas": 2, "up_to_date_replicas": 2,
            "kubernetes_version": version, "follow_control_plane": follows, "max_surge": 1,
            "deleting": false, "nodes": []
        }))
        .unwrap()
    }

    fn machine_pool(version: Option<&str>) -> MachinePool {
        MachinePool {
            name: "workers".into(),
            cluster: "shop".into(),
            replicas: 2,
            version: version.map(str::to_owned),
        }
    }

    #[test]
    fn a_pool_as_asked_needs_no_change() {
        let unset = machine_pool(None);
        assert!(wanted(&pool(), &unset, &view("v1.35.3", true)).is_none());
        let pinned = machine_pool(Some("v1.35.3"));
        assert!(wanted(&pool(), &pinned, &view("v1.35.3", false)).is_none());
    }

    #[test]
    fn the_machine_pools_version_pins_the_pool_even_at_the_control_planes() {
        let asked = machine_pool(Some("v1.35.3"));
        let (change, what) = wanted(&pool(), &asked, &view("v1.35.3", true)).unwrap();
        assert_eq!(change.kubernetes_version.as_deref(), Some("v1.35.3"));
        assert_eq!(change.follow_control_plane, Some(false));
        assert_eq!(what, ["workers of v1.35.3"]);
        let moved = machine_pool(Some("v1.36.3"));
        let (change, _) = wanted(&pool(), &moved, &view("v1.35.3", false)).unwrap();
        assert_eq!(change.kubernetes_version.as_deref(), Some("v1.36.3"));
        // Without a version, a pinned pool follows the control plane again.
        let (change, _) = wanted(&pool(), &machine_pool(None), &view("v1.35.3", false)).unwrap();
        assert_eq!(
            (change.kubernetes_version, change.follow_control_plane),
            (None, Some(true))
        );
    }

    #[test]
    fn replicas_labels_and_taints_are_asked_together() {
        let mut pool = pool();
        pool.spec.labels.insert("tier".into(), "web".into());
        let mut mp = machine_pool(None);
        mp.replicas = 3;
        let (change, what) = wanted(&pool, &mp, &view("v1.35.3", true)).unwrap();
        assert_eq!(change.count, Some(3));
        assert_eq!(change.labels.unwrap()["tier"], "web");
        assert_eq!(change.taints, None);
        assert_eq!(what, ["scaling to 3", "new labels"]);
    }
}
