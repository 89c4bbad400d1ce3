//! `POST /clusters` with bad bodies, on SQLite and PostgreSQL: every malformed, out-of-range,
//! unknown-field or non-object body answers 4xx in our error format naming the field, and a
//! refused request leaves no row and no resource.

use serde_json::{Value, json};

use crate::app::{Backend, both_backends, json_of, spawn_app, valid_body};
use crate::founding::assert_nothing_left;

/// Bad bodies: each answers 4xx with our JSON error (naming the field when there is one), and
/// nothing is created.
async fn bad_bodies_are_refused_and_create_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    let with = |patch: Value| {
        let mut body = valid_body(1);
        for (k, v) in patch.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body.to_string()
    };
    let ssh_rsa_in_ed25519 = "ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 x";
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        (
            with(json!({"control_plane_count": 2})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_count": 4})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_count": 0})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_count": -1})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_count": "3"})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_count": 1.5})),
            400,
            Some("control_plane_count"),
        ),
        (
            with(json!({"control_plane_image_id": null})),
            400,
            Some("control_plane_image_id"),
        ),
        (
            with(json!({"control_plane_image_id": 0})),
            400,
            Some("control_plane_image_id"),
        ),
        (
            with(json!({"control_plane_image_id": -3})),
            400,
            Some("control_plane_image_id"),
        ),
        (
            with(json!({"control_plane_image_id": "42"})),
            400,
            Some("control_plane_image_id"),
        ),
        (
            with(json!({"control_plane_instance_type": null})),
            400,
            Some("control_plane_instance_type"),
        ),
        (
            with(json!({"control_plane_instance_type": ""})),
            400,
            Some("control_plane_instance_type"),
        ),
        (
            with(json!({"control_plane_instance_type": "e2 medium"})),
            400,
            Some("control_plane_instance_type"),
        ),
        (
            with(json!({"control_plane_instance_type": "-e2"})),
            400,
            Some("control_plane_instance_type"),
        ),
        (
            with(json!({"control_plane_instance_type": "x".repeat(65)})),
            400,
            Some("control_plane_instance_type"),
        ),
        (with(json!({"zone_id": 0})), 400, Some("zone_id")),
        (with(json!({"subnet_id": null})), 400, Some("subnet_id")),
        (with(json!({"subnet_id": 0})), 400, Some("subnet_id")),
        (
            with(json!({"security_group_ids": [1, 1]})),
            400,
            Some("security_group_ids"),
        ),
        (
            with(json!({"security_group_ids": [0]})),
            400,
            Some("security_group_ids"),
        ),
        (
            with(json!({"security_group_ids": [1, 2, 3, 4, 5, 6]})),
            400,
            Some("security_group_ids"),
        ),
        (
            with(json!({"security_group_ids": "1"})),
            400,
            Some("security_group_ids"),
        ),
        (
            with(json!({"allocate_public_ipv4": "yes"})),
            400,
            Some("allocate_public_ipv4"),
        ),
        (
            with(json!({"ssh_pubkey": "not a key"})),
            400,
            Some("ssh_pubkey"),
        ),
        (
            with(json!({"ssh_pubkey": ssh_rsa_in_ed25519})),
            400,
            Some("ssh_pubkey"),
        ),
        (
            with(json!({"root_volume_size_gib": 5})),
            400,
            Some("root_volume_size_gib"),
        ),
        (
            with(json!({"root_volume_size_gib": 100_000})),
            400,
            Some("root_volume_size_gib"),
        ),
        (
            with(json!({"key_algorithm": "ed25519"})),
            400,
            Some("key_algorithm"),
        ),
        (
            with(json!({"key_algorithm": "rsa-1024"})),
            400,
            Some("key_algorithm"),
        ),
        (
            with(json!({"kubernetes_version": "v1.20.0"})),
            400,
            Some("kubernetes_version"),
        ),
        (
            with(json!({"pod_network": "calico"})),
            400,
            Some("pod_network"),
        ),
        (with(json!({"org_id": 8})), 400, Some("org_id")),
        (with(json!({"project_id": 1})), 400, Some("project_id")),
        (with(json!({"subnet_id": 5000})), 422, Some("subnet_id")),
        (
            with(json!({"security_group_ids": [999]})),
            422,
            Some("security_group_ids"),
        ),
        // serde's sequence form of the struct: every body must be a JSON object.
        (
            r#"[1,1,"dev.small",null,1,null,null,null,null,null,null]"#.into(),
            400,
            None,
        ),
        (format!("  \n[{}]", valid_body(1)), 400, None),
        ("{".into(), 400, None),
        ("[]".into(), 400, None),
        ("null".into(), 400, None),
        ("".into(), 400, None),
        (
            format!(
                "{{\"control_plane_instance_type\": \"{}\"}}",
                "x".repeat(70_000)
            ),
            413,
            None,
        ),
    ];
    assert!(cases.len() >= 30);
    for (body, status, field) in &cases {
        let response = app
            .post("/clusters")
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status().as_u16(),
            *status,
            "body {}",
            &body[..body.len().min(120)]
        );
        let error = json_of(response).await;
        assert!(error["error"]["code"].is_string(), "{error}");
        if let Some(field) = field {
            assert_eq!(error["error"]["field"].as_str(), Some(*field), "{error}");
        }
    }
    let wrong_type = app
        .post("/clusters")
        .header("content-type", "text/plain")
        .body(valid_body(1).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_type.status(), 415);
    assert_eq!(
        json_of(wrong_type).await["error"]["code"],
        "unsupported_media_type"
    );
    let no_type = app
        .post("/clusters")
        .body(valid_body(1).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(no_type.status(), 415);
    // Everything checkable before founding starts (subnet, security groups) is checked first:
    // a refused request leaves no row at all.
    assert_eq!(app.cluster_count().await, 0);
    assert_nothing_left(&app);
}

both_backends!(bad_bodies_are_refused_and_create_nothing);
