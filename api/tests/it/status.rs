//! A cluster's status in Cluster API's terms, on SQLite and PostgreSQL, following its nodes'
//! reports: `replicas`, `ready_replicas`, `up_to_date_replicas`, `version`, `initialized` and
//! the `Deleting` condition, from founding through boot and a rollout.

use exk8s_common::node_auth::NodeKey;
use serde_json::{Value, json};

use crate::app::{
    Backend, both_backends, cluster_with_credentials, credentials_for, json_of, spawn_app,
    spawn_clocked, test_config,
};
use crate::bootstrap::report;
use crate::membership::{condition, roll, view};
use crate::sync::register;

fn counts(view: &Value) -> [i64; 3] {
    ["replicas", "ready_replicas", "up_to_date_replicas"].map(|k| view[k].as_i64().unwrap())
}

async fn replicas_follow_the_reports_from_founding_through_a_rollout(backend: Backend) {
    let app = spawn_app(backend).await;
    let created = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let cluster = created["cluster_id"].as_i64().unwrap();

    let founded = view(&app, cluster).await;
    assert_eq!(
        counts(&founded),
        [3, 0, 0],
        "no node fetched its bundle yet"
    );
    assert_eq!(founded["initialized"], false);
    assert_eq!(founded["version"], founded["kubernetes_version"]);
    assert!(founded["version"].as_str().unwrap().starts_with('v'));
    let deleting = condition(&founded, "Deleting");
    assert_eq!(deleting["status"], "False", "{deleting}");
    assert_eq!(deleting["reason"], "NotDeleting");

    let mut members = Vec::new();
    for (booted, node) in credentials_for(&app, 7, &created)
        .await
        .into_iter()
        .enumerate()
    {
        let key = NodeKey::generate().unwrap();
        register(&app, &node, &key).await;
        assert_eq!(report(&app, &node, "etcd", "started").await, 204);
        let booting = view(&app, cluster).await;
        assert_eq!(booting["initialized"], booted > 0, "{booted} booted");
        assert_eq!(report(&app, &node, "complete", "succeeded").await, 204);
        let up = view(&app, cluster).await;
        let booted = i64::try_from(booted).unwrap() + 1;
        assert_eq!(counts(&up), [3, booted, booted]);
        assert_eq!(up["initialized"], true);
        members.push((node, key));
    }

    let started = app
        .post(&format!("/clusters/{cluster}/rollout"))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 202);
    assert_eq!(counts(&view(&app, cluster).await), [3, 3, 0]);
    roll(&app, &members).await;
    let rolled = view(&app, cluster).await;
    assert_eq!(counts(&rolled), [3, 3, 3]);
    assert_eq!(rolled["initialized"], true);
}

both_backends!(replicas_follow_the_reports_from_founding_through_a_rollout);

async fn the_cluster_list_comes_in_pages(backend: Backend) {
    // A clock that stands still: a page and a view read a second apart must not see a
    // certificate's days left change between them.
    let clock = std::sync::Arc::new(exk8s_api::clock::ManualClock::starting_at(
        time::OffsetDateTime::now_utc(),
    ));
    let app = spawn_clocked(backend, test_config(), None, clock).await;
    let mut made = Vec::new();
    for _ in 0..5 {
        let created = json_of(app.found(1, json!({"control_plane_image_id": 42})).await).await;
        made.push(created["cluster_id"].as_i64().unwrap());
    }
    let mut seen = Vec::new();
    let mut path = "/clusters?limit=2".to_owned();
    let mut pages = 0;
    loop {
        let page = app.get(&path).send().await.unwrap();
        assert_eq!(page.status(), 200);
        let next = page
            .headers()
            .get("link")
            .map(|l| l.to_str().unwrap().to_owned());
        let rows = json_of(page).await;
        let ids: Vec<i64> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_i64().unwrap())
            .collect();
        assert!(ids.len() <= 2, "{ids:?}");
        seen.extend(ids);
        pages += 1;
        let Some(link) = next else { break };
        assert!(link.ends_with(">; rel=\"next\""), "{link}");
        path = link
            .trim_start_matches('<')
            .split('>')
            .next()
            .unwrap()
            .to_owned();
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, made, "every cluster once, in id order");
    let all = app.get("/clusters").send().await.unwrap();
    assert!(all.headers().get("link").is_none(), "one page holds five");
    assert_eq!(json_of(all).await.as_array().unwrap().len(), 5);

    // Whatever a cluster holds (reports, a pool, three nodes), its entry in a page is its own
    // view: a page is built with one query per table, a single view as a page of one.
    let three = json_of(app.found(3, json!({"control_plane_image_id": 42})).await).await;
    let node = &credentials_for(&app, 7, &three).await[1];
    assert_eq!(report(&app, node, "etcd", "started").await, 204);
    let pool = json!({"name": "idle", "count": 0, "instance_type": "e2.medium", "image_id": 42, "subnet_id": 5});
    let added = app
        .post(&format!("/clusters/{}/node-pools", made[0]))
        .json(&pool)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 202);
    let listed = json_of(app.get("/clusters").send().await.unwrap()).await;
    assert_eq!(listed.as_array().unwrap().len(), 6);
    for entry in listed.as_array().unwrap() {
        assert_eq!(entry, &view(&app, entry["id"].as_i64().unwrap()).await);
    }
    let with_pool = &listed[0];
    assert_eq!(with_pool["node_pools"][0]["name"], "idle", "{with_pool}");
    assert_eq!(listed[5]["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(listed[5]["nodes"][1]["phase"], "etcd:started");

    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("cursor=2", "cursor"),
        ("page=2", "page"),
    ] {
        let refused = app.get(&format!("/clusters?{query}")).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{query}");
        assert_eq!(json_of(refused).await["error"]["field"], field, "{query}");
    }
}

both_backends!(the_cluster_list_comes_in_pages);

async fn a_long_page_shows_its_org_own_clusters_in_order(backend: Backend) {
    // A page is read as the span of ids it covers, and a page this long is written in slices
    // joined afterwards. Another org's clusters lie inside the span: none of them, nor any of
    // their nodes, may show, and every entry must still be that cluster's own view.
    let clock = std::sync::Arc::new(exk8s_api::clock::ManualClock::starting_at(
        time::OffsetDateTime::now_utc(),
    ));
    let app = spawn_clocked(backend, test_config(), None, clock).await;
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..70 {
        if i % 10 == 5 {
            theirs.push(cluster_with_credentials(&app, 8, 3).await[0].cluster);
        }
        let created = json_of(app.found(1, json!({"control_plane_image_id": 42})).await).await;
        ours.push(created["cluster_id"].as_i64().unwrap());
    }
    assert!(theirs.iter().all(|id| (ours[0]..ours[69]).contains(id)));
    let listed = json_of(app.get("/clusters").send().await.unwrap()).await;
    let listed = listed.as_array().unwrap();
    let ids: Vec<i64> = listed.iter().map(|c| c["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, ours, "the org's clusters, each once, in id order");
    for entry in listed {
        assert_eq!(entry["nodes"].as_array().unwrap().len(), 1, "{entry}");
        assert_eq!(entry, &view(&app, entry["id"].as_i64().unwrap()).await);
    }
}

both_backends!(a_long_page_shows_its_org_own_clusters_in_order);
