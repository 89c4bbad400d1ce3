//! Shrinking a running control plane through the API, on SQLite and PostgreSQL (the agents'
//! side acted by the test; booted machines prove it in tests/tests/boot_cluster/scale.rs), and
//! growing one to five and back: `PATCH` from 3 to 1
//! removes the newest member first, one at a time — the oldest voter's next bundle drains it
//! and removes it from etcd through the members that stay; once that bundle is reported
//! applied the shared DNS name stops listing it, and only then does its VM go; every other
//! member then follows (the remover's own generation already left it out).

use std::time::Duration;

use exk8s_api::sim::Faults;
use exk8s_common::node_auth::NodeKey;
use exk8s_common::payload::PlanStep;
use serde_json::json;

use crate::app::{Backend, both_backends, credentials_for, json_of, spawn_app};
use crate::bootstrap::report;
use crate::crash::wait_until;
use crate::membership::{condition, control_plane, roll, scale, view};
use crate::sync::{fetch_update, register, sync_report, update_payload};

async fn a_control_plane_shrinks_newest_first(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let dns_name = created["control_plane_dns_name"].as_str().unwrap();
    let mut members = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        members.push((node, key));
    }
    let started = scale(&app, cluster, json!({"control_plane_count": 1})).await;
    assert_eq!(started.status(), 202, "{}", started.text().await.unwrap());

    for left in [2, 1] {
        let leaving_vm = members[left].0.vm;
        wait_until(
            "the newest member leaving",
            Duration::from_secs(20),
            || async {
                control_plane(&view(&app, cluster).await)
                    .iter()
                    .any(|n| n["vm_id"] == leaving_vm && n["etcd_membership"] == "leaving")
            },
        )
        .await;
        let now = view(&app, cluster).await;
        assert_eq!(condition(&now, "ScalingDown")["reason"], "MemberLeaving");
        let busy = scale(&app, cluster, json!({"control_plane_count": 3})).await;
        assert_eq!(busy.status(), 409, "one change at a time");
        let leaving = control_plane(&now)
            .into_iter()
            .find(|n| n["vm_id"] == leaving_vm)
            .unwrap();
        let ip = leaving["private_ipv4"].as_str().unwrap();

        let (remover, key) = &members[0];
        let update = update_payload(&app, fetch_update(&app, remover, key).await).await;
        let drained: Vec<&str> = update
            .plan
            .iter()
            .filter_map(|s| match s {
                PlanStep::DrainNode { node, .. } => Some(node.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(drained, [leaving["name"].as_str().unwrap()]);
        let removal = update
            .plan
            .iter()
            .find_map(|s| match s {
                PlanStep::EtcdRemove {
                    voters,
                    member_client_url,
                    member_peer_url,
                    ..
                } => Some((voters.clone(), member_client_url, member_peer_url)),
                _ => None,
            })
            .expect("a removal step");
        assert_eq!(removal.1.to_string(), format!("https://{ip}:2379"));
        assert_eq!(removal.2.to_string(), format!("https://{ip}:2380"));
        assert_eq!(removal.0.len(), left, "through the members that stay");
        assert!(
            app.sims.compute.vms().iter().any(|vm| vm.id == leaving_vm),
            "no VM goes before etcd let it go"
        );
        let address = leaving["public_ipv4"].as_str().unwrap_or(ip).to_owned();
        let listed = || {
            app.sims
                .dns
                .records()
                .get(dns_name)
                .cloned()
                .unwrap_or_default()
        };
        assert!(
            listed().contains(&address),
            "the name lists it while the remover's components roll: {:?}",
            listed()
        );
        // Held at its VM's delete: by then the name no longer lists it.
        app.sims.set_faults(Faults {
            hold_vm_delete: true,
            ..Faults::default()
        });
        sync_report(&app, remover, key, "succeeded", update.identity.generation).await;
        wait_until(
            "the shared name without the leaving member",
            Duration::from_secs(20),
            || async { !listed().contains(&address) },
        )
        .await;
        assert_eq!(listed().len(), left, "{:?}", listed());
        assert!(
            app.sims.compute.vms().iter().any(|vm| vm.id == leaving_vm),
            "its VM is deleted after the name stops listing it"
        );
        app.sims.set_faults(Faults::default());
        wait_until("the member gone", Duration::from_secs(20), || async {
            control_plane(&view(&app, cluster).await).len() == left
        })
        .await;
        assert!(app.sims.compute.vms().iter().all(|vm| vm.id != leaving_vm));
        // Every other member follows; the remover's own generation already left the member
        // out, so it is not rolled again (with no other member, that would be an outage).
        let after = control_plane(&view(&app, cluster).await);
        for node in &after {
            let remover_node = node["vm_id"] == members[0].0.vm;
            assert_eq!(node["up_to_date"], remover_node, "{node}");
        }
        members.truncate(left);
        roll(&app, &members).await;
    }
    let done = view(&app, cluster).await;
    assert_eq!(control_plane(&done).len(), 1);
    assert_eq!(condition(&done, "ScalingDown")["reason"], "AtDesiredSize");
    assert_eq!(app.sims.compute.vms().len(), 1);
}

both_backends!(a_control_plane_shrinks_newest_first);

/// Moves the cluster's change on once, waiting out a pass a report started.
async fn converge_once(app: &crate::app::TestApp, cluster: i64) {
    use exk8s_api::membership::converge::{Outcome, converge};
    wait_until("a converge pass", Duration::from_secs(20), || async {
        converge(&app.state.membership(), cluster).await.unwrap() != Outcome::Busy
    })
    .await;
}

/// Whether `remover`'s next update removes the member with address `ip` from etcd.
async fn removes(
    app: &crate::app::TestApp,
    remover: &(crate::app::Node, NodeKey),
    ip: &str,
) -> (bool, u64) {
    let update = update_payload(app, fetch_update(app, &remover.0, &remover.1).await).await;
    let removes = update.plan.iter().any(|s| {
        matches!(s, PlanStep::EtcdRemove { member_client_url, .. }
            if member_client_url.to_string() == format!("https://{ip}:2379"))
    });
    (removes, update.identity.generation)
}

async fn a_remover_busy_applying_keeps_the_removal_and_a_failed_one_hands_it_on(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut members = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        members.push((node, key));
    }
    let started = scale(&app, cluster, json!({"control_plane_count": 1})).await;
    assert_eq!(started.status(), 202);
    let leaving_vm = members[2].0.vm;
    wait_until(
        "the newest member leaving",
        Duration::from_secs(20),
        || async {
            control_plane(&view(&app, cluster).await)
                .iter()
                .any(|n| n["vm_id"] == leaving_vm && n["etcd_membership"] == "leaving")
        },
    )
    .await;
    let now = view(&app, cluster).await;
    let name = |vm: i64| {
        control_plane(&now)
            .into_iter()
            .find(|n| n["vm_id"] == vm)
            .unwrap()["name"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let (first_name, second_name) = (name(members[0].0.vm), name(members[1].0.vm));
    let ip = control_plane(&now)
        .into_iter()
        .find(|n| n["vm_id"] == leaving_vm)
        .unwrap()["private_ipv4"]
        .as_str()
        .unwrap()
        .to_owned();
    let remover_named = |view: &serde_json::Value, who: &str| {
        condition(view, "ScalingDown")["message"]
            .as_str()
            .unwrap()
            .contains(who)
    };
    assert!(remover_named(&now, &first_name), "{now}");

    // The oldest member is applying the removal: it stays the remover.
    let (removes_it, generation) = removes(&app, &members[0], &ip).await;
    assert!(removes_it);
    sync_report(&app, &members[0].0, &members[0].1, "started", generation).await;
    converge_once(&app, cluster).await;
    let busy = view(&app, cluster).await;
    assert!(remover_named(&busy, &first_name), "{busy}");

    // Its apply failed: the removal goes to the next voter. The failed node's own retry no
    // longer removes anything; once it is healthy again, the next voter's update does.
    sync_report(&app, &members[0].0, &members[0].1, "failed", generation).await;
    converge_once(&app, cluster).await;
    let failed = view(&app, cluster).await;
    assert!(remover_named(&failed, &second_name), "{failed}");
    let (removes_it, generation) = removes(&app, &members[0], &ip).await;
    assert!(!removes_it);
    sync_report(&app, &members[0].0, &members[0].1, "succeeded", generation).await;
    let (removes_it, generation) = removes(&app, &members[1], &ip).await;
    assert!(removes_it);
    sync_report(&app, &members[1].0, &members[1].1, "succeeded", generation).await;
    wait_until("the member gone", Duration::from_secs(20), || async {
        control_plane(&view(&app, cluster).await).len() == 2
    })
    .await;
    assert!(app.sims.compute.vms().iter().all(|vm| vm.id != leaving_vm));
}

both_backends!(a_remover_busy_applying_keeps_the_removal_and_a_failed_one_hands_it_on);

async fn one_member_is_removed_even_a_dead_one_and_never_the_last(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();
    let mut members = Vec::new();
    for node in credentials_for(&app, 7, &created).await {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        members.push((node, key));
    }
    let delete = |vm: i64| {
        app.delete(&format!("/clusters/{cluster}/nodes/{vm}"))
            .send()
    };
    assert_eq!(delete(999_999).await.unwrap().status(), 404);

    // The second member dies (its last sync failed).
    let (dead, dead_key) = &members[1];
    sync_report(&app, dead, dead_key, "failed", 1).await;
    let (third, _) = &members[2];
    let refused = delete(third.vm).await.unwrap();
    assert_eq!(refused.status(), 409);
    let message = json_of(refused).await["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("would be healthy: no majority"),
        "{message}"
    );

    let dead_ip = control_plane(&view(&app, cluster).await)[1]["private_ipv4"]
        .as_str()
        .unwrap()
        .to_owned();
    let keyed = || {
        app.delete(&format!("/clusters/{cluster}/nodes/{}", dead.vm))
            .header("Idempotency-Key", "remove-the-dead-one")
            .send()
    };
    let accepted = keyed().await.unwrap();
    assert_eq!(accepted.status(), 202);
    let first_answer = json_of(accepted).await;
    // A retry with its key gets the first answer, not "a change is in progress".
    let retried = keyed().await.unwrap();
    assert_eq!(retried.status(), 202);
    assert_eq!(json_of(retried).await, first_answer);
    let (remover, key) = &members[0];
    let update = update_payload(&app, fetch_update(&app, remover, key).await).await;
    let removes_it = update.plan.iter().any(|s| {
        matches!(s, PlanStep::EtcdRemove { member_client_url, .. }
            if member_client_url.to_string() == format!("https://{dead_ip}:2379"))
    });
    assert!(removes_it, "{:?}", update.plan);
    sync_report(&app, remover, key, "succeeded", update.identity.generation).await;
    let dead_vm = dead.vm;
    wait_until("the dead member gone", Duration::from_secs(20), || async {
        control_plane(&view(&app, cluster).await).len() == 2
    })
    .await;
    assert!(app.sims.compute.vms().iter().all(|vm| vm.id != dead_vm));
    members.remove(1);
    roll(&app, &members).await;

    // Down to one, and the last one stays.
    let third_vm = members[1].0.vm;
    assert_eq!(delete(third_vm).await.unwrap().status(), 202);
    let (remover, key) = &members[0];
    let update = update_payload(&app, fetch_update(&app, remover, key).await).await;
    sync_report(&app, remover, key, "succeeded", update.identity.generation).await;
    wait_until("one member left", Duration::from_secs(20), || async {
        control_plane(&view(&app, cluster).await).len() == 1
    })
    .await;
    let last = delete(members[0].0.vm).await.unwrap();
    assert_eq!(last.status(), 409);
    assert!(
        json_of(last).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("only control-plane member")
    );
}

both_backends!(one_member_is_removed_even_a_dead_one_and_never_the_last);

/// Five members and back: two joins one at a time (each a voter before the next starts), then
/// the two newest leave, each removed from etcd by the oldest member's update through the
/// members that stay; the shared name and the compute API follow every step.
async fn a_control_plane_goes_three_five_three(backend: Backend) {
    let app = spawn_app(backend).await;
    let (cluster, mut members) = crate::replace::founded(&app, 3).await;
    let dns_name = view(&app, cluster).await["control_plane_dns_name"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed = || app.sims.dns.records().get(&dns_name).map_or(0, Vec::len);
    let started = scale(&app, cluster, json!({"control_plane_count": 5})).await;
    assert_eq!(started.status(), 202, "{}", started.text().await.unwrap());
    for voters in [3, 4] {
        let counted = view(&app, cluster).await["control_plane_members"].clone();
        assert_eq!(
            (&counted["desired"], &counted["voters"]),
            (&json!(5), &json!(voters)),
            "{counted}"
        );
        crate::replace::joins(&app, cluster, &mut members).await;
        wait_until(
            "the name lists the new member",
            Duration::from_secs(20),
            || async { listed() == voters + 1 },
        )
        .await;
    }
    let five = view(&app, cluster).await;
    assert_eq!(
        five["control_plane_members"],
        json!({"desired": 5, "voters": 5, "joining": 0, "leaving": 0})
    );
    assert_eq!(condition(&five, "ScalingUp")["reason"], "AtDesiredSize");
    assert_eq!(app.sims.compute.vms().len(), 5);

    let started = scale(&app, cluster, json!({"control_plane_count": 3})).await;
    assert_eq!(started.status(), 202, "{}", started.text().await.unwrap());
    for left in [4, 3] {
        let leaving_vm = members[left].0.vm;
        wait_until(
            "the newest member leaving",
            Duration::from_secs(20),
            || async {
                control_plane(&view(&app, cluster).await)
                    .iter()
                    .any(|n| n["vm_id"] == leaving_vm && n["etcd_membership"] == "leaving")
            },
        )
        .await;
        let leaving = control_plane(&view(&app, cluster).await)
            .into_iter()
            .find(|n| n["vm_id"] == leaving_vm)
            .unwrap();
        let ip = leaving["private_ipv4"].as_str().unwrap();
        let (removes_it, generation) = removes(&app, &members[0], ip).await;
        assert!(removes_it, "the oldest member's update removes {ip}");
        let (remover, key) = &members[0];
        sync_report(&app, remover, key, "succeeded", generation).await;
        wait_until("the member gone", Duration::from_secs(20), || async {
            control_plane(&view(&app, cluster).await).len() == left
        })
        .await;
        assert!(app.sims.compute.vms().iter().all(|vm| vm.id != leaving_vm));
        assert_eq!(listed(), left);
        members.truncate(left);
        roll(&app, &members).await;
    }
    let done = view(&app, cluster).await;
    assert_eq!(
        done["control_plane_members"],
        json!({"desired": 3, "voters": 3, "joining": 0, "leaving": 0})
    );
    assert_eq!(condition(&done, "ScalingDown")["reason"], "AtDesiredSize");
    assert_eq!(app.sims.compute.vms().len(), 3);
}

both_backends!(a_control_plane_goes_three_five_three);

async fn another_orgs_day_two_requests_find_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(1, json!({})).await).await;
    let id = created["cluster_id"].as_i64().unwrap();
    let vm = created["control_plane_vm_ids"][0].as_i64().unwrap();
    let other_org =
        crate::app::operator_token(&app.state, 8, exk8s_api::tokens::Scope::Operator, 3600).await;
    for (method, path, body) in [
        (
            reqwest::Method::PATCH,
            format!("/clusters/{id}"),
            json!({"control_plane_count": 3}),
        ),
        (
            reqwest::Method::POST,
            format!("/clusters/{id}/node-pools"),
            crate::pools::pool_body("other", 1),
        ),
        (
            reqwest::Method::GET,
            format!("/clusters/{id}/node-pools"),
            json!({}),
        ),
        (
            reqwest::Method::DELETE,
            format!("/clusters/{id}/nodes/{vm}"),
            json!({}),
        ),
    ] {
        let response = app
            .http
            .request(method.clone(), format!("{}{path}", app.url))
            .bearer_auth(&other_org)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
        let unauthenticated = app
            .http
            .request(method.clone(), format!("{}{path}", app.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(unauthenticated.status(), 401, "{method} {path}");
    }
    // Nothing moved for the cluster's own org.
    let view = view(&app, id).await;
    assert!(view.get("desired_control_plane_count").is_none(), "{view}");
    assert_eq!(view["node_pools"], json!([]), "{view}");
    assert_eq!(app.sims.compute.vms().len(), 1);
}

both_backends!(another_orgs_day_two_requests_find_nothing);
