//! What a cluster's recorded state means, judged: its conditions in Cluster API v1beta2's shape
//! and its replica counts in Cluster API's sense, computed from rows and nothing else. `http/`
//! renders them (times as RFC 3339); a new day-2 feature (upgrades, snapshots, remediation)
//! adds its conditions here.

pub mod catalog;
mod certificates;
mod cluster;
mod components;
mod health;
mod rollout;
mod sa_key;
mod snapshots;

pub use certificates::{Availability, EXPIRING_SOON_DAYS, availability, certificates};
pub use cluster::{
    Replicas, Rotating, ca_rotation, deleting, machines, pool_node_up_to_date, pool_replicas,
    replicas, scaling,
};
pub use components::Health;
pub use health::{health_check, remediation_allowed};
pub use rollout::rolling_out;
pub use sa_key::{SaKey, SaKeyRotating, age_days, sa_key_fresh, sa_key_rotating};
pub use snapshots::{Snapshots, snapshots};

/// A condition's status, as Cluster API writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::True => "True",
            Self::False => "False",
            Self::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One judged condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `Available`, `EtcdClusterHealthy`, `KubeletHealthy`, ...
    pub type_: &'static str,
    pub status: Status,
    /// CamelCase, as Cluster API's reasons are.
    pub reason: &'static str,
    pub message: String,
    /// Unix seconds of the last transition.
    pub since: i64,
}
