//! A node's phase: what it last said about itself, and what that means — finished booting,
//! healthy at what it applied, failed.

use std::fmt;

use exk8s_common::contract::{BootPhase, ReportState, UnknownName};

/// What a node last said about itself: nothing yet, or a phase and where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodePhase {
    Pending,
    Reported {
        phase: BootPhase,
        state: ReportState,
    },
}

impl NodePhase {
    /// The node finished its boot: it completed, or it has synced since.
    pub fn completed(self) -> bool {
        matches!(
            self,
            Self::Reported {
                phase: BootPhase::Complete | BootPhase::Sync,
                ..
            }
        )
    }

    /// Healthy at what it applied: boot complete, or the last sync succeeded.
    pub fn healthy(self) -> bool {
        matches!(
            self,
            Self::Reported {
                phase: BootPhase::Complete | BootPhase::Sync,
                state: ReportState::Succeeded,
            }
        )
    }

    /// Its last report said something failed (a step, or its etcd between updates). A node
    /// that is busy applying has `Started` and is neither healthy nor failed.
    pub fn failed(self) -> bool {
        matches!(
            self,
            Self::Reported {
                state: ReportState::Failed,
                ..
            }
        )
    }

    /// The two stored columns, `phase` and `phase_state`.
    pub fn columns(self) -> (&'static str, &'static str) {
        match self {
            Self::Pending => ("pending", ReportState::Succeeded.as_str()),
            Self::Reported { phase, state } => (phase.as_str(), state.as_str()),
        }
    }

    pub fn from_columns(phase: &str, state: &str) -> Result<Self, UnknownName> {
        if phase == "pending" {
            return Ok(Self::Pending);
        }
        Ok(Self::Reported {
            phase: phase.parse()?,
            state: state.parse()?,
        })
    }
}

/// `pending`, `etcd` (succeeded), or `etcd:failed`: the form the API has always shown.
impl fmt::Display for NodePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pending => f.write_str("pending"),
            Self::Reported {
                phase,
                state: ReportState::Succeeded,
            } => write!(f, "{phase}"),
            Self::Reported { phase, state } => write!(f, "{phase}:{state}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn node_phases_round_trip_through_their_columns() {
        let all = std::iter::once(NodePhase::Pending).chain(BootPhase::ALL.into_iter().flat_map(
            |phase| {
                ReportState::ALL
                    .into_iter()
                    .map(move |state| NodePhase::Reported { phase, state })
            },
        ));
        for node in all {
            let (phase, state) = node.columns();
            assert_eq!(NodePhase::from_columns(phase, state).unwrap(), node);
        }
        assert!(NodePhase::from_columns("booting", "succeeded").is_err());
        assert!(NodePhase::from_columns("etcd", "ok").is_err());
        let failed = NodePhase::Reported {
            phase: BootPhase::Etcd,
            state: ReportState::Failed,
        };
        assert_eq!(failed.to_string(), "etcd:failed");
        assert!(!failed.healthy());
    }
}
