//! etcd snapshots: `GET|POST /clusters/{id}/snapshots`, `GET|DELETE …/snapshots/{sid}`.

use serde::{Deserialize, Serialize};

/// One snapshot of a cluster's etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotView {
    pub id: i64,
    pub cluster_id: i64,
    /// `requested` (a member is taking it), `stored` or `failed`.
    pub state: String,
    /// `operator`, `schedule`, or `upgrade` (the preflight of a Kubernetes upgrade).
    pub trigger: String,
    /// The member asked to take it.
    pub member: String,
    /// Unix seconds.
    pub requested_at: i64,
    /// The member's upload must come before this (Unix seconds).
    pub not_after: i64,
    /// When it was stored (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<i64>,
    /// The member's store revision when the snapshot began (it holds at least this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// The etcd release that took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// Bytes, as etcd wrote it (sealed, it is a little larger).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<i64>,
    /// SHA-256 (hex) of the snapshot as etcd wrote it (what `GET …/content` yields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// SHA-256 (hex) of the cluster CA certificate it was taken under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_sha256: Option<String>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A cluster's snapshot schedule: `GET|PUT /clusters/{id}/snapshots/schedule`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SnapshotSchedule {
    /// Hours between snapshots, 0–744 (default 12; 0: only when an operator asks).
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 744))]
    pub every_hours: i64,
    /// How many stored snapshots are kept, 1–1000 (default 14); the oldest beyond are deleted.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub retain: i64,
}

/// `POST /clusters/{id}/restore`: which stored snapshot to restore the cluster's etcd from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    pub snapshot_id: Option<i64>,
}

/// An in-place restore of a cluster's etcd (`POST|GET /clusters/{id}/restore`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RestoreView {
    pub id: i64,
    pub cluster_id: i64,
    pub snapshot_id: i64,
    /// `stop` (every member stops), `restore` (every member restores the snapshot and starts
    /// etcd), `start` (the static pods come back, one member at a time), `done` or `failed`.
    pub phase: String,
    /// Unix seconds.
    pub started_at: i64,
    pub updated_at: i64,
    /// Added to the snapshot's revision; every older revision is marked compacted.
    pub bump_revision: i64,
    /// Where and why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub members: Vec<RestoreMemberView>,
}

/// How far one member of a restore got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RestoreMemberView {
    pub member: String,
    /// `waiting`, `stopped`, `restored` or `started`.
    pub state: String,
}
