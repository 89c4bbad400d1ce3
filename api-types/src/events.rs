//! The data of the events `GET /clusters/{id}/events` streams.

use serde::{Deserialize, Serialize};

use crate::cluster::{ClusterView, Condition};
use crate::phase::ClusterPhase;

/// The data of a `cluster`, `node`, `removed`, `report`, `remediation`, `snapshot`, `restore` or
/// `upgrade` event.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangeEvent {
    /// Unix seconds.
    pub at: i64,
    /// A cluster phase (`cluster`), a node's phase as `GET /clusters/{id}` shows it, the
    /// machine set a node left (`removed`) or a remediation replaces a machine of
    /// (`control-plane`, `worker`), a snapshot's state (`requested`, `stored`, `failed`), the
    /// phase a restore entered (`stop`, `restore`, `start`, `done`, `failed`), or an upgrade's
    /// step (`started`: the control plane's target changed; `member`: a member runs a new
    /// release; `done`: every member runs the target; `pool`: a pool takes another release).
    pub phase: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<i64>,
    /// A remediation's: `started` or `finished` (the machine gone, its set back at its size and
    /// every node up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The snapshot a `snapshot` event is about, or the one a `restore` restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// A failure's message, the text of a node's report, the node that left and how, the node
    /// a remediation replaces and what is wrong with it (its Cluster API reason in
    /// `error_reason`) or that it was replaced, a snapshot's: whom it was asked of, what was
    /// stored, or why it failed (`error_reason` `SnapshotFailed`), a restore's: which one, or
    /// why it failed (`error_reason` `RestoreFailed`), or an upgrade step's: from which
    /// release to which, which member runs what, or which pool takes what.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The data of a `status` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StatusEvent {
    pub phase: ClusterPhase,
    pub ready: bool,
    pub initialized: bool,
    pub replicas: i64,
    pub ready_replicas: i64,
    pub up_to_date_replicas: i64,
    /// The oldest Kubernetes version a control-plane member runs.
    #[serde(default)]
    pub version: String,
    pub conditions: Vec<Condition>,
}

/// Why the server ended a stream (the data of an `end` event); the client reconnects with
/// `Last-Event-ID` where the reason allows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StreamEnd {
    /// `token` (the token was revoked or expired: reconnect with a valid one), `lifetime`
    /// (streams last at most the server's stream lifetime: reconnect) or `draining` (this
    /// server stops: reconnect, to another replica).
    pub reason: String,
}

impl From<&ClusterView> for StatusEvent {
    fn from(v: &ClusterView) -> Self {
        Self {
            phase: v.phase,
            ready: v.ready,
            initialized: v.initialized,
            replicas: v.replicas,
            ready_replicas: v.ready_replicas,
            up_to_date_replicas: v.up_to_date_replicas,
            version: v.version.clone(),
            conditions: v.conditions.clone(),
        }
    }
}
