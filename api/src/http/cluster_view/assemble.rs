//! One cluster's view from its related rows ([`super::Parts`]): its conditions judged by
//! `status/`, its nodes, pools, members and rotations as operators read them.

use exk8s_common::contract::Role;

use super::Parts;
use crate::app::AppState;
use crate::db::phase::EtcdMembership;
use crate::db::{self, clusters::ClusterRow, phase::ClusterPhase};
use crate::http::conditions::Condition;
use crate::status;
use crate::upgrade::skew::Release;
use exk8s_api_types::{
    CaRotationView, ClusterView, MembersView, NodeView, PoolSummary, SaKeyRotationView,
    ServiceAccountKeyView,
};

/// What a rotation waits for, as operators read it.
fn waiting_for(n: &db::nodes::NodeRow) -> String {
    format!(
        "{} (vm {}) to apply generation {} (it applied {}, it is {})",
        n.node_name, n.vm_id, n.desired_generation, n.applied_generation, n.phase
    )
}

pub(super) fn assemble(state: &AppState, row: ClusterRow, parts: Parts, now: i64) -> ClusterView {
    let nodes = parts.nodes;
    let inventory = crate::certificates::inventory_of(
        row.id,
        row.sa_key_made_at(),
        &nodes,
        parts.certificates,
        now,
    );
    if !inventory.certificates.is_empty() {
        state
            .metrics
            .set_soonest_expiry(row.id, inventory.soonest_expiry());
    }
    let certificates = status::availability(&inventory, row.created_at, now);
    let ca_rotation = parts.rotation.map(|r| CaRotationView {
        ca: db::rotations::ca_name(r.ca).to_owned(),
        phase: r.phase.to_string(),
        started_at: r.started_at,
        updated_at: r.updated_at,
        waiting_for: crate::rotation::waiting_for(&nodes).map(waiting_for),
    });
    let service_account_key = sa_key_view(&row, parts.sa_rotation.as_ref(), &nodes, now);
    let founded = row.phase == ClusterPhase::Founded;
    let control_plane = || nodes.iter().filter(|n| n.role == Role::ControlPlane);
    let ready =
        founded && control_plane().next().is_some() && control_plane().all(|n| n.phase.completed());
    let last_report = parts.last_report;
    let machines = status::machines(&nodes, last_report.unwrap_or(row.created_at));
    let (desired_control_plane_count, membership_error) = parts.membership;
    let [scaling_up, scaling_down] = status::scaling(
        &nodes,
        desired_control_plane_count,
        membership_error.as_deref(),
        last_report.unwrap_or(row.created_at),
    );
    // Each pool's release: its own, or the control plane's when it follows it.
    let release_of = |p: &db::pools::PoolRow| {
        p.kubernetes_version
            .clone()
            .unwrap_or_else(|| row.kubernetes_version.clone())
    };
    let pool_releases: std::collections::HashMap<i64, String> =
        parts.pools.iter().map(|p| (p.id, release_of(p))).collect();
    let node_pools = parts
        .pools
        .iter()
        .map(|p| {
            let release = &release_of(p);
            let [replicas, ready_replicas, up_to_date_replicas] =
                status::pool_replicas(nodes.iter().filter(|n| n.pool_id == Some(p.id)), release);
            PoolSummary {
                id: p.id,
                name: p.name.clone(),
                desired: p.desired_count,
                replicas,
                ready_replicas,
                up_to_date_replicas,
            }
        })
        .collect();
    let api_endpoints = if !founded {
        Vec::new()
    } else if row.dns_configured {
        vec![format!("https://{}:6443", row.control_plane_dns_name)]
    } else {
        nodes
            .iter()
            .map(|n| {
                format!(
                    "https://{}:6443",
                    n.public_ipv4.as_deref().unwrap_or(&n.private_ipv4)
                )
            })
            .collect()
    };
    let replicas = status::replicas(&nodes);
    let deleting = status::deleting(row.phase, row.updated_at);
    let rotating = status::ca_rotation(
        ca_rotation
            .as_ref()
            .map(|r| status::Rotating {
                ca: &r.ca,
                phase: &r.phase,
                updated_at: r.updated_at,
                waiting_for: r.waiting_for.as_deref(),
            })
            .as_ref(),
        row.created_at,
    );
    // A stored version that is not a release cannot come from this API: shown as it is, and
    // judged as the oldest there is.
    let target: Option<Release> = row.kubernetes_version.parse().ok();
    let version = target.map_or_else(
        || row.kubernetes_version.clone(),
        |t| crate::upgrade::state::oldest(t, &nodes).to_string(),
    );
    // The upgrade's snapshot, while it is not stored (each state's latest is at hand).
    let snapshot_hold = row.upgrade_snapshot_id.and_then(|id| {
        let named = parts.snapshots.iter().find(|s| s.id == id)?;
        let wait = crate::upgrade::snapshot::wait_of(Some(named), now)?;
        Some(crate::rollout::Hold::UpgradeSnapshot { id, wait })
    });
    let rolling_out = status::rolling_out(
        target.unwrap_or(Release { minor: 0, patch: 0 }),
        &nodes,
        last_report.unwrap_or(row.created_at),
        snapshot_hold,
    );
    let snapshots = status::snapshots(
        status::Snapshots {
            founded,
            every_secs: row.snapshot_every_secs,
            created_at: row.created_at,
            latest: &parts.snapshots,
        },
        now,
        crate::snapshots::UPLOAD_WINDOW_SECS,
    );
    let sa_key = status::SaKey {
        made_at: service_account_key.created_at,
        max_age_days: service_account_key.max_age_days,
        auto_rotate: service_account_key.auto_rotate,
        rotation: service_account_key
            .rotation
            .as_ref()
            .map(|r| status::SaKeyRotating {
                phase: &r.phase,
                updated_at: r.updated_at,
                waiting_for: r.waiting_for.as_deref(),
                drop_old_at: r.drop_old_at,
            }),
    };
    let sa_key_rotating = status::sa_key_rotating(sa_key.rotation.as_ref(), row.created_at);
    let sa_key_fresh = status::sa_key_fresh(&sa_key, &row.name, now);
    let reported = parts.components;
    let health = status::Health::new(&nodes, &reported);
    let [available, etcd_healthy, components_healthy] = health.cluster(founded, row.created_at);
    let policy = crate::health::policy::of(&row);
    let remediation = status::remediation_allowed(
        &policy,
        row.remediation_blocked.as_deref(),
        &parts.pools,
        row.created_at,
    );
    let node_conditions: Vec<Vec<Condition>> = nodes
        .iter()
        .map(|n| {
            let facts = crate::health::Facts {
                node: n,
                components: &reported,
            };
            let own = crate::health::policy::for_node(&row, &parts.pools, n);
            let verdict = crate::health::judge(&own, facts, now);
            let checked = status::health_check(n, &verdict, now);
            health
                .node(n)
                .into_iter()
                .chain(std::iter::once(checked))
                .map(Condition::from)
                .collect()
        })
        .collect();
    ClusterView {
        replicas: replicas.replicas,
        ready_replicas: replicas.ready,
        up_to_date_replicas: replicas.up_to_date,
        version,
        initialized: founded && replicas.initialized,
        id: row.id,
        name: row.name,
        phase: row.phase,
        ready,
        api_endpoints,
        error_reason: row.error_reason,
        error_message: row.error_message,
        control_plane_dns_name: row.control_plane_dns_name,
        dns_configured: row.dns_configured,
        key_algorithm: row.key_algorithm,
        kubernetes_version: row.kubernetes_version,
        service_cidr: row.service_cidr,
        pod_cidr: row.pod_cidr,
        // A spec this API cannot read stops the cluster's every issuance, which says why.
        pod_network: crate::cluster::Spec::from_stored(&row.spec_json)
            .map_or("unknown", |spec| spec.pod_network.as_str())
            .to_owned(),
        conditions: [
            available,
            etcd_healthy,
            components_healthy,
            status::certificates(&certificates),
            machines,
            rolling_out,
            scaling_up,
            scaling_down,
            rotating,
            sa_key_rotating,
            sa_key_fresh,
            snapshots,
            remediation,
            deleting,
        ]
        .into_iter()
        .map(Condition::from)
        .collect(),
        node_pools,
        control_plane_members: members_view(&nodes, desired_control_plane_count),
        desired_control_plane_count,
        membership_error,
        ca_rotation,
        service_account_key,
        health_policy: policy,
        nodes: nodes
            .into_iter()
            .zip(node_conditions)
            .map(|(n, conditions)| NodeView {
                conditions,
                last_seen_at: n.last_seen_at,
                up_to_date: match n.pool_id.and_then(|p| pool_releases.get(&p)) {
                    Some(release) => status::pool_node_up_to_date(&n, release),
                    None => n.up_to_date(),
                },
                agent_version: n.agent_version,
                kubernetes_version: n.kubernetes_version,
                provider_id: exk8s_api_types::provider_id(row.id, n.vm_id),
                vm_id: n.vm_id,
                ordinal: n.ordinal,
                name: n.node_name,
                private_ipv4: n.private_ipv4,
                public_ipv4: n.public_ipv4,
                is_initial: n.is_initial,
                role: n.role,
                phase: n.phase.to_string(),
                serial: n.serial,
                desired_generation: n.desired_generation,
                applied_generation: n.applied_generation,
                etcd_membership: n.etcd_membership,
                replacing: n.replace_since.is_some(),
            })
            .collect(),
        created_at: row.created_at,
    }
}

/// The cluster's service-account key: its age and policy, and its rotation in progress.
pub(in crate::http) fn sa_key_view(
    row: &ClusterRow,
    rotation: Option<&db::sa_rotations::SaRotation>,
    nodes: &[db::nodes::NodeRow],
    now: i64,
) -> ServiceAccountKeyView {
    let made_at = row.sa_key_made_at();
    ServiceAccountKeyView {
        created_at: made_at,
        age_days: status::age_days(made_at, now),
        max_age_days: row.sa_key_max_age_days,
        auto_rotate: row.sa_key_auto_rotate,
        rotation: rotation.map(|r| {
            let control_plane: Vec<_> = nodes
                .iter()
                .filter(|n| n.role == Role::ControlPlane)
                .cloned()
                .collect();
            SaKeyRotationView {
                phase: r.phase.to_string(),
                started_at: r.started_at,
                updated_at: r.updated_at,
                drop_old_after_seconds: r.drop_old_after,
                signing_since: r.signing_since,
                drop_old_at: r.drop_old_at(),
                waiting_for: crate::rotation::waiting_for(&control_plane).map(waiting_for),
            }
        }),
    }
}

/// A control plane's members counted from its nodes; `asked` is the size asked for.
fn members_view(nodes: &[db::nodes::NodeRow], asked: Option<i64>) -> MembersView {
    let count = |m: EtcdMembership| {
        let n = nodes
            .iter()
            .filter(|n| n.role == Role::ControlPlane && n.etcd_membership == Some(m))
            .count();
        i64::try_from(n).unwrap_or(i64::MAX)
    };
    let (voters, joining, leaving) = (
        count(EtcdMembership::Voter),
        count(EtcdMembership::Joining),
        count(EtcdMembership::Leaving),
    );
    MembersView {
        desired: asked.unwrap_or(voters + joining),
        voters,
        joining,
        leaving,
    }
}
