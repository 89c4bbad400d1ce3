//! The `ExK8sCluster` controller: the infrastructure of a Cluster founded by exk8s is an exk8s
//! API that answers its org's token. Provisioned (Cluster API's
//! `status.initialization.provisioned`, condition `Ready`) once it does; it stays provisioned.
//! The control plane's endpoint comes from the `ExK8sControlPlane` (exk8s names it at founding).

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::conditions::{self, set};
use crate::crd::ExK8sCluster;
use crate::{Context, ReconcileError, credentials, owner};

/// How often the credentials are tried again.
const AGAIN: Duration = Duration::from_secs(30);

/// One pass over `infra`.
pub async fn reconcile(
    infra: Arc<ExK8sCluster>,
    ctx: Arc<Context>,
) -> Result<Action, ReconcileError> {
    if infra.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = infra.namespace().ok_or(ReconcileError::NotNamespaced)?;
    let api: Api<ExK8sCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(cluster) = owner::owner_cluster(infra.as_ref()) else {
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let owner = owner::get(&ctx.client, &namespace, &cluster).await?;
    let generation = infra.meta().generation;
    let mut status = infra.status.clone().unwrap_or_default();
    status.observed_generation = generation;
    let paused = conditions::paused_because(
        owner.as_ref().is_some_and(|o| o.paused),
        owner::annotated_paused(infra.as_ref()),
        "ExK8sCluster",
    );
    conditions::set_paused(&mut status.conditions, paused.as_deref(), generation);
    let action = if paused.is_some() {
        Action::await_change()
    } else {
        let checked =
            match credentials::client(&ctx.client, &namespace, &infra.spec.credentials_ref).await {
                Ok(exk8s) => exk8s.versions().await.map(drop).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
        match checked {
            Ok(()) => {
                status.initialization.provisioned = Some(true);
                set(
                    &mut status.conditions,
                    "Ready",
                    "True",
                    "Provisioned",
                    "",
                    generation,
                );
            }
            Err(message) => {
                // Once provisioned it stays so (the contract): the problem is the condition's.
                set(
                    &mut status.conditions,
                    "Ready",
                    "False",
                    "CredentialsUnusable",
                    &message,
                    generation,
                );
            }
        }
        Action::requeue(AGAIN)
    };
    if infra.status.as_ref() != Some(&status) {
        api.patch_status(
            &infra.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    }
    Ok(action)
}
