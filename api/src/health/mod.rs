//! Machine health: each machine judged against its cluster's [`policy::HealthPolicy`]
//! ([`judge`]), and whether a machine set may be remediated now ([`allowed`]).
//!
//! The signs are the ones the API sees without dialling into the cluster: the compute API's VM
//! state, the agent's heartbeat (`cluster_nodes.last_seen_at`, written by its signed requests),
//! and the components' health its agent reports.

pub mod blocked;
pub mod judge;
pub mod pass;
pub mod policy;

pub use judge::{Facts, Problem, Verdict, VmSeen, judge};
pub use policy::{HealthPolicy, MaxUnhealthy, PolicyError};

/// Records that the node's agent was heard from at `at` (an authenticated request of its own):
/// written when the stored heartbeat is a minute old or more, so a node's requests cost one
/// write a minute at most.
pub async fn heartbeat(
    db: &crate::db::Db,
    node: &crate::db::nodes::NodeRow,
    at: i64,
) -> Result<(), crate::db::DbError> {
    if crate::db::nodes::heartbeat_due(node, at) {
        crate::db::nodes::seen(&db.pool, node.id, at).await?;
    }
    Ok(())
}

/// Why a machine set's remediation waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    /// The cluster's policy turns remediation off.
    Off,
    /// More unhealthy machines than the policy allows: something larger than a machine.
    TooManyUnhealthy { unhealthy: usize, allowed: usize },
    /// Removing the unhealthy control-plane member would leave fewer healthy voters than a
    /// quorum of the members that remain.
    QuorumAtRisk { healthy: usize, members: usize },
    /// The set was remediated `max_remediations` times within the retry period.
    RetriesExhausted { count: u32, period_secs: u32 },
    /// Another change runs (a membership change, an upgrade, a restore, a rotation).
    ChangeInProgress(String),
}

impl Blocked {
    /// Cluster API-style reason (`RemediationAllowed` False).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Off => "RemediationOff",
            Self::TooManyUnhealthy { .. } => "TooManyUnhealthy",
            Self::QuorumAtRisk { .. } => "QuorumAtRisk",
            Self::RetriesExhausted { .. } => "RetriesExhausted",
            Self::ChangeInProgress(_) => "ChangeInProgress",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Off => "the cluster's health policy turns remediation off".into(),
            Self::TooManyUnhealthy { unhealthy, allowed } => format!(
                "{unhealthy} machines are unhealthy, more than max_unhealthy allows ({allowed}): something larger than one machine is wrong, so none is replaced"
            ),
            Self::QuorumAtRisk { healthy, members } => format!(
                "only {healthy} of {members} etcd members are healthy: removing another would lose quorum"
            ),
            Self::RetriesExhausted { count, period_secs } => format!(
                "{count} machines were replaced in the last {} h, the policy's limit: left alone until an operator looks",
                period_secs / 3600
            ),
            Self::ChangeInProgress(what) => format!("waits for {what}"),
        }
    }
}

/// One unhealthy machine: the problem and since when.
#[derive(Debug, Clone)]
pub struct Unhealthy<'a> {
    pub node: &'a crate::db::nodes::NodeRow,
    pub problem: Problem,
    pub since: i64,
}

/// The unhealthy machines among `nodes`, longest unhealthy first.
pub fn unhealthy<'a>(
    policy: &HealthPolicy,
    nodes: impl IntoIterator<Item = &'a crate::db::nodes::NodeRow>,
    components: &[crate::db::components::ComponentRow],
    now: i64,
) -> Vec<Unhealthy<'a>> {
    let mut found: Vec<Unhealthy<'a>> = nodes
        .into_iter()
        .filter_map(
            |node| match judge(policy, Facts { node, components }, now) {
                Verdict::Unhealthy { problem, since } => Some(Unhealthy {
                    node,
                    problem,
                    since,
                }),
                _ => None,
            },
        )
        .collect();
    found.sort_by_key(|u| (u.since, u.node.ordinal));
    found
}

/// A machine set's counts, as the pass sees them.
#[derive(Debug, Clone, Copy)]
pub struct SetHealth {
    /// Machines in the set (not being removed).
    pub machines: usize,
    pub unhealthy: usize,
    /// Remediations of this set within the policy's retry period.
    pub recent_remediations: u32,
    /// For the control plane: etcd voters, and how many of them are healthy.
    pub voters: Option<(usize, usize)>,
}

/// Whether one unhealthy machine of a set may be remediated now (Cluster API's
/// MachineHealthCheck and KubeadmControlPlane rules: off switch, `maxUnhealthy`, retry limit,
/// and for a control plane quorum of the members left after the removal).
pub fn allowed(policy: &HealthPolicy, set: SetHealth) -> Result<(), Blocked> {
    if !policy.remediation {
        return Err(Blocked::Off);
    }
    let limit = policy.max_unhealthy.of(set.machines);
    if set.unhealthy > limit {
        return Err(Blocked::TooManyUnhealthy {
            unhealthy: set.unhealthy,
            allowed: limit,
        });
    }
    if set.recent_remediations >= policy.max_remediations {
        return Err(Blocked::RetriesExhausted {
            count: set.recent_remediations,
            period_secs: policy.retry_period_secs,
        });
    }
    if let Some((members, healthy)) = set.voters {
        // The unhealthy member goes first (remove-first), then its replacement joins: the
        // healthy ones must be a majority of the members left.
        let left = members.saturating_sub(1);
        if healthy < left / 2 + 1 || left == 0 {
            return Err(Blocked::QuorumAtRisk { healthy, members });
        }
    }
    Ok(())
}

/// The control plane's remediation now: `Ok(None)` when no member is unhealthy, the member to
/// remediate (longest unhealthy first), or why none may go. `change` names another change that
/// runs (a membership change, an upgrade, a restore, a rotation); `recent` counts the control
/// plane's remediations within the policy's retry period. Quorum counts as healthy only the
/// members judged [`Verdict::Healthy`] whose agent last reported healthy.
pub fn control_plane<'a>(
    policy: &HealthPolicy,
    members: &[&'a crate::db::nodes::NodeRow],
    components: &[crate::db::components::ComponentRow],
    now: i64,
    recent: u32,
    change: Option<String>,
) -> Result<Option<Unhealthy<'a>>, Blocked> {
    let mut sick = unhealthy(policy, members.iter().copied(), components, now);
    if sick.is_empty() {
        return Ok(None);
    }
    if !policy.remediation {
        return Err(Blocked::Off);
    }
    if let Some(change) = change {
        return Err(Blocked::ChangeInProgress(change));
    }
    let healthy = members
        .iter()
        .filter(|node| {
            node.phase.healthy()
                && judge(policy, Facts { node, components }, now) == Verdict::Healthy
        })
        .count();
    let set = SetHealth {
        machines: members.len(),
        unhealthy: sick.len(),
        recent_remediations: recent,
        voters: Some((members.len(), healthy)),
    };
    allowed(policy, set)?;
    Ok(Some(sick.swap_remove(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(machines: usize, unhealthy: usize, voters: Option<(usize, usize)>) -> SetHealth {
        SetHealth {
            machines,
            unhealthy,
            recent_remediations: 0,
            voters,
        }
    }

    #[test]
    fn one_dead_member_of_three_may_go_two_may_not() {
        let policy = HealthPolicy::default();
        assert_eq!(allowed(&policy, set(3, 1, Some((3, 2)))), Ok(()));
        // Two of three dead: 40% of 3 allows one, and quorum would be lost anyway.
        assert_eq!(
            allowed(&policy, set(3, 2, Some((3, 1)))),
            Err(Blocked::TooManyUnhealthy {
                unhealthy: 2,
                allowed: 1
            })
        );
        let lenient = HealthPolicy {
            max_unhealthy: MaxUnhealthy::Percent(100),
            ..policy
        };
        assert_eq!(
            allowed(&lenient, set(3, 2, Some((3, 1)))),
            Err(Blocked::QuorumAtRisk {
                healthy: 1,
                members: 3
            })
        );
        // A single-member control plane has nothing to keep quorum with.
        assert!(matches!(
            allowed(&lenient, set(1, 1, Some((1, 0)))),
            Err(Blocked::QuorumAtRisk { .. })
        ));
        // Five members, one dead: four healthy of four left.
        assert_eq!(allowed(&policy, set(5, 1, Some((5, 4)))), Ok(()));
    }

    #[test]
    fn the_switch_the_limit_and_the_retry_budget_each_stop_it_and_say_why() {
        let policy = HealthPolicy {
            max_unhealthy: MaxUnhealthy::Count(1),
            ..HealthPolicy::default()
        };
        assert_eq!(allowed(&policy, set(3, 1, None)), Ok(()));
        let two = allowed(&policy, set(3, 2, None)).unwrap_err();
        assert_eq!(two.reason(), "TooManyUnhealthy");
        assert!(
            two.describe().contains("2 machines are unhealthy"),
            "{}",
            two.describe()
        );
        let off = HealthPolicy {
            remediation: false,
            ..policy
        };
        assert_eq!(allowed(&off, set(3, 1, None)), Err(Blocked::Off));
        let spent = SetHealth {
            recent_remediations: 3,
            ..set(3, 1, None)
        };
        let blocked = allowed(&policy, spent).unwrap_err();
        assert_eq!(blocked.reason(), "RetriesExhausted");
        assert!(
            blocked
                .describe()
                .contains("3 machines were replaced in the last 24 h")
        );
    }

    #[test]
    fn a_dead_member_goes_first_only_with_quorum_and_nothing_else_changing() {
        const T0: i64 = 1_800_000_000;
        let member = |ordinal| {
            let mut n = crate::upgrade::state::tests::node(ordinal, "v1.35.3", [1, 1, 1]);
            n.created_at = T0;
            n.last_seen_at = Some(T0);
            n
        };
        let gone = |ordinal| {
            let mut n = member(ordinal);
            n.vm_state = Some(judge::GONE.to_owned());
            n.vm_down_since = Some(T0);
            n
        };
        let policy = HealthPolicy::default();
        let now = T0 + 121;
        let healthy = [member(1), member(2), member(3)];
        let refs: Vec<_> = healthy.iter().collect();
        assert!(matches!(
            control_plane(&policy, &refs, &[], now, 0, None),
            Ok(None)
        ));
        let one_dead = [member(1), member(2), gone(3)];
        let refs: Vec<_> = one_dead.iter().collect();
        let chosen = control_plane(&policy, &refs, &[], now, 0, None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (chosen.node.ordinal, chosen.problem.reason()),
            (3, "MachineDeleted")
        );
        // Not before its timeout: the VM is only watched.
        assert!(matches!(
            control_plane(&policy, &refs, &[], T0 + 60, 0, None),
            Ok(None)
        ));
        let upgrading = Some("the control plane's move to v1.36.3".to_owned());
        assert_eq!(
            control_plane(&policy, &refs, &[], now, 0, upgrading)
                .unwrap_err()
                .reason(),
            "ChangeInProgress"
        );
        assert_eq!(
            control_plane(&policy, &refs, &[], now, 3, None)
                .unwrap_err()
                .reason(),
            "RetriesExhausted"
        );
        // A member only suspected (its VM gone a minute) is no healthy voter for quorum.
        let mut suspect = gone(2);
        suspect.vm_down_since = Some(T0 + 100);
        let two_down = [member(1), suspect, gone(3)];
        let refs: Vec<_> = two_down.iter().collect();
        assert_eq!(
            control_plane(&policy, &refs, &[], now, 0, None).unwrap_err(),
            Blocked::QuorumAtRisk {
                healthy: 1,
                members: 3
            }
        );
        let off = HealthPolicy {
            remediation: false,
            ..policy
        };
        let refs: Vec<_> = one_dead.iter().collect();
        assert_eq!(
            control_plane(&off, &refs, &[], now, 0, None).unwrap_err(),
            Blocked::Off
        );
    }
}
