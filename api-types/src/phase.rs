//! The closed sets the API answers with (and stores as text): a cluster's phase, a worker's
//! removal and a control-plane node's place in etcd. Each parses from its name and nothing
//! else.

use serde::{Deserialize, Serialize};

/// Where a cluster stands: `provisioning` → `founded` | (`compensating` →) `failed`;
/// `deleting` while its resources are released, then `deleted`: only what recovery needs is
/// kept (its trust and stored snapshots) until it is purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ClusterPhase {
    Provisioning,
    Founded,
    Compensating,
    Failed,
    Deleting,
    Deleted,
}

impl ClusterPhase {
    pub const ALL: [Self; 6] = [
        Self::Provisioning,
        Self::Founded,
        Self::Compensating,
        Self::Failed,
        Self::Deleting,
        Self::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::Founded => "founded",
            Self::Compensating => "compensating",
            Self::Failed => "failed",
            Self::Deleting => "deleting",
            Self::Deleted => "deleted",
        }
    }
}

exk8s_common::text_enum!(ClusterPhase);

/// Where a node being removed stands: its workloads are being evicted (`draining`), or they
/// are gone — or the drain's deadline passed — and its VM may be deleted (`drained`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Removal {
    Draining,
    Drained,
}

impl Removal {
    pub const ALL: [Self; 2] = [Self::Draining, Self::Drained];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::Drained => "drained",
        }
    }
}

exk8s_common::text_enum!(Removal);

/// A control-plane node's place in etcd: a voter, joining (a learner until promoted), or
/// leaving (to be removed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum EtcdMembership {
    Voter,
    Joining,
    Leaving,
}

impl EtcdMembership {
    pub const ALL: [Self; 3] = [Self::Voter, Self::Joining, Self::Leaving];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Voter => "voter",
            Self::Joining => "joining",
            Self::Leaving => "leaving",
        }
    }
}

exk8s_common::text_enum!(EtcdMembership);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_parses_from_its_name_and_nothing_else() {
        for phase in ClusterPhase::ALL {
            assert_eq!(phase.as_str().parse::<ClusterPhase>(), Ok(phase));
        }
        for removal in Removal::ALL {
            assert_eq!(removal.to_string().parse::<Removal>(), Ok(removal));
        }
        for membership in EtcdMembership::ALL {
            assert_eq!(
                membership.as_str().parse::<EtcdMembership>(),
                Ok(membership)
            );
        }
        let unknown = "Founded".parse::<ClusterPhase>().unwrap_err();
        assert!(unknown.to_string().contains("provisioning"), "{unknown}");
    }
}
