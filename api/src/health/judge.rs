//! Judging one machine: each sign of trouble the API can see (the compute API's VM state, the
//! agent's heartbeat, its components' reported health, a boot that never finished) and how
//! long it has lasted, against the policy's timeouts. Pure: the pass gathers the facts.

use crate::db::components::ComponentRow;
use crate::db::nodes::NodeRow;

use super::policy::HealthPolicy;

/// What the compute API said of a machine's VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmSeen {
    /// Running or still starting.
    Up,
    /// Any other state (`stopped`, `terminated`, ...).
    Down(String),
    /// The compute API no longer knows it.
    Gone,
}

/// The stored word for [`VmSeen::Gone`] (`cluster_nodes.vm_state`).
pub const GONE: &str = "gone";

impl VmSeen {
    /// What a VM's state says (`pending` and `running` are up; clouds name the rest).
    pub fn of(vm: Option<&crate::compute::Vm>) -> Self {
        match vm.map(|vm| vm.state.as_str()) {
            None => Self::Gone,
            Some("running" | "pending") => Self::Up,
            Some(other) => Self::Down(other.to_owned()),
        }
    }

    /// As `cluster_nodes.vm_state` keeps it (None while up).
    pub fn stored(&self) -> Option<&str> {
        match self {
            Self::Up => None,
            Self::Down(state) => Some(state),
            Self::Gone => Some(GONE),
        }
    }

    /// What the node row says the last health pass saw.
    pub fn of_node(node: &NodeRow) -> Self {
        match node.vm_state.as_deref() {
            None => Self::Up,
            Some(GONE) => Self::Gone,
            Some(state) => Self::Down(state.to_owned()),
        }
    }
}

/// One sign of trouble.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    VmGone,
    VmDown {
        state: String,
    },
    /// No signed request from the agent since.
    Unreachable,
    ComponentUnhealthy {
        component: String,
        message: String,
    },
    /// Made, and never reported healthy.
    NeverStarted,
}

impl Problem {
    /// Cluster API's reason for it (`HealthCheckSucceeded` False).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::VmGone => "MachineDeleted",
            Self::VmDown { .. } => "MachineNotRunning",
            Self::Unreachable => "NodeUnreachable",
            Self::ComponentUnhealthy { .. } => "UnhealthyNode",
            Self::NeverStarted => "NodeStartupTimeout",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::VmGone => "its VM no longer exists".into(),
            Self::VmDown { state } => format!("its VM is {state}"),
            Self::Unreachable => "its agent stopped asking for updates".into(),
            Self::ComponentUnhealthy { component, message } if message.is_empty() => {
                format!("{component} reports unhealthy")
            }
            Self::ComponentUnhealthy { component, message } => {
                format!("{component} reports unhealthy: {message}")
            }
            Self::NeverStarted => "it never reported healthy after it was made".into(),
        }
    }
}

/// The machine's health at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    /// Something is wrong, not yet for as long as the policy waits.
    Suspect {
        problem: Problem,
        since: i64,
        unhealthy_at: i64,
    },
    Unhealthy {
        problem: Problem,
        since: i64,
    },
    /// Being removed: nothing to judge.
    Leaving,
}

/// What the checks know of one machine: its row (heartbeat, VM state as the last health pass
/// saw it, boot) and its reported components.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub node: &'a NodeRow,
    /// This node's reported components (others' are ignored).
    pub components: &'a [ComponentRow],
}

/// Judges one machine: the first problem past its timeout makes it unhealthy (a VM that is
/// down or gone first, then silence, then a component, then a boot that never finished);
/// otherwise the one nearest its timeout makes it suspect.
pub fn judge(policy: &HealthPolicy, facts: Facts<'_>, now: i64) -> Verdict {
    let node = facts.node;
    if node.removal.is_some()
        || node.etcd_membership == Some(crate::db::phase::EtcdMembership::Leaving)
    {
        return Verdict::Leaving;
    }
    let after = |secs: u32| i64::from(secs);
    let mut problems: Vec<(Problem, i64, i64)> = Vec::new();
    let down_since = node.vm_down_since.unwrap_or(now);
    match VmSeen::of_node(node) {
        VmSeen::Gone => problems.push((
            Problem::VmGone,
            down_since,
            after(policy.vm_down_after_secs),
        )),
        VmSeen::Down(state) => problems.push((
            Problem::VmDown { state },
            down_since,
            after(policy.vm_down_after_secs),
        )),
        VmSeen::Up => {}
    }
    // A node that once ran its release is expected to keep polling; one that never did is
    // judged by how long its boot takes instead.
    if node.kubernetes_version.is_some() {
        if let Some(seen) = node.last_seen_at {
            // Silence counts only while the API was there to hear a poll.
            let silent_since = node.silence_counts_from.map_or(seen, |from| seen.max(from));
            problems.push((
                Problem::Unreachable,
                silent_since,
                after(policy.unreachable_after_secs),
            ));
        }
        let mine = facts.components.iter().filter(|c| c.node_id == node.id);
        for c in mine.filter(|c| !c.healthy) {
            problems.push((
                Problem::ComponentUnhealthy {
                    component: c.component.as_str().to_owned(),
                    message: c.message.clone(),
                },
                c.changed_at,
                after(policy.unhealthy_after_secs),
            ));
        }
    } else if !node.phase.healthy() {
        problems.push((
            Problem::NeverStarted,
            node.created_at,
            after(policy.startup_timeout_secs),
        ));
    }
    if let Some((problem, since, _)) = problems
        .iter()
        .find(|(_, since, wait)| now - since >= *wait)
    {
        return Verdict::Unhealthy {
            problem: problem.clone(),
            since: *since,
        };
    }
    // The silence of a polling agent is only a problem once it is longer than a poll.
    problems
        .into_iter()
        .filter(|(p, since, _)| {
            *p != Problem::Unreachable || now - since >= after(policy.unreachable_after_secs) / 2
        })
        .min_by_key(|(_, since, wait)| since + wait)
        .map_or(Verdict::Healthy, |(problem, since, wait)| {
            Verdict::Suspect {
                problem,
                since,
                unhealthy_at: since + wait,
            }
        })
}

#[cfg(test)]
mod tests {
    use exk8s_common::contract::{BootPhase, Component, ReportState};

    use super::*;
    use crate::lifecycle::NodePhase;

    const T0: i64 = 1_800_000_000;

    fn booted() -> NodeRow {
        let mut n = crate::upgrade::state::tests::node(1, "v1.35.3", [1, 1, 1]);
        n.phase = NodePhase::Reported {
            phase: BootPhase::Complete,
            state: ReportState::Succeeded,
        };
        n.created_at = T0;
        n.last_seen_at = Some(T0);
        n
    }

    fn at(node: &NodeRow, components: &[ComponentRow], now: i64) -> Verdict {
        judge(&HealthPolicy::default(), Facts { node, components }, now)
    }

    fn with_vm(node: &NodeRow, vm: &VmSeen, down_since: Option<i64>) -> NodeRow {
        let mut node = node.clone();
        node.vm_state = vm.stored().map(str::to_owned);
        node.vm_down_since = down_since;
        node
    }

    #[test]
    fn a_polling_machine_is_healthy_and_a_silent_one_turns_unhealthy_at_its_timeout() {
        let node = booted();
        assert_eq!(at(&node, &[], T0 + 400), Verdict::Healthy);
        assert_eq!(
            at(&node, &[], T0 + 600),
            Verdict::Suspect {
                problem: Problem::Unreachable,
                since: T0,
                unhealthy_at: T0 + 900
            }
        );
        assert_eq!(
            at(&node, &[], T0 + 900),
            Verdict::Unhealthy {
                problem: Problem::Unreachable,
                since: T0
            }
        );
    }

    #[test]
    fn silence_counts_only_from_when_the_api_could_hear_a_poll() {
        // Last seen at T0; the API was away for two hours, its passes resumed at T0 + 7200.
        let resumed = T0 + 7200;
        let mut node = booted();
        node.silence_counts_from = Some(resumed);
        assert_eq!(at(&node, &[], resumed + 60), Verdict::Healthy);
        assert_eq!(
            at(&node, &[], resumed + 600),
            Verdict::Suspect {
                problem: Problem::Unreachable,
                since: resumed,
                unhealthy_at: resumed + 900
            }
        );
        assert_eq!(
            at(&node, &[], resumed + 900),
            Verdict::Unhealthy {
                problem: Problem::Unreachable,
                since: resumed
            }
        );
        // A poll after the resumption counts from itself.
        node.last_seen_at = Some(resumed + 300);
        assert_eq!(at(&node, &[], resumed + 600), Verdict::Healthy);
    }

    #[test]
    fn a_stopped_or_lost_vm_is_unhealthy_after_its_own_shorter_wait_and_goes_first() {
        let node = booted();
        let stopped = with_vm(&node, &VmSeen::Down("stopped".into()), Some(T0 + 10));
        assert!(matches!(
            at(&stopped, &[], T0 + 60),
            Verdict::Suspect { problem: Problem::VmDown { .. }, unhealthy_at, .. } if unhealthy_at == T0 + 130
        ));
        let gone = with_vm(&node, &VmSeen::Gone, Some(T0 + 10));
        assert_eq!(
            at(&gone, &[], T0 + 1000),
            Verdict::Unhealthy {
                problem: Problem::VmGone,
                since: T0 + 10
            }
        );
        assert_eq!(Problem::VmGone.describe(), "its VM no longer exists");
    }

    #[test]
    fn an_unhealthy_component_counts_from_its_last_change_and_a_leaving_machine_is_not_judged() {
        let mut node = booted();
        let etcd = ComponentRow {
            node_id: node.id,
            component: Component::Etcd,
            healthy: false,
            message: "connection refused".into(),
            changed_at: T0 + 100,
        };
        node.last_seen_at = Some(T0 + 650);
        let unhealthy = at(&node, std::slice::from_ref(&etcd), T0 + 700);
        assert_eq!(
            unhealthy,
            Verdict::Unhealthy {
                problem: Problem::ComponentUnhealthy {
                    component: "etcd".into(),
                    message: "connection refused".into()
                },
                since: T0 + 100
            }
        );
        // Another node's component is not this one's.
        let other = ComponentRow {
            node_id: node.id + 1,
            ..etcd.clone()
        };
        assert_eq!(at(&node, &[other], T0 + 700), Verdict::Healthy);
        let healthy = ComponentRow {
            healthy: true,
            ..etcd
        };
        assert_eq!(at(&node, &[healthy], T0 + 700), Verdict::Healthy);
        node.removal = Some(crate::db::phase::Removal::Draining);
        let gone = with_vm(&node, &VmSeen::Gone, Some(T0));
        assert_eq!(at(&gone, &[], T0 + 9999), Verdict::Leaving);
    }

    #[test]
    fn a_machine_that_never_booted_is_judged_by_its_startup_timeout_only() {
        let mut node = booted();
        node.kubernetes_version = None;
        node.last_seen_at = None;
        node.phase = NodePhase::Pending;
        assert!(matches!(
            at(&node, &[], T0 + 60),
            Verdict::Suspect {
                problem: Problem::NeverStarted,
                ..
            }
        ));
        assert_eq!(
            at(&node, &[], T0 + 1200),
            Verdict::Unhealthy {
                problem: Problem::NeverStarted,
                since: T0
            }
        );
        assert_eq!(Problem::NeverStarted.reason(), "NodeStartupTimeout");
    }

    #[test]
    fn a_vm_state_reads_as_up_down_or_gone_and_is_stored_so() {
        let vm = |state: &str| crate::compute::Vm {
            id: 1,
            name: "n".into(),
            state: state.into(),
            private_ipv4: None,
            private_ipv6: None,
            public_ipv4: None,
            client_token: None,
            tags: Default::default(),
        };
        assert_eq!(VmSeen::of(Some(&vm("running"))), VmSeen::Up);
        assert_eq!(VmSeen::of(Some(&vm("pending"))), VmSeen::Up);
        assert_eq!(
            VmSeen::of(Some(&vm("stopped"))),
            VmSeen::Down("stopped".into())
        );
        assert_eq!(VmSeen::of(None), VmSeen::Gone);
        for seen in [VmSeen::Up, VmSeen::Down("terminated".into()), VmSeen::Gone] {
            let node = with_vm(&booted(), &seen, Some(T0));
            assert_eq!(VmSeen::of_node(&node), seen);
        }
    }
}
