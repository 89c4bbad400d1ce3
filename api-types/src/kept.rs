//! Deleted clusters kept for recovery: `GET /deleted-clusters`, `GET|DELETE
//! /deleted-clusters/{id}` (the purge).

use serde::{Deserialize, Serialize};

/// A deleted cluster and what is kept of it until it is purged: what founding a cluster from
/// one of its snapshots needs (`restore_from`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeletedClusterView {
    pub cluster_id: i64,
    pub name: String,
    /// The Kubernetes version it ran.
    pub kubernetes_version: String,
    /// When its delete finished (Unix seconds).
    pub deleted_at: i64,
    /// When the reconciler purges it (Unix seconds).
    pub kept_until: i64,
    /// What is kept: `trust` (its CAs, service-account keys, secrets-encryption key, the CA
    /// standby, sealed) and `snapshots` (its stored ones, when it has any).
    pub kept: Vec<String>,
    /// Its stored snapshots (`GET /clusters/{id}/snapshots` lists them).
    pub snapshots: i64,
    /// Their bytes, as etcd wrote them.
    pub snapshot_bytes: i64,
}
