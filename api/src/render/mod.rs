//! Rendering: durable cluster facts + one node + its peers + freshly minted certificates →
//! the v2 bundle payload for exactly that node (files with paths and modes, artifacts, packages,
//! and the typed plan). A pure function: no I/O, no clock, no randomness.
//!
//! Templates live in `templates/`, are embedded at build time ([`engine`], which keeps each
//! rendering by the digest of its context: invisible to callers but for the time it saves) and
//! each has one typed context ([`contexts`]). Every path a template names comes from [`paths::PATHS`], the
//! same table the file list is built from.

pub mod catalog;
mod contexts;
mod engine;
mod files;
mod input;
pub mod paths;
pub mod plan;
mod worker;

pub use catalog::{ArtifactCatalog, CatalogError};
pub use input::{
    ClusterSpec, ControlPlaneNode, EncryptionKey, Issuance, Membership, NodeCredentials, PodCidr,
    RenderInput, Versions, etcd_for,
};
pub use plan::{DEFAULT_UPDATE_WAIT_SECS, downloads};
pub use worker::{WorkerInput, WorkerNode, render_worker_bundle};

use exk8s_common::payload::{BundlePayload, Freshness, Identity, Role};

/// Why a bundle could not be rendered. Each is a defect in the inputs or the templates, never a
/// reason to send a partial bundle.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("rendering template {template}")]
    Template {
        template: &'static str,
        #[source]
        source: minijinja::Error,
    },
    #[error("node vm {0} is not among the cluster's control-plane nodes")]
    NodeNotInPeers(u64),
    #[error("the cluster has {0} initial control-plane nodes; exactly one is required")]
    InitialNodes(usize),
    #[error("pod CIDR `{0}` is invalid: {1}")]
    BadPodCidr(String, &'static str),
    #[error("rendered value is not valid in a bundle: {0}")]
    InvalidValue(String),
    #[error("the operating system's random source failed")]
    Random,
    #[error("the pod CIDR has no block {index} for this node")]
    PodRangeExhausted { index: u32 },
    #[error("the node's credentials lack its {0}")]
    MissingCredentials(&'static str),
}

/// Renders the bundle payload for `input.node`.
pub fn render_bundle(input: &RenderInput<'_>) -> Result<BundlePayload, RenderError> {
    if !input.peers.iter().any(|p| p == input.node) {
        return Err(RenderError::NodeNotInPeers(input.node.vm_id));
    }
    let initial = input.peers.iter().filter(|p| p.is_initial).count();
    if initial != 1 {
        return Err(RenderError::InitialNodes(initial));
    }
    let cluster = input.cluster;
    let issuance = input.issuance;
    let rendered = files::render_files(input)?;
    Ok(BundlePayload {
        identity: Identity {
            bundle_id: issuance.bundle_id,
            cluster_id: cluster.cluster_id,
            cluster_name: cluster.name.clone(),
            org_id: cluster.org_id,
            vm_id: input.node.vm_id,
            node_name: input.node.addresses.name.clone(),
            role: Role::ControlPlane,
            is_initial_control_plane: input.node.is_initial,
            kind: issuance.kind,
            generation: issuance.generation,
        },
        freshness: Freshness {
            issued_at: issuance.issued_at,
            expires_at: issuance.expires_at,
            serial: issuance.serial,
            nonce: issuance.nonce.clone(),
        },
        artifacts: plan::artifacts(input)?,
        packages: plan::packages(),
        plan: plan::steps(input, &rendered.static_pods)?,
        files: rendered.files,
    })
}

/// The VM userdata: a cloud-config that writes `/etc/exk8s/agent.toml` and starts the agent.
/// It carries where the API and instance metadata are — nothing secret.
pub fn render_userdata(
    api_url: &str,
    imds_url: &str,
    insecure_http: bool,
) -> Result<String, RenderError> {
    for url in [api_url, imds_url] {
        exk8s_common::names::HttpUrl::new(url)
            .map_err(|e| RenderError::InvalidValue(e.to_string()))?;
    }
    let ctx = contexts::Userdata {
        api_url,
        imds_url,
        insecure_http,
    };
    render(&ctx)
}

/// A static pod's manifest with the digest of its inputs ([`engine::render_static_pod`]).
fn render_static_pod<T: engine::Template>(
    ctx: &T,
    inputs_sha256: &exk8s_common::names::Sha256Digest,
) -> Result<String, RenderError> {
    engine::render_static_pod(ctx, &inputs_sha256.to_hex()).map_err(|source| {
        RenderError::Template {
            template: T::NAME,
            source,
        }
    })
}

fn render<T: engine::Template>(ctx: &T) -> Result<String, RenderError> {
    engine::render(ctx).map_err(|source| RenderError::Template {
        template: T::NAME,
        source,
    })
}
