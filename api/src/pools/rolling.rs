//! Moving a pool to another Kubernetes release by replacement, as Cluster API's
//! MachineDeployment rolls out. With a `max_surge` of N ≥ 1 (`maxSurge` N, `maxUnavailable` 0):
//! up to N new workers are made at the pool's release beside the others (never more than there
//! are workers left to replace); once every worker of that release is healthy, the oldest worker
//! of another release is drained (by a control-plane node's agent, as a scale-down is) and its
//! VM released; then the next. The pool never has fewer healthy workers than it asks for. With a
//! `max_surge` of 0 (`maxSurge` 0, `maxUnavailable` 1), for a pool that cannot have a VM more
//! than its count: the oldest old worker is drained and its VM released first, then its
//! replacement is made, and the next goes once that one is healthy. Either way no worker
//! changes its release in place, and one worker goes at a time.

use crate::db::nodes::NodeRow;

/// The next step of a replacement.
#[derive(Debug, Clone)]
pub enum Step<'a> {
    /// Every worker runs the pool's release (or was made for it and has not booted yet).
    Done,
    /// Make one worker at the pool's release.
    Surge,
    /// A worker of the pool's release is not healthy yet: nothing goes before it is.
    Wait { booting: &'a str },
    /// Drain and release this worker of an older (or other) release.
    Replace(&'a NodeRow),
}

impl PartialEq for Step<'_> {
    /// Workers are the same when their rows are.
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Done, Self::Done) | (Self::Surge, Self::Surge) => true,
            (Self::Wait { booting: a }, Self::Wait { booting: b }) => a == b,
            (Self::Replace(a), Self::Replace(b)) => a.id == b.id,
            _ => false,
        }
    }
}

/// Whether `node` was handed another release than `release`.
pub fn outdated(node: &NodeRow, release: &str) -> bool {
    node.handed_version.as_deref().is_some_and(|v| v != release)
}

/// Workers a pool may have beyond `desired` now: while workers of another release remain, as
/// many as are left to replace, at most `max_surge`; otherwise none.
pub fn allowance(active: &[&NodeRow], release: &str, desired: usize, max_surge: usize) -> usize {
    if desired == 0 {
        return 0;
    }
    max_surge.min(active.iter().filter(|n| outdated(n, release)).count())
}

/// The next step for a pool asking for `desired` workers at `release`, `max_surge` of them
/// made beyond it at a time, of which `active` (not being removed) exist.
pub fn step<'a>(
    active: &[&'a NodeRow],
    release: &str,
    desired: usize,
    max_surge: usize,
) -> Step<'a> {
    let Some(oldest) = active
        .iter()
        .copied()
        .filter(|n| outdated(n, release))
        .min_by_key(|n| n.ordinal)
    else {
        return Step::Done;
    };
    if active.len() < desired + allowance(active, release, desired, max_surge) {
        return Step::Surge;
    }
    if let Some(booting) = active
        .iter()
        .find(|n| !outdated(n, release) && !n.phase.healthy())
    {
        return Step::Wait {
            booting: &booting.node_name,
        };
    }
    Step::Replace(oldest)
}

#[cfg(test)]
mod tests {
    use exk8s_common::contract::{BootPhase, ReportState, Role};

    use super::*;
    use crate::lifecycle::NodePhase;

    fn worker(ordinal: i64, handed: Option<&str>, healthy: bool) -> NodeRow {
        let mut n = crate::upgrade::state::tests::node(ordinal, "v1.35.3", [1, 1, 1]);
        n.role = Role::Worker;
        n.etcd_membership = None;
        n.node_name = format!("blue-{ordinal}");
        n.handed_version = handed.map(str::to_owned);
        n.phase = if healthy {
            NodePhase::Reported {
                phase: BootPhase::Complete,
                state: ReportState::Succeeded,
            }
        } else {
            NodePhase::Pending
        };
        n
    }

    #[test]
    fn a_pool_is_replaced_one_surge_at_a_time_oldest_first() {
        let new = "v1.36.3";
        let (a, b) = (
            worker(4, Some("v1.35.3"), true),
            worker(5, Some("v1.35.3"), true),
        );
        assert_eq!(step(&[&a, &b], "v1.35.3", 2, 1), Step::Done);
        assert_eq!(step(&[&a, &b], new, 2, 1), Step::Surge);
        // The surge worker has not booted: nothing goes yet.
        let c = worker(6, None, false);
        assert_eq!(
            step(&[&a, &b, &c], new, 2, 1),
            Step::Wait { booting: "blue-6" }
        );
        let c = worker(6, Some(new), false);
        assert_eq!(
            step(&[&a, &b, &c], new, 2, 1),
            Step::Wait { booting: "blue-6" }
        );
        let c = worker(6, Some(new), true);
        assert_eq!(step(&[&a, &b, &c], new, 2, 1), Step::Replace(&a));
        // The oldest is on its way out: the next surge.
        assert_eq!(step(&[&b, &c], new, 2, 1), Step::Surge);
        let d = worker(7, Some(new), true);
        assert_eq!(step(&[&b, &c, &d], new, 2, 1), Step::Replace(&b));
        assert_eq!(step(&[&c, &d], new, 2, 1), Step::Done);
    }

    #[test]
    fn a_larger_surge_makes_new_workers_first_then_replaces_the_old() {
        let new = "v1.36.3";
        let (a, b, c) = (
            worker(4, Some("v1.35.3"), true),
            worker(5, Some("v1.35.3"), true),
            worker(6, Some("v1.35.3"), true),
        );
        assert_eq!(step(&[&a, &b, &c], new, 3, 2), Step::Surge);
        let d = worker(7, Some(new), true);
        assert_eq!(step(&[&a, &b, &c, &d], new, 3, 2), Step::Surge);
        let e = worker(8, Some(new), false);
        assert_eq!(
            step(&[&a, &b, &c, &d, &e], new, 3, 2),
            Step::Wait { booting: "blue-8" }
        );
        let e = worker(8, Some(new), true);
        assert_eq!(step(&[&a, &b, &c, &d, &e], new, 3, 2), Step::Replace(&a));
        assert_eq!(step(&[&b, &c, &d, &e], new, 3, 2), Step::Surge);
        let f = worker(9, Some(new), true);
        assert_eq!(step(&[&b, &c, &d, &e, &f], new, 3, 2), Step::Replace(&b));
        // One old worker left: no more than one beyond the count.
        assert_eq!(step(&[&c, &d, &e, &f], new, 3, 2), Step::Replace(&c));
        assert_eq!(step(&[&d, &e, &f], new, 3, 2), Step::Done);
    }

    #[test]
    fn without_a_surge_each_old_worker_goes_before_its_replacement_is_made() {
        let new = "v1.36.3";
        let (a, b) = (
            worker(4, Some("v1.35.3"), true),
            worker(5, Some("v1.35.3"), true),
        );
        assert_eq!(step(&[&a, &b], new, 2, 0), Step::Replace(&a));
        // The oldest gone, below the count: its replacement.
        assert_eq!(step(&[&b], new, 2, 0), Step::Surge);
        let c = worker(6, Some(new), false);
        assert_eq!(step(&[&b, &c], new, 2, 0), Step::Wait { booting: "blue-6" });
        let c = worker(6, Some(new), true);
        assert_eq!(step(&[&b, &c], new, 2, 0), Step::Replace(&b));
        // Nothing of the old release is left: the count is the pool's own business.
        assert_eq!(step(&[&c], new, 2, 0), Step::Done);
    }

    #[test]
    fn a_pool_scaled_to_zero_makes_nothing_and_a_larger_surplus_drains_old_first() {
        let new = "v1.36.3";
        let a = worker(4, Some("v1.35.3"), true);
        assert_eq!(step(&[&a], new, 0, 1), Step::Replace(&a));
        let (b, c) = (worker(5, Some(new), true), worker(6, Some(new), true));
        assert_eq!(step(&[&a, &b, &c], new, 1, 1), Step::Replace(&a));
    }
}
