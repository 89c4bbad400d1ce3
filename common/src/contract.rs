//! The wire contract between the agent and the API beyond the bundle itself: the headers a VM
//! sends, a node's role, the kinds of bundle, the phases it reports and where each stands. Both programs use these types, so
//! a phase or header renamed on one side cannot silently diverge from the other.

use serde::{Deserialize, Serialize};

/// The instance-metadata session token a VM presents with every bootstrap request.
pub const IMDS_TOKEN_HEADER: &str = "X-exc-imds-token";
/// The agent's fresh per-request nonce, echoed in the bundle payload.
pub const NONCE_HEADER: &str = "X-Exk8s-Nonce";
/// Longest report message the API accepts, in characters.
pub const MAX_REPORT_MESSAGE_CHARS: usize = 1000;

/// What a node is for. The API chooses it from the node's record, never from a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    ControlPlane,
    Worker,
}

impl Role {
    pub const ALL: [Self; 2] = [Self::ControlPlane, Self::Worker];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlane => "control-plane",
            Self::Worker => "worker",
        }
    }
}

/// Which bundle of a node's life this is: the first one (fetched with the bootstrap token at
/// first boot) or a later one (fetched by `exk8s-agent sync` with the node's own key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BundleKind {
    Bootstrap,
    Update,
}

impl BundleKind {
    pub const ALL: [Self; 2] = [Self::Bootstrap, Self::Update];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bootstrap => "bootstrap",
            Self::Update => "update",
        }
    }
}

/// The phases a node reports, in order: its boot, then each later sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootPhase {
    Fetch,
    Verify,
    Files,
    Prereqs,
    Services,
    Etcd,
    Apiserver,
    Addons,
    Complete,
    /// A day-2 sync applying an update bundle.
    Sync,
}

impl BootPhase {
    pub const ALL: [Self; 10] = [
        Self::Fetch,
        Self::Verify,
        Self::Files,
        Self::Prereqs,
        Self::Services,
        Self::Etcd,
        Self::Apiserver,
        Self::Addons,
        Self::Complete,
        Self::Sync,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Verify => "verify",
            Self::Files => "files",
            Self::Prereqs => "prereqs",
            Self::Services => "services",
            Self::Etcd => "etcd",
            Self::Apiserver => "apiserver",
            Self::Addons => "addons",
            Self::Complete => "complete",
            Self::Sync => "sync",
        }
    }
}

/// Where a reported phase stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportState {
    Started,
    Succeeded,
    Failed,
}

impl ReportState {
    pub const ALL: [Self; 3] = [Self::Started, Self::Succeeded, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// A name that is not one of the enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not one of {expected}")]
pub struct UnknownName {
    given: String,
    expected: String,
}

impl UnknownName {
    /// `given` (shown at most 40 characters) is none of `expected`.
    pub fn new(given: &str, expected: &[&str]) -> Self {
        Self {
            given: given.chars().take(40).collect(),
            expected: expected.join(", "),
        }
    }
}

/// `Display` and `FromStr` for a closed set of names: a type with `ALL` and `as_str`. A name
/// outside the set is an [`UnknownName`] that lists the set.
#[macro_export]
macro_rules! text_enum {
    ($ty:ty) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::contract::UnknownName;

            fn from_str(s: &str) -> ::std::result::Result<Self, $crate::contract::UnknownName> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| {
                        $crate::contract::UnknownName::new(s, &<$ty>::ALL.map(<$ty>::as_str))
                    })
            }
        }
    };
}

/// A node component whose health an agent reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Component {
    #[serde(rename = "etcd")]
    Etcd,
    #[serde(rename = "kube-apiserver")]
    Apiserver,
    #[serde(rename = "kube-controller-manager")]
    ControllerManager,
    #[serde(rename = "kube-scheduler")]
    Scheduler,
    #[serde(rename = "kubelet")]
    Kubelet,
}

impl Component {
    pub const ALL: [Self; 5] = [
        Self::Etcd,
        Self::Apiserver,
        Self::ControllerManager,
        Self::Scheduler,
        Self::Kubelet,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Etcd => "etcd",
            Self::Apiserver => "kube-apiserver",
            Self::ControllerManager => "kube-controller-manager",
            Self::Scheduler => "kube-scheduler",
            Self::Kubelet => "kubelet",
        }
    }
}

/// One component's health as the agent's probe last saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentHealth {
    pub component: Component,
    pub healthy: bool,
    /// What the probe saw when unhealthy; at most [`MAX_REPORT_MESSAGE_CHARS`] characters.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

text_enum!(Role);
text_enum!(Component);
text_enum!(BundleKind);
text_enum!(BootPhase);
text_enum!(ReportState);

/// A node's generations, as `GET /nodes/{vm_id}/generation` answers them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Generations {
    /// The generation the node should run (bumped whenever its bundle would change).
    pub desired_generation: u64,
    /// The generation the node last reported healthy (0 before its first bundle is applied).
    pub applied_generation: u64,
    /// `applied_generation` has reached `desired_generation`.
    pub up_to_date: bool,
    /// An etcd snapshot this node is asked to take and upload (a voter's, at most one at a
    /// time); absent otherwise. Older agents ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotTask>,
    /// This member's next step of an in-place restore of the cluster's etcd; absent
    /// otherwise. Older agents ignore it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreTask>,
}

/// A step of an in-place restore of the cluster's etcd, in the order etcd's recovery guide
/// asks: every member stops, every member restores the same snapshot as a new logical
/// cluster, then the control plane comes back one member at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum RestoreStep {
    /// Put the control-plane static pods aside, then stop etcd.
    Stop,
    /// Fetch the snapshot, check its digest, restore it into a fresh data directory (the old
    /// one kept aside) and start etcd.
    Restore,
    /// Once etcd is healthy, put the static pods back and wait for the apiserver.
    Start,
}

impl RestoreStep {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Restore => "restore",
            Self::Start => "start",
        }
    }
}

/// What a member does for step `step` of restore `id`, then acknowledges with `PUT
/// /nodes/{vm_id}/restores/{id}` ([`RestoreAck`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RestoreTask {
    pub id: i64,
    pub step: RestoreStep,
    /// Fetched with `GET /nodes/{vm_id}/snapshots/{snapshot_id}/content`.
    pub snapshot_id: i64,
    /// The snapshot's SHA-256 as etcd wrote it (hex).
    pub sha256: String,
    /// This member's etcd name, peer URL and the restored cluster's members and token.
    pub member_name: String,
    pub peer_url: String,
    pub initial_cluster: String,
    pub initial_cluster_token: String,
    /// Added to the snapshot's revision (`etcdutl snapshot restore --bump-revision`, with
    /// `--mark-compacted`), so every watch and cache from before the restore ends.
    pub bump_revision: u64,
    /// etcd's data directory and `etcdutl` on the node.
    pub data_dir: String,
    pub etcdutl: String,
    /// The static-pod manifests put aside and back.
    pub manifests: Vec<String>,
}

/// A member's word on a step of a restore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RestoreAck {
    pub step: RestoreStep,
    /// Empty when the step was done; why not otherwise (at most
    /// [`MAX_REPORT_MESSAGE_CHARS`] characters).
    #[serde(default)]
    pub failure: String,
}

/// A snapshot to take: stream it from the node's own etcd member and `PUT` it to
/// `/nodes/{vm_id}/snapshots/{id}` before `not_after` (Unix seconds), with its revision and
/// etcd version in [`ETCD_REVISION_HEADER`] and [`ETCD_VERSION_HEADER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotTask {
    pub id: i64,
    pub not_after: i64,
}

/// The revision of the member's store when its snapshot began (the snapshot holds at least it).
pub const ETCD_REVISION_HEADER: &str = "X-Exk8s-Etcd-Revision";
/// The etcd release of the member that took a snapshot (`3.6.14`).
pub const ETCD_VERSION_HEADER: &str = "X-Exk8s-Etcd-Version";
/// Why a member could not take the snapshot asked of it (its upload's body is then empty).
pub const SNAPSHOT_FAILURE_HEADER: &str = "X-Exk8s-Snapshot-Failure";

/// A phase report, as the agent sends it to `…/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseReport {
    pub phase: BootPhase,
    pub state: ReportState,
    /// At most [`MAX_REPORT_MESSAGE_CHARS`] characters.
    #[serde(default)]
    pub message: String,
    /// The generation of the bundle the node is applying; absent from agents that predate
    /// generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The components this node's probes checked, at most one entry each; absent from agents
    /// that predate component reports and from reports that checked none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentHealth>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for phase in BootPhase::ALL {
            assert_eq!(phase.as_str().parse::<BootPhase>().unwrap(), phase);
            assert_eq!(
                serde_json::to_string(&phase).unwrap(),
                format!("\"{phase}\"")
            );
        }
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
            assert_eq!(serde_json::to_string(&role).unwrap(), format!("\"{role}\""));
        }
        for kind in BundleKind::ALL {
            assert_eq!(serde_json::to_string(&kind).unwrap(), format!("\"{kind}\""));
        }
        for state in ReportState::ALL {
            assert_eq!(state.as_str().parse::<ReportState>().unwrap(), state);
        }
        let error = "booting".parse::<BootPhase>().unwrap_err().to_string();
        assert!(error.contains("fetch, verify"), "{error}");
        assert!(serde_json::from_str::<PhaseReport>(r#"{"phase":"etcd","state":"ok"}"#).is_err());
    }
}
