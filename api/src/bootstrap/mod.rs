//! The bootstrap endpoint's logic (SECURITY.md 1–8): who is asking — a VM's IMDS session token
//! AND a bootstrap-scope principal token of the same org, for its own VM id — and issuing that
//! VM's bundle: certificates minted fresh, rendered, signed, with the serial taken and the audit
//! row written in one transaction.
//!
//! Refusals fall into classes with one status and one body each: 401 for missing, malformed,
//! unknown, expired or revoked credentials; 403 for a token of the wrong scope; 404 for anything
//! that would reveal another VM or org. The caller never learns which check failed; the audit
//! row and the log say.

use std::net::Ipv4Addr;

use axum::http::HeaderMap;
use exk8s_common::names::Nonce;
use time::OffsetDateTime;

use crate::app::AppState;
use crate::db::{self, DbError, clusters::ClusterRow, issuances::Audit, nodes::NodeRow};
use crate::founding::trust;
use crate::http::error::ApiError;
use crate::pki::{BundleCerts, ClusterNetwork, NodeAddresses, NodeServingCerts, ServiceCidr};
use crate::render::{
    self, ClusterSpec, ControlPlaneNode, Issuance, NodeCredentials, PodCidr, RenderInput, Versions,
};
use crate::tokens::{self, Scope};

pub use exk8s_common::contract::{IMDS_TOKEN_HEADER as IMDS_HEADER, NONCE_HEADER};

/// A caller that passed every check.
#[derive(Debug, Clone)]
pub struct Vm {
    pub node: NodeRow,
    pub cluster: ClusterRow,
}

/// Why a caller was refused: the class decides the answer, the reason goes to the audit.
#[derive(Debug)]
pub struct Refusal {
    pub class: ApiError,
    pub reason: &'static str,
}

fn unauthorized(reason: &'static str) -> Refusal {
    Refusal {
        class: ApiError::Unauthorized,
        reason,
    }
}

fn hidden(reason: &'static str) -> Refusal {
    Refusal {
        class: ApiError::NotFound,
        reason,
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let value = headers.get(name)?.to_str().ok()?.trim();
    (!value.is_empty() && value.len() <= 256).then_some(value)
}

/// Checks both credentials and the VM's membership, in the order that never reveals more than
/// the caller may know.
pub async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    path_vm: i64,
) -> Result<Result<Vm, Refusal>, DbError> {
    let Some(imds) = header(headers, IMDS_HEADER) else {
        return Ok(Err(unauthorized("IMDS token missing or malformed")));
    };
    let bearer = header(headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(bearer) = bearer.filter(|b| !b.is_empty()) else {
        return Ok(Err(unauthorized("bearer token missing or malformed")));
    };
    let now = db::now();
    let Some(session) = db::tokens::find_imds_token(&state.db.pool, &tokens::hash(imds)).await?
    else {
        return Ok(Err(unauthorized("IMDS token unknown")));
    };
    if session.expires_at <= now {
        return Ok(Err(unauthorized("IMDS token expired")));
    }
    let Some(principal) = db::tokens::find_api_token(&state.db.pool, &tokens::hash(bearer)).await?
    else {
        return Ok(Err(unauthorized("bearer token unknown")));
    };
    if principal.revoked {
        return Ok(Err(unauthorized("bearer token revoked")));
    }
    if principal.expires_at <= now {
        return Ok(Err(unauthorized("bearer token expired")));
    }
    if principal.scope != Scope::Bootstrap {
        return Ok(Err(Refusal {
            class: ApiError::Forbidden("this token's scope does not allow bootstrap calls"),
            reason: "bearer token is not bootstrap scope",
        }));
    }
    if principal.org_id != session.org_id {
        return Ok(Err(hidden(
            "bearer and IMDS tokens belong to different orgs",
        )));
    }
    if session.vm_id != path_vm {
        return Ok(Err(hidden("the path names another VM than the IMDS token")));
    }
    let Some(node) = db::nodes::find_by_vm(&state.db.pool, path_vm).await? else {
        return Ok(Err(hidden("the VM is no control-plane node")));
    };
    let Some(cluster) = db::clusters::get(&state.db.pool, session.org_id, node.cluster_id).await?
    else {
        return Ok(Err(hidden("the VM's cluster belongs to another org")));
    };
    if cluster.phase == "provisioning" {
        // The VM booted before founding finished: retryable, and it is the VM's own cluster.
        return Ok(Err(Refusal {
            class: ApiError::Unavailable {
                retry_after_secs: 5,
            },
            reason: "the VM's cluster is still being founded",
        }));
    }
    if cluster.phase != "founded" {
        return Ok(Err(hidden("the VM's cluster is not founded")));
    }
    Ok(Ok(Vm { node, cluster }))
}

/// Writes a refusal's audit row and turns it into its answer.
pub async fn refuse(state: &AppState, path_vm: i64, refusal: Refusal, source: &str) -> ApiError {
    tracing::info!(
        vm_id = path_vm,
        reason = refusal.reason,
        source,
        "bootstrap request refused"
    );
    let audit = Audit {
        vm_id: path_vm,
        outcome: "refused",
        reason: Some(refusal.reason),
        source_address: Some(source),
        ..Audit::default()
    };
    if let Err(e) = db::issuances::insert(&state.db.pool, &audit, db::now()).await {
        return ApiError::from(e);
    }
    refusal.class
}

fn addresses(node: &NodeRow) -> Result<NodeAddresses, ApiError> {
    let bad =
        || ApiError::Internal(format!("node {} has unusable stored addresses", node.vm_id).into());
    Ok(NodeAddresses {
        name: node.node_name.parse().map_err(|_| bad())?,
        private_ipv4: node.private_ipv4.parse::<Ipv4Addr>().map_err(|_| bad())?,
        private_ipv6: node
            .private_ipv6
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|_| bad())?,
        public_ipv4: node
            .public_ipv4
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(|_| bad())?,
    })
}

fn control_plane_node(node: &NodeRow) -> Result<ControlPlaneNode, ApiError> {
    Ok(ControlPlaneNode {
        vm_id: u64::try_from(node.vm_id).map_err(ApiError::internal)?,
        addresses: addresses(node)?,
        is_initial: node.is_initial,
    })
}

/// Renders and signs `vm`'s bundle; returns the envelope bytes.
pub async fn issue(
    state: &AppState,
    vm: &Vm,
    nonce: &str,
    source: &str,
) -> Result<Vec<u8>, ApiError> {
    let nonce = Nonce::new(nonce).map_err(|e| ApiError::invalid("X-Exk8s-Nonce", e.to_string()))?;
    let (cluster, node) = (&vm.cluster, &vm.node);
    if !node.issuance_allowed {
        let audit = Audit {
            vm_id: node.vm_id,
            cluster_id: Some(cluster.id),
            outcome: "refused",
            reason: Some("node is complete"),
            source_address: Some(source),
            ..Audit::default()
        };
        db::issuances::insert(&state.db.pool, &audit, db::now()).await?;
        return Err(ApiError::Gone(
            "this node finished bootstrapping; an operator must re-arm it for another bundle"
                .into(),
        ));
    }
    let peers_rows = db::nodes::list(&state.db.pool, cluster.id).await?;
    let serving_row = db::nodes::serving(&state.db.pool, node.id)
        .await?
        .ok_or_else(|| ApiError::Internal("node has no serving certificates".into()))?;
    let pki = trust::open(&state.keks, cluster).map_err(ApiError::internal)?;
    let encryption_key =
        trust::open_encryption_key(&state.keks, cluster).map_err(ApiError::internal)?;
    let open = |column: &str, cert: &str, sealed: &str| {
        trust::open_node_cert(&state.keks, cluster.id, node.vm_id, column, cert, sealed)
            .map_err(ApiError::internal)
    };
    let serving = NodeServingCerts {
        apiserver: open(
            "apiserver_key",
            &serving_row.apiserver_cert,
            &serving_row.apiserver_key_sealed,
        )?,
        etcd_server: open(
            "etcd_server_key",
            &serving_row.etcd_server_cert,
            &serving_row.etcd_server_key_sealed,
        )?,
        etcd_peer: open(
            "etcd_peer_key",
            &serving_row.etcd_peer_cert,
            &serving_row.etcd_peer_key_sealed,
        )?,
    };
    let this = control_plane_node(node)?;
    let peers = peers_rows
        .iter()
        .map(control_plane_node)
        .collect::<Result<Vec<_>, _>>()?;
    let network = ClusterNetwork::new(
        ServiceCidr::parse(&cluster.service_cidr).map_err(ApiError::internal)?,
        &cluster.cluster_domain,
        &cluster.control_plane_dns_name,
    )
    .map_err(ApiError::internal)?;
    let spec = ClusterSpec {
        cluster_id: u64::try_from(cluster.id).map_err(ApiError::internal)?,
        org_id: u64::try_from(cluster.org_id).map_err(ApiError::internal)?,
        name: cluster.name.parse().map_err(ApiError::internal)?,
        network,
        pod_cidr: PodCidr::parse(&cluster.pod_cidr).map_err(ApiError::internal)?,
        versions: Versions {
            kubernetes: cluster
                .kubernetes_version
                .parse()
                .map_err(ApiError::internal)?,
            ..Versions::default()
        },
        encryption_key,
    };
    let minting_pki = pki.clone();
    let minting_addresses = this.addresses.clone();
    let minted = state
        .cpu
        .run(move || BundleCerts::mint(&minting_pki, &minting_addresses, OffsetDateTime::now_utc()))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;

    let mut tx = state.db.begin().await?;
    let Some(serial) = db::nodes::take_serial(&mut tx, node.id).await? else {
        return Err(ApiError::Gone(
            "this node finished bootstrapping; an operator must re-arm it for another bundle"
                .into(),
        ));
    };
    let now = db::now();
    let ttl = i64::try_from(state.config.bundle_ttl.as_secs()).unwrap_or(900);
    let issuance = Issuance {
        bundle_id: uuid::Uuid::new_v4(),
        issued_at: now,
        expires_at: now + ttl,
        serial: u64::try_from(serial).map_err(ApiError::internal)?,
        nonce,
    };
    let payload = render::render_bundle(&RenderInput {
        cluster: &spec,
        node: &this,
        peers: &peers,
        credentials: NodeCredentials {
            cluster_ca_pem: pki.cluster_ca.cert_pem(),
            etcd_ca_pem: pki.etcd_ca.cert_pem(),
            front_proxy_ca_pem: pki.front_proxy_ca.cert_pem(),
            service_account: &pki.service_account,
            serving: &serving,
            minted: &minted,
        },
        issuance: &issuance,
        artifacts: &state.config.artifacts,
    })
    .map_err(ApiError::internal)?;
    let payload_bytes = serde_json::to_vec(&payload).map_err(ApiError::internal)?;
    let envelope = state
        .signer
        .sign(exk8s_common::BUNDLE_PAYLOAD_TYPE, &payload_bytes);
    let envelope = serde_json::to_vec(&envelope).map_err(ApiError::internal)?;
    let bundle_id = issuance.bundle_id.to_string();
    let digest = exk8s_common::names::Sha256Digest::of(&payload_bytes).to_hex();
    let key_id = state.signer.key_id().to_string();
    let audit = Audit {
        vm_id: node.vm_id,
        cluster_id: Some(cluster.id),
        serial: Some(serial),
        bundle_id: Some(&bundle_id),
        bundle_sha256: Some(&digest),
        key_id: Some(&key_id),
        outcome: "issued",
        reason: None,
        source_address: Some(source),
    };
    db::issuances::insert(&mut *tx, &audit, now).await?;
    tx.commit().await?;
    state.metrics.bundles_issued.inc();
    tracing::info!(vm_id = node.vm_id, cluster_id = cluster.id, serial, bundle_id = %bundle_id, "bundle issued");
    Ok(envelope)
}
