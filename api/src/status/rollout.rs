//! `RollingOut`, as Cluster API v1beta2's KubeadmControlPlane writes it: True while some
//! control-plane machine is not up to date, saying how many and — during an upgrade — the
//! version required, how many members run it, and the step (the member applying it, or the
//! one whose failure stopped it).

use super::{Condition, Status};
use crate::db::nodes::NodeRow;
use crate::rollout::Hold;
use crate::upgrade::skew::Release;
use crate::upgrade::state::{ControlPlane, Step};

/// `RollingOut` for a control plane whose target is `target`; `since` is when a machine last
/// reported; `snapshot`, the upgrade's preflight etcd snapshot while it is not stored.
pub fn rolling_out(
    target: Release,
    nodes: &[NodeRow],
    since: i64,
    snapshot: Option<Hold>,
) -> Condition {
    let behind = nodes
        .iter()
        .filter(|n| n.role == exk8s_common::contract::Role::ControlPlane && !n.up_to_date())
        .count();
    let cp = ControlPlane::read(target, nodes);
    let (status, reason, message) = if behind == 0 && cp.step == Step::Steady {
        (Status::False, "NotRollingOut", String::new())
    } else {
        let mut lines = vec![format!("Rolling out {behind} not up-to-date replicas")];
        let mixed = cp.mixed();
        if cp.mixed() {
            lines.push(format!(
                "* Version {} required ({} of {} members run it)",
                cp.target, cp.done, cp.members
            ));
        }
        match cp.step {
            Step::Steady => {}
            Step::Applying { node } => lines.push(format!("* {node} is applying its update")),
            Step::Next { node } => lines.push(format!("* {node} is next")),
            Step::Stopped { node, phase } => lines.push(format!(
                "* stopped: {node} reported {phase} and the others wait; it recovers on its \
                 own, or PATCH the cluster back to {} to roll back",
                cp.oldest
            )),
        }
        if let Some(hold) = snapshot.filter(|_| mixed) {
            lines.push(format!("* {hold}"));
        }
        (Status::True, "RollingOut", lines.join("\n"))
    };
    Condition {
        type_: "RollingOut",
        status,
        reason,
        message,
        since,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgrade::state::tests::{node, r};

    #[test]
    fn rolling_out_says_the_version_required_and_the_step() {
        let steady = [node(0, "v1.35.3", [1, 1, 1])];
        let c = rolling_out(r("v1.35.3"), &steady, 7, None);
        assert_eq!(
            (c.status, c.reason, c.since),
            (Status::False, "NotRollingOut", 7)
        );
        let upgrading = [node(0, "v1.36.3", [2, 2, 2]), node(1, "v1.35.3", [2, 1, 2])];
        let c = rolling_out(r("v1.36.3"), &upgrading, 7, None);
        assert_eq!((c.status, c.reason), (Status::True, "RollingOut"));
        assert_eq!(
            c.message,
            "Rolling out 1 not up-to-date replicas\n\
             * Version v1.36.3 required (1 of 2 members run it)\n\
             * cp-1 is applying its update"
        );
    }
}
