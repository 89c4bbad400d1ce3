use super::state::tests::{node, r};
use super::*;

fn offered() -> Vec<Release> {
    ["v1.35.3", "v1.36.3"].map(r).to_vec()
}

#[test]
fn asking_for_the_version_it_runs_changes_nothing() {
    let nodes = [node(0, "v1.35.3", [1, 1, 1]), node(1, "v1.35.3", [1, 1, 1])];
    let cp = ControlPlane::read(r("v1.35.3"), &nodes);
    assert_eq!(
        decide(&cp, &nodes, r("v1.35.3"), &offered()).unwrap(),
        Started::Current {
            version: r("v1.35.3"),
            members: 2
        }
    );
}

#[test]
fn a_steady_control_plane_starts_an_upgrade_and_asking_again_reports_it() {
    let nodes = [node(0, "v1.35.3", [1, 1, 1]), node(1, "v1.35.3", [1, 1, 1])];
    let cp = ControlPlane::read(r("v1.35.3"), &nodes);
    let started = Started::Upgrading {
        from: r("v1.35.3"),
        to: r("v1.36.3"),
        done: 0,
        members: 2,
    };
    assert_eq!(
        decide(&cp, &nodes, r("v1.36.3"), &offered()).unwrap(),
        started
    );
    // Started: the target moved and every member's generation was bumped.
    let mut nodes = [node(0, "v1.36.3", [2, 2, 2]), node(1, "v1.35.3", [1, 1, 2])];
    let cp = ControlPlane::read(r("v1.36.3"), &nodes);
    assert_eq!(
        decide(&cp, &nodes, r("v1.36.3"), &offered()).unwrap(),
        Started::Upgrading {
            from: r("v1.35.3"),
            to: r("v1.36.3"),
            done: 1,
            members: 2,
        }
    );
    nodes[1] = node(1, "v1.36.3", [2, 2, 2]);
    let cp = ControlPlane::read(r("v1.36.3"), &nodes);
    assert!(matches!(
        decide(&cp, &nodes, r("v1.36.3"), &offered()).unwrap(),
        Started::Current { .. }
    ));
}

#[test]
fn mid_upgrade_only_the_version_the_others_run_is_accepted_and_rolls_back() {
    let nodes = [node(0, "v1.36.3", [2, 2, 2]), node(1, "v1.35.3", [1, 1, 2])];
    let cp = ControlPlane::read(r("v1.36.3"), &nodes);
    assert_eq!(
        decide(&cp, &nodes, r("v1.35.3"), &offered()).unwrap(),
        Started::RollingBack {
            from: r("v1.36.3"),
            to: r("v1.35.3")
        }
    );
    let more = [r("v1.35.3"), r("v1.36.1"), r("v1.36.3")];
    let err = decide(&cp, &nodes, r("v1.36.1"), &more).unwrap_err();
    assert!(
        err.to_string()
            .contains("changing from v1.35.3 to v1.36.3 (1 of 2 members run it)")
            && err.to_string().contains("PATCH back to v1.35.3"),
        "{err}"
    );
}

#[test]
fn a_member_that_failed_before_any_ran_the_target_still_allows_the_rollback() {
    let mut nodes = [node(0, "v1.35.3", [2, 1, 2]), node(1, "v1.35.3", [1, 1, 2])];
    nodes[0].phase = crate::lifecycle::NodePhase::Reported {
        phase: exk8s_common::contract::BootPhase::Sync,
        state: exk8s_common::contract::ReportState::Failed,
    };
    let cp = ControlPlane::read(r("v1.36.3"), &nodes);
    assert!(matches!(
        decide(&cp, &nodes, r("v1.35.3"), &offered()).unwrap(),
        Started::RollingBack { .. }
    ));
}

#[test]
fn a_pool_being_replaced_counts_its_oldest_worker() {
    let pool = db::pools::PoolRow {
        id: 9,
        cluster_id: 1,
        name: "blue".into(),
        instance_type: "e2.small".into(),
        image_id: 1,
        subnet_id: 1,
        labels_json: "{}".into(),
        taints_json: "[]".into(),
        desired_count: 2,
        deleting: false,
        last_error: None,
        kubernetes_version: Some("v1.36.3".into()),
        follow_control_plane: true,
        max_surge: 1,
        created_at: 0,
        updated_at: 0,
        health_policy: None,
        remediation_blocked: None,
    };
    let mut old = node(5, "v1.33.0", [1, 1, 1]);
    old.role = Role::Worker;
    old.pool_id = Some(9);
    let new = node(6, "v1.36.3", [1, 1, 1]);
    let mut other_pool = node(7, "v1.30.0", [1, 1, 1]);
    other_pool.pool_id = Some(10);
    let kubelets = oldest_kubelets(&[pool], &[old, new, other_pool], "v1.36.3").unwrap();
    assert_eq!(kubelets, [("blue".to_owned(), r("v1.33.0"))]);
}
