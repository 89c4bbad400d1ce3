//! exk8s as a Cluster API provider: the controllers of `ExK8sCluster` (infrastructure),
//! `ExK8sControlPlane` (control plane) and `ExK8sMachinePool` (a MachinePool's workers) against
//! a management cluster. They call the exk8s API named by the credentials Secret and never a
//! workload cluster.

pub mod conditions;
pub mod control_plane;
pub mod crd;
pub mod credentials;
pub mod exk8s;
pub mod infrastructure;
pub mod kubeconfig;
pub mod machine_pool;
pub mod owner;
pub mod rbac;

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use crate::crd::{ExK8sCluster, ExK8sControlPlane, ExK8sMachinePool};

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
}

/// Why a pass failed: it is tried again.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("the object is not namespaced")]
    NotNamespaced,
    #[error("the management cluster: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Exk8s(#[from] exk8s::Exk8sError),
    #[error(transparent)]
    Credentials(#[from] credentials::CredentialsError),
    #[error("exk8s is still deleting cluster {0}")]
    DeletePending(i64),
    #[error("exk8s is still deleting pool {0}")]
    PoolDeletePending(i64),
    #[error("finalizer: {0}")]
    Finalizer(Box<kube::runtime::finalizer::Error<ReconcileError>>),
}

/// How soon a failed reconcile is tried again when the API did not say.
const RETRY: Duration = Duration::from_secs(5);

fn error_policy<K>(_: Arc<K>, error: &ReconcileError, _: Arc<Context>) -> Action {
    match error {
        ReconcileError::DeletePending(_) | ReconcileError::PoolDeletePending(_) => {
            tracing::info!("{error}");
        }
        _ => tracing::warn!("{error}"),
    }
    Action::requeue(retry_in(error))
}

/// When to try a reconcile that failed with `error` again: after the wait a busy exk8s API
/// asked for (`Retry-After`), and never sooner than [`RETRY`].
fn retry_in(error: &ReconcileError) -> Duration {
    use kube::runtime::finalizer::Error as Finalizer;
    match error {
        ReconcileError::Exk8s(e) => e.retry_after().map_or(RETRY, |asked| asked.max(RETRY)),
        ReconcileError::Finalizer(e) => match e.as_ref() {
            Finalizer::ApplyFailed(inner) | Finalizer::CleanupFailed(inner) => retry_in(inner),
            _ => RETRY,
        },
        _ => RETRY,
    }
}

/// The object `reference` names (a Cluster's `controlPlaneRef` or `infrastructureRef`, a
/// MachinePool's `infrastructureRef`) in `owner`'s namespace, when it is of `kind`.
fn referred<K>(
    owner: &DynamicObject,
    reference: &serde_json::Value,
    kind: &str,
) -> Option<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    (reference["kind"].as_str() == Some(kind)).then(|| {
        let name = reference["name"].as_str().unwrap_or_default();
        let namespace = owner.namespace().unwrap_or_default();
        ObjectRef::new(name).within(&namespace)
    })
}

/// Runs both controllers against the management cluster `KUBECONFIG` (or the pod's service
/// account) names, until SIGTERM or Ctrl-C.
pub async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let client = Client::try_default().await?;
    let ctx = Arc::new(Context {
        client: client.clone(),
    });
    let cluster = owner::cluster_resource();
    let clusters = || Api::<DynamicObject>::all_with(client.clone(), &cluster);
    let control_planes = Controller::new(
        Api::<ExK8sControlPlane>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<Secret>::all(client.clone()),
        watcher::Config::default().labels(owner::CLUSTER_NAME_LABEL),
    )
    .watches_with(
        clusters(),
        cluster.clone(),
        watcher::Config::default(),
        |c| {
            referred::<ExK8sControlPlane>(
                &c,
                &c.data["spec"]["controlPlaneRef"],
                "ExK8sControlPlane",
            )
        },
    )
    .shutdown_on_signal()
    .run(control_plane::reconcile, error_policy, ctx.clone())
    .for_each(|_| async {});
    let infrastructure = Controller::new(
        Api::<ExK8sCluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_with(
        clusters(),
        cluster.clone(),
        watcher::Config::default(),
        |c| referred::<ExK8sCluster>(&c, &c.data["spec"]["infrastructureRef"], "ExK8sCluster"),
    )
    .shutdown_on_signal()
    .run(infrastructure::reconcile, error_policy, ctx.clone())
    .for_each(|_| async {});
    let machine_pool = owner::machine_pool_resource();
    let machine_pools = Controller::new(
        Api::<ExK8sMachinePool>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches_with(
        Api::<DynamicObject>::all_with(client.clone(), &machine_pool),
        machine_pool.clone(),
        watcher::Config::default(),
        |mp| {
            let reference = &mp.data["spec"]["template"]["spec"]["infrastructureRef"];
            referred::<ExK8sMachinePool>(&mp, reference, "ExK8sMachinePool")
        },
    )
    .shutdown_on_signal()
    .run(machine_pool::reconcile, error_policy, ctx)
    .for_each(|_| async {});
    tracing::info!("exk8s-capi: reconciling ExK8sCluster, ExK8sControlPlane and ExK8sMachinePool");
    futures_util::future::join3(control_planes, infrastructure, machine_pools).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy(retry_after: Option<u64>) -> ReconcileError {
        ReconcileError::Exk8s(exk8s::Exk8sError::Refused {
            status: 503,
            code: "unavailable".into(),
            message: "busy".into(),
            retry_after: retry_after.map(Duration::from_secs),
        })
    }

    #[test]
    fn a_busy_api_is_asked_again_when_it_said() {
        assert_eq!(retry_in(&busy(Some(10))), Duration::from_secs(10));
        assert_eq!(retry_in(&busy(Some(1))), RETRY, "never sooner than RETRY");
        assert_eq!(retry_in(&busy(None)), RETRY);
        let in_cleanup = ReconcileError::Finalizer(Box::new(
            kube::runtime::finalizer::Error::CleanupFailed(busy(Some(30))),
        ));
        assert_eq!(retry_in(&in_cleanup), Duration::from_secs(30));
        assert_eq!(retry_in(&ReconcileError::DeletePending(1)), RETRY);
    }
}
