//! A node's generations and what moves them. `desired` is what it should run (bumped by
//! renewal, rotation, rollouts, membership and drains), `handed` what its last bundle carried
//! (moved by issuance, through the rollout gate), `applied` what it last reported healthy at
//! (moved by its reports, here). Always `applied ≤ handed ≤ desired`.

use super::NodePhase;
use exk8s_common::contract::BootPhase;

/// A node's three generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeGenerations {
    pub desired: i64,
    pub handed: i64,
    pub applied: i64,
}

impl NodeGenerations {
    /// It runs what it should.
    pub fn up_to_date(self) -> bool {
        self.applied >= self.desired
    }

    /// Handed a generation it has not reported applied yet.
    pub fn in_flight(self) -> bool {
        self.handed > self.applied
    }
}

/// What a report changes on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub phase: NodePhase,
    /// `complete` closes bootstrap issuance until an operator re-arms the node.
    pub closes_bootstrap: bool,
    /// The node's applied generation after the report.
    pub applied: i64,
}

/// The effect of `phase`, reported at `generation`, on a node at `now`. A healthy report
/// (`complete` or `sync` succeeded) marks its generation applied — the handed one for agents
/// that predate generations — when it was handed out and is newer than what was applied; any
/// other report leaves `applied` as it was.
pub fn report(now: NodeGenerations, phase: NodePhase, generation: Option<i64>) -> Reported {
    let reported = generation.unwrap_or(now.handed);
    let applies = phase.healthy() && reported <= now.handed && reported > now.applied;
    Reported {
        phase,
        closes_bootstrap: matches!(
            phase,
            NodePhase::Reported {
                phase: BootPhase::Complete,
                ..
            }
        ),
        applied: if applies { reported } else { now.applied },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use exk8s_common::contract::ReportState;

    fn at(phase: BootPhase, state: ReportState) -> NodePhase {
        NodePhase::Reported { phase, state }
    }

    const NOW: NodeGenerations = NodeGenerations {
        desired: 4,
        handed: 3,
        applied: 2,
    };

    #[test]
    fn a_healthy_report_applies_what_was_handed_and_nothing_else() {
        let synced = at(BootPhase::Sync, ReportState::Succeeded);
        assert_eq!(report(NOW, synced, Some(3)).applied, 3);
        assert_eq!(
            report(NOW, synced, None).applied,
            3,
            "an agent without generations"
        );
        assert_eq!(report(NOW, synced, Some(4)).applied, 2, "never handed");
        assert_eq!(report(NOW, synced, Some(1)).applied, 2, "never backwards");
        let failed = at(BootPhase::Sync, ReportState::Failed);
        assert_eq!(report(NOW, failed, Some(3)).applied, 2);
        let busy = at(BootPhase::Etcd, ReportState::Started);
        assert_eq!(report(NOW, busy, Some(3)).applied, 2);
    }

    #[test]
    fn only_complete_closes_bootstrap() {
        for state in ReportState::ALL {
            assert!(report(NOW, at(BootPhase::Complete, state), None).closes_bootstrap);
            assert!(!report(NOW, at(BootPhase::Sync, state), None).closes_bootstrap);
        }
        assert!(!report(NOW, NodePhase::Pending, None).closes_bootstrap);
    }

    #[test]
    fn up_to_date_and_in_flight() {
        assert!(!NOW.up_to_date() && NOW.in_flight());
        let settled = NodeGenerations {
            desired: 3,
            handed: 3,
            applied: 3,
        };
        assert!(settled.up_to_date() && !settled.in_flight());
    }
}
