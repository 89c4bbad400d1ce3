//! Shrinking a running control plane through the API, on SQLite and PostgreSQL (the agents'
//! side acted by the test; real etcd proves it in tests/tests/scale.rs): `PATCH` from 3 to 1
//! removes the newest member first, one at a time — the oldest voter's next bundle drains it
//! and removes it from etcd through the members that stay; its VM goes only once that bundle
//! is reported applied, and every member then follows.

use std::time::Duration;

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
        sync_report(&app, remover, key, "succeeded", update.identity.generation).await;
        wait_until("the member gone", Duration::from_secs(20), || async {
            control_plane(&view(&app, cluster).await).len() == left
        })
        .await;
        assert!(app.sims.compute.vms().iter().all(|vm| vm.id != leaving_vm));
        members.truncate(left);
        roll(&app, &members).await;
    }
    let done = view(&app, cluster).await;
    assert_eq!(control_plane(&done).len(), 1);
    assert_eq!(condition(&done, "ScalingDown")["reason"], "AtDesiredSize");
    assert_eq!(app.sims.compute.vms().len(), 1);
}

both_backends!(a_control_plane_shrinks_newest_first);

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
    let accepted = delete(dead.vm).await.unwrap();
    assert_eq!(accepted.status(), 202);
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
